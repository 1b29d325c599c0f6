"""Property tests: every tool-call dialect's grammar and parser agree (chatkit/tools/grammar.py,
parser.py, dialects.py).

For each dialect in ``DIALECTS``, and the variants detection makes of it (the template's JSON
separators, text before the calls), on SmolLM2's vocabulary:

- written calls: calls whose arguments are drawn from the tools' JSON schemas (strings made of
  every dialect's own markers, quotes, backslashes, ``\\x``, newlines, control characters and
  unicode; integers, numbers, booleans, null, enums, nested objects and arrays), written as
  the family writes them (``render_calls``), are accepted by the call grammar (``tool_grammar``
  compiled with ``markup_for(engine)``: the text's tokens go through the matcher, which then
  takes the end of the turn) under ``required`` and ``auto``, and parse back (``parse_calls``)
  to the same calls: names, ids in the dialect's scheme, arguments equal with their JSON types
  (``True`` is not ``1``, ``1`` is not ``1.0``); also with the layout around markers left out
  where the grammar makes it optional, and after text where the family writes text first;
- text replies: text the family writes as a reply (in its text wrapper) is accepted under
  ``auto`` and ``none`` and parses back to the text;
- random schemas: parameter schemas drawn at random, values from hypothesis-jsonschema;
- grammar-accepted text parses: a random walk through the grammar's own token masks (biased
  towards the dialect's markers, quotes, escapes and closers) ends in text the grammar
  accepts; it parses (into calls under ``required``), and the calls read back are written
  again as text the grammar accepts and that parses to them once more.

Known mismatches are the ``xfail(strict=True)`` tests at the end, each naming the dialects, the
input and what the grammar and the parser do: they fail (XPASS) once fixed. The strategies
above stay clear of exactly those inputs; ``KNOWN`` says where, by the same keys.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from chatkit import (
    Constraint,
    Model,
    SchemaUnsupported,
    ToolArgumentsInvalid,
    ToolCall,
    ToolDefinitionError,
)
from chatkit.grammar.value_checks import known_format
from chatkit.tools.definition import Tool
from chatkit.tools.dialects import DIALECTS, Dialect, render_calls
from chatkit.tools.grammar import DEFAULT_MAX_CALLS, call_head, key_end, tool_grammar
from chatkit.tools.lark_text import markup_for
from chatkit.tools.parser import parse_calls, split_reasoning
from tests.helpers import ATEM_REASONING, TEXT_LEADS

NAMES = sorted(DIALECTS)
XML = sorted(n for n, d in DIALECTS.items() if d.args.kind == "xml")
GEMMA = sorted(n for n, d in DIALECTS.items() if d.args.kind == "gemma")
JSON_ARGS = sorted(n for n, d in DIALECTS.items() if d.args.kind == "json")
PYTHONIC = sorted(n for n, d in DIALECTS.items() if d.args.kind == "python")
SPACED = (", ", ": ")
COMPACT = (",", ":")

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
QUICK = settings(PROPERTY, max_examples=25)


def per_dialect(runs: settings) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A property of every dialect: the test is parametrized by ``name`` (each of ``DIALECTS``),
    run under ``runs`` and given ``data`` to draw from."""
    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        return pytest.mark.parametrize("name", NAMES)(runs(given(data=st.data())(test)))
    return wrap


def draw_dialect(data: st.DataObject, name: str) -> Dialect:
    """One of the dialect's written variants (spelling and layout a template may choose)."""
    return data.draw(st.sampled_from(variants(DIALECTS[name])), label="dialect")

KNOWN = {
    "json-del": "JSON arguments (every JSON dialect, and JSON-typed values in XML and pythonic "
    "ones): render_calls writes U+007F (DEL) raw inside a string, as json.dumps and RFC 8259 "
    "allow, and the grammar's JSON lexer refuses it (it takes '\\u007f')",
    "xml-union-string": "XML dialects whose keys do not say the type: a string value of a "
    "parameter whose schema is not only string (['string', 'null'], anyOf string|integer, a "
    "mixed enum): render_calls writes it raw, as the families' templates do, the grammar "
    "wants it as JSON ('\"x\"'): 'x' is refused by the grammar, 'null' and '5' are accepted "
    "and read back as None and 5 (a raw lexeme that never reads as JSON costs llguidance "
    "1.9 its lexer fuel at its first dead end: see test_known_llguidance_raw_dead_end)",
    "xml-leading-space": "qwen3-xml: '<parameter=s> x' (the optional line break after '>' left "
    "out, the value starts with a space): the parser takes one whitespace character of any "
    "kind as the layout and reads 'x'",
    "text-wrapper-lead": "command-r7b with text_before (detection does not set it today): under "
    "auto, text before calls is one lazy lexeme that also matches the text wrapper, and the "
    "longer lexeme wins, so '<|START_RESPONSE|>ok<|END_RESPONSE|>' can never end where the "
    "wrapper's markers are text (any vocabulary but Command R7B's)",
    "number-spelling": "JSON numbers (every dialect): the grammar's bounded-number lexer "
    "refuses -0.0 (json.dumps(-0.0)) anywhere, and the float spelling of a one-point range "
    "(minimum == maximum == 2 refuses 2.0, takes 2); render_calls writes both",
}


# ------------------------------------------------------------------ the vocabulary
@pytest.fixture(scope="module")
def engine(smol: Model) -> Model:
    """SmolLM2 (conftest's session model). On it no dialect marker is one token, so a reply
    is its text tokenized as content (``special=False``): values holding markers included."""
    lit = markup_for(smol)
    for d in DIALECTS.values():
        for text in markup_texts(d):
            assert "<[" not in lit(text), (d.name, text)
    return smol


_COMPILED: dict[tuple[Any, ...], Constraint] = {}


def constraint(engine: Model, d: Dialect, tools: Sequence[Tool], choice: str,
               think_budget: int | None = None) -> Constraint:
    """The turn's grammar for ``tools`` in ``d`` (with a think block where ``think_budget``
    is given), bound to ``engine`` (cached)."""
    key = (id(engine), d, choice, think_budget,
           tuple((t.name, json.dumps(t.definition.parameters_schema)) for t in tools))
    made = _COMPILED.get(key)
    if made is None:
        if len(_COMPILED) > 400:
            _COMPILED.clear()
        grammar = tool_grammar(tools, choice, dialect=d, markup=markup_for(engine),
                               think_budget=think_budget)
        made = Constraint.lark(grammar, model=engine)
        made.prefetch = False  # masks only when asked: this file steps grammars by hand
        _COMPILED[key] = made
    return made


def tokens(engine: Model, text: str) -> list[int]:
    toks = engine.tokenize(text, special=False)
    assert engine.detokenize_bytes(toks) == text.encode(), text
    return toks


def refusal(engine: Model, c: Constraint, text: str) -> str | None:
    """None when ``c`` accepts ``text`` whole (and the end of turn after it), else where
    and how it refused."""
    toks = tokens(engine, text)
    if c.accepts(toks):
        return None
    c.reset()
    n = c.valid_prefix_len(toks)
    if n == len(toks):
        return f"the grammar cannot end after {text!r}"
    done = engine.detokenize_bytes(toks[:n]).decode(errors="replace")
    nxt = engine.detokenize_bytes(toks[n:n + 1]).decode(errors="replace")
    return f"the grammar refused {nxt!r} after {done[-60:]!r} in {text!r}"


# ------------------------------------------------------------------ markers and text
def markup_texts(d: Dialect) -> list[str]:
    a = d.args
    out = [p for p in d.call if isinstance(p, str)] + list(d.section or ())
    out += [d.separator, a.key_open, a.key_close, a.value_close, a.separator, d.text_open,
            d.text_close, *d.stops, a.quote if a.kind == "gemma" else ""]
    return [t for t in out if t]


MARKERS = sorted({t for d in DIALECTS.values() for t in markup_texts(d)}
                 | {t.strip() for d in DIALECTS.values() for t in markup_texts(d) if t.strip()})
