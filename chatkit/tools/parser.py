"""One parser for every tool-call dialect: the markers the grammar wrote, read back.

The grammar fixes the shape, so the parser scans the dialect's pieces in order (literal
markup compared whitespace aside), takes the name among the turn's tools, the id in the
dialect's scheme, and the arguments in its encoding, typed by the tool's schema
(``<parameter=n>5</parameter>`` is 5 for an integer, "5" for a string). It never guesses
a value's type from the text alone.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ToolArgumentsInvalid
from ..messages import ToolCall
from .definition import Tool
from .dialects import ARGS, ID, INDEX, NAME, Dialect
from .grammar import call_head, key_end
from .lark_text import resolves_to_string, string_values
from .tree_values import TreeMismatch, read_tree_args

__all__: list[str] = []

_ids = itertools.count(1)
_DECODER = json.JSONDecoder()
_JSON_SPACE = " \t\n\r"


class _NoMatch(Exception):
    """The text does not continue as the dialect says (at ``pos``)."""

    def __init__(self, pos: int, wanted: str) -> None:
        super().__init__(f"expected {wanted!r} at {pos}")
        self.pos = pos
        self.wanted = wanted


@dataclass(frozen=True)
class ScannedCall:
    """A call as written: its name, the id the model wrote (if any), its arguments (typed
    by the schema, unvalidated) and where it sits in the text."""

    name: str
    written_id: str | None
    arguments: Any
    start: int
    end: int


def _expect(text: str, pos: int, literal: str) -> int:
    """Where ``literal`` ends when ``text`` continues with it at ``pos``, whitespace aside;
    raises ``_NoMatch``."""
    i = pos
    for ch in literal:
        if ch.isspace():
            continue
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text) or text[i] != ch:
            raise _NoMatch(pos, literal)
        i += 1
    trailing = len(literal) - len(literal.rstrip())  # trailing layout belongs to it
    while trailing and i < len(text) and text[i].isspace():
        i += 1
        trailing -= 1
    return i


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class _Scanner:
    def __init__(self, text: str, dialect: Dialect, tools: Sequence[Tool]) -> None:
        self.text = text
        self.d = dialect
        self.by_name = {t.name: t for t in tools}
        self.names = sorted(self.by_name, key=len, reverse=True)

    def name(self, pos: int, following: str | None) -> tuple[str, int]:
        pos = _skip_space(self.text, pos)
        for n in self.names:
            if self.text.startswith(n, pos):
                end = pos + len(n)
                if following is None or self._continues(end, following):
                    return n, end
        raise _NoMatch(pos, "a tool name")

    def _continues(self, pos: int, literal: str) -> bool:
        try:
            _expect(self.text, pos, literal)
        except _NoMatch:
            return False
        return True

    def call(self, pos: int, index: int) -> ScannedCall:
        start = pos
        name = ""
        written: str | None = None
        args: Any = None
        pieces = self.d.call
        for k, piece in enumerate(pieces):
            nxt = pieces[k + 1] if k + 1 < len(pieces) else None
            following = nxt if isinstance(nxt, str) else None
            if isinstance(piece, str):
                pos = _expect(self.text, pos, piece)
            elif piece is NAME:
                name, pos = self.name(pos, following)
            elif piece is ID or piece is INDEX:
                pos = _skip_space(self.text, pos)
                end = pos
                while end < len(self.text) and self.text[end].isalnum():
                    end += 1
                if piece is ID:
                    written = self.text[pos:end]
                pos = end
            elif piece is ARGS:
                args, pos = self.args(pos, self.by_name[name] if name else None, following)
        return ScannedCall(name, written, args, start, pos)

    def args(self, pos: int, tool: Tool | None, following: str | None) -> tuple[Any, int]:
        kind = self.d.args.kind
        if kind == "json":
            pos = _skip_space(self.text, pos)
            try:
                value, end = _DECODER.raw_decode(self.text, pos)
            except ValueError as exc:
                raise _NoMatch(pos, "JSON arguments") from exc
            return value, end
        schema = tool.definition.parameters_schema if tool is not None else {}
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        if kind == "xml":
            return self.xml_args(pos, props)
        if kind == "tree":
            try:
                return read_tree_args(self.text, pos, schema, self.d.args)
            except TreeMismatch as exc:
                raise _NoMatch(exc.pos, exc.wanted) from None
        if kind == "gemma":
            return _gemma_pairs(self.text, pos, self.d.args.quote,
                                (following or "}").strip()[:1] or "}")
        return self.py_args(pos, props, following)

    def xml_args(self, pos: int, props: dict[str, Any], *,
                 partial: bool = False) -> tuple[dict[str, Any], int]:
        """XML-like parameters from ``pos``; ``partial``: the ones complete so far, where the
        text ends inside one (a reply still being written)."""
        out: dict[str, Any] = {}
        while self._continues(pos, self.d.args.key_open):
            try:
                more, pos = self._xml_one(pos, props)
            except _NoMatch:
                if partial:
                    return out, pos
                raise
            out.update(more)
        return out, pos

    def _xml_one(self, pos: int, props: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """One XML-like parameter (its value closed), raising ``_NoMatch`` if unfinished."""
        a = self.d.args
        close = a.value_close.strip()
        pos = _expect(self.text, pos, a.key_open)
        end = self.text.find(key_end(self.d), pos)
        if end < 0:
            raise _NoMatch(pos, a.key_close)
        key = self.text[pos:end].strip()
        if "{type}" in a.key_close_json:  # the key says the value's type (Kimi K3)
            before, after = a.key_close_json.split("{type}", 1)
            pos = _expect(self.text, end, before)
            stop = self.text.find(after, pos)
            if stop < 0:
                raise _NoMatch(pos, after)
            typed_json, pos = self.text[pos:stop] != "string", stop + len(after)
        else:
            typed_json = bool(a.key_close_json) and self._continues(end, a.key_close_json)
            pos = _expect(self.text, end, a.key_close_json if typed_json else a.key_close)
        # JSON where the key says so, or (untyped keys) where the schema is not a string's
        as_json = typed_json or (not a.key_close_json and not resolves_to_string(props.get(key)))
        if as_json:
            whole = self._json_then(pos, close)  # a JSON string may hold the marker
            if whole is not None:
                return {key: whole[0]}, _expect(self.text, whole[1], close)
        elif isinstance(props.get(key), dict) and (values := string_values(props[key])):
            for value in sorted(values, key=len, reverse=True):  # one may hold the marker
                if self.text.startswith(value, pos):
                    try:
                        return {key: value}, _expect(self.text, pos + len(value), close)
                    except _NoMatch:
                        continue
        stop = self.text.find(close, pos)
        if stop < 0:
            raise _NoMatch(pos, close)
        raw = self.text[pos:stop]
        lead = a.value_close[: len(a.value_close) - len(a.value_close.lstrip())]
        if lead and raw.endswith(lead):
            raw = raw[: -len(lead)]
        value = _json_value(raw, key) if as_json else raw
        return {key: value}, _expect(self.text, stop, close)

    def _json_then(self, pos: int, close: str) -> tuple[Any, int] | None:
        """A whole JSON value from ``pos`` (layout around it) and where ``close`` follows it,
        or None: no JSON value there, or something else before ``close``."""
        start = len(self.text) - len(self.text[pos:].lstrip(_JSON_SPACE))
        try:
            value, end = _DECODER.raw_decode(self.text, start)
        except ValueError:
            return None
        if not _utf8(value):
            return None
        after = len(self.text) - len(self.text[end:].lstrip(_JSON_SPACE))
        return (value, after) if self.text.startswith(close, after) else None

    def head(self, pos: int, index: int) -> tuple[str, str | None, int]:
        """Call ``index`` from ``pos`` (its section opening or separator first) up to its
        arguments: the name, the id written, where the arguments begin. Raises
        ``_NoMatch`` while the text does not yet reach them."""
        d = self.d
        if index == 0 and d.section:
            pos = _expect(self.text, pos, d.section[0])
        elif index > 0 and d.separator:
            pos = _expect(self.text, pos, d.separator)
        name, written = "", None
        for k, piece in enumerate(d.call):
            nxt = d.call[k + 1] if k + 1 < len(d.call) else None
            following = nxt if isinstance(nxt, str) else None
            if isinstance(piece, str):
                pos = _expect(self.text, pos, piece)
            elif piece is NAME:
                name, pos = self.name(pos, following)
            elif piece is ARGS:
                if not name:  # the name after the arguments: the call is said whole
                    raise _NoMatch(pos, "a tool name")
                return name, written, _skip_space(self.text, pos)
            else:
                pos = _skip_space(self.text, pos)
                end = pos
                while end < len(self.text) and self.text[end].isalnum():
                    end += 1
                if end == len(self.text):
                    raise _NoMatch(pos, "an id")
                written = self.text[pos:end] if piece is ID else written
                pos = end
        raise _NoMatch(pos, "arguments")

    def py_args(self, pos: int, props: dict[str, Any],
                following: str | None) -> tuple[dict[str, Any], int]:
        closer = (following or ")").strip() or ")"
        end = self.text.find(closer, pos)
        while end >= 0:
            try:
                node = ast.parse(f"f({self.text[pos:end]})", mode="eval").body
            except SyntaxError:
                end = self.text.find(closer, end + 1)
                continue
            if isinstance(node, ast.Call) and not node.args:
                try:
                    out = {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
                except ValueError:  # a name, an expression, a lone surrogate: no literal
                    break
                return out, end
            break
        raise _NoMatch(pos, "Python keyword arguments")

    def calls(self, pos: int) -> tuple[list[ScannedCall], int]:
        d = self.d
        if d.section:
            pos = _expect(self.text, pos, d.section[0])
        found = [self.call(pos, 0)]
        pos = found[-1].end
        while True:
            try:
                after = _expect(self.text, pos, d.separator) if d.separator else pos
                found.append(self.call(after, len(found)))
            except _NoMatch:
                break
            pos = found[-1].end
        if d.section and d.section[1]:
            pos = _expect(self.text, pos, d.section[1])
        return found, pos


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_GEMMA_WORDS = (("true", True), ("false", False), ("None", None))


def _gemma_value(text: str, pos: int, quote: str) -> tuple[Any, int]:
    """One value in Gemma 4's encoding at ``pos`` and where it ends; raises ``_NoMatch``
    where the text does not (yet) hold a whole one."""
    if text.startswith(quote, pos):
        end = text.find(quote, pos + len(quote))
        if end < 0:
            raise _NoMatch(pos, quote)
        return text[pos + len(quote):end], end + len(quote)
    if text.startswith("{", pos):
        pairs, pos = _gemma_pairs(text, pos + 1, quote, "}")
        return pairs, pos + 1
    if text.startswith("[", pos):
        items: list[Any] = []
        pos += 1
        while not text.startswith("]", pos):
            if items:
                if not text.startswith(",", pos):
                    raise _NoMatch(pos, ",")
                pos += 1
            item, pos = _gemma_value(text, pos, quote)
            items.append(item)
        return items, pos + 1
    for word, value in _GEMMA_WORDS:
        if text.startswith(word, pos):
            return value, pos + len(word)
    m = _NUMBER.match(text, pos)
    if m is None or m.end() == len(text):  # a number may go on
        raise _NoMatch(pos, "a gemma-4 value")
    number = m.group()
    return (int(number) if number.lstrip("-").isdigit() else float(number)), m.end()


def _gemma_pairs(text: str, pos: int, quote: str, close: str, *,
                 partial: bool = False) -> tuple[dict[str, Any], int]:
    """``key:value`` pairs from ``pos`` up to ``close`` (not consumed); ``partial``: the
    pairs complete so far, where the text ends inside one."""
    out: dict[str, Any] = {}
    while not text.startswith(close, pos):
        try:
            at = pos
            if out:
                if not text.startswith(",", at):
                    raise _NoMatch(at, ",")
                at += 1
            colon = text.find(":", at)
            if colon < 0:
                raise _NoMatch(at, "a key")
            value, end = _gemma_value(text, colon + 1, quote)
        except _NoMatch:
            if partial:
                return out, pos
            raise
        out[text[at:colon]] = value
        pos = end
    return out, pos


def _json_value(raw: str, key: str) -> Any:
    try:
        value = json.loads(raw)
    except ValueError:
        return raw  # the validator names it (a string where the schema wants another type)
    return value if _utf8(value) else raw


def _utf8(value: Any) -> bool:
    """Whether a JSON value's strings are text (no lone surrogate from a ``\\ud83d``)."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False,
          "None": None}


