"""Python keyword arguments as grammar rules (``Args.kind == "python"``): ``k=v`` joined
by the dialect's separator, strings quoted as Python writes them (escapes included),
``True`` / ``False`` / ``None``, numbers and containers as JSON; the ``k=v`` list is shared
with Gemma 4's ``k:v`` (:mod:`.gemma_values`)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from ..errors import SchemaUnsupported
from .dialects import Dialect, json_tag
from .lark_text import RAW_STRING_MAX, regex_text, resolves_to_string, string_also, text_markup

__all__: list[str] = []

ANNOTATIONS = frozenset({"description", "title", "examples", "$comment"})
"""Schema keywords that say nothing about which values are valid."""


class RuleBuilder(Protocol):
    """What value rules are made with (here, in ``gemma_values`` and ``tree_values``): the
    tool-grammar builder (``grammar._Builder``)."""

    dialect: Dialect
    rules: list[str]

    def add(self, name: str, body: str) -> str: ...
    def lit(self, text: str) -> str: ...
    def json_value(self, name: str, schema: dict[str, Any]) -> str: ...
    def raw_value(self, close: str, schema: dict[str, Any]) -> str: ...
    def py_params(self, name: str, items: list[tuple[str, str, bool]]) -> str: ...


def py_params(b: RuleBuilder, name: str, items: list[tuple[str, str, bool]]) -> str:
    """``k=v`` joined by the separator: required ones always, optional ones maybe, no
    separator before the first one written. ``r_i``: items i.. after something was
    written; ``f_i``: items i.. with nothing written yet (linear in size)."""
    sep = b.lit(b.dialect.args.separator)
    assign = ":" if b.dialect.args.kind == "gemma" else "="
    kws = [f"{text_markup(k + assign)} {v}" for k, v, _ in items]
    n = len(items)
    for i in range(n - 1, -1, -1):
        rest = f" {name}_r{i + 1}" if i + 1 < n else ""
        one = f"{sep} {kws[i]}"
        b.add(f"{name}_r{i}", (one if items[i][2] else f"({one})?") + rest)
        first = f"{kws[i]}{rest}"
        if not items[i][2]:
            later = f"{name}_f{i + 1}" if i + 1 < n else '""'
            first = f"{first} | {later}"
        b.add(f"{name}_f{i}", first)
    return f"{name}_f0" if n else ""


def py_value(b: RuleBuilder, name: str, schema: Any) -> str:
    quote = b.dialect.args.quote
    if resolves_to_string(schema):
        values = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if values:
            return b.add(name, " | ".join(
                text_markup(py_literal(v, quote)) for v in values))
        q = regex_text(quote)
        span = f"{{{schema.get('minLength', 0)},{schema.get('maxLength', RAW_STRING_MAX)}}}"
        terminal = name.upper()
        also = string_also(schema)
        if also:  # the text as written is the value: no escapes
            b.rules.append(f"{terminal}: /[^{q}\\\\\\n\\r\\x00]{span}/{also}")
            return b.add(name, f"{text_markup(quote)} {terminal} {text_markup(quote)}")
        b.rules.append(f"{terminal}: /{q}(?:[^{q}\\\\\\n\\r\\x00]|{PY_ESCAPE}){span}{q}/")
        return terminal
    kind = schema.get("type") if isinstance(schema, dict) else None
    values = schema.get("enum", [schema["const"]] if "const" in schema else None) \
        if isinstance(schema, dict) else None
    if isinstance(values, list) and values:  # a mixed enum, each in Python's spelling
        return b.add(name, " | ".join(text_markup(
            py_literal(v, quote) if isinstance(v, str) else "None" if v is None
            else str(v) if isinstance(v, bool) else json.dumps(v)) for v in values))
    if kind == "boolean":
        return b.add(name, '"True" | "False"')
    if kind == "null":
        return b.add(name, '"None"')
    members = simple_union(schema)
    if members:  # Optional[str] and friends: each member in Python's spelling
        return b.add(name, " | ".join(py_value(b, f"{name}_{k}", m)
                                         for k, m in enumerate(members)))
    return b.json_value(name, schema if isinstance(schema, dict) else {})


SIMPLE = ("string", "null", "boolean", "integer", "number")


def simple_union(schema: Any) -> list[dict[str, Any]]:
    """The members of a union of simple types (``type: [string, null]``, or an ``anyOf``
    of simple schemas), each a schema of its own; [] for anything else."""
    if not isinstance(schema, dict):
        return []
    kinds = schema.get("type")
    if isinstance(kinds, list) and len(kinds) > 1 and all(k in SIMPLE for k in kinds):
        rest = {k: v for k, v in schema.items() if k != "type"}
        return [{**rest, "type": k} if k == "string" else {"type": k} for k in kinds]
    options = schema.get("anyOf")
    if isinstance(options, list) and len(options) > 1 and set(schema) <= {
            "anyOf", *ANNOTATIONS, "default"} and all(
            isinstance(o, dict) and o.get("type") in SIMPLE and "enum" not in o
            for o in options):
        return list(options)
    return []


PY_ESCAPE = (r"\\[\\'\"abfnrtv]|\\x[0-9a-fA-F]{2}"
             r"|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"
             r"|\\U(?:0000(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"
             r"|000[1-9a-fA-F][0-9a-fA-F]{4}|0010[0-9a-fA-F]{4})")
"""One escape in a Python string literal, as a regex: those ``ast`` reads as one character
and UTF-8 can hold (no ``\\N{...}``, no octal, no lone surrogate, nothing above U+10FFFF),
so a ``maxLength`` counts characters, not the escaped source."""


def py_literal(value: str, quote: str) -> str:
    body = json.dumps(value, ensure_ascii=False)[1:-1]
    if quote == "'":
        body = body.replace('\\"', '"').replace("'", "\\'")
    return f"{quote}{body}{quote}"


_TAGS = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
         "null": "null", "object": "object", "array": "array"}


def typed_members(schema: Any, defs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A parameter's schema split by the JSON type of its values, as a key that says its
    value's type needs it (Kimi K3): ``(tag, schema of the values with that tag)``, tags as
    :func:`.dialects.json_tag` writes them, each schema with ``defs`` for its references.
    Raises ``SchemaUnsupported`` where the split is not known (``allOf``, ``not``, ...)."""
    if not isinstance(schema, dict) or not (set(schema) - ANNOTATIONS - {"default"}):
        return [(tag, {"type": kind, **defs}) for kind, tag in _TAGS.items() if kind != "integer"]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        where, _, name = ref[2:].partition("/")
        if name in defs.get(where, {}) and len(set(schema) - ANNOTATIONS) == 1:
            return typed_members(defs[where][name], defs)
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list):
        groups: dict[str, list[Any]] = {}
        for v in values:
            groups.setdefault(json_tag(v), []).append(v)
        return [(tag, {"enum": vs}) for tag, vs in groups.items()]
    kinds = schema.get("type")
    if isinstance(kinds, str | list) and kinds:
        rest = {k: v for k, v in schema.items() if k != "type"}
        tags: dict[str, list[str]] = {}
        for kind in [kinds] if isinstance(kinds, str) else kinds:
            tags.setdefault(_TAGS[kind], []).append(kind)
        return [(tag, {**rest, **defs, "type": ks[0] if len(ks) == 1 else ks})
                for tag, ks in tags.items()]
    options = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(options, list) and options and set(schema) <= {
            "anyOf", "oneOf", *ANNOTATIONS, "default"}:
        merged: dict[str, list[dict[str, Any]]] = {}
        for option in options:
            for tag, sub in typed_members(option, defs):
                merged.setdefault(tag, []).append(sub)
        key = "oneOf" if "oneOf" in schema else "anyOf"
        return [(tag, subs[0] if len(subs) == 1 else {key: subs, **defs})
                for tag, subs in merged.items()]
    raise SchemaUnsupported("type", "", "a key that says its value's type (Kimi K3) needs the "
                            "type of every value the schema allows: give 'type', 'enum', "
                            "'const' or an 'anyOf' of such schemas")
