"""Values a schema leaves untyped (``{}``, an open object's extra values, ``items`` unset,
``json_object``) are any JSON, and the digit bound holds there too: chatkit's own "any
value" definition (numbers of at most 15 integer digits, strings of at most
``ANY_STRING_MAX`` characters) replaces llguidance's unbounded one, in the grammar only."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatkit import Conversation, Model
from chatkit.grammar.schema import compile_json_schema
from chatkit.grammar.schema_numbers import ANY_STRING_MAX, bound_numbers

ASK = 'Reply with JSON holding the number 12345678901234567890123 and the word "ok".'
SHAPES = [{}, {"type": "object"}, {"type": "array"},
          {"type": "object", "properties": {"n": {}}, "required": ["n"]}]


def numbers(value: Any) -> list[float]:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int | float):
        return [value]
    items = value.values() if isinstance(value, dict) else value
    return [n for item in items for n in numbers(item)]


@pytest.mark.parametrize("schema", SHAPES, ids=["{}", "object", "array", "property {}"])
def test_every_number_has_at_most_15_integer_digits(smol: Model, schema: Any) -> None:
    reply = Conversation(smol, max_tokens=160).send(ASK, schema=schema)
    found = numbers(json.loads(reply.text))
    assert all(abs(n) < 10**15 for n in found), reply.text


def test_the_any_definition_bounds_numbers_and_strings() -> None:
    doc = bound_numbers({"type": "object"}, root=True)
    assert doc["additionalProperties"] == {"$ref": "#/$defs/__chatkit_any"}
    branches = doc["$defs"]["__chatkit_any"]["anyOf"]
    assert {"type": "string", "maxLength": ANY_STRING_MAX} in branches
    assert any(b.get("type") == "number" and "exclusiveMaximum" in b for b in branches)
    # meaning kept where bounding an untyped value would change it
    kept = {"allOf": [{"type": "object"}, {"required": ["a"]}]}
    assert bound_numbers(kept, root=True) == kept
    assert bound_numbers({}, digits=None, root=True) == {}  # the bound lifted: as it was
    compile_json_schema({"type": "array", "items": {}})  # compiles (a recursive definition)