def _literal(node: ast.AST) -> Any:
    """A Python literal (JSON's true / false / null accepted too)."""
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k) if k is not None else None: _literal(v)
                for k, v in zip(node.keys, node.values, strict=True)}
    value = ast.literal_eval(node)
    if isinstance(value, str):
        value.encode()  # a lone surrogate ('\ud83d') is no text: UnicodeEncodeError, a ValueError
    return value


SPACE = "".join(c for c in map(chr, range(0x3001)) if c.isspace() and c not in "\x1c\x1d\x1e\x1f")
"""Unicode's White_Space, the grammar's ``\\s`` (``str.isspace`` also takes U+001C..U+001F)."""
_SPACES = re.compile(f"[{re.escape(SPACE)}]+")


def starts_calls(text: str, dialect: Dialect) -> bool:
    """Whether a reply is calls (it opens with the dialect's call markup), not text."""
    trigger = dialect.trigger
    stripped = text.lstrip(SPACE)
    opener = dialect.text_open.lstrip(SPACE)
    if opener.strip() and stripped.startswith(opener) and \
            not trigger.lstrip(SPACE).startswith(opener):  # Kimi K3's calls open so too
        return False  # text's own markup (ATEM's ' to=user' beside its calls' ' to=NAME')
    head = call_head(dialect)
    if head and not stripped.startswith(head):  # the markup word exactly, as the grammar
        return False
    if trigger.strip():  # layout inside the markup as the template writes it, or none
        return _SPACES.sub("", stripped[:len(trigger) + 8]).startswith(_SPACES.sub("", trigger))
    return bool(stripped) and not (dialect.text_open and text.startswith(dialect.text_open))