TRICKY = ['"', "'", "\\", "\\x", "\\x41", "\\u0041", "\\ud83d", "\\n", "\\\\", '\\"', "\\'",
          "\\N", "\n", "\r\n", "\r", "\t", " ", "  ", "\u00a0", "é", "😀", "\u2028", "\x00",
          "\x01", "\x1b", "\x1c", "\x7f", "\x85", "{", "}", "[", "]", "(", ")", ",", ":", "=",
          ", ", ": ", "True", "None", "null", "true", "</", ">", "<", "```", "<|im_end|>",
          "<|im_start|>", "${x}", "%s", "{}", "[]", '{"a": 1}', "f(x=1)", "all\n",
          "functions.f:0", "\\u00e9"]


UNSPELLABLE = re.compile("[\x04\x06\x13\x14\x16\x1d\U00040000-\U000bffff]")
"""Characters SmolLM2's vocabulary has no bytes for (no token holds 0x04, 0x06, 0x13,
0x14, 0x16, 0x1D, 0xF1 or 0xF2; its tokenizer drops them): no reply can hold them."""


def spellable(text: str) -> str:
    """``text`` without what no reply can hold, nor DEL (KNOWN json-del)."""
    return UNSPELLABLE.sub("", text).replace("\x7f", "")


def texts(max_size: int | None = None) -> st.SearchStrategy[str]:
    piece = st.one_of(st.sampled_from(MARKERS + TRICKY), st.text(max_size=6))
    out = st.one_of(st.text(max_size=24), st.lists(piece, max_size=8).map("".join))
    out = out.map(spellable)
    return out.map(lambda s: s[:max_size]) if max_size is not None else out


def without(text: str, marker: str) -> str:
    """``text`` with every ``marker`` in it broken by a space after its first character."""
    while marker and marker in text:
        text = text.replace(marker, marker[0] + " " + marker[1:])
    return text


# ------------------------------------------------------------------ tools
ENUM = ["red", "dark blue", "it's", 'say "hi"', "back\\slash", "", " pad ", "x\ny", "é😀",
        "True", "null"]


def _obj(props: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


@functools.cache
def tools_for(d: Dialect) -> list[Tool]:
    """The turn's tools in ``d``: scalars and strings (``probe``), nested values
    (``probe-2``, whose name has ``probe`` as a prefix), unions (``maybe``), no arguments
    (``ping.v2``); without what ``KNOWN`` keeps out of the dialect."""
    kind = d.args.kind
    nested: dict[str, Any] = {"type": "string"}
    probe = _obj({"s": {"type": "string"}, "t": {"type": "string", "maxLength": 8},
                  "e": {"enum": ENUM},
                  "n": {"type": "integer", "minimum": -10**12, "maximum": 10**12},
                  "x": {"type": "number", "minimum": -10**6, "maximum": 10**6},
                  "b": {"type": "boolean"}, "z": {"type": "null"}}, ["s"])
    structured = _obj({
        "o": _obj({"k": nested, "v": {"type": "integer", "minimum": 0, "maximum": 999},
                   "f": {"type": "boolean"},
                   "tags": {"type": "array", "items": nested, "maxItems": 3},
                   "deep": _obj({"q": {"type": "array", "items": {"type": "boolean"},
                                       "maxItems": 2}})}, ["k"]),
        "arr": {"type": "array", "items": {"type": "integer", "minimum": -99, "maximum": 99},
                "maxItems": 4},
        "c": {"const": "fixed"}}, ["arr"])
    # KNOWN xml-union-string: where XML keys do not say the type, a union's string is JSON
    untyped = kind == "xml" and not d.args.key_close_json
    maybe = _obj({"u": {"type": ["boolean" if untyped else "string", "null"]},
                  "w": {"type": ["integer", "null"], "minimum": 0, "maximum": 50},
                  "any": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                    {"type": "boolean"}]}})
    out = [Tool.from_schema("probe", probe)]
    if not (kind == "python" and d.json_separators != COMPACT):  # nesting: tested apart
        out.append(Tool.from_schema("probe-2", structured))
    if kind != "python":  # pythonic unions: their own test below
        out.append(Tool.from_schema("maybe", maybe))
    out.append(Tool.from_schema("ping.v2", _obj({})))
    return out


def is_raw(d: Dialect, schema: dict[str, Any]) -> bool:
    """Whether an XML dialect writes a parameter of ``schema`` as raw text."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    return schema.get("type") == "string" or (
        bool(values) and all(isinstance(v, str) for v in values))


def has_string_member(schema: dict[str, Any]) -> bool:
    """Whether ``schema`` is a union with a string member (raw in an XML dialect)."""
    kinds = schema.get("type")
    return (isinstance(kinds, list) and "string" in kinds) or any(
        isinstance(m, dict) and m.get("type") == "string" for m in schema.get("anyOf", []))


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What a dialect's values must keep clear of."""

    d: Dialect
    edge_space: bool = True
    """Raw XML strings may start and end with whitespace (False where the layout next to
    them is left out: the text is then ambiguous, or KNOWN xml-leading-space)."""


