"""MiniMax M3's arguments as grammar rules (``Args.kind == "tree"``).

MiniMax M3's template writes each argument as an element, ``M<key>VALUE M</key>`` with
``M`` its ``]<]minimax[>[`` marker (``Args``: ``key_open`` is ``M<``, ``value_close`` is
``M``): a string raw, a number as Python prints it, ``true`` / ``false``, an object as its
properties' elements, a list as ``item`` elements; a null value is left out. Nothing says a
value's type but the schema, so each value is a rule made from it (as
:mod:`.gemma_values` does): a string's length, ``pattern`` and ``format`` bound its raw text,
numbers are ``%json`` with chatkit's bounds, a list's ``minItems`` / ``maxItems`` bound its
items. Each marker is a lexeme of its own, so a value's end and the next element's start
never share one. A schema this encoding cannot hold is refused by name
(``SchemaUnsupported``): free-form objects, a union with an object or list member (its
text could not be told from a string's). A null value is no element; read back, a required
parameter that can be null and is left out is null.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import SchemaUnsupported
from .gemma_values import resolved, union_members
from .lark_text import resolves_to_string, text_markup
from .py_values import RuleBuilder

__all__: list[str] = []

_WHO = "minimax-m3"


def tree_params(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
                path: str) -> str:
    """An object's elements in its properties' order, optional ones maybe ("" for none)."""
    props: dict[str, Any] = schema.get("properties", {})
    if schema.get("additionalProperties", False) is not False:
        raise SchemaUnsupported("additionalProperties", path or "/", "minimax-m3 arguments "
                                "are elements named by the schema: only declared properties")
    required = set(schema.get("required", []))
    parts = []
    for j, key in enumerate(props):
        if not key or ">" in key:
            raise SchemaUnsupported("properties", f"{path}/{key}", "a minimax-m3 element is "
                                    "named <key>: an empty name or one holding '>' cannot be "
                                    "read")
        sub = resolved(props[key], defs, f"{path}/{key}", _WHO)
        if _only_null(sub):
            continue  # left out, as the template leaves a null value out; read back as null
        value = value_rule(b, f"{name}_{j}", sub, defs, f"{path}/{key}")
        one = f"{_open(b, key)} {value} {b.lit(f'</{key}>')}"
        # a nullable value may also be left out
        parts.append(one if key in required and not _nullable(sub) else f"({one})?")
    return b.add(name, " ".join(parts)) if parts else ""


def value_rule(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
               path: str) -> str:
    """One value and the marker after it (where its element's closing tag begins)."""
    mark = b.lit(b.dialect.args.value_close)
    if _only_null(schema):  # a list's null item: nothing between its tags
        return mark
    if resolves_to_string(schema):
        values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if values:
            return b.add(name, " | ".join(f"{text_markup(v) if v else ''} {mark}".strip()
                                          for v in values))
        return b.raw_value(b.dialect.args.value_close, schema)
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values:
        return b.add(name, " | ".join(f"{_literal(v)} {mark}" if v is not None else mark
                                      for v in values))
    kind = schema.get("type")
    if isinstance(kind, list) or isinstance(schema.get("anyOf"), list):
        return _union(b, name, schema, defs, path)
    if kind == "boolean":
        return b.add(name, f'("true" | "false") {mark}')
    if kind in ("integer", "number"):
        return f"{b.json_value(name, schema)} {mark}"
    if kind == "array":
        return _array(b, name, schema, defs, path)
    if kind == "object":
        inner = tree_params(b, f"{name}_o", schema, defs, path)
        return f"{inner} {mark}" if inner else mark
    raise SchemaUnsupported("type", path, f"minimax-m3 arguments cannot write {kind!r}")


def _open(b: RuleBuilder, key: str) -> str:
    """An element's opening: the marker, then ``<key>`` (two lexemes)."""
    a = b.dialect.args
    tag = a.key_open[len(a.value_close):] + key + a.key_close
    return f"{b.lit(a.value_close)} {b.lit(tag)}"


def _literal(value: Any) -> str:
    return text_markup("true" if value is True else "false" if value is False else str(value))


def _union(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
           path: str) -> str:
    """``type: [...]`` or ``anyOf`` of scalars: any member's value (null left out)."""
    members = [resolved(m, defs, path, _WHO) for m in union_members(schema)]
    nullable = any(_only_null(m) for m in members)  # empty where it is a list's item
    members = [m for m in members if not _only_null(m)]
    if any(m.get("type") in ("object", "array") for m in members) and len(members) > 1:
        raise SchemaUnsupported("anyOf", path, "minimax-m3 writes an object or a list as "
                                "elements and a string raw: a union of them cannot be read")
    alts = [value_rule(b, f"{name}_{k}", m, defs, f"{path}/anyOf/{k}")
            for k, m in enumerate(members)]
    return b.add(name, " | ".join(alts + ([b.lit(b.dialect.args.value_close)] if nullable
                                          else [])) or '""')


def _array(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
           path: str) -> str:
    if not isinstance(schema.get("items"), dict):
        raise SchemaUnsupported("items", path, "minimax-m3 lists need an items schema")
    mark = b.lit(b.dialect.args.value_close)
    lo, hi = schema.get("minItems", 0), schema.get("maxItems")
    if hi == 0:
        return mark
    item_schema = resolved(schema["items"], defs, f"{path}/items", _WHO)
    item = value_rule(b, f"{name}_i", item_schema, defs, f"{path}/items")
    one = b.add(f"{name}_e", f"{_open(b, 'item')} {item} {b.lit('</item>')}")
    return b.add(name, f"{one}{{{lo},{'' if hi is None else hi}}} {mark}")


def _only_null(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null" or schema.get("const", 0) is None or \
        schema.get("enum") == [None]


def _nullable(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return (isinstance(kind, list) and "null" in kind) or any(
        isinstance(o, dict) and _only_null(o) for o in schema.get("anyOf", ())) or \
        None in schema.get("enum", ())


# ------------------------------------------------------------------ reading
class TreeMismatch(ValueError):
    """The text is not MiniMax M3 arguments under the schema (``pos``: where; ``wanted``)."""

    def __init__(self, pos: int, wanted: str) -> None:
        super().__init__(f"expected {wanted!r} at {pos}")
        self.pos, self.wanted = pos, wanted


def read_tree_args(text: str, pos: int, schema: Any, args: Any, *,
                   partial: bool = False) -> tuple[dict[str, Any], int]:
    """The arguments from ``pos`` typed by ``schema`` (a parameter that is null left out is
    None where required), and where they end; ``partial``: the top-level ones complete so
    far. Raises ``TreeMismatch``."""
    schema = schema if isinstance(schema, dict) else {}
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    return _read_object(text, pos, schema, defs, args, partial)


def _read_object(text: str, pos: int, schema: dict[str, Any], defs: dict[str, Any],
                 a: Any, partial: bool = False) -> tuple[dict[str, Any], int]:
    props = schema.get("properties", {})
    out: dict[str, Any] = {}
    closing = a.value_close + "</"
    while text.startswith(a.key_open, pos) and not text.startswith(closing, pos):
        try:
            start = pos + len(a.key_open)
            end = text.find(a.key_close, start)
            if end < 0:
                raise TreeMismatch(start, a.key_close)
            key = text[start:end]
            sub = resolved(props.get(key, {"type": "string"}), defs, f"/{key}", _WHO)
            value, pos = _read_value(text, end + len(a.key_close), sub, defs, a)
            tag = f"{closing}{key}{a.key_close}"
            if not text.startswith(tag, pos):
                raise TreeMismatch(pos, tag)
            pos += len(tag)
        except TreeMismatch:
            if partial:
                return out, pos
            raise
        out[key] = value
    for key, sub in props.items():  # written as nothing
        if key not in out and key in schema.get("required", []) and isinstance(sub, dict) \
                and (_only_null(sub) or _nullable(sub)):
            out[key] = None
    return out, pos


def _read_value(text: str, pos: int, schema: dict[str, Any], defs: dict[str, Any],
                a: Any) -> tuple[Any, int]:
    kinds = _kinds(schema, defs)
    if kinds & {"object", "array"} and text.startswith(a.key_open, pos) and \
            not text.startswith(a.value_close + "</", pos):
        if "array" in kinds:
            items = resolved(schema.get("items", {"type": "string"}), defs, "/items", _WHO)
            out = []
            head = f"{a.key_open}item{a.key_close}"
            tail = f"{a.value_close}</item{a.key_close}"
            while text.startswith(head, pos):
                value, pos = _read_value(text, pos + len(head), items, defs, a)
                if not text.startswith(tail, pos):
                    raise TreeMismatch(pos, tail)
                out.append(value)
                pos += len(tail)
            return out, pos
        return _read_object(text, pos, schema, defs, a)
    stop = text.find(a.value_close, pos)
    if stop < 0:
        raise TreeMismatch(pos, a.value_close)
    raw = text[pos:stop]
    if not raw and "array" in kinds:
        return [], stop
    if not raw and "object" in kinds:  # its required nullable members are null
        return _read_object(text, pos, schema, defs, a)
    if not raw and "null" in kinds and "string" not in kinds:
        return None, stop  # a list's null item (a string where one may be: written alike)
    return _scalar(raw, kinds, schema, pos), stop


def _kinds(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The JSON types a value under ``schema`` may have."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list):
        return {"boolean" if isinstance(v, bool) else "integer" if isinstance(v, int) else
                "number" if isinstance(v, float) else "string" if isinstance(v, str) else
                "null" for v in values}
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return set(kind)
    out: set[str] = set()
    for option in schema.get("anyOf", ()):
        if isinstance(option, dict):
            out |= _kinds(resolved(option, defs, "", _WHO), defs)
    return out or {"string"}


def _scalar(raw: str, kinds: set[str], schema: dict[str, Any], pos: int) -> Any:
    if "boolean" in kinds and raw in ("true", "false"):
        return raw == "true"
    if kinds & {"integer", "number"}:
        try:
            number = json.loads(raw)
        except ValueError:
            number = None
        if isinstance(number, int | float) and not isinstance(number, bool) and (
                "number" in kinds or isinstance(number, int)):
            return number
    if "string" in kinds:
        return raw
    raise TreeMismatch(pos, f"a value of type {'/'.join(sorted(kinds))}")