def scan_calls(text: str, dialect: Dialect, tools: Sequence[Tool]) -> list[ScannedCall]:
    """The calls a reply holds, as written (no validation); stops at the first thing that
    is not a call (a reply cut short)."""
    scanner = _Scanner(text, dialect, tools)
    try:
        return scanner.calls(_skip_space(text, 0))[0]
    except _NoMatch:
        found: list[ScannedCall] = []
        pos = _skip_space(text, 0)
        try:
            if dialect.section:
                pos = _expect(text, pos, dialect.section[0])
            while True:
                if found and dialect.separator:
                    pos = _expect(text, pos, dialect.separator)
                found.append(scanner.call(pos, len(found)))
                pos = found[-1].end
        except (_NoMatch, KeyError):
            return found


def scan_head(text: str, pos: int, dialect: Dialect, tools: Sequence[Tool],
              index: int) -> tuple[str, str | None, int] | None:
    """Call ``index`` of a reply being written, from ``pos`` (its section opening or
    separator first): its name, the id it wrote and where its arguments begin; None while
    the text does not reach its arguments yet."""
    try:
        return _Scanner(text, dialect, tools).head(pos, index)
    except _NoMatch:
        return None


def xml_args_so_far(text: str, pos: int, dialect: Dialect, tool: Tool) -> dict[str, Any]:
    """The XML-like parameters written completely from ``pos`` so far (typed as
    :func:`parse_calls` types them)."""
    schema = tool.definition.parameters_schema
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return _Scanner(text, dialect, [tool]).xml_args(pos, props, partial=True)[0]


