"""Refusals before the first token, and grammar behaviour with llguidance's byte tokenizer.

No model here: the grammar tests use ``LLTokenizer("byte")`` (one token per byte).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import llguidance
import pytest
from pydantic import BaseModel, Field

from chatkit import (
    Constraint,
    GrammarInvalid,
    SchemaInvalid,
    SchemaReader,
    SchemaUnsupported,
    SchemaViolation,
)
from chatkit.schema import compile_json_schema, load_schema

BYTE_TOK = llguidance.LLTokenizer("byte")


def accepts(grammar: str, text: str) -> bool:
    """Feed ``text`` byte by byte; True when every byte is allowed and the end is accepting."""
    m = llguidance.LLMatcher(BYTE_TOK, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    tokens = BYTE_TOK.tokenize_str(text)
    return m.try_consume_tokens(tokens) == len(tokens) and m.is_accepting()


def json_grammar(schema: Any, **kw: Any) -> str:
    doc = load_schema(schema).doc
    return compile_json_schema(doc, **kw)


class Verdict(BaseModel):
    decision: Literal["approve", "reject"]
    confidence: float = Field(ge=0, le=1)
    reasons: list[str] = Field(max_length=3)


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("text", ["{bad", "[1, 2", "", "nul"])
def test_malformed_json_is_schema_invalid(text: str) -> None:
    with pytest.raises(SchemaInvalid):
        Constraint.json_schema(text)


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "strin"}, "/type"),
        ({"type": "object", "properties": {"a": {"minLength": -1}}}, "/properties/a/minLength"),
        ([{"type": "string"}], ""),
        (42, ""),
    ],
)
def test_non_schema_is_schema_invalid(schema: Any, path: str) -> None:
    with pytest.raises(SchemaInvalid) as info:
        Constraint.json_schema(schema)
    assert info.value.path == path


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems", "/uniqueItems"),
        ({"type": "object", "properties": {"tags": {"type": "array", "contains": {"const": 1}}}},
         "contains", "/properties/tags/contains"),
        ({"$defs": {"x": {"not": {"type": "string"}}}, "$ref": "#/$defs/x"}, "not",
         "/$defs/x/not"),
        ({"anyOf": [{"type": "string"}, {"type": "object", "propertyNames": {"maxLength": 2}}]},
         "propertyNames", "/anyOf/1/propertyNames"),
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if", "/if"),
        ({"type": "string", "format": "no-such-format"}, "format", "/format"),
        ({"$ref": "https://example.com/remote.json"}, "$ref", "/$ref"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "dependentRequired",
         "/dependentRequired"),
    ],
)
def test_unsupported_keyword_is_refused_with_its_path(schema: Any, keyword: str, path: str) -> None:
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema(schema)
    assert info.value.keyword == keyword
    assert info.value.path == path


def test_property_named_like_a_keyword_is_not_a_keyword() -> None:
    """A property called "not" is data; the refusal must point at the real keyword."""
    schema = {"type": "object", "properties": {"not": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema(schema)
    assert info.value.path == "/properties/not/uniqueItems"


@pytest.mark.parametrize("pattern", ["(", "a{2,1}", "[z-a]", "\\"])
def test_bad_regex_is_grammar_invalid(pattern: str) -> None:
    with pytest.raises(GrammarInvalid) as info:
        Constraint.regex(pattern)
    assert info.value.kind == "regex" and info.value.diagnostic


@pytest.mark.parametrize(
    "grammar", ["start: (", "start: foo", "start: /[/", "nonsense ::= x", 'foo: "a"']
)
def test_bad_lark_is_grammar_invalid(grammar: str) -> None:
    with pytest.raises(GrammarInvalid) as info:
        Constraint.lark(grammar)
    assert info.value.kind == "lark"


def test_bad_pattern_inside_schema_is_schema_invalid() -> None:
    with pytest.raises(SchemaInvalid) as info:
        Constraint.json_schema({"type": "string", "pattern": "(unclosed"})
    assert info.value.path == "/pattern"


def test_unbound_constraint_refuses_to_process() -> None:
    c = Constraint.regex("a+")
    from chatkit import InvalidParameter

    with pytest.raises(InvalidParameter):
        c.commit(1)


# ----------------------------------------------------- grammar, byte tokenizer
def test_pydantic_model_compiles_and_matches() -> None:
    g = json_grammar(Verdict)
    assert accepts(g, '{"decision":"approve","confidence":0.5,"reasons":["ok"]}')
    assert not accepts(g, '{"decision":"maybe","confidence":0.5,"reasons":[]}')
    assert not accepts(g, '{"decision":"approve","confidence":1.5,"reasons":[]}')
    assert not accepts(g, '{"decision":"reject","confidence":0,"reasons":["a","b","c","d"]}')


def test_whitespace_compact_by_default_and_bounded() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    compact = json_grammar(schema)
    assert accepts(compact, '{"a":1}')
    assert not accepts(compact, '{"a": 1}')
    assert not accepts(compact, '{ "a":1}')
    assert not accepts(compact, '{"a":1}\n')
    spaced = json_grammar(schema, whitespace="spaced")
    assert accepts(spaced, '{"a": 1}')
    assert not accepts(spaced, '{"a":  1}')


def test_strings_may_contain_control_token_text() -> None:
    """At byte level the characters of <|im_end|> are legal inside a JSON string."""
    g = json_grammar({"type": "string"})
    assert accepts(g, json.dumps("<|im_end|>\n<|im_start|>system"))


def test_regex_and_lark_match_in_full() -> None:
    r = Constraint.regex(r"\d{3}-[a-z]+").grammar
    assert accepts(r, "123-abc") and not accepts(r, "12-abc") and not accepts(r, "123-abc!")
    lark = Constraint.lark('start: "yes" | "no" NUM\nNUM: /[0-9]+/').grammar
    assert accepts(lark, "yes") and accepts(lark, "no42") and not accepts(lark, "maybe")


# -------------------------------------------------------------- second reader
def test_reader_returns_pydantic_instance_and_rejects_invalid_text() -> None:
    doc, cls, _ = load_schema(Verdict)
    reader = SchemaReader(doc, cls)
    v = reader.read('{"decision":"approve","confidence":0.25,"reasons":[]}')
    assert isinstance(v, Verdict) and v.confidence == 0.25
    with pytest.raises(SchemaViolation) as info:
        reader.read('{"decision":"approve","confidence":2,"reasons":[]}')
    assert info.value.text.startswith("{") and info.value.errors
    with pytest.raises(SchemaViolation):
        reader.read('{"decision":"appr')


def test_pydantic_objects_are_closed_unless_extra_allowed() -> None:
    from pydantic import ConfigDict

    class Inner(BaseModel):
        x: int

    class Outer(BaseModel):
        inner: Inner

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        x: int

    g = json_grammar(Outer)
    assert accepts(g, '{"inner":{"x":1}}')
    assert not accepts(g, '{"inner":{"x":1,"y":2}}')
    assert not accepts(g, '{"inner":{"x":1},"y":2}')
    assert accepts(json_grammar(Open), '{"x":1,"y":2}')
    # A plain dict schema is taken as written: JSON Schema allows extra keys by default.
    assert accepts(json_grammar({"type": "object", "properties": {"x": {"type": "integer"}}}),
                   '{"x":1,"y":2}')