def values(schema: dict[str, Any], ctx: Ctx, *, raw: bool = False) -> st.SearchStrategy[Any]:
    """Values of ``schema`` (the subset the tools here use), strings hostile to ``ctx.d``;
    ``raw``: an XML parameter's (written raw if a string)."""
    if "enum" in schema:
        return st.sampled_from([v for v in schema["enum"] if ctx.edge_space or not
                                isinstance(v, str) or v == v.strip()])
    if "const" in schema:
        return st.just(schema["const"])
    if "anyOf" in schema:
        return st.one_of([values(s, ctx, raw=raw) for s in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([values({**schema, "type": k}, ctx, raw=raw)
                          for k in kind])
    if kind == "string":
        return strings(schema, ctx, raw=raw)
    if kind == "integer":
        return st.integers(schema.get("minimum", -10**12), schema.get("maximum", 10**12))
    if kind == "number":
        lo, hi = schema.get("minimum", -10**6), schema.get("maximum", 10**6)
        # bounded digits (NUMBER_DIGITS) and no exponent: the numbers the grammar writes
        return st.one_of(st.integers(lo, hi),
                         st.integers(lo * 1000, hi * 1000).map(lambda i: i / 1000))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(values(schema.get("items", {}), ctx), max_size=schema.get("maxItems", 3))
    if kind == "object":
        return objects(schema, ctx)
    raise AssertionError(schema)


def strings(schema: dict[str, Any], ctx: Ctx, *, raw: bool) -> st.SearchStrategy[str]:
    d = ctx.d
    hi = schema.get("maxLength")
    out = texts(hi)
    if d.args.kind == "gemma":  # documented: a string never holds the quote marker
        out = out.map(lambda s: without(s, d.args.quote))
    if (raw and d.args.kind == "xml") or d.args.kind == "tree":  # (tree: every string raw)
        core = d.args.value_close.strip()  # documented: a raw string never holds it
        out = out.map(lambda s: without(s, core))
        if not ctx.edge_space:
            out = out.map(str.strip)
    if raw and hi and d.args.key_close != d.args.key_close.rstrip():
        out = out.map(lambda s: s[:hi - 1])  # layout and length: their own test below
    return out


@st.composite
def objects(draw: st.DrawFn, schema: dict[str, Any], ctx: Ctx, top: bool = False) -> Any:
    """An object of ``schema``, its keys in the schema's order (the grammar's order)."""
    required = set(schema.get("required", []))
    out = {}
    for key, sub in schema.get("properties", {}).items():
        if key in required or draw(st.booleans()):
            raw = top and ctx.d.args.kind == "xml"
            out[key] = draw(values(sub, ctx, raw=raw))
    return out


def max_calls(d: Dialect) -> int:
    return min(DEFAULT_MAX_CALLS, d.max_calls or DEFAULT_MAX_CALLS)


ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


@st.composite
def calls_for(draw: st.DrawFn, tools: Sequence[Tool], ctx: Ctx) -> list[ToolCall]:
    out = []
    for i in range(draw(st.integers(1, max_calls(ctx.d)))):
        tool = draw(st.sampled_from(list(tools)))
        args = draw(objects(tool.definition.parameters_schema, ctx, top=True))
        ident = (draw(st.text(ALNUM, min_size=9, max_size=9)) if ctx.d.ids == "alnum9"
                 else f"call_{i}")
        out.append(ToolCall(id=ident, name=tool.name, arguments=args))
    return out


def variants(d: Dialect) -> list[Dialect]:
    """``d`` as declared and as detection may make it: the template's JSON separators, text
    before the calls (where calls open with a markup word)."""
    out = [d, dataclasses.replace(d, json_separators=SPACED if d.json_separators == COMPACT
                                  else COMPACT)]
    if call_head(d) and not d.text_before and not d.text_open:  # KNOWN text-wrapper-lead
        out.append(dataclasses.replace(d, text_before=True))
    if d.name in LEADS:
        out.append(dataclasses.replace(d, text_lead=LEADS[d.name]))
    return out


LEADS = TEXT_LEADS


def with_lead(d: Dialect, said: str, wire: str) -> str:
    """``said`` in ``d``'s ``text_lead`` markup, then the calls ``wire`` (the part of their
    section's opening the markup wrote left out)."""
    assert d.text_lead is not None
    open_, close = d.text_lead
    section = d.section[0] if d.section else ""
    return open_ + said + close + (wire[len(section):] if section.startswith(open_ + close)
                                   else wire)


# ------------------------------------------------------------------ comparing calls
def typed(value: Any) -> Any:
    """A JSON value with its type spelled out (True is not 1, 1 is not 1.0)."""
    if isinstance(value, bool) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, int | float | str):
        return (type(value).__name__, value)
    if isinstance(value, list):
        return ("list", [typed(v) for v in value])
    if isinstance(value, dict):
        return ("dict", {k: typed(v) for k, v in value.items()})
    raise AssertionError(value)


def _no_nulls(value: Any) -> Any:
    """A value as MiniMax M3 writes it: an object's null member left out (the template's
    convention: a null argument is an absent one), a list's null item empty, as an empty
    string is (documented: read back as the string where the item may be one)."""
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return ["" if v is None else _no_nulls(v) for v in value]
    return value


def same_calls(d: Dialect, got: Sequence[ToolCall], want: Sequence[ToolCall]) -> None:
    same = _no_nulls if d.args.kind == "tree" else (lambda v: v)
    assert [(c.name, typed(same(c.arguments))) for c in got] == \
        [(c.name, typed(same(c.arguments))) for c in want]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if d.ids == "alnum9":
            assert g.id == d.history_id(w.id)
        elif d.ids == "kimi":
            assert g.id == f"functions.{w.name}:{i}"


def read(text: str, tools: Sequence[Tool], d: Dialect) -> tuple[str, list[ToolCall]]:
    try:
        return parse_calls(text, tools, d)
    except ToolArgumentsInvalid as exc:
        raise AssertionError(f"{d.name}: parse_calls refused {text!r}: {exc}") from None


# ------------------------------------------------------------------ written calls
@per_dialect(PROPERTY)
def test_written_calls_are_accepted_and_parse_back(engine: Model, name: str,
                                                   data: st.DataObject) -> None:
    d = draw_dialect(data, name)
    tools = tools_for(d)
    calls = data.draw(calls_for(tools, Ctx(d)), label="calls")
    wire = render_calls(d, calls)
    head = call_head(d)
    lead = data.draw(st.sampled_from(["", "\n", " \n\n"]) if head else st.just(""), label="lead")
    trail = data.draw(st.sampled_from(["", "\n", "\n\n"]), label="trail")
    said = ""
    if d.text_before and data.draw(st.booleans(), label="text first"):
        said = data.draw(texts().map(lambda s: without(s, head)), label="text")
        lead = said + lead
    reply = lead + wire + trail
    if d.text_lead and data.draw(st.booleans(), label="text first"):
        close = d.text_lead[1]
        # not ending in a prefix of the close ('x>' before '>>>'): the markup is then
        # ambiguous, and grammar and parser both end the text at the first close
        said = data.draw(texts().map(lambda s: without(s, close)).filter(
            lambda s: bool(s.strip()) and (s + close).find(close) == len(s)), label="text")
        reply = with_lead(d, said, wire) + trail
    for choice in ("auto",) if said else ("required", "auto"):
        assert refusal(engine, constraint(engine, d, tools, choice), reply) is None, choice
    text, got = read(reply, tools, d)
    assert text == said.strip()
    same_calls(d, got, calls)


@pytest.mark.parametrize("name", sorted(LEADS))
def test_text_in_a_lead_may_begin_as_its_close(engine: Model, name: str) -> None:
    """Text before calls in ``text_lead`` markup that begins as a prefix of the close
    (``<``, ``<|``): accepted, read back. Where the calls' section opens with the
    lead's whole markup, a grammar that wrote that opening as one lexeme made the lexer
    commit to it at such text (the CI failure of llama4-json's text '<')."""
    d = dataclasses.replace(DIALECTS[name], text_lead=LEADS[name])
    tools = tools_for(d)
    calls = [ToolCall(id="call_0", name="ping.v2", arguments={})]
    wire = render_calls(d, calls)
    close = LEADS[name][1].strip()
    candidates = {close[:k] for k in range(1, len(close))} | {"<", "x <", "x " + close[:1]}
    # not ending in a prefix of the close: ambiguous markup (as in the property above)
    for said in sorted(s for s in candidates if (s + close).find(close) == len(s)):
        reply = with_lead(d, said, wire)
        assert refusal(engine, constraint(engine, d, tools, "auto"), reply) is None, reply
        text, got = read(reply, tools, d)
        assert text == said.strip()
        same_calls(d, got, calls)


@pytest.mark.parametrize(("name", "think"), [
    ("hermes", ("<think>", "</think>")), ("hermes", ("<think>\n", "\n</think>\n\n")),
    ("mistral-v11", ("[THINK]", "[/THINK]")), ("glm-4.5", ("<think>", "</think>"))])
def test_reasoning_then_calls_or_text_where_the_close_is_text(
        engine: Model, name: str, think: tuple[str, str]) -> None:
    """A think block whose close is text on this vocabulary, then calls or text: accepted
    as the text tokenizes (a token holding the close's end and the calls' first byte, '><',
    included). Was refused at that token: the think text ended at a hidden stop string
    (``stop=``), which llguidance's mask does not let a token cross; now a ``suffix=``."""
    d = dataclasses.replace(DIALECTS[name], reasoning=think)
    tool = Tool.from_schema("f", STR_TOOL)
    for body in (render_calls(d, one(tool, {"s": "x"})), "Hi there"):
        reply = think[0] + "Hmm." + think[1] + body
        assert refusal(engine, constraint(engine, d, [tool], "auto", 64), reply) is None, reply


def drop_layout(text: str) -> str:
    return re.sub(r"\s*\n\s*", "", text)


@st.composite
def laid_out(draw: st.DrawFn, d: Dialect) -> tuple[Dialect, Ctx]:
    """``d`` with the layout (line-break runs) the grammar makes optional left out of some of
    its markup, for writing; and the values that layout leaves unambiguous."""
    call = list(d.call)
    for k, piece in enumerate(call):
        if isinstance(piece, str) and draw(st.booleans()):
            call[k] = drop_layout(piece)
    section = d.section
    if section is not None:
        section = (drop_layout(section[0]) if draw(st.booleans()) else section[0],
                   drop_layout(section[1]) if draw(st.booleans()) else section[1])
    a = d.args
    changes = {f: drop_layout(getattr(a, f)) for f in ("key_open", "key_close", "value_close")
               if draw(st.booleans())}
    if "key_close" in changes:  # layout right before a raw value stays as written
        kept = a.key_close[len(a.key_close.rstrip()):]
        changes["key_close"] = drop_layout(a.key_close.rstrip()) + kept
    edge = not any(getattr(a, f) != v for f, v in changes.items())
    args = dataclasses.replace(a, **changes)
    sep = drop_layout(d.separator) if draw(st.booleans()) else d.separator
    written = dataclasses.replace(d, call=tuple(call), section=section, separator=sep, args=args)
    return written, Ctx(d, edge_space=edge)


@per_dialect(QUICK)
def test_calls_without_optional_layout_parse_back(engine: Model, name: str,
                                                  data: st.DataObject) -> None:
    """The grammar makes line breaks around markers optional (templates differ in them): a
    reply without them is accepted and parses to the same calls."""
    d = DIALECTS[name]
    written, ctx = data.draw(laid_out(d), label="layout")
    tools = tools_for(d)
    calls = data.draw(calls_for(tools, ctx), label="calls")
    wire = render_calls(written, calls)
    assert refusal(engine, constraint(engine, d, tools, "required"), wire) is None
    text, got = read(wire, tools, d)
    assert text == ""
    same_calls(d, got, calls)


# ------------------------------------------------------------------ text replies
def write_text(d: Dialect, text: str) -> str:
    body = json.dumps(text, ensure_ascii=False) if d.text_json else text
    return d.text_open + body + d.text_close


@st.composite
def replies(draw: st.DrawFn, d: Dialect) -> str:
    """Text a reply may say under ``d`` (the grammar's docstring): not empty, the calls'
    markup word nowhere in it, nor (where calls open without one) their opening's first word
    at its start, nor the text's closing marker."""
    text = draw(texts().map(lambda s: "".join(c for c in s if c not in "\x1c\x1d\x1e\x1f")))
    if not text.strip():
        text += "ok"
    if d.text_json:
        return text
    head = call_head(d)
    words = d.trigger.split()
    text = without(text, head) if head else text
    text = without(text, d.text_close.strip()) if d.text_close.strip() else text
    if not head and words and text.lstrip().startswith(words[0]):
        text = "x" + text
    if d.text_lead:  # nor the close of text before calls, nor (plain) its opening
        text = without(text, d.text_lead[1].strip())
        if d.text_lead[0].strip() != d.text_open.strip() and \
                text.lstrip().startswith(d.text_lead[0].strip()):
            text = "x" + text
    return text


@per_dialect(QUICK)
def test_text_replies_are_accepted_and_parse_back(engine: Model, name: str,
                                                  data: st.DataObject) -> None:
    d = draw_dialect(data, name)
    text = data.draw(replies(d), label="text")
    reply = write_text(d, text)
    tools = tools_for(d)
    for choice in ("auto", "none"):
        assert refusal(engine, constraint(engine, d, tools, choice), reply) is None, choice
    said, calls = read(reply, tools, d)
    assert calls == []
    assert said == (text if d.text_json else text.strip())


@pytest.mark.parametrize("name", [  # not where the word holds text's own close (Kimi K3's)
    n for n in NAMES if call_head(DIALECTS[n]) and not (
        DIALECTS[n].text_close and DIALECTS[n].text_close in call_head(DIALECTS[n]))])
def test_a_broken_call_word_is_text(engine: Model, name: str) -> None:
    """The call's markup word with a space inside (``< seed:tool_call>``) is text to the
    grammar, so it is text to the parser (the rest of the markup may follow)."""
    d = DIALECTS[name]
    head = call_head(d)
    text = head[0] + " " + head[1:] + d.trigger[d.trigger.index(head) + len(head):]
    reply = write_text(d, text)
    tools = tools_for(d)
    assert refusal(engine, constraint(engine, d, tools, "auto"), reply) is None
    said, calls = read(reply, tools, d)
    assert calls == [] and said == text.strip()


# ------------------------------------------------------------------ random schemas
KEYS = ["a", "b", "city", "from", "max-n", "x.y", "q_1", "名前", "camelCase", "two words"]
PY_KEYWORDS = {"from", "class", "import", "lambda", "def", "if", "in", "is", "None", "True"}


def keys_for(d: Dialect) -> list[str]:
    if d.args.kind == "python":  # refused by name (SchemaUnsupported): their own test
        return [k for k in KEYS if k.isidentifier() and k not in PY_KEYWORDS]
    return KEYS


@st.composite
def leaf_schemas(draw: st.DrawFn, d: Dialect) -> dict[str, Any]:
    kinds = ["string", "short", "enum", "const", "integer", "number", "boolean", "null",
             "checked"]
    if d.args.kind != "python":  # pythonic unions: their own test below
        kinds += ["nullable", "anyof", "mixed-enum"]
    kind = draw(st.sampled_from(kinds))
    # KNOWN xml-union-string: str | int takes strings as JSON where keys do not say the type
    union_string = not (d.args.kind == "xml" and not d.args.key_close_json)
    words = st.text(max_size=8).map(spellable)
    lo = draw(st.integers(-1000, 1000))
    made: dict[str, Any] = {
        "string": {"type": "string"},
        "short": {"type": "string", "minLength": 1, "maxLength": draw(st.integers(1, 12))},
        "integer": {"type": "integer", "minimum": lo, "maximum": lo + draw(st.integers(0, 10**6))},
        # a range of one point refuses the float spelling of it: KNOWN number-spelling
        "number": {"type": "number", "minimum": lo, "maximum": lo + draw(st.integers(1, 1000))},
        "boolean": {"type": "boolean"},
        "null": {"type": "null"},
        # anchored: hypothesis-jsonschema draws values a search matches, the grammar (as
        # llguidance's JSON) matches a pattern whole
        "checked": draw(st.sampled_from([{"type": "string", "format": "date"},
                                         {"type": "string", "format": "uuid"},
                                         {"type": "string", "pattern": "^[a-z]{1,5}-[0-9]$"},
                                         {"type": "string", "pattern": "^[A-Z][a-z ]{0,3}$"}])),
        "nullable": {"type": [draw(st.sampled_from(["string", "integer", "boolean"]
                                                   if union_string else ["integer", "boolean"])),
                              "null"], "minimum": -10**9, "maximum": 10**9},  # NUMBER_DIGITS
        "anyof": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 99},
                            {"type": "string", "maxLength": 6} if union_string
                            else {"type": "boolean"}]},
    }.get(kind, {})
    if kind == "enum":
        made = {"enum": draw(st.lists(words, min_size=1, max_size=4, unique=True))}
    elif kind == "const":
        made = {"const": draw(words)}
    elif kind == "mixed-enum":
        scalars = [st.integers(-9, 9), st.booleans(), st.none()]
        mixed = [words] if d.args.kind != "xml" else []  # KNOWN xml-union-string
        made = {"enum": draw(st.lists(st.one_of(*scalars, *mixed),
                                      min_size=1, max_size=4, unique_by=json.dumps))}
    return made