def tree_args_so_far(text: str, pos: int, dialect: Dialect, tool: Tool) -> dict[str, Any]:
    """MiniMax M3's top-level arguments written completely from ``pos`` so far."""
    try:
        return read_tree_args(text, pos, tool.definition.parameters_schema, dialect.args,
                              partial=True)[0]
    except TreeMismatch:
        return {}


def gemma_args_so_far(text: str, pos: int, dialect: Dialect) -> dict[str, Any]:
    """Gemma 4's ``key:value`` pairs written completely from ``pos`` so far."""
    return _gemma_pairs(text, pos, dialect.args.quote, "}", partial=True)[0]


def py_args_so_far(text: str, pos: int, dialect: Dialect) -> dict[str, Any]:
    """The Python keyword arguments written completely from ``pos`` so far: the longest
    prefix ending before a separator that reads as keyword arguments."""
    sep = dialect.args.separator.strip() or ","
    body = text[pos:]
    cut = body.rfind(sep)
    while cut > 0:
        try:
            node = ast.parse(f"f({body[:cut]})", mode="eval").body
        except SyntaxError:
            cut = body.rfind(sep, 0, cut)
            continue
        if isinstance(node, ast.Call) and not node.args:
            try:
                return {kw.arg: _literal(kw.value) for kw in node.keywords if kw.arg}
            except ValueError:
                return {}
        return {}
    return {}


