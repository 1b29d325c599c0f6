"""One grammar builder for every tool-call dialect.

Per tool: the dialect's call pieces, the name as a literal, the id in its scheme, the
arguments under that tool's schema (JSON: ``%json``; XML: one rule per parameter, raw text
only where the schema resolves to string, ``%json`` elsewhere; Python keywords: quoted
strings, ``True``/``False``/``None``, JSON for numbers and containers; Gemma 4's keyed
values: :mod:`.gemma_values`), with chatkit's
number bounds. A name can never be paired with another tool's arguments. ``tool_choice``:

- ``"auto"``: free text containing no call opening, calls, or text then calls where
  the family writes that (after an optional think block); a call is fully constrained.
- ``"required"``: one or more calls (exactly one when not parallel).
- ``"none"``: free text in which the call opening cannot appear.
- a tool name: calls of exactly that tool.

With ``output=`` (a schema) the free-text alternative becomes that schema's JSON. Markup
resolves against the model's vocabulary (:func:`markup_for`): a marker that is one special
or added token is that token id (``<[id]>``), anything else literal text.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..engine.protocols import Vocabulary
from ..errors import SchemaUnsupported, ToolDefinitionError
from ..grammar.schema import bound_numbers, closed_objects, json_options
from .definition import Tool
from .dialects import ARGS, HERMES, ID, INDEX, NAME, Dialect
from .gemma_values import gemma_params
from .lark_text import (
    RAW_STRING_MAX,
    Markup,
    markup_for,
    regex_text,
    resolves_to_string,
    string_also,
    text_markup,
)
from .options import TOOL_CHOICES, check_parallel, check_tool_choice
from .py_values import ANNOTATIONS, py_params, py_value, simple_union, typed_members
from .tree_values import tree_params

__all__: list[str] = []

DEFAULT_MAX_CALLS = 4


def _json_options(dialect: Dialect) -> dict[str, Any]:
    """llguidance's JSON options with the dialect's separators (the template's own)."""
    if dialect.json_indent is not None:  # any layout: the indent grows with depth
        return {**json_options(), "whitespace_flexible": True,
                "whitespace_pattern": "[\\n ]{0,64}"}
    item_sep, key_sep = dialect.json_separators
    return {**json_options(), "item_separator": item_sep, "key_separator": key_sep}


class _Builder:
    """Collects the rules of one tool grammar."""

    def __init__(self, dialect: Dialect, lit: Markup) -> None:
        self.dialect = dialect
        self.lit = lit
        self.rules: list[str] = []
        self.arg_rules: list[str] = []
        """Per callable tool, its arguments' rule (made once, shared by every call)."""
        self.raw: set[str] = set()
        """The raw-string lexemes made (one per length range and pattern)."""
        self.raw_shapes: dict[tuple[int, int, str], str] = {}
        """The key of each raw-string lexeme with a pattern or format."""
        self.json_rules: dict[str, str] = {}
        """Each ``%json`` body made, by its text, and its rule's name."""

    def add(self, name: str, body: str) -> str:
        self.rules.append(f"{name}: {body}")
        return name

    def markup(self, text: str, *, before_raw: bool = False) -> str:
        """Call markup as Lark, its line breaks optional: a family's templates differ in
        the layout around the same markers (a newline after ``<tool_call>`` or none), and
        a model writes the one it was trained on; spaces stay as written. ``before_raw``:
        a raw value follows, so trailing layout stays as written (optional, the value
        could begin with it, and its length would count it)."""
        runs = [r for r in re.split(r"(\s*\n\s*)", text) if r]
        out = []
        for k, run in enumerate(runs):
            lark = self.lit(run)
            last = before_raw and k == len(runs) - 1
            out.append(f"({lark})?" if not run.strip() and not last else lark)
        return " ".join(out)

    def json_value(self, name: str, schema: dict[str, Any]) -> str:
        """A JSON value under ``schema``; one rule per distinct schema (XML and Python
        parameters of many tools share their ``integer`` or ``boolean``)."""
        bare = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
        doc = {**bound_numbers(bare), "x-guidance": _json_options(self.dialect)}
        body = f"%json {json.dumps(doc)}"
        if body not in self.json_rules:
            self.json_rules[body] = self.add(name, body)
        return self.json_rules[body]

    # -- arguments
    def args(self, name: str, tool: Tool) -> str:
        schema = closed_objects(tool.definition.parameters_schema)
        kind = self.dialect.args.kind
        if kind == "json":
            return self.json_value(name, schema)
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        if kind == "gemma":
            return self.add(name, gemma_params(self, name, schema, defs, "") or '""')
        if kind == "tree":
            return self.add(name, tree_params(self, f"{name}_t", schema, defs, "") or '""')
        items = []
        for j, (key, sub) in enumerate(props.items()):
            if kind == "xml" and (key_end(self.dialect) in key or key != key.strip()):
                raise SchemaUnsupported("properties", f"/{key}", "an XML parameter name ends "
                                        f"at {key_end(self.dialect)!r} and has no layout "
                                        "around it: this name cannot be read back")
            if kind == "python" and (not key.isidentifier() or keyword.iskeyword(key)):
                raise SchemaUnsupported("properties", f"/{key}", "a pythonic call writes "
                                        "name=value: a parameter name must be a Python "
                                        "identifier and not a keyword")
            if kind == "xml" and "{type}" in self.dialect.args.key_close_json:
                items.append(("", self.xml_typed(f"{name}_{j}", key, sub, defs),
                              key in required))
                continue
            member = _string_member(sub, bool(self.dialect.args.key_close_json)) \
                if kind == "xml" else None
            sub = {**sub, **defs} if isinstance(sub, dict) else sub
            if member is not None:  # its markup up to the value is part of each branch
                items.append(("", self.xml_union(f"{name}_{j}", key, sub, member),
                              key in required))
                continue
            value = (self.xml_value if kind == "xml" else self.py_value)(f"{name}_{j}", sub)
            head = key
            if kind == "xml":  # the key's markup up to the value
                a = self.dialect.args
                head = a.key_open + key + (a.key_close if resolves_to_string(sub)
                                           or not a.key_close_json else a.key_close_json)
            items.append((head, value, key in required))
        if kind == "xml":
            return self.add(name, self.xml_params(items) or '""')
        return self.add(name, self.py_params(name, items) or '""')

    def xml_params(self, items: list[tuple[str, str, bool]]) -> str:
        """Each parameter's markup up to its value (``key_open KEY key_close``), its value
        rule (ending with ``value_close``), optional where not required."""
        parts = []
        for head, value, required in items:  # each value rule ends with value_close
            one = f"{self.markup(head, before_raw=True)} {value}" if head else value
            parts.append(one if required else f"({one})?")
        return " ".join(parts)

    def xml_value(self, name: str, schema: Any) -> str:
        """A value and its closing marker. A raw string never holds the marker and ends at
        its first one: where the marker is text, the string and the marker are one lazy
        lexeme (a greedy regex would swallow the marker); where it is a token, a regex never
        matches it anyway."""
        close = self.dialect.args.value_close
        if not resolves_to_string(schema):
            value = self.json_value(name, schema if isinstance(schema, dict) else {})
            return f"{value} {self.markup(close)}"
        values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if values:
            alts = self.add(name, " | ".join(text_markup(v) or '""' for v in values))
            return f"{alts} {self.markup(close)}"
        return self.raw_value(close, schema)

    def xml_union(self, name: str, key: str, schema: dict[str, Any],
                  member: dict[str, Any]) -> str:
        """A parameter whose schema is a union with a string member (``str | None``) in a
        dialect whose key says the value's type (DSML's ``string="true"`` / ``"false"``):
        a string raw after the one key markup, as the template writes it, any other
        member JSON after the other."""
        a = self.dialect.args
        raw_head = self.markup(a.key_open + key + a.key_close, before_raw=True)
        json_head = self.markup(a.key_open + key + a.key_close_json, before_raw=True)
        json_part = f"{self.json_value(name + '_json', schema)} {self.markup(a.value_close)}"
        return self.add(name, f"{raw_head} {self.raw_value(a.value_close, member)} | "
                              f"{json_head} {json_part}")

    def xml_typed(self, name: str, key: str, schema: Any, defs: dict[str, Any]) -> str:
        """A parameter whose key says its value's JSON type (Kimi K3's ``type="number"``):
        one branch per type the schema allows, a string raw, any other JSON."""
        a = self.dialect.args
        alts = []
        for tag, sub in typed_members(schema, defs):
            close = a.key_close if tag == "string" else a.key_close_json.replace("{type}", tag)
            head = self.markup(a.key_open + key + close, before_raw=True)
            value = self.xml_value(f"{name}_{tag}", sub) if tag == "string" else \
                f"{self.json_value(f'{name}_{tag}', sub)} {self.markup(a.value_close)}"
            alts.append(f"{head} {value}")
        return self.add(name, " | ".join(alts))

    def raw_value(self, close: str, schema: dict[str, Any]) -> str:
        """Raw text under a string ``schema`` (its length, pattern and format: see
        :func:`~.lark_text.string_regexes`) and its closing marker ``close``."""
        core = close.strip()
        lead = close[: len(close) - len(close.lstrip())]
        tail = close[len(lead) + len(core):]
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", RAW_STRING_MAX)
        also = string_also(schema)
        # one lexeme per length range (and pattern), shared by every parameter with it (a
        # grammar of many tools would otherwise hold hundreds of equal lexemes)
        key = f"{lo}_{hi}"
        if also:
            key = self.raw_shapes.setdefault((lo, hi, also), f"{key}_{len(self.raw_shapes)}")
        terminal, rule = f"RAW_{key}", f"raw_{key}"
        if terminal not in self.raw:
            self.raw.add(terminal)
            # never the marker inside: the parser ends a value at its first marker
            self.rules.append(f"{terminal}: /(?s:.{{{lo},{hi}}})/ & "
                              f"~/(?s:.*{regex_text(core)}.*)/{also}")
            if "<[" not in self.lit(core):
                before = f"({text_markup(lead)})? " if lead else ""
                self.rules.append(f"{rule}[lazy]: {terminal} {before}{text_markup(core)}")
        if "<[" in self.lit(core):
            return f"{terminal} {self.markup(close)}"
        return f"{rule} {self.markup(tail)}" if tail else rule

    def py_params(self, name: str, items: list[tuple[str, str, bool]]) -> str:
        return py_params(self, name, items)

    def py_value(self, name: str, schema: Any) -> str:
        return py_value(self, name, schema)

    # -- calls
    def call(self, name: str, tool: Tool, args_rule: str, index: int, *,
             strip: str = "") -> str:
        """One call of ``tool``; ``strip``: markup already written before the call's first
        literal piece (a lead took it)."""
        d = self.dialect
        parts = []
        for k, piece in enumerate(d.call):
            if isinstance(piece, str):
                if k == 0 and strip:  # the markup word and the layout before it
                    piece = piece[piece.index(strip) + len(strip):]
                parts.append(self.markup(piece))
            elif piece is NAME:
                parts.append(self.lit(tool.name))
            elif piece is ID:
                parts.append(self.lit(str(index)) if d.ids == "index"
                             else "/[A-Za-z0-9]{9}/")
            elif piece is INDEX:
                parts.append(self.lit(str(index + d.first_index)))
            elif piece is ARGS:
                parts.append(args_rule)
        return self.add(name, " ".join(p for p in parts if p))


def _string_member(schema: Any, typed_keys: bool) -> dict[str, Any] | None:
    """The string member of a simple union, where the dialect's keys say the value's type
    (``typed_keys``); None otherwise. (Where they do not, a union's value is JSON: raw text
    that must not read as JSON needs a lexeme whose dead ends llguidance 1.9 cannot afford,
    see docs/tools.md.)"""
    if not typed_keys:
        return None
    strings = [m for m in simple_union(schema) if m.get("type") == "string"]
    if len(strings) != 1 or "enum" in strings[0] or "const" in strings[0]:
        return None
    return strings[0]


def key_end(dialect: Dialect) -> str:
    """Where an XML parameter's name ends (the parser's view of ``key_close``)."""
    close = dialect.args.key_close
    return close.split()[0] if close.strip() else close


def call_head(dialect: Dialect) -> str:
    """The markup word a turn's calls open with (``<tool_call>``, ``[TOOL_CALLS][``,
    ``functools[``), or ""
    where calls open with a name, JSON or a bare bracket (text could not end before it)."""
    words = dialect.trigger.split()
    head = words[0] if words else ""
    markup = len(head) > 3 and (head[0] in "<[]" or head[-1] == "[" or (
        head[-1] == ":" and head[:-1].isalpha() and len(words) > 1)) and \
        any(c.isalpha() for c in head)  # (functools[: Firefunction; Action: ```json: Command R+)
    return head if markup else ""


def _plain(dialect: Dialect, reasoning: bool) -> str:
    """Free text, never empty (an empty turn is neither an answer nor a call) and never the
    call opening: its markup word (``<tool_call>``, ``[TOOL_CALLS]``) nowhere in it;
    otherwise (``{"name":``, a bare ``[``) not at its start. Where the text has a closing
    marker (Command R7B's ``<|END_RESPONSE|>``), the text never holds it; nor the closing
    markup of text before calls (``text_lead``), nor opens with its opening markup; with a
    think block, text never opens with the block's marker."""
    inside: list[str] = []  # never anywhere in the text
    opening: list[str] = []  # never at its start
    head = call_head(dialect)
    words = dialect.trigger.split()
    if head:
        inside.append(head)
    elif words:
        opening.append(words[0])
    for close in (dialect.text_close, dialect.text_lead[1] if dialect.text_lead else ""):
        if close.strip():
            inside.append(close.strip())
    if dialect.text_lead and dialect.text_lead[0].strip() != dialect.text_open.strip():
        opening.append(dialect.text_lead[0].strip())
    if reasoning and dialect.reasoning and dialect.reasoning[0].strip():
        opening.append(dialect.reasoning[0].strip())
    # one ban that another implies is dropped: intersections cost llguidance's lexer states
    inside = [w for w in dict.fromkeys(inside) if not any(o != w and o in w for o in inside)]
    opening = [w for w in dict.fromkeys(opening) if not any(o in w for o in inside)]
    banned = [f"(?s:.*{regex_text(w)}.*)" for w in inside] + \
        [f"(?s:\\s*{regex_text(w)}.*)" for w in opening]
    return r"PLAIN: /(?s:\s*\S.*)/" + "".join(f" & ~/{b}/" for b in banned)


def tool_grammar(tools: Sequence[Tool], tool_choice: str = "auto", *,
                 parallel: bool | int = True, output: dict[str, Any] | None = None,
                 dialect: Dialect = HERMES, markup: Markup = text_markup,
                 think_budget: int | None = None, think_opened: bool = False) -> str:
    """The Lark grammar (llguidance dialect) for one assistant turn with ``tools``, written
    in ``dialect``; ``markup`` renders its literal text (:func:`markup_for` an engine).

    The turn is shaped as the family writes it: a think block (when ``think_budget`` is
    given and the dialect has reasoning markup; at most ``think_budget`` tokens; the
    prompt already opened it when ``think_opened``), then under ``auto`` either text or
    calls, with text before the calls where ``dialect.text_before``; under ``required`` and
    a tool name, calls (after at most a line break or two of layout); under ``none``, text.

    ``parallel``: False for exactly one call per turn, True for up to
    ``DEFAULT_MAX_CALLS`` (a small model would otherwise repeat calls until
    max_tokens), or an int for up to that many; never more than the dialect allows.
    """
    parallel = check_parallel(parallel)
    max_calls = DEFAULT_MAX_CALLS if parallel is True else 1 if parallel is False else parallel
    if dialect.max_calls is not None:
        max_calls = min(max_calls, dialect.max_calls)
    tool_choice = check_tool_choice(tool_choice, [t.name for t in tools])
    callable_tools = [t for t in tools if tool_choice in TOOL_CHOICES or t.name == tool_choice]
    _check_names(dialect, callable_tools)
    b = _Builder(dialect, markup)
    reason = think_budget is not None and dialect.reasoning is not None
    free = _free(b, output)
    if tool_choice == "none":
        body = free
    else:
        calls = _calls(b, callable_tools, max_calls)
        lead = _lead(b, callable_tools, max_calls, text=tool_choice == "auto")
        said = ""
        if tool_choice == "auto" and output is None and _calls_after_text(dialect):
            free = _text_then_calls(b, callable_tools, max_calls, free)
        elif tool_choice == "auto" and dialect.text_lead:
            said = _said(b, callable_tools, max_calls)
        body = " | ".join(p for p in (free if tool_choice == "auto" else "", calls, lead, said)
                          if p)
    lines = [f"start: {_reasoning(b, think_budget, think_opened)} ({body})" if reason
             else f"start: {body}"]
    if output is None and not dialect.text_json:
        lines.append(_plain(dialect, reason))
    return "\n".join(lines + b.rules) + "\n"


def _check_names(dialect: Dialect, tools: Sequence[Tool]) -> None:
    """Raises ``ToolDefinitionError`` for a tool whose call would read as the dialect's text
    or reasoning: Functionary v3.2 writes text after ``all\n``, a call after its name and a
    line break; ATEM writes text after `` to=user<|message|>``, reasoning after
    `` to=self<|message|>`` and a call after `` to=NAME<|message|>``."""
    call = dialect.call
    k = next((i for i, p in enumerate(call) if p is NAME), None)
    if k is None or not all(isinstance(p, str) for p in call[:k]):
        return
    before = "".join(p for p in call[:k] if isinstance(p, str))
    nxt = call[k + 1] if len(call) > k + 1 else ""
    after = nxt if isinstance(nxt, str) else ""
    markups = [dialect.text_open, dialect.reasoning[0] if dialect.reasoning else ""]
    for markup in (m for m in markups if m and m.startswith(before)):
        for t in tools:
            written = before + t.name + after
            if written.startswith(markup) or markup.startswith(written):
                raise ToolDefinitionError(t.name, f"{dialect.name} writes text or reasoning "
                                          f"after {markup!r}: a call of this tool would read "
                                          "as that (rename the tool)")


def _free(b: _Builder, output: dict[str, Any] | None) -> str:
    """The text alternative: plain text (or the output schema's JSON) in the dialect's
    text wrapper; a JSON string where the dialect writes text as JSON."""
    d, lit = b.dialect, b.lit
    if output is not None:
        answer = {**bound_numbers(closed_objects(output)), "x-guidance": _json_options(d)}
        free = b.add("answer", f"%json {json.dumps(answer)}")
    elif d.text_json:
        free = b.add("answer", '%json {"type": "string", "pattern": "\\\\S"}')
    else:
        free = "PLAIN"
    close = lit(d.text_close)
    if close and free == "PLAIN" and "<[" not in close:
        # text closed by text: one lazy lexeme, as a greedy one would swallow the marker
        b.rules.append(f"text[lazy]: PLAIN {close}")
        free, close = "text", ""
    return " ".join(p for p in (_beside_calls(b, d.text_open), free, close) if p)


def _beside_calls(b: _Builder, markup: str) -> str:
    """Text's or reasoning's opening, parted after the calls' leading markup (ATEM's `` to=``)."""
    first = b.dialect.call[0] if b.dialect.call and not b.dialect.section else ""
    return _parted(b.lit, markup, first if isinstance(first, str) else "")


def _parted(render: Markup, text: str, prefix: str) -> str:
    """``text`` as Lark, parted after ``prefix`` where it begins with it: alternatives that begin
    alike share that lexeme (one lexeme for all would be committed to at text begun so)."""
    if prefix and text != prefix and text.startswith(prefix):
        return f"{render(prefix)} {render(text[len(prefix):])}"
    return render(text)


def _lead(b: _Builder, tools: Sequence[Tool], max_calls: int, *, text: bool) -> str:
    """Calls after a lead: text (``text``, where the family writes text before its calls)
    or a line break or two of layout, ending where the calls' markup word begins. Where the
    word is text, the lead and the word are one lazy lexeme (a greedy text lexeme would
    swallow the word) and the calls continue after it; where it is a token, text ends at
    the token. "" when the dialect's calls open with no markup word."""
    head = call_head(b.dialect)
    if not head:
        return ""
    text = text and b.dialect.text_before
    pattern = "(?s:.*)" if text else "[ \\t]?\\n{1,2}"
    word = b.lit(head)
    if word.startswith("<["):
        b.rules.append(f"LEAD: /{pattern}/" + (f" & ~/(?s:.*{regex_text(head)}.*)/"
                                                 if text else ""))
        return "LEAD calls"
    b.rules.append(f"LEAD: /{pattern}/ & ~/(?s:.*{regex_text(head)}.*)/")
    b.rules.append(f"lead[lazy]: LEAD {word}")
    return "lead " + _calls(b, tools, max_calls, after=head, name="calls_after")


def _said(b: _Builder, tools: Sequence[Tool], max_calls: int) -> str:
    """Text in the dialect's ``text_lead`` markup, then the calls (the part of their section
    opening the markup wrote left out). The text is never empty and never holds the closing
    markup: where that is text, text and marker are one lazy lexeme."""
    d = b.dialect
    assert d.text_lead is not None
    open_, close = d.text_lead
    written = open_ + close
    calls = _calls(b, tools, max_calls, after=written, name="calls_said") \
        if d.section and d.section[0].startswith(written) else "calls"
    word = b.lit(close)
    b.rules.append(f"SAID: /(?s:\\s*\\S.*)/ & ~/(?s:.*{regex_text(close.strip())}.*)/")
    if word.startswith("<["):
        return " ".join(p for p in (b.lit(open_), "SAID", word, calls) if p)
    b.rules.append(f"said[lazy]: SAID {word}")
    return " ".join(p for p in (b.lit(open_), "said", calls) if p)


def _calls_after_text(d: Dialect) -> bool:
    """The text before calls is the plain reply's own wrapper, its close then the calls'
    opening (Kimi K3's ``<|open|>response<|sep|>`` ... ``<|close|>response<|sep|>`` then
    ``<|open|>tools<|sep|>``)."""
    return d.text_lead is not None and bool(d.text_close) and d.text_lead[0] == d.text_open \
        and d.text_lead[1].startswith(d.text_close) and d.text_lead[1] != d.text_close


def _text_then_calls(b: _Builder, tools: Sequence[Tool], max_calls: int, free: str) -> str:
    """The plain reply, then maybe the calls (where ``_calls_after_text``): one text lexeme
    for both (two that end at the same marker would each cut the other off)."""
    assert b.dialect.text_lead is not None
    open_, close = b.dialect.text_lead
    calls = _calls(b, tools, max_calls, after=open_ + close, name="calls_said")
    rest = b.markup(close[len(b.dialect.text_close):])
    return f"({free}) ({rest} {calls})?"


def _reasoning(b: _Builder, budget: int | None, opened: bool) -> str:
    """The think block (optional; the rule ``think`` captures its text): the dialect's
    opening markup (unless the prompt opened it), at most ``budget`` tokens, the closing
    markup (a token: written by the model, or forced when the budget runs out; text: the
    think text's ``suffix`` where the model writes it, and optional once the budget ran out,
    the reply's reasoning then ending where the budget did)."""
    assert b.dialect.reasoning is not None
    open_, close = b.dialect.reasoning
    core = close.strip()
    lead_ws = close[: len(close) - len(close.lstrip())]
    tail = b.lit(close[len(lead_ws) + len(core):])
    mark = b.lit(core)  # the layout before it is think text
    limit = f"max_tokens={max(1, budget or 1)}"
    if "<[" in mark:  # the closing marker is a token: no text lexeme can match it
        b.rules.append(f"think[capture, {limit}]: /(?s:.*)/")
        b.add("think_end", " ".join(p for p in (mark, tail) if p))
    else:
        b.rules.append(f"think[capture, suffix={json.dumps(core)}, {limit}]: "
                       "/(?s:.*)/")
        written = " ".join(p for p in (mark, tail) if p)
        b.add("think_end", f"{tail} | {written}" if tail else f"({written})?")
    body = "think think_end" if opened else f"{_beside_calls(b, open_)} think think_end"
    if b.dialect.think_closed and not opened:  # no reasoning: the close alone
        b.add("reason", f"{body} | {' '.join(p for p in (mark, tail) if p)}")
        return "reason"
    b.add("reason", body)
    return "reason" if opened else "reason?"


def _calls(b: _Builder, tools: Sequence[Tool], max_calls: int, *, after: str = "",
           name: str = "calls") -> str:
    """The rule ``name``: a turn's calls (the section, separators, at most ``max_calls``);
    ``after``: the markup word the calls open with was already written (a lead took it).
    Both forms share every per-tool rule: the first call is the markup word (where the
    calls open without a section) then ``call_0h``, the call without it. Returns ``name``."""
    d = b.dialect
    by_position = d.ids == "index" or INDEX in d.call
    head = call_head(d)
    if not b.arg_rules:
        b.arg_rules = [b.args(f"a{i}", t) for i, t in enumerate(tools)]
        positions = range(max_calls) if by_position else range(1)
        for k in positions:
            if k == 0 and head and not d.section:  # the word apart, the rest shared
                first_piece = d.call[0] if isinstance(d.call[0], str) else ""
                word = first_piece[: first_piece.index(head) + len(head)]
                b.add("call_0h", " | ".join(b.call(f"t{i}_0h", t, b.arg_rules[i], 0,
                                                   strip=head)
                                            for i, t in enumerate(tools)))
                b.add("call_0", f"{b.markup(word)} call_0h")
                continue
            b.add(f"call_{k}", " | ".join(b.call(f"t{i}_{k}", t, b.arg_rules[i], k)
                                          for i, t in enumerate(tools)))
    first = "call_0h" if after and not d.section else "call_0"
    sep = b.markup(d.separator)
    more = ""
    for k in range(max_calls - 1, 0, -1):  # nested optionals: at most max_calls calls
        more = f" ({sep} call_{k if by_position else 0}{more})?"
    opening = d.section[0][d.section[0].index(after) + len(after):] if after and d.section \
        else d.section[0] if d.section else ""
    first_piece = d.call[0] if d.call and isinstance(d.call[0], str) else ""
    open_, close = (b.markup(opening),  # the close parted where a next call begins alike
                    _parted(b.markup, d.section[1], first_piece)) if d.section else ("", "")
    lead_open, lead_close = d.text_lead or ("", "")
    if not after and lead_open and opening.startswith(lead_open + lead_close):
        open_ = _parted(b.markup, opening, lead_open)  # text before calls opens so too
    elif not after and d.text_open.strip() and opening.startswith(d.text_open):
        open_ = _parted(b.markup, opening, d.text_open)  # so does a text reply (Kimi K3)
    trail = '("\\n" | "\\n\\n")?'  # the layout some templates write after the calls
    b.add(name, " ".join(p for p in (open_, f"{first}{more}", close, trail) if p))
    return name


def opening_tokens(engine: Vocabulary, dialect: Dialect = HERMES) -> NDArray[np.intp]:
    """The tokens a reply can begin ``dialect``'s calls with: the opening marker's token
    when it is one special token, else those spelling a non-empty prefix of the opening
    text, or it whole (and more). Empty when calls open with the tool's name. Computed
    once per engine and opening."""
    trigger = dialect.trigger

    def build() -> NDArray[np.intp]:
        if not trigger:
            return np.array([], dtype=np.intp)
        head = markup_for(engine)(trigger).split(" ", 1)[0]
        if head.startswith("<["):
            return np.array([int(head[2:-2])], dtype=np.intp)
        opening = trigger.encode()
        ids = [t for t in range(engine.n_vocab)
               if not engine.is_control(t) and (b := engine.token_bytes(t))
               and (opening.startswith(b) or b.startswith(opening))]
        return np.array(ids, dtype=np.intp)

    return engine.cache(("call_opening", trigger), build)
