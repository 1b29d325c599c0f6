"""Number bounds: the digits a grammar lets the model write in a number field.

:func:`bound_numbers` adds, to a copy of a schema, the bound ``NUMBER_DIGITS`` describes
wherever a number or integer subschema sets none of its own. Only the grammar is bounded;
the second reader checks the schema as written.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .schema_walk import is_number, walk

__all__: list[str] = []

NUMBER_DIGITS = (15, 6)
"""The default bound on a number the grammar lets the model write: at most 15 integer digits
and 6 fractional digits (floats), so a number field always ends; a small model otherwise
writes ``1.0000...`` or ``1000000...`` until ``max_tokens``. Applied to the grammar only (the
second reader checks the schema as written); a schema's own ``multipleOf``, ``minimum`` and
``maximum`` take precedence. ``None`` (per constraint) turns it off."""

Digits = tuple[int, int] | None

# The shared bounded definitions bound_numbers(root=True) adds to ``$defs``, per kind.
_SHARED_NUMBERS = {"number": "__chatkit_number", "integer": "__chatkit_integer"}
_ANY = "__chatkit_any"
ANY_STRING_MAX = 1024
"""Characters a string may hold where the schema leaves the value untyped (``{}``, an open
object's extra values, ``items`` unset, ``json_object``): with unbounded numbers, the one
place a small model could write until ``max_tokens``. Grammar only, as the digit bound."""
# Where a subschema is a value (an untyped one there admits any JSON value).
_VALUE_PLACES = frozenset({"properties", "items", "additionalProperties", "prefixItems",
                           "anyOf", "$defs", "definitions", "patternProperties"})
# Every JSON Schema keyword (drafts 4 to 2020-12) but the pure annotations, and llguidance's
# own: a number subschema with none of these but ``type`` may use the shared definition
# (llguidance ignores other keys).
_KEYWORDS = frozenset("""$schema $id id $ref $defs definitions $anchor $dynamicRef
$dynamicAnchor $recursiveRef $recursiveAnchor $vocabulary type enum const multipleOf maximum
exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern items additionalItems
prefixItems contains minContains maxContains maxItems minItems uniqueItems unevaluatedItems
properties patternProperties additionalProperties unevaluatedProperties propertyNames required
dependentRequired dependentSchemas dependencies maxProperties minProperties allOf anyOf oneOf
not if then else format contentEncoding contentMediaType contentSchema x-guidance""".split())


def bound_numbers(schema: Any, digits: Digits = NUMBER_DIGITS, *, root: bool = False) -> Any:
    """A copy of ``schema`` whose number and integer subschemas carry the digit bound (see
    ``NUMBER_DIGITS``) where the schema sets none; ``schema`` itself is not changed (and is
    returned as is when it has no number to bound).

    ``root=True``, for a whole document (its ``#`` pointers resolve against it): a number or
    integer subschema with no keyword but ``type`` becomes a ``$ref`` to one bounded
    definition per kind, added to ``$defs`` (llguidance builds a bounded number's lexer once
    per definition, not per use). Not under ``oneOf``/``allOf``, nor in a
    document with nested base URIs (``$id``) or the names already taken."""
    if digits is None or not isinstance(schema, dict):
        return schema
    found = survey_of(schema)
    if found.numbers or (root and found.anys):
        return bounded(schema, digits, found, share=root)
    return schema


class Survey(NamedTuple):
    """What compiling a schema document needs to know about it (one walk)."""

    refs: bool
    """A ``$ref`` or ``$dynamicRef``: the language may be empty (a cycle with no base case)."""
    numbers: bool
    """Number or integer subschemas: the digit bound applies."""
    nested_ids: bool
    """A subschema sets its own base URI (``$id``, draft-04 ``id``)."""
    anys: bool = False
    """Values the schema leaves untyped: any JSON there, numbers and strings unbounded."""
    intersects: bool = False
    """A subschema llguidance intersects: ``anyOf``/``allOf``/``oneOf`` or ``$ref`` beside
    other keywords."""


_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples",
                          "deprecated", "readOnly", "writeOnly"})


_COMBINED = frozenset({"anyOf", "allOf", "oneOf", "$ref"})


def survey_of(schema: dict[str, Any]) -> Survey:
    """What ``schema`` holds that compiling it must know (one walk)."""
    refs = numbers = nested_ids = anys = composed = intersects = False
    for path, node in walk(schema, ""):
        refs = refs or "$ref" in node or "$dynamicRef" in node
        numbers = numbers or bool(_number_kinds(node))
        anys = anys or _untyped(path, node) is not None
        composed = composed or bool({"allOf", "oneOf", "not"} & set(node)) or (
            "$ref" in node and len(set(node) - _ANNOTATIONS) > 1)  # $ref + siblings: allOf
        keys = set(node) - _ANNOTATIONS
        intersects = intersects or (len(keys) > 1 and bool(keys & _COMBINED))
        if path and ("$id" in node or isinstance(node.get("id"), str)):
            nested_ids = True
    # under allOf / oneOf / not (directly or through a $ref), a bounded "any" changes what
    # the branches mean together, and llguidance's intersections balk at it: left as is
    return Survey(refs, numbers, nested_ids, anys and not composed, intersects)


def _untyped(path: str, node: dict[str, Any]) -> str | None:
    """Where ``node`` leaves a value untyped: ``"self"`` (no keyword at all, in a value
    place), ``"additionalProperties"`` (an open object) or ``"items"`` (an array without
    items); None elsewhere, and under ``allOf``/``oneOf``/``not`` (meaning would change)."""
    if any(f"/{k}" in path for k in ("allOf", "oneOf", "not", "if", "then", "else")):
        return None
    parts = path.split("/")
    place = parts[-2] if len(parts) >= 3 and parts[-2] in _VALUE_PLACES else parts[-1]
    if (path == "" or place in _VALUE_PLACES) and not any(k in _KEYWORDS for k in node):
        return "self"
    kind = node.get("type")
    if kind == "object" and node.get("additionalProperties", True) in (True, {}) and not \
            {"patternProperties", "unevaluatedProperties"} & set(node):
        return "additionalProperties"
    if kind == "array" and node.get("items", True) in (True, {}) and not \
            {"unevaluatedItems", "additionalItems"} & set(node):
        return "items"
    return None


def _number_kinds(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return {k for k in kinds if k == "number" or k == "integer"}


def bounded(schema: dict[str, Any], digits: tuple[int, int], survey: Survey, *,
            share: bool) -> dict[str, Any]:
    """A bounded copy of ``schema`` (``survey``: its :func:`survey_of`); ``share``: plain
    number subschemas use the shared definitions where the document allows (see
    :func:`bound_numbers`)."""
    copy: dict[str, Any] = json.loads(json.dumps(schema))
    defs = copy.get("$defs", {})
    share = share and not survey.nested_ids and isinstance(defs, dict) and \
        defs.keys().isdisjoint(_SHARED_NUMBERS.values())
    shared: set[str] = set()
    anys = share and survey.anys and _ANY not in defs
    if anys:
        ref = {"$ref": f"#/$defs/{_ANY}"}
        for path, node in list(walk(copy, "")):
            where = _untyped(path, node)
            if where == "self":
                node.update(ref)
            elif where is not None:
                node[where] = dict(ref)
    for path, node in list(walk(copy, "")):
        kinds = _number_kinds(node)
        if not kinds or "enum" in node or "const" in node:
            continue
        if share and _plain_type(node) and "/oneOf/" not in path and "/allOf/" not in path:
            shared.add(_use_shared_number(node, kinds))
        else:
            _bound_in_place(node, kinds, digits)
    if shared or anys:
        copy["$defs"] = {**defs, **{_SHARED_NUMBERS[kind]: _number_bound(kind, digits)
                                    for kind in sorted(shared)}}
    if anys:
        copy["$defs"][_ANY] = _any_value(digits)
    return copy


def _any_value(digits: tuple[int, int]) -> dict[str, Any]:
    """Any JSON value, its numbers and strings bounded (the shared untyped definition)."""
    ref = {"$ref": f"#/$defs/{_ANY}"}
    return {"anyOf": [{"type": "null"}, {"type": "boolean"}, _number_bound("number", digits),
                      {"type": "string", "maxLength": ANY_STRING_MAX},
                      {"type": "array", "items": ref},
                      {"type": "object", "additionalProperties": ref}]}


def _plain_type(node: dict[str, Any]) -> bool:
    """Whether ``type`` (a name or a list of names) is the only keyword of ``node``."""
    kind = node["type"]
    names = kind if isinstance(kind, list) else [kind]
    return all(isinstance(k, str) for k in names) and \
        all(k == "type" or k not in _KEYWORDS for k in node)


def _use_shared_number(node: dict[str, Any], kinds: set[str]) -> str:
    """Make ``node`` a ``$ref`` to the shared definition (in an ``anyOf`` with its other
    types, if any); returns the kind used."""
    kind = "number" if "number" in kinds else "integer"  # ["integer", "number"] is a number
    ref = {"$ref": f"#/$defs/{_SHARED_NUMBERS[kind]}"}
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    others = [t for t in types if t not in ("number", "integer")]
    node.clear()
    if others:
        node["anyOf"] = [ref, {"type": others if len(others) > 1 else others[0]}]
    else:
        node.update(ref)
    return kind


def _number_bound(kind: str, digits: tuple[int, int]) -> dict[str, Any]:
    """The shared definition of a bounded number or integer."""
    bound: dict[str, Any] = {"type": kind}
    _bound_in_place(bound, {kind}, digits)
    return bound


def _bound_in_place(node: dict[str, Any], kinds: set[str], digits: tuple[int, int]) -> None:
    """Bound a number subschema's digits where it sets no bound of its own.

    Floats: strictly between -10**whole and 10**whole (at most ``whole`` integer digits; an
    exclusive float bound compiles faster in llguidance than ``10**whole - 1``);
    integers: within ±(10**whole - 1), the same set."""
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    if not all(v is None or is_number(v) for v in (low, high)):
        return  # not a real bound (e.g. data under an unknown keyword): leave it
    whole, fraction = digits
    limit = 10**whole - 1
    if "number" in kinds:
        node.setdefault("multipleOf", float(f"1e-{fraction}"))
        upper: tuple[str, float] = ("exclusiveMaximum", float(10**whole))
        lower: tuple[str, float] = ("exclusiveMinimum", -float(10**whole))
    else:
        upper, lower = ("maximum", limit), ("minimum", -limit)
    if high is None and (low is None or low < limit):
        node[upper[0]] = upper[1]
    if low is None and (high is None or high > -limit):
        node[lower[0]] = lower[1]