@st.composite
def param_schemas(draw: st.DrawFn, d: Dialect) -> dict[str, Any]:
    def prop(depth: int) -> st.SearchStrategy[dict[str, Any]]:
        leaf = leaf_schemas(d)
        if depth == 0 or (d.args.kind == "python" and d.json_separators != COMPACT):
            return leaf
        inner = prop(depth - 1)
        return st.one_of(
            leaf,
            st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n},
                      inner, st.integers(0, 3)),
            st.builds(lambda ps, req: _obj(ps, [k for k in ps if k in req]),
                      st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
                      st.sets(st.sampled_from(KEYS))))

    props = draw(st.dictionaries(st.sampled_from(keys_for(d)), prop(1), max_size=4))
    required = draw(st.sets(st.sampled_from(sorted(props)))) if props else set()
    return _obj(props, [k for k in props if k in required])


@st.composite
def schema_values(draw: st.DrawFn, schema: dict[str, Any], ctx: Ctx, top: bool = False,
                  raw: bool = False) -> Any:
    """A value of ``schema`` from hypothesis-jsonschema; objects assembled here, keys in the
    schema's order (hypothesis-jsonschema 0.23's object strategy predates hypothesis 6.170's
    ``many``), numbers kept to the digits the grammar writes."""
    if schema.get("type") == "object":
        out = {}
        required = set(schema.get("required", []))
        for key, sub in schema.get("properties", {}).items():
            if key in required or draw(st.booleans()):
                raw = top and ctx.d.args.kind == "xml" and (is_raw(ctx.d, sub)
                                                            or has_string_member(sub))
                out[key] = draw(schema_values(sub, ctx, raw=raw))
        return out
    if schema.get("type") == "array":
        n = draw(st.integers(0, schema.get("maxItems", 3)))
        return [draw(schema_values(schema["items"], ctx)) for _ in range(n)]
    value = draw(from_schema(schema))
    if isinstance(value, str):
        value = spellable(value)
    if isinstance(value, float):
        lo, hi = schema.get("minimum", -10**6), schema.get("maximum", 10**6)
        value = min(max(round(value, 3), lo), hi) or 0.0
        if "e" in repr(value):
            value = float(lo)
    if isinstance(value, str) and ctx.d.args.kind == "gemma":
        value = without(value, ctx.d.args.quote)
    if isinstance(value, str) and (raw or ctx.d.args.kind == "tree"):
        value = without(value, ctx.d.args.value_close.strip())
        key_close = ctx.d.args.key_close
        if key_close != key_close.rstrip() and len(value) == schema.get("maxLength"):
            value = value[:-1]  # layout and length: their own test below
    return value


