"""Refusals before the first token, and grammar behaviour with llguidance's byte tokenizer.

No model here: the grammar tests use ``LLTokenizer("byte")`` (one token per byte).
"""

from __future__ import annotations

import json
import subprocess
import sys
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
from chatkit.grammar.schema import compile_json_schema, load_schema

from .conftest import ROOT

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
        ({"$schema": 5, "type": "string"}, "/$schema"),
    ],
)
def test_non_schema_is_schema_invalid(schema: Any, path: str) -> None:
    with pytest.raises(SchemaInvalid) as info:
        Constraint.json_schema(schema)
    assert info.value.path == path


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"$ref": "https://example.com/remote.json"}, "$ref", "/$ref"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
         "$ref", "/properties/a/$ref"),
    ],
)
def test_unsupported_keyword_is_refused_with_its_path(schema: Any, keyword: str, path: str) -> None:
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema(schema)
    assert info.value.keyword == keyword
    assert info.value.path == path


def test_property_named_like_a_keyword_is_not_a_keyword() -> None:
    """A property called "not" is data: the check is the real keyword's, at its place."""
    schema = {"type": "object", "properties": {"not": {"type": "array", "uniqueItems": True}}}
    checks = Constraint.json_schema(schema).checks
    assert checks is not None
    assert checks.relaxed == {"/properties/not": ("uniqueItems",)}
    assert [(c.pattern, c.pointer) for c in checks.checks] == [(("not",), "/properties/not")]


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
    # the reader checks Pydantic's schema as written (no decision: extra keys are valid)
    assert "additionalProperties" not in load_schema(Outer).doc


def test_open_objects_are_closed_for_generation_and_read_as_written() -> None:
    """One rule for dicts, Pydantic models, the CLI and the server: an object with no
    ``additionalProperties`` decision is closed in the grammar; the reader keeps the schema
    as written."""
    open_ = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    g = json_grammar(open_)
    assert accepts(g, '{"x":1}') and not accepts(g, '{"x":1,"y":2}')
    assert accepts(json_grammar({**open_, "additionalProperties": True}), '{"x":1,"y":2}')
    loaded = load_schema(open_)
    assert loaded.doc == open_ and "additionalProperties" not in open_  # not mutated
    loaded.reader().read('{"x":1,"y":2}')  # the schema as written admits extra keys


def test_closing_leaves_alone_what_it_would_change() -> None:
    obj = {"type": "object", "properties": {"a": {"type": "integer"}}}
    both = {"allOf": [obj, {"type": "object", "properties": {"b": {"type": "integer"}}}]}
    assert accepts(json_grammar(both), '{"a":1,"b":2}')  # each branch closed would refuse it
    undeclared = {**obj, "required": ["a", "z"]}
    assert accepts(json_grammar(undeclared), '{"a":1,"z":2}')
    patterned = {**obj, "patternProperties": {"^p": {"type": "integer"}}}
    assert accepts(json_grammar(patterned), '{"a":1,"q":2}')
    refs = {"$defs": {"A": obj, "B": {"type": "object", "properties": {"b": {"type": "integer"}}}},
            "allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    assert accepts(json_grammar(refs), '{"a":1,"b":2}')  # branches reached by $ref too
    nested = {"type": "object", "properties": {"in": obj}}
    g = json_grammar(nested)
    assert not accepts(g, '{"in":{"a":1,"b":2}}') and not accepts(g, '{"in":{},"z":1}')


# ------------------------------------------------------- meta-schema fast check
_META_BASES: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x+$", "minLength": 1},
                                      "b": {"type": ["integer", "null"], "minimum": 0},
                                      "c": {"enum": ["x", 1, None], "default": "x"},
                                      "d": {"type": "array", "items": {"$ref": "#/$defs/n"},
                                            "maxItems": 3, "uniqueItems": False}},
     "required": ["a"], "additionalProperties": False,
     "$defs": {"n": {"type": "number", "exclusiveMaximum": 5, "multipleOf": 0.5}}},
    {"anyOf": [{"type": "string", "format": "date"}, {"const": [1, {"a": True}]}],
     "definitions": {"x": {"allOf": [{"title": "t"}, {"description": "d"}]}}},
    {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
     "properties": {"n": {"type": "number", "minimum": 1, "exclusiveMinimum": True}},
     "dependencies": {"n": ["m"]}, "required": ["n"]},
    {"$schema": "http://json-schema.org/draft-06/schema#", "type": "array",
     "items": [{"type": "string"}, {"type": "boolean"}], "additionalItems": False,
     "contains": {"const": "x"}},
]
# Values that corrupt a schema in the ways the meta-schemas care about: wrong types, integers
# written as floats, duplicates, bad regexes, negative counts, containers under uniqueItems.
_JUNK: list[Any] = [-1, 1.5, 1.0, "(", None, True, {}, ["string", "string"], [1, 1.0], [1, True],
                    [{"a": 1}, {"a": 1}], "strin", {"type": 5}, {"exclusiveMinimum": True},
                    {"$ref": 1}]


