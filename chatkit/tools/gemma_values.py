"""Gemma 4's arguments as grammar rules (``Args.kind == "gemma"``).

Gemma 4's template writes a call's arguments as ``key:value`` pairs in sorted key order
(Jinja's ``dictsort``), keys bare, a string as raw text between two ``<|"|>`` markers,
``true`` / ``false`` / ``None``, numbers as Python writes them, and lists and objects of such
values (``tags:[<|"|>a<|"|>],where:{city:<|"|>Oslo<|"|>}``). Nothing of it is JSON but the
numbers, so each value is a rule made from its schema here: a string's length, ``pattern``
and ``format`` bound its raw text (as for XML dialects: ``lark_text.string_regexes``),
numbers are ``%json`` with chatkit's bounds, an array's ``minItems``/``maxItems`` bound its
items. A schema keyword this encoding cannot enforce is refused by name
(``SchemaUnsupported``), never dropped.
"""

from __future__ import annotations

from typing import Any

from ..errors import SchemaUnsupported
from .dialects import gemma_order, gemma_value
from .lark_text import resolves_to_string, text_markup
from .py_values import RuleBuilder

__all__: list[str] = []


REFUSED = ("uniqueItems", "contains", "prefixItems", "oneOf", "allOf", "not", "if",
           "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
           "minProperties", "maxProperties")
"""Keywords a Gemma 4 value's grammar cannot enforce (``SchemaUnsupported``)."""


def gemma_params(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
                 path: str) -> str:
    """An object's ``key:value`` pairs in sorted key order, optional ones maybe ("" for
    none). Raises ``SchemaUnsupported`` for undeclared keys (``additionalProperties``) and
    a key holding ``:`` (where a key ends)."""
    props: dict[str, Any] = schema.get("properties", {})
    if schema.get("additionalProperties", False) is not False:
        raise SchemaUnsupported("additionalProperties", path or "/", "gemma-4 arguments are "
                                "written in sorted key order: only declared properties")
    for key in props:
        if ":" in key:
            raise SchemaUnsupported("properties", f"{path}/{key}", "a gemma-4 key ends at "
                                    "its ':'; a name holding one cannot be read")
    required = set(schema.get("required", []))
    items = [(key, value_rule(b, f"{name}_{j}", props[key], defs, f"{path}/{key}"),
              key in required) for j, key in enumerate(gemma_order(list(props)))]
    return b.py_params(name, items)


def value_rule(b: RuleBuilder, name: str, schema: Any, defs: dict[str, Any], path: str) -> str:
    """One value under ``schema`` (its ``$ref`` resolved in ``defs``)."""
    schema = resolved(schema, defs, path)
    if resolves_to_string(schema):
        return _string(b, name, schema)
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(values, list) and values:
        return b.add(name, " | ".join(_literal(b, v) for v in values))
    kind = schema.get("type")
    if isinstance(kind, list) or isinstance(schema.get("anyOf"), list):
        return _union(b, name, schema, defs, path)
    if kind == "boolean":
        return b.add(name, '"true" | "false"')
    if kind == "null":
        return b.add(name, '"None"')
    if kind in ("integer", "number"):
        return b.json_value(name, schema)
    if kind == "array":
        return _array(b, name, schema, defs, path)
    if kind == "object":
        pairs = gemma_params(b, f"{name}_o", schema, defs, path)
        return b.add(name, f'"{{" {pairs} "}}"' if pairs else '"{" "}"')
    raise SchemaUnsupported("type", path, f"gemma-4 arguments cannot write {kind!r}")


def resolved(schema: Any, defs: dict[str, Any], path: str, who: str = "gemma-4"
             ) -> dict[str, Any]:
    """``schema`` with its local ``$ref`` followed in ``defs``; ``SchemaUnsupported`` (naming
    ``who``, the dialect) for a missing definition, an untyped value or a keyword in
    ``REFUSED``."""
    table = {**defs.get("$defs", {}), **defs.get("definitions", {})}
    while isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"].rsplit("/", 1)[-1]
        if ref not in table:
            raise SchemaUnsupported("$ref", path, f"{schema['$ref']!r} is not a local "
                                    "definition")
        schema = table[ref]
    if not isinstance(schema, dict) or not schema:
        raise SchemaUnsupported("schema", path, f"{who} arguments need a typed value")
    for keyword in REFUSED:
        if keyword in schema:
            raise SchemaUnsupported(keyword, path, f"not enforced in {who} arguments")
    return schema


def _literal(b: RuleBuilder, value: Any) -> str:
    """A const/enum member as written (a string between quote markers, as tokens where
    the markers are)."""
    q = b.lit(b.dialect.args.quote)
    if isinstance(value, str):
        return f"{q} {text_markup(value)} {q}" if value else f"{q} {q}"
    return text_markup(gemma_value(value, b.dialect.args.quote))


def _string(b: RuleBuilder, name: str, schema: dict[str, Any]) -> str:
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if values:
        return b.add(name, " | ".join(_literal(b, v) for v in values))
    quote = b.dialect.args.quote
    return f"{b.lit(quote)} " + b.raw_value(quote, schema)


def _union(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
           path: str) -> str:
    """``type: [...]`` or ``anyOf``: any member's value."""
    return b.add(name, " | ".join(
        value_rule(b, f"{name}_{k}", m, defs, f"{path}/anyOf/{k}")
        for k, m in enumerate(union_members(schema))) or '""')


def union_members(schema: dict[str, Any]) -> list[Any]:
    """A ``type: [...]`` or ``anyOf`` schema's members, each with the rest of ``schema``."""
    kind = schema.get("type")
    if isinstance(kind, list):
        return [{**schema, "type": k} for k in kind]
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return [{**rest, **o} if isinstance(o, dict) else o for o in schema["anyOf"]]


def _array(b: RuleBuilder, name: str, schema: dict[str, Any], defs: dict[str, Any],
           path: str) -> str:
    if not isinstance(schema.get("items"), dict):
        raise SchemaUnsupported("items", path, "gemma-4 arrays need an items schema")
    lo, hi = schema.get("minItems", 0), schema.get("maxItems")
    if hi == 0:
        return b.add(name, '"[" "]"')
    item = value_rule(b, f"{name}_i", schema["items"], defs, f"{path}/items")
    more = "" if hi == 1 else \
        f' ("," {item}){{{max(lo - 1, 0)},{"" if hi is None else hi - 1}}}'
    body = f"{item}{more}"
    return b.add(name, f'"[" {body} "]"' if lo else f'"[" ({body})? "]"')