@per_dialect(QUICK)
def test_random_schemas_round_trip(engine: Model, name: str, data: st.DataObject) -> None:
    _random_schemas(engine, name, data)


@pytest.mark.slow
@per_dialect(PROPERTY)
def test_random_schemas_round_trip_at_length(engine: Model, name: str,
                                             data: st.DataObject) -> None:
    _random_schemas(engine, name, data)


def _random_schemas(engine: Model, name: str, data: st.DataObject) -> None:
    d = draw_dialect(data, name)
    schema = data.draw(param_schemas(d), label="schema")
    tool = Tool.from_schema("fn", schema)
    ctx = Ctx(d)
    args = data.draw(schema_values(schema, ctx, top=True).filter(_valid(tool)), label="args")
    calls = [ToolCall(id="abcDEF123", name="fn", arguments=args)]
    wire = render_calls(d, calls)
    assert refusal(engine, constraint(engine, d, [tool], "required"), wire) is None
    text, got = read(wire, [tool], d)
    assert text == ""
    same_calls(d, got, calls)


def _valid(tool: Tool) -> Callable[[Any], bool]:
    def check(args: Any) -> bool:
        try:
            tool.validate(args)
        except ToolArgumentsInvalid:
            return False
        return True
    return check


# ------------------------------------------------------------------ grammar-accepted text

class Walk:
    """Steps through a grammar by its token masks, choosing by hypothesis draws: most often
    a whole marker or closer (``macros``), else one of a few characters of interest
    (``menu``), else any token the mask allows."""

    def __init__(self, engine: Model, d: Dialect, tools: Sequence[Tool]) -> None:
        self.engine = engine
        self.d = d
        words = set(MARKERS) | set(TRICKY) | set(ENUM) | {"fixed", "0", "7", "-3", "1.5", "0.25"}
        for t in tools:
            words.add(t.name)
            words.update(t.definition.parameters_schema.get("properties", {}))
        words.update(markup_texts(d))
        words.update(m.strip() for m in markup_texts(d) if m.strip())
        self.macros = sorted({tuple(engine.tokenize(w, special=False)) for w in words if w})
        self.closers = [tuple(engine.tokenize(w, special=False)) for w in
                        [d.args.value_close, d.args.value_close.strip(), '"', "'", "}", "]",
                         ")", *(p for p in d.call if isinstance(p, str)),
                         *(d.section or ()), d.text_close, "0", "a"] if w]
        menu = set()
        for s in ['"', "'", "\\", "\n", " ", "x", "u", "0", "1", "9", "-", ".", "e", ",", ":",
                  "{", "}", "[", "]", "(", ")", "=", "<", ">", "/", "é", "t", "n", "N", "ab"]:
            toks = engine.tokenize(s, special=False)
            if len(toks) == 1:
                menu.add(toks[0])
        self.menu = np.array(sorted(menu))
        self.row = np.zeros(engine.n_vocab, dtype=np.float32)
        self.layout_rule = d.args.kind == "xml"

    def allowed(self, c: Constraint) -> Any:
        self.row[:] = 0
        c.process(self.row, [])
        ids = np.flatnonzero(np.isfinite(self.row))
        return ids[ids != c.stop_token]

    def run(self, data: st.DataObject, c: Constraint, steps: int = 90) -> list[int] | None:
        c.reset()
        out: list[int] = []
        for step in range(steps + 60):
            if c.is_accepting() and (step >= steps or data.draw(st.integers(0, 2)) == 0):
                return out
            move = 0 if step >= steps else data.draw(st.integers(0, 9))
            chosen: Sequence[int] | None = None
            if move < 4:
                pool = self.closers if step >= steps else self.macros
                start = 0 if step >= steps else data.draw(st.integers(0, len(pool) - 1))
                for k in range(len(pool)):
                    cand = pool[(start + k) % len(pool)]
                    if self.fits(c, out, cand):
                        chosen = cand
                        break
            if chosen is None:
                allowed = self.allowed(c)
                pool = np.intersect1d(allowed, self.menu) if move < 8 else allowed
                if pool.size == 0:
                    pool = allowed
                if pool.size == 0:
                    return out if c.is_accepting() else None
                pick = int(pool[data.draw(st.integers(0, pool.size - 1))])
                if not self.fits(c, out, (pick,)):
                    continue
                chosen = (pick,)
            for t in chosen:
                c.commit(t)
            out.extend(chosen)
        return out if c.is_accepting() else None

    def fits(self, c: Constraint, out: list[int], cand: Sequence[int]) -> bool:
        if c.valid_prefix_len(list(cand)) != len(cand):
            return False
        if not self.layout_rule:
            return True
        text = self.engine.detokenize_bytes(out + list(cand)).decode(errors="ignore")
        return not known_layout(self.d, text)


def known_layout(d: Dialect, text: str) -> bool:
    """Whether ``text`` (so far) is on a KNOWN layout mismatch's path: a value that starts
    with a space right after an XML key whose line break was left out (xml-leading-space)."""
    key_close = d.args.key_close
    if d.args.kind == "xml" and key_close != key_close.rstrip():
        pattern = re.escape(d.args.key_open) + "[^\n]*?" + re.escape(key_close.rstrip())
        if re.search(pattern + r"[^\S\n]", text):
            return True
    return False


_WALKS: dict[tuple[Any, ...], Walk] = {}


def walk_for(engine: Model, d: Dialect, tools: Sequence[Tool]) -> Walk:
    key = (id(engine), d, tuple(t.name for t in tools))
    if key not in _WALKS:
        _WALKS[key] = Walk(engine, d, tools)
    return _WALKS[key]


def _accepted_text_parses(engine: Model, name: str, data: st.DataObject) -> None:
    d = draw_dialect(data, name)
    tools = tools_for(d)
    choice = data.draw(st.sampled_from(["required", "auto"]), label="tool_choice")
    c = constraint(engine, d, tools, choice)
    toks = walk_for(engine, d, tools).run(data, c)
    if toks is None:
        event("the walk did not reach an end")
        return
    text = engine.detokenize_bytes(toks).decode()
    said, calls = read(text, tools, d)
    event(f"{choice}: {'calls' if calls else 'text'}")
    if choice == "required":
        assert calls, text
        assert said == "", text
    if calls and any("\x7f" in json.dumps(c.arguments, ensure_ascii=False) for c in calls):
        event("DEL in a value: not written again (KNOWN json-del)")
    elif calls:
        again = render_calls(d, calls)
        assert refusal(engine, constraint(engine, d, tools, "required"), again) is None
        said2, calls2 = read(again, tools, d)
        assert said2 == ""
        same_calls(d, calls2, calls)


@per_dialect(QUICK)
def test_grammar_accepted_text_parses(engine: Model, name: str, data: st.DataObject) -> None:
    _accepted_text_parses(engine, name, data)