def _slots(node: Any) -> list[tuple[Any, Any]]:
    """(container, key) of every value inside ``node``, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    out: list[tuple[Any, Any]] = []
    for key, value in list(items):
        out.append((node, key))
        if isinstance(value, dict | list):
            out += _slots(value)
    return out


def _corrupted() -> list[Any]:
    """Every base schema with each of its values, one at a time, replaced by each junk value."""
    out: list[Any] = []
    for base in _META_BASES:
        for node, key in _slots(base):
            for junk in _JUNK:
                saved = node[key]
                node[key] = junk
                out.append(json.loads(json.dumps(base)))
                node[key] = saved
    return out


def _refusal_of(doc: Any) -> tuple[str, str] | None:
    try:
        load_schema(doc)
    except SchemaInvalid as exc:
        return str(exc), exc.path
    return None


def test_fast_meta_check_agrees_with_jsonschema(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled meta-schema check never accepts what jsonschema refuses, so refusals keep
    jsonschema's message and JSON pointer; a valid schema is accepted without jsonschema."""
    import jsonschema

    from chatkit.grammar import meta_schema

    docs = _corrupted()
    assert len(docs) > 1000
    accepted = accepted_draft7 = 0
    for doc in docs:
        for cls in (jsonschema.Draft4Validator, jsonschema.Draft6Validator,
                    jsonschema.Draft7Validator):
            if meta_schema._surely_valid(cls, doc):
                accepted += 1
                assert meta_schema._meta_validator(cls).is_valid(doc), (cls.__name__, doc)
        if isinstance(doc, dict) and meta_schema._surely_valid_draft7(doc):  # without jsonschema
            accepted_draft7 += 1
            assert meta_schema._meta_validator(jsonschema.Draft7Validator).is_valid(doc), doc
    assert accepted > 500 and accepted_draft7 > 200  # the fast paths are taken, not just safe
    for base in _META_BASES:
        cls = jsonschema.validators.validator_for(base, default=jsonschema.Draft7Validator)
        assert meta_schema._surely_valid(cls, base)

    meta_schema._checked_keys.clear()
    fast = [_refusal_of(doc) for doc in docs]
    meta_schema._checked_keys.clear()
    monkeypatch.setattr(meta_schema, "_surely_valid", lambda cls, doc: False)
    monkeypatch.setattr(meta_schema, "_surely_valid_draft7", lambda doc: False)
    assert fast == [_refusal_of(doc) for doc in docs]  # same acceptance, message and pointer
    assert sum(r is not None for r in fast) > 100
    meta_schema._checked_keys.clear()


def test_draft7_check_without_jsonschema_reads_its_meta_schema() -> None:
    """The jsonschema-free draft-07 check: the meta-schema jsonschema uses, formats as it
    checks them here, and URI formats left to jsonschema when it could check them."""
    import jsonschema

    from chatkit.grammar import meta_schema

    assert meta_schema._draft7_meta() == jsonschema.Draft7Validator.META_SCHEMA
    checker = jsonschema.Draft7Validator.FORMAT_CHECKER
    formats = meta_schema._LocalFormats()
    assert formats.uri_checked == ("uri" in checker.checkers)
    for value in ["a+", "(", "[", "\\", 5, None, "x(?P<n>y)"]:
        assert formats.conforms(value, "regex") == checker.conforms(value, "regex"), value
    for value in ["http://x", "not a uri", "#/$defs/a"]:
        for fmt in ("uri", "uri-reference"):
            assert formats.conforms(value, fmt) is checker.conforms(value, fmt)
    formats.uri_checked = True  # e.g. rfc3987 installed: say False, jsonschema decides
    assert not formats.conforms("http://x", "uri")
    assert not formats.conforms("x", "date")