def split_reasoning(text: str, dialect: Dialect, *, opened: bool,
                    captured: str | None = None) -> tuple[str | None, str]:
    """A reply's think text (None: it wrote no think block) and the rest, by the dialect's
    think markup; ``opened``: the prompt opened the block, the reply begins inside it.
    ``captured``: the think text as the grammar captured it (where the block's budget ran
    out, the closing markup may be missing: the text is known to end there)."""
    if dialect.reasoning is None:
        return None, text
    open_, close = (m.strip() for m in dialect.reasoning)
    rest = text
    if not opened:
        stripped = text.lstrip()
        if dialect.think_closed and close and stripped.startswith(close):
            return None, stripped[len(close):]  # no reasoning: the close alone (MiniMax M3)
        if not open_ or not stripped.startswith(open_):
            return None, text
        rest = stripped[len(open_):]
    end = rest.find(close)
    if captured is not None and (end < 0 or end > len(captured) + len(close)):
        at = rest.find(captured) if captured else 0
        if at >= 0:
            after = rest[at + len(captured):]
            while after.lstrip().startswith(close):  # written, and again where optional
                after = after.lstrip()[len(close):]
            return captured.strip(), after
    if end < 0:
        return rest.strip(), ""
    after = rest[end + len(close):]
    while after.lstrip().startswith(close):  # written again where the grammar allowed it
        after = after.lstrip()[len(close):]
    return rest[:end].strip(), after


def _lead(text: str, dialect: Dialect) -> tuple[str, str]:
    """Text written before the calls' markup word (or inside the dialect's ``text_lead``
    markup), and the rest (the calls, their section's opening restored where the markup
    wrote it; or all of the text where it holds no call)."""
    if dialect.text_lead:
        open_, close = dialect.text_lead
        body = text.lstrip(SPACE)
        end = body.find(close, len(open_)) if body.startswith(open_) else -1
        if end >= 0 and body[len(open_):end].strip():
            section = dialect.section[0] if dialect.section else ""
            written = open_ + close
            rest = (section if section.startswith(written) else "") + body[end + len(close):]
            if starts_calls(rest, dialect):
                return body[len(open_):end], rest
    head = call_head(dialect)
    at = text.find(head) if head else -1
    if at <= 0:
        return "", text
    return text[:at], text[at:]


def parse_calls(text: str, tools: Sequence[Tool],
                dialect: Dialect | None = None) -> tuple[str, list[ToolCall]]:
    """Split a reply into its text and its validated calls.

    A reply is text (the dialect's text wrapper removed; a JSON string where the dialect
    writes text as JSON), calls, or text then calls where the family writes that. Raises
    ``ToolArgumentsInvalid`` for calls that do not read as the dialect writes them, name
    no tool, or whose arguments fail the tool's validator.
    """
    from .dialects import HERMES

    d = dialect or HERMES
    lead, text = _lead(text, d)
    if not starts_calls(text, d):
        body = lead + text
        opener = d.text_open.lstrip(SPACE)
        if opener and body.lstrip().startswith(opener):
            body = body.lstrip()[len(opener):]
        if d.text_close and body.rstrip().endswith(d.text_close):
            body = body.rstrip()[: -len(d.text_close)]
        if d.text_json:
            try:
                value = json.loads(body)
            except ValueError:
                value = None
            if isinstance(value, str):
                return value, []
        return body.strip(), []
    scanner = _Scanner(text, d, tools)
    try:
        scanned, end = scanner.calls(_skip_space(text, 0))
    except _NoMatch as exc:
        raise ToolArgumentsInvalid("?", text, [f"not a {d.name} tool call: expected "
                                               f"{exc.wanted!r} at {exc.pos}"]) from None
    if text[end:].strip():
        raise ToolArgumentsInvalid("?", text, [f"text after the {d.name} calls: "
                                               f"{text[end:][:40]!r}"])
    calls = []
    for index, sc in enumerate(scanned):
        tool = scanner.by_name.get(sc.name)
        if tool is None:
            raise ToolArgumentsInvalid(sc.name, sc.arguments, ["no such tool"])
        parsed = tool.validate(sc.arguments)
        ident = d.call_id(sc.name, index, sc.written_id) or f"call_{next(_ids)}"
        calls.append(ToolCall(id=ident, name=sc.name,
                              arguments=dict(sc.arguments) if isinstance(sc.arguments, dict)
                              else {}, parsed=parsed))
    return lead.strip(), calls