WALK_ORDER = pytest.mark.xfail(strict=False, reason=(
    "number spelling: a walk that writes a small number (-0.000007, accepted) parses it to a "
    "float that json.dumps re-renders as -7e-06, which the grammar's bounded-number lexer "
    "(no exponent) refuses; seen for deepseek-v3.1 and granite-3 in full-suite runs, where "
    "the walk drew such a number (the number-spelling mismatch, not fixed yet)"))


@pytest.mark.slow
@WALK_ORDER
@per_dialect(PROPERTY)
def test_grammar_accepted_text_parses_at_length(engine: Model, name: str,
                                                data: st.DataObject) -> None:
    _accepted_text_parses(engine, name, data)


# ------------------------------------------------------------------ documented limits
@pytest.mark.parametrize("name", XML)
def test_a_raw_xml_string_never_holds_its_close_marker(engine: Model, name: str) -> None:
    """Documented (docs/tools.md, Arguments): the grammar refuses a raw string value holding
    its closing marker, the one string an XML dialect cannot write."""
    d = DIALECTS[name]
    tools = tools_for(d)
    core = d.args.value_close.strip()
    wire = render_calls(d, [ToolCall(id="c", name="probe", arguments={"s": f"a{core}b"})])
    assert refusal(engine, constraint(engine, d, tools, "required"), wire) is not None


@pytest.mark.parametrize("name", GEMMA)
def test_a_gemma_string_never_holds_its_quote_marker(engine: Model, name: str) -> None:
    """Documented (docs/tools.md, Arguments): a gemma-4 string is raw text between two
    ``<|"|>`` markers, so the grammar refuses one holding the marker."""
    d = DIALECTS[name]
    wire = render_calls(d, [ToolCall(id="c", name="probe",
                                     arguments={"s": f"a{d.args.quote}b"})])
    assert refusal(engine, constraint(engine, d, tools_for(d), "required"), wire) is not None


@pytest.mark.parametrize("name", GEMMA)
def test_a_gemma_key_holding_a_colon_is_refused_by_name(name: str) -> None:
    with pytest.raises(SchemaUnsupported, match="ends at its ':'"):
        tool_grammar([Tool.from_schema("f", _obj({"a:b": {"type": "string"}}, ["a:b"]))],
                     dialect=DIALECTS[name])


# ------------------------------------------------------------------ known mismatches
def known(key: str, names: Sequence[str]) -> list[Any]:
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[key]))
            for n in names]


def agrees(engine: Model, d: Dialect, tools: Sequence[Tool], reply: str,
           want: Sequence[ToolCall] | None, choice: str = "required") -> None:
    """The grammar accepts ``reply`` exactly when it parses, and to ``want`` (None: only
    that it parses); what the mismatch tests assert."""
    accepted = refusal(engine, constraint(engine, d, tools, choice), reply) is None
    try:
        text, got = parse_calls(reply, tools, d)
    except ToolArgumentsInvalid as exc:
        raise AssertionError(f"grammar accepted={accepted}, parser refused: {exc}") from None
    assert accepted, f"the parser read {got}, the grammar refused {reply!r}"
    if want is not None:
        assert text == ""
        same_calls(d, got, want)
    for call in got:  # what a tool, the history or a JSON client gets must be UTF-8
        json.dumps(call.arguments, ensure_ascii=False).encode()


def one(tool: Tool, args: dict[str, Any]) -> list[ToolCall]:
    return [ToolCall(id="abcDEF123", name=tool.name, arguments=args)]


def _written_agree(engine: Model, d: Dialect, schema: dict[str, Any],
                   args: dict[str, Any], name: str = "f") -> None:
    tool = Tool.from_schema(name, schema)
    calls = one(tool, args)
    agrees(engine, d, [tool], render_calls(d, calls), calls)


@pytest.mark.parametrize("name", XML)
def test_an_xml_json_value_may_hold_the_close_marker(engine: Model, name: str) -> None:
    """Was a mismatch (the grammar took it, the parser ended the value at the marker):
    a value typed as JSON is read as a whole JSON value."""
    d = DIALECTS[name]
    core = d.args.value_close.strip()
    _written_agree(engine, d, _obj({"o": _obj({"k": {"type": "string"}})}, ["o"]),
                   {"o": {"k": f"a{core}b"}})