def test_a_schema_turn_imports_jsonschema_only_to_validate() -> None:
    """jsonschema is not on the path to the first token (a process's first schema turn)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from chatkit import Constraint, Model\n"
            "model = Model.load_vocab()\n"
            "Constraint.json_schema({'type': 'object', 'properties': {'a': {'type': 'string',"
            " 'pattern': '^x+$'}}, '$defs': {'b': {'type': 'integer'}}}, model=model)\n"
            "print('jsonschema' in sys.modules)\n"
            "from chatkit import SchemaInvalid\n"
            "try:\n"
            "    Constraint.json_schema({'type': 'string', 'pattern': '('}, model=model)\n"
            "except SchemaInvalid as exc:\n"
            "    print(exc.path, 'jsonschema' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["False", "/pattern", "True"]


# ------------------------------------------------------------- number bound
PLAIN_NUMBERS = {
    "type": "object",
    "properties": {"a": {"type": "number", "description": "a"}, "b": {"type": "integer"},
                   "c": {"type": ["number", "null"]},
                   "d": {"type": "array", "items": {"type": "number"}},
                   "e": {"type": "number", "minimum": 0}},
    "required": ["a", "b"],
}


def test_plain_numbers_share_one_bounded_definition() -> None:
    """Root documents: a number or integer with nothing but its type uses one bounded
    definition per kind; the bound holds everywhere, and the reader sees the schema as written."""
    g = json_grammar(PLAIN_NUMBERS)
    assert "__chatkit_number" in g and "__chatkit_integer" in g
    assert accepts(g, '{"a":999999999999999,"b":-999999999999999,"c":null,"d":[1.5,-2]}')
    assert accepts(g, '{"a":999999999999999.5,"b":0,"c":0.000001}')  # 15 integer digits
    assert accepts(g, '{"a":-1.25,"b":1,"e":999999999999999}')
    for bad in ('{"a":1000000000000000,"b":0}', '{"a":0,"b":1000000000000000}',
                '{"a":0,"b":0,"c":-1000000000000000}', '{"a":0,"b":0,"d":[1.1234567]}',
                '{"a":0,"b":0,"e":1000000000000000}', '{"a":0,"b":1.5}', '{"a":0,"b":0,"c":"x"}'):
        assert not accepts(g, bad), bad
    c = Constraint.json_schema(PLAIN_NUMBERS)
    assert c.source is not None and c.reader is not None
    assert "$defs" not in c.source and c.reader.schema == PLAIN_NUMBERS
    assert c.reader.read('{"a":1e300,"b":12345678901234567890}')["b"] == 12345678901234567890


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "number"}, {"type": "string"}]},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "number"}}}, {"required": ["a"]}]},
    {"type": "object", "properties": {"a": {"type": "number"}},
     "$defs": {"__chatkit_number": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"$id": "http://example.com/a", "type": "object",
                                            "properties": {"n": {"type": "number"}}}}},
])
def test_numbers_are_bounded_in_place_where_sharing_is_unsafe(schema: dict[str, Any]) -> None:
    """Under oneOf/allOf, with a nested base URI, or with the name taken: the bound is written
    into each number instead, as before."""
    g = json_grammar(schema)
    assert '"$ref": "#/$defs/__chatkit_number"' not in g
    assert "1e15" in g or "1000000000000000" in g


def test_bound_numbers_copies_only_what_it_changes() -> None:
    from chatkit.grammar.schema import bound_numbers

    no_numbers = {"type": "object", "properties": {"s": {"type": "string"}}}
    assert bound_numbers(no_numbers) is no_numbers
    before = json.dumps(PLAIN_NUMBERS)
    bounded = bound_numbers(PLAIN_NUMBERS)  # embedded use (tool arguments): no $ref added
    assert json.dumps(PLAIN_NUMBERS) == before and "$defs" not in bounded
    assert bounded["properties"]["a"]["exclusiveMaximum"] == 1e15
    assert bounded["properties"]["b"]["maximum"] == 999999999999999
    assert bound_numbers(PLAIN_NUMBERS, None) is PLAIN_NUMBERS