XML_OPTIONAL = _obj({"u": {"type": ["string", "null"]}})
XML_UNION = _obj({"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}})
TYPED_KEYS = [n for n in XML if DIALECTS[n].args.key_close_json]
UNTYPED_KEYS = sorted(set(XML) - set(TYPED_KEYS))


@pytest.mark.parametrize("value", ["x", None, "say \"hi\"", '"q', "5 apples", "null", "5"])
@pytest.mark.parametrize("name", TYPED_KEYS)
def test_an_optional_xml_string_is_written_raw(engine: Model, name: str,
                                               value: str | None) -> None:
    """Was a mismatch (the grammar wanted '"x"', the template writes x after
    string="true"): in ``str | None`` a string is raw, None JSON after string="false"."""
    _written_agree(engine, DIALECTS[name], XML_OPTIONAL, {"u": value})


@pytest.mark.parametrize("args", [{"u": "null"}, {"u": "5"}, {"a": "x y"}, {"a": 5},
                                  {"a": "7"}])
@pytest.mark.parametrize("name", TYPED_KEYS)
def test_a_typed_xml_union_says_which_member(engine: Model, name: str,
                                            args: dict[str, Any]) -> None:
    """DSML's keys say the type (string="true" / "false"): any union reads back exactly."""
    _written_agree(engine, DIALECTS[name], _obj({"u": {"type": ["string", "null"]},
                                                 **XML_UNION["properties"]}), args)


@pytest.mark.parametrize("args", [{"u": "x"}, {"u": "null"}, {"a": "x y"}, {"a": "5"}])
@pytest.mark.parametrize("name", known("xml-union-string", UNTYPED_KEYS))
def test_known_xml_union_holding_a_string(engine: Model, name: str,
                                          args: dict[str, Any]) -> None:
    _written_agree(engine, DIALECTS[name], _obj({"u": {"type": ["string", "null"]},
                                                 **XML_UNION["properties"]}), args)


@pytest.mark.parametrize("name", XML)
def test_an_xml_enum_member_may_hold_the_close_marker(engine: Model, name: str) -> None:
    """Was a mismatch (the grammar took the member, the parser ended it at the marker)."""
    d = DIALECTS[name]
    value = "a" + d.args.value_close.strip() + "b"
    _written_agree(engine, d, _obj({"e": {"enum": [value, "c"]}}, ["e"]), {"e": value})


XML_KEYS = {"qwen3-xml": "a>b", "seed-oss": "a>b", "glm-4.5": "a</arg_key>b",
            "minimax-m2": 'a">b'}


@pytest.mark.parametrize("name", XML)
def test_an_xml_parameter_name_holding_the_key_close_is_refused_by_name(name: str) -> None:
    """Was a mismatch (the grammar wrote the name, the parser ended it at the marker)."""
    key = XML_KEYS[name] if name in XML_KEYS else "a" + key_end(DIALECTS[name]) + "b"
    with pytest.raises(SchemaUnsupported, match="cannot be read back"):
        tool_grammar([Tool.from_schema("f", _obj({key: {"type": "string"}}, [key]))],
                     dialect=DIALECTS[name])


def _py_reply(d: Dialect, args: str, name: str = "f") -> str:
    body = f"{name}({args})"
    return d.section[0] + body + d.section[1] if d.section else body


STR_TOOL = _obj({"s": {"type": "string"}}, ["s"])


def both_refuse(engine: Model, d: Dialect, tools: Sequence[Tool], reply: str) -> None:
    """The grammar refuses ``reply`` and so does the parser."""
    assert refusal(engine, constraint(engine, d, tools, "required"), reply) is not None
    with pytest.raises(ToolArgumentsInvalid):
        parse_calls(reply, tools, d)


@pytest.mark.parametrize("escape", ["\\x", "\\x4", "\\N{DASH}", "\\u12", "\\d", "\\ud83d",
                                    "\\U00110000", "\\U0000dfff"])
@pytest.mark.parametrize("name", PYTHONIC)
def test_a_pythonic_string_holds_only_escapes_python_reads_as_one_character(
        engine: Model, name: str, escape: str) -> None:
    """Was a mismatch (the lexeme took any backslash pair): an escape ``ast`` refuses, warns
    on, or reads as a lone surrogate is refused by the grammar too."""
    d = DIALECTS[name]
    q = d.args.quote
    both_refuse(engine, d, [Tool.from_schema("f", STR_TOOL)], _py_reply(d, f"s={q}{escape}{q}"))


@pytest.mark.parametrize("char", ["\r", "\x00"])
@pytest.mark.parametrize("name", PYTHONIC)
def test_a_pythonic_string_never_holds_a_raw_cr_or_nul(engine: Model, name: str,
                                                        char: str) -> None:
    d = DIALECTS[name]
    q = d.args.quote
    both_refuse(engine, d, [Tool.from_schema("f", STR_TOOL)], _py_reply(d, f"s={q}a{char}b{q}"))


@pytest.mark.parametrize("args", ["s=foo", "s='a' + 'b'", "s=f(1)"])
@pytest.mark.parametrize("name", PYTHONIC)
def test_a_pythonic_argument_that_is_no_literal_is_refused_by_name(engine: Model, name: str,
                                                                   args: str) -> None:
    """Was a bare ValueError out of parse_calls (ast.literal_eval's)."""
    d = DIALECTS[name]
    both_refuse(engine, d, [Tool.from_schema("f", STR_TOOL)], _py_reply(d, args))


@pytest.mark.parametrize("value", ["\x01\x7f", "\ud7ff\ue000", "😀é", "\\'\"\n\t"])
@pytest.mark.parametrize("name", PYTHONIC)
def test_a_pythonic_string_escapes_every_character_it_must(engine: Model, name: str,
                                                            value: str) -> None:
    """The escapes render_calls writes (JSON's: ``\\u0001``, ``\\n``, ``\\\\``) and raw
    non-ASCII are accepted and read back; maxLength counts characters, not source."""
    _written_agree(engine, DIALECTS[name],
                   _obj({"s": {"type": "string", "maxLength": len(value)}}, ["s"]), {"s": value})


UNION = _obj({"u": {"type": ["string", "null"]}, "b": {"type": ["boolean", "null"]},
              "m": {"enum": ["a", 1, None]}})


@pytest.mark.parametrize("args", [{"u": "x"}, {"u": None}, {"b": True}, {"m": "a"},
                                  {"m": None}])
@pytest.mark.parametrize("name", ["lfm2", "lfm2-content"])
def test_known_pythonic_union_values(engine: Model, name: str, args: dict[str, Any]) -> None:
    _written_agree(engine, DIALECTS[name], UNION, args)


@pytest.mark.parametrize("args", [{"u": None}, {"b": True}, {"m": None}])
@pytest.mark.parametrize("name", ["llama4-pythonic"])
def test_known_pythonic_union_values_double_quoted(engine: Model, name: str,
                                                   args: dict[str, Any]) -> None:
    _written_agree(engine, DIALECTS[name], UNION, args)


@pytest.mark.parametrize("key", ["from", "class", "None", "max-results", "2x", "a b"])
@pytest.mark.parametrize("name", PYTHONIC)
def test_a_pythonic_parameter_name_that_python_cannot_read_is_refused_by_name(
        name: str, key: str) -> None:
    """Was a mismatch (the grammar wrote ``from=...``, ast refused it)."""
    with pytest.raises(SchemaUnsupported, match="Python identifier"):
        tool_grammar([Tool.from_schema("f", _obj({key: {"type": "string"}}, [key]))],
                     dialect=DIALECTS[name])


@pytest.mark.parametrize("name", PYTHONIC)
def test_known_pythonic_nested_values_with_spaced_separators(engine: Model, name: str) -> None:
    d = dataclasses.replace(DIALECTS[name], json_separators=SPACED)
    schema = _obj({"o": _obj({"k": {"type": "integer"}}), "l": {"type": "array",
                                                           "items": {"type": "integer"}}})
    _written_agree(engine, d, schema, {"o": {"k": 1}, "l": [1, 2]})


@pytest.mark.parametrize("name", ["qwen3-xml", "seed-oss"])
def test_call_opening_without_its_line_break(engine: Model, name: str) -> None:
    """Was a mismatch (parse_calls took '<tool_call><function=f>' for text), fixed in
    7de1b0b; the layout property covers it, this pins the minimal case."""
    d = DIALECTS[name]
    tool = Tool.from_schema("f", STR_TOOL)
    calls = one(tool, {"s": "x"})
    wire = render_calls(d, calls)
    agrees(engine, d, [tool], wire.replace("tool_call>\n<function=", "tool_call><function="),
           calls)


@pytest.mark.parametrize("name", known("xml-leading-space", ["qwen3-xml"]))
def test_known_xml_value_leading_space_without_the_line_break(engine: Model, name: str) -> None:
    d = DIALECTS[name]
    tool = Tool.from_schema("f", STR_TOOL)
    calls = one(tool, {"s": " x"})
    wire = render_calls(d, calls).replace("<parameter=s>\n", "<parameter=s>")
    agrees(engine, d, [tool], wire, calls)


@pytest.mark.parametrize(("schema", "value"), [
    ({"type": "string", "maxLength": 3}, "abc"),
    pytest.param({"type": "string", "minLength": 1}, "", marks=pytest.mark.xfail(
        strict=True, reason="qwen3-xml: the optional line break before '</parameter>' can be "
        "lexed into an empty value, so '' passes minLength 1 in the grammar (the validator "
        "then refuses it)"))])
@pytest.mark.parametrize("name", ["qwen3-xml"])
def test_known_xml_length_counts_the_layout(engine: Model, name: str, schema: dict[str, Any],
                                           value: str) -> None:
    d = DIALECTS[name]
    tool = Tool.from_schema("f", _obj({"t": schema}, ["t"]))
    calls = one(tool, {"t": value})
    agrees(engine, d, [tool], render_calls(d, calls), calls if schema.get("maxLength") else None)


@pytest.mark.parametrize("name", known("text-wrapper-lead", ["command-r7b"]))
def test_known_text_reply_with_text_before_calls(engine: Model, name: str) -> None:
    d = dataclasses.replace(DIALECTS[name], text_before=True)
    reply = write_text(d, "ok")
    agrees(engine, d, [Tool.from_schema("f", STR_TOOL)], reply, None, choice="auto")


@pytest.mark.parametrize("space", ["\x1c", "\x1f"])
@pytest.mark.parametrize("name", ["llama3-json", "llama4-pythonic"])
def test_a_unicode_separator_before_a_call_opening_is_text(engine: Model, name: str,
                                                       space: str) -> None:
    d = DIALECTS[name]
    reply = space + d.trigger + "nope"  # plain text to the grammar, a call to the parser
    agrees(engine, d, [Tool.from_schema("f", STR_TOOL)], reply, None, choice="auto")


@pytest.mark.xfail(strict=True, reason="llguidance 1.9: a raw string's lazy lexeme (its text "
                   "and close marker) that is not accepting at the marker (a minLength not "
                   "yet met) spends the compiled grammar's whole lexer fuel on the dead end, "
                   "and every later copy of that grammar refuses its first token; a "
                   "minLength is rare in tool schemas, the validator checks it as well")
@pytest.mark.parametrize("name", ["qwen3-xml"])
def test_known_llguidance_raw_dead_end(engine: Model, name: str) -> None:
    d = DIALECTS[name]
    tool = Tool.from_schema("f", _obj({"s": {"type": "string", "minLength": 2}}, ["s"]))
    c = constraint(engine, d, [tool], "required")
    short = render_calls(d, one(tool, {"s": "a"}))
    good = render_calls(d, one(tool, {"s": "abc"}))
    assert refusal(engine, c, good) is None
    assert refusal(engine, c, short) is not None
    assert refusal(engine, c, good) is None  # refused at its first token


RAW_CHECKED = [
    ({"type": "string", "pattern": "^[0-9]+$"}, "123", ["abc", "12a", ""]),
    ({"type": "string", "pattern": "[a-c]{2}"}, "ab", ["a", "dd"]),
    ({"type": "string", "pattern": "^(?!ab)[a-z]{3}$"}, "abx"[::-1], ["abx", "ab1"]),
    ({"type": "string", "format": "date"}, "2024-02-29", ["abc", "2023-02-29", "2023-04-31"]),
    ({"type": "string", "format": "date-time"}, "2024-01-02T03:04:05Z", ["2024-01-02"]),
    ({"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", ["123"]),
    ({"type": "string", "format": "ipv4", "maxLength": 9}, "10.0.0.1", ["10.0.0.256",
                                                                      "192.168.0.1"]),
]


@pytest.mark.parametrize(("schema", "good", "bad"), RAW_CHECKED)
@pytest.mark.parametrize("name", XML + PYTHONIC + GEMMA)
def test_a_raw_string_keeps_its_pattern_and_format_in_the_grammar(
        engine: Model, name: str, schema: dict[str, Any], good: str, bad: list[str]) -> None:
    """Was a limit (the validator alone checked them, the grammar let the model write any
    text): a value the validator refuses is refused by the grammar, one it takes is taken
    (a pattern matched whole, as llguidance matches one in JSON)."""
    d = DIALECTS[name]
    tool = Tool.from_schema("f", _obj({"s": schema}, ["s"]))
    _written_agree(engine, d, _obj({"s": schema}, ["s"]), {"s": good})
    for value in bad:
        wire = render_calls(d, one(tool, {"s": value}))
        assert refusal(engine, constraint(engine, d, [tool], "required"), wire) is not None, value
        if known_format(schema.get("format", "date")):  # date-time, time: where jsonschema
            with pytest.raises(ToolArgumentsInvalid):    # has rfc3339-validator
                parse_calls(wire, [tool], d)


@pytest.mark.parametrize(("name", "tool"), [("functionary-v3.2", "all"), ("atem", "user"),
                                           ("atem", "self")])
def test_a_tool_named_like_the_text_wrapper_is_refused_by_name(name: str, tool: str) -> None:
    """Was a mismatch (Functionary's 'all\\n{...}' is its text wrapper: the grammar took a
    call of a tool named 'all', the parser returned it as text; ATEM's ' to=user' is text,
    ' to=self' reasoning)."""
    d = DIALECTS[name]
    if name == "atem":
        d = dataclasses.replace(d, reasoning=ATEM_REASONING)
    with pytest.raises(ToolDefinitionError, match="rename the tool"):
        tool_grammar([Tool.from_schema(tool, STR_TOOL)], dialect=d)


def test_a_tool_whose_name_begins_as_the_text_wrapper_is_a_call(engine: Model) -> None:
    """ATEM writes text after ' to=user<|message|>' and a call after ' to=NAME<|message|>':
    a tool named 'user_info' (or 'selfie') is called, and plain text is text. Was refused
    at the name's '_' (the text's opening one lexeme, the lexer committed to it)."""
    d = dataclasses.replace(DIALECTS["atem"], reasoning=ATEM_REASONING)
    tools = [Tool.from_schema("user_info", STR_TOOL), Tool.from_schema("selfie", STR_TOOL)]
    turn = constraint(engine, d, tools, "auto", 64)
    for name in ("user_info", "selfie"):
        wire = render_calls(d, one(next(t for t in tools if t.name == name), {"s": "x"}))
        for reply in (wire, ATEM_REASONING[0] + "Hmm." + ATEM_REASONING[1] + wire):
            assert refusal(engine, turn, reply) is None, reply
        assert [c.name for c in parse_calls(wire, tools, d)[1]] == [name]
    text = " to=user<|message|>Hello there."
    assert refusal(engine, turn, text) is None
    assert parse_calls(text, tools, d) == ("Hello there.", [])


def test_a_typed_key_takes_each_type_its_schema_allows(engine: Model) -> None:
    """Kimi K3's key says its value's JSON type: a union is one branch per type (a string
    raw, an integer and a number both ``type="number"``), each parsing back as written; a
    type the schema does not allow is refused; unknown types are refused by name."""
    d = DIALECTS["kimi-k3"]
    schema = {"type": "object", "properties": {"v": {"anyOf": [
        {"type": "string", "maxLength": 8}, {"type": "integer"}, {"type": "number"},
        {"type": "null"}, {"$ref": "#/$defs/P"}]}, "n": {"type": "integer"}},
        "required": ["v", "n"],
        "$defs": {"P": {"type": "object", "properties": {"x": {"type": "boolean"}},
                        "required": ["x"]}}}
    t = Tool.from_schema("f", schema)
    turn = constraint(engine, d, [t], "auto")
    for value in ("Oslo", 3, 2.5, None, {"x": True}):
        wire = render_calls(d, one(t, {"v": value, "n": 1}))
        assert refusal(engine, turn, wire) is None, wire
        assert [c.arguments for c in parse_calls(wire, [t], d)[1]] == [{"v": value, "n": 1}]
    wrong = render_calls(d, one(t, {"v": 3, "n": 1})).replace('type="number"', 'type="array"', 1)
    assert refusal(engine, turn, wrong) is not None
    with pytest.raises(SchemaUnsupported, match="type of every value"):
        tool_grammar([Tool.from_schema("g", {"type": "object", "properties": {
            "v": {"allOf": [{"type": "string"}]}}})], dialect=d)


def test_a_turn_without_reasoning_may_open_with_the_think_close(engine: Model) -> None:
    """MiniMax M3's template opens a turn without reasoning with ``</mm:think>``: the
    grammar takes that or a whole think block before the calls (nothing else there), the
    parser reads no reasoning from it; a union of a string and an object is refused by
    name (their texts could not be told apart)."""
    d = dataclasses.replace(DIALECTS["minimax-m3"], reasoning=("<mm:think>", "</mm:think>"),
                            think_closed=True)
    tool = Tool.from_schema("f", _obj({"o": _obj({"k": {"type": "integer"}}, ["k"]),
                                       "tags": {"type": "array", "items": {"type": "string"}}},
                                      ["o"]))
    wire = render_calls(d, one(tool, {"o": {"k": 3}, "tags": ["a", ""]}))
    turn = constraint(engine, d, [tool], "auto", 64)
    for reply in ("</mm:think>" + wire, "<mm:think>Hmm.</mm:think>" + wire):
        assert refusal(engine, turn, reply) is None, reply
    assert refusal(engine, turn, wire) is not None
    reasoning, rest = split_reasoning("</mm:think>" + wire, d, opened=False)
    assert reasoning is None
    assert parse_calls(rest, [tool], d)[1][0].arguments == {"o": {"k": 3}, "tags": ["a", ""]}
    with pytest.raises(SchemaUnsupported, match="cannot be read"):
        tool_grammar([Tool.from_schema("g", _obj({"v": {"anyOf": [
            {"type": "string"}, _obj({"k": {"type": "string"}})]}}))], dialect=d)


@pytest.mark.parametrize("name", known("json-del", JSON_ARGS))
def test_known_json_string_holding_del(engine: Model, name: str) -> None:
    _written_agree(engine, DIALECTS[name], STR_TOOL, {"s": "a\x7fb"})


@pytest.mark.parametrize("name", known("json-del", XML + PYTHONIC))
def test_known_json_typed_value_holding_del(engine: Model, name: str) -> None:
    _written_agree(engine, DIALECTS[name], _obj({"l": {"type": "array",
                                                       "items": {"type": "string"}}}, ["l"]),
                   {"l": ["a\x7fb"]})


@pytest.mark.parametrize(("schema", "value"), [({"type": "number"}, -0.0),
                                               ({"type": "number", "minimum": 2, "maximum": 2},
                                                2.0)])
@pytest.mark.parametrize("name", known("number-spelling", ["hermes", "qwen3-xml", "lfm2"]))
def test_known_number_spellings(engine: Model, name: str, schema: dict[str, Any],
                                value: float) -> None:
    _written_agree(engine, DIALECTS[name], _obj({"b": schema}, ["b"]), {"b": value})
