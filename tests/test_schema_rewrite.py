"""Valid schemas chatkit used to refuse, now enforced; keywords the grammar can say, said
by the grammar (the first generated character obeys); strings whose every end a check
refuses, rolled back instead of running to ``max_tokens``."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import numpy as np
import pytest

from chatkit import ChecksExhausted, Constraint, Conversation, Model, Truncated
from chatkit.grammar.regex_sets import without_lookarounds
from chatkit.grammar.schema import closed_objects
from chatkit.grammar.schema_rewrite import ecma_pattern


def accepts(c: Constraint, model: Model, value: Any) -> bool:
    return c.accepts(model.tokenize(json.dumps(value, separators=(",", ":")), special=False))


def allowed_after(c: Constraint, model: Model, prefix: str) -> list[bytes]:
    """The bytes of every token the constraint allows after ``prefix``."""
    c.reset()
    for t in model.tokenize(prefix, special=False):
        c.commit(t)
    row = np.zeros(model.n_vocab, dtype=np.float32)
    c.process(row, [])
    return [model.token_bytes(int(t)) for t in np.flatnonzero(row > -np.inf)]


# ----------------------------------------------------------- closing and composition
PETS = {"definitions": {
    "pets": {"type": "object", "properties": {"dog": {"type": "string"}},
             "required": ["dog"]},
    "morePets": {"allOf": [{"$ref": "#/definitions/pets"},
                           {"type": "object", "properties": {"horse": {"type": "string"}},
                            "required": ["horse"]}]}},
    "type": "object",
    "properties": {"pets": {"$ref": "#/definitions/pets"},
                   "morePets": {"$ref": "#/definitions/morePets"}},
    "required": ["pets", "morePets"]}
"""An object extended through allOf + $ref, defined before the extension: closing the base
on its own made the extension's required key unsatisfiable."""

SIBLINGS = {"$defs": {"base": {"type": "object", "properties": {"id": {"type": "integer"}},
                               "required": ["id"]}},
            "$ref": "#/$defs/base", "properties": {"name": {"type": "string"}},
            "required": ["id", "name"]}
"""A $ref with sibling properties: composition, as allOf is."""


SHAPE = {"type": "object", "properties": {"kind": {"enum": ["circle", "square"]}},
         "required": ["kind"], "oneOf": [
             {"properties": {"kind": {"const": "circle"},
                             "radius": {"type": "integer", "minimum": 1, "maximum": 99}},
              "required": ["radius"]},
             {"type": "object", "properties": {"kind": {"const": "square"},
                                               "side": {"type": "integer", "minimum": 1,
                                                        "maximum": 99}},
              "required": ["side"]}]}
"""Properties beside a oneOf whose branches require other keys (one branch typed as an
object, which closed apart would reject ``kind``): closing the outer object before the
branches were merged made ``radius`` and ``side`` unsatisfiable."""

KIND = {"type": "object", "properties": {"kind": {"type": "string", "maxLength": 8}},
        "required": ["kind"]}
ADDRESS = {"type": "object", "properties": {"street": {"type": "string", "maxLength": 9}},
           "required": ["street"]}


def _with(extra: dict[str, Any], base: dict[str, Any] = KIND) -> dict[str, Any]:
    return {**base, **extra}


@pytest.mark.parametrize(("schema", "valid", "invalid"), [
    (PETS, {"pets": {"dog": "a"}, "morePets": {"dog": "b", "horse": "c"}},
     {"pets": {"dog": "a"}, "morePets": {"dog": "b"}}),
    (SIBLINGS, {"id": 1, "name": "x"}, {"id": 1}),
    (SHAPE, {"kind": "square", "side": 2}, {"kind": "square", "radius": 2}),
    (_with({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}), {"kind": "k", "b": 1},
     {"kind": "k"}),
    (_with({"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}),
     {"kind": "k", "a": 1}, {"kind": "k", "a": "1"}),
    (_with({"if": {"properties": {"kind": {"const": "x"}}},
            "then": {"properties": {"n": {"type": "integer"}}, "required": ["n"]}}),
     {"kind": "x", "n": 1}, {"kind": "x"}),
    (_with({"dependentSchemas": {"kind": {"properties": {"n": {"type": "integer"}},
                                          "required": ["n"]}}}),
     {"kind": "x", "n": 1}, {"kind": "x", "n": "1"}),
    (_with({"dependentRequired": {"kind": ["n"]}}), {"kind": "x", "n": 1}, {"kind": "x"}),
    (_with({"properties": {"home": ADDRESS}, "required": ["home"],
            "anyOf": [{"properties": {"home": {"properties": {"zip": {"type": "integer"}},
                                               "required": ["zip"]}}}]}),
     {"home": {"street": "s", "zip": 1}}, {"home": {"street": "s"}}),
], ids=["allOf-ref", "ref-siblings", "oneOf-beside-properties", "anyOf-required",
        "allOf-beside-properties", "if-then-key", "dependentSchemas-key",
        "dependentRequired-key", "a-key-declared-beside-too"])
def test_composed_objects_are_not_closed_apart(smol: Model, schema: dict[str, Any],
                                               valid: Any, invalid: Any) -> None:
    c = Constraint.json_schema(schema, model=smol)
    assert accepts(c, smol, valid)
    assert not accepts(c, smol, invalid)


def test_bounded_numbers_inside_an_intersection_compile() -> None:
    # oneOf (read as anyOf for the grammar) beside type: shared number definitions made
    # llguidance's intersection stack overflow
    field = {"type": "object", "oneOf": [
        {"properties": {"type": {"type": "string", "enum": ["callback"]},
                        "value": {"type": "string"}, "options": {"type": "object"}}},
        {"properties": {"type": {"type": "string", "enum": ["field", "value"]},
                        "value": {"type": ["string", "null", "boolean", "number"]},
                        "options": {"type": "object"}}}]}
    schema = {"definitions": {"field": field}, "type": "object",
              "properties": {k: {"$ref": "#/definitions/field"} for k in "wxyz"},
              "required": ["w", "x"]}
    Constraint.json_schema(schema)


# ----------------------------------------------------------- ECMA-262 patterns
def test_ecma_escapes_are_translated() -> None:
    assert ecma_pattern(r"a\<b\>c") == "a<b>c"
    assert ecma_pattern(r"x[^]y") == r"x[\s\S]y"
    assert ecma_pattern(r"\\<") == r"\\<"  # an escaped backslash, then a plain <


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    (r"^a\<b$", "a<b", "ab"),  # ECMA: a literal <, Rust: a word boundary
    (r"^(?!x)[a-z]+(?<!q)$", "abc", "xab"),  # lookarounds
    (r"^(a|b)\1$", "aa", "ab"),  # a backreference
    (r"/^[0-9]{4}$/|^[0-9]+$", "12", "1a"),  # a mid-pattern $
], ids=["word-boundary", "lookaround", "backreference", "mid-dollar"])
def test_patterns_rust_reads_otherwise_are_enforced(smol: Model, pattern: str, good: str,
                                                    bad: str) -> None:
    c = Constraint.json_schema({"type": "string", "pattern": pattern}, model=smol)
    assert accepts(c, smol, good)
    assert not accepts(c, smol, bad)


def test_a_pattern_property_key_with_a_lookahead_is_enforced(smol: Model) -> None:
    schema = {"type": "object", "patternProperties": {"^(?!x)[a-z]+$": {"type": "integer"}},
              "additionalProperties": False}
    c = Constraint.json_schema(schema, model=smol)
    assert accepts(c, smol, {"ab": 1})
    assert not accepts(c, smol, {"xb": 1})
    assert not accepts(c, smol, {"ab": "s"})


def test_a_pattern_llguidance_cannot_decide_beside_a_length_is_checked(smol: Model) -> None:
    schema = {"type": "string", "pattern": "^([a-z][0-9])+$", "minLength": 10000}
    c = Constraint.json_schema(schema, model=smol)
    assert c.checks is not None and "pattern" in c.checks.keywords
    assert accepts(c, smol, "a1" * 5000)
    assert not accepts(c, smol, "a1" * 4999 + "aa")


def test_a_lookaround_pattern_is_enforced_in_generation(smol: Model) -> None:
    pattern = r"^(?!x)[a-z]+(?<!q)$"
    schema = {"type": "object", "properties": {"w": {"type": "string", "pattern": pattern,
                                                     "maxLength": 12}},
              "required": ["w"]}
    c = Constraint.json_schema(schema, model=smol)
    assert c.checks is None  # said by the grammar: nothing to roll back
    reply = Conversation(smol, max_tokens=120).send(
        "Write the word xylophone in lowercase as the value of key w.", schema=schema)
    assert re.search(pattern, json.loads(reply.text)["w"])
    assert reply.usage.rollbacks == 0


# ----------------------------------------------------------- lookarounds as plain regexes
EDGE_LOOKAROUNDS = [r"^(?!ab)[a-z]{3}$", r"^[a-z-]+(?<!-)$", r"^(?!.*--)[a-z-]+$",
                    r"^(?!\s*$).+", r"^(?!ab|cd)[a-d]{2}$", r"^(?=a)", r"^(?=[ab]+$)",
                    r"^(?!x)(?=.*b).{0,4}$", r"^.{2}(?<=ab|c1)$", r"^(?<!^a)$",
                    r"^(?:a|b)+?(?<!aa)$"]


def _full_matcher(regex: str) -> Callable[[str], bool]:
    """Whether llguidance's regex grammar for ``regex`` takes a whole text (one matcher, reset
    for each text; a new one after a refusal, which a reset does not clear)."""
    import llguidance

    tokenizer = llguidance.LLTokenizer("byte")
    grammar = llguidance.LLMatcher.grammar_from_regex(regex)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)

    def full(text: str) -> bool:
        nonlocal matcher
        if matcher.is_error():
            matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        else:
            matcher.reset()
        return bool(matcher.consume_tokens(list(text.encode()))) and matcher.is_accepting()

    return full


@pytest.mark.parametrize("pattern", EDGE_LOOKAROUNDS)
def test_lookarounds_at_a_values_edges_become_a_plain_regex(pattern: str) -> None:
    """The translation admits exactly the strings the pattern finds (every string of up to
    4 characters over an alphabet without line terminators, where ECMA-262 and Python's
    ``re`` agree; 300 random longer ones)."""
    regex = without_lookarounds(pattern)
    assert regex is not None and "(?=" not in regex and "(?<" not in regex
    rng = random.Random(pattern)
    alphabet = "abcdx-1 "
    texts = ["".join(t) for n in range(5) for t in itertools.product(alphabet, repeat=n)]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(5, 12)))
              for _ in range(300)]
    full = _full_matcher(regex)
    wrong = [t for t in texts if full(t) != bool(re.search(pattern, t))]
    assert wrong == []


@pytest.mark.parametrize("pattern", [
    r"a(?!b)c",  # not at an edge of the value
    r"(?!ab)[a-z]{3}$",  # a lookahead without ^: any position
    r"^(a)(?=\1)",  # a backreference
    r"^(?i)(?!a)b$",  # a flag
    r"(?i)^(?!a)b$",  # a flag at the start
    r"^(?=.*\d)(?=.*[a-z])(?=.*[A-Z]).{12,}$",  # past the written regex's length
    r"^[a-z]+$",  # nothing to translate
])
def test_other_lookarounds_stay_checks(pattern: str) -> None:
    assert without_lookarounds(pattern) is None


@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_a_banned_prefix_is_never_written(name: str, request: pytest.FixtureRequest) -> None:
    """Asked for the one prefix its lookahead bans, the model writes another code with no
    rollback: the grammar holds the lookahead from the first character (before, the check
    refused "abc" at the value's end and ran out of rollbacks)."""
    model: Model = request.getfixturevalue(name)
    schema = {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^(?!ab)[a-z]{3}$"}}, "required": ["code"]}
    reply = Conversation(model, system="Answer in JSON.").send(
        'Write the code "abc".', schema=schema, max_tokens=40)
    code = json.loads(reply.text)["code"]
    assert re.fullmatch("[a-z]{3}", code) and not code.startswith("ab")
    assert reply.usage.rollbacks == 0


@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_properties_beside_a_one_of_generate_valid_documents(
        name: str, request: pytest.FixtureRequest) -> None:
    model: Model = request.getfixturevalue(name)
    conv = Conversation(model, system="Answer in JSON.")
    for prompt in ["A circle of radius 3.", "A square with side 4."]:
        reply = conv.send(prompt, schema=SHAPE, max_tokens=60)
        jsonschema.validate(json.loads(reply.text), SHAPE)


# ----------------------------------------------------------- $ref cycles with siblings
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "kids": {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/node"},
                                                  {"required": ["name"]}]}},
    "name": {"type": "string", "maxLength": 12}}}}, "$ref": "#/$defs/node"}
CHAIN = {"$defs": {"node": {"type": "object", "properties": {
    "next": {"$ref": "#/$defs/node", "required": ["v"]}, "v": {"type": "integer"}}}},
    "$ref": "#/$defs/node"}


@pytest.mark.parametrize(("schema", "valid", "invalid"), [
    (TREE, {"kids": [{"name": "b"}], "name": "a"}, {"kids": [{}], "name": "a"}),
    (CHAIN, {"next": {"v": 2}, "v": 1}, {"next": {}, "v": 1}),
], ids=["allOf", "siblings"])
def test_ref_cycles_with_siblings_are_enforced(smol: Model, schema: dict[str, Any],
                                               valid: Any, invalid: Any) -> None:
    c = Constraint.json_schema(schema, model=smol)
    assert c.checks is not None  # the siblings are checked at the value's end
    assert accepts(c, smol, valid)
    assert not accepts(c, smol, invalid)


def test_a_ref_cycle_with_siblings_generates_valid_documents(smol: Model) -> None:
    import jsonschema

    reply = Conversation(smol, max_tokens=200).send(
        "Write a small JSON tree of named nodes with kids.", schema=TREE)
    jsonschema.validate(json.loads(reply.text), TREE)


# ----------------------------------------------------------- said by the grammar
KEYS = {"type": "object", "propertyNames": {"pattern": "^a[a-z]{0,8}$"},
        "additionalProperties": {"type": "integer"}}


@pytest.mark.parametrize("names", [
    {"pattern": "^a[a-z]{0,8}$"}, {"enum": ["apple", "axe"]}, {"const": "ab"},
    {"type": "string", "minLength": 1, "maxLength": 3}])
def test_property_names_become_the_key_grammar(names: dict[str, Any]) -> None:
    doc = closed_objects({"type": "object", "propertyNames": names})
    assert "propertyNames" not in doc and doc["additionalProperties"] is False
    assert Constraint.json_schema({"type": "object", "propertyNames": names}).checks is None


def test_a_key_pattern_holds_from_the_first_character(smol: Model) -> None:
    c = Constraint.json_schema(KEYS, model=smol)
    assert c.checks is None
    firsts = allowed_after(c, smol, '{"')
    assert firsts and all(b.startswith(b"a") for b in firsts), firsts[:5]
    try:
        text = Conversation(smol, max_tokens=60).send(
            'Reply with a JSON object whose keys are "b" and "c", values 1 and 2.',
            schema=KEYS).text
    except Truncated as exc:  # an open object: a build's model may go on; its keys obey
        text = exc.text
    keys = re.findall(r'"([^"]*)":', text)
    assert keys and all(re.search("^a[a-z]{0,8}$", k) for k in keys), text


def test_declared_properties_keep_their_own_schema() -> None:
    schema = {"type": "object", "properties": {"ab": {"type": "string"}},
              "propertyNames": {"pattern": "^a"}, "additionalProperties": {"type": "integer"}}
    # a pattern's schema would apply to "ab" too: not rewritten, checked instead
    assert "propertyNames" in closed_objects(schema)
    assert Constraint.json_schema(schema).checks is not None


@pytest.mark.parametrize(("banned", "words", "grammar"), [
    ({"const": ""}, [""], True), ({"enum": ["yes", "no"]}, ["yes", "no"], True),
    ({"enum": ["a]b", "-^["]}, ["a]b", "-^["], True),
    ({"enum": ['a"b', "c\\"]}, ['a"b', "c\\"], False)])  # llguidance's [^"] admits '"'
def test_not_of_strings_becomes_a_pattern(smol: Model, banned: dict[str, Any],
                                          words: list[str], grammar: bool) -> None:
    schema = {"type": "string", "not": banned}
    c = Constraint.json_schema(schema, model=smol)
    assert (c.checks is None) == grammar
    for word in words:
        assert not accepts(c, smol, word)
        assert accepts(c, smol, word + "s")
        if word:
            assert accepts(c, smol, word[:-1])
    assert accepts(c, smol, "maybe")


def test_not_empty_holds_from_the_first_character(smol: Model) -> None:
    c = Constraint.json_schema({"type": "string", "not": {"const": ""}}, model=smol)
    assert all(not b.startswith(b'"') for b in allowed_after(c, smol, '"'))


# ----------------------------------------------------------- runaway strings
def test_a_string_whose_ends_are_refused_is_rolled_back_not_run_on(smol: Model) -> None:
    # scripted (any build): "x... can never match; its end is refused, it grows on
    from chatkit.grammar.guard import STUCK_STEPS, Rollback

    schema = {"type": "string", "pattern": r"^a?(?!x)[a-z]+(?<!q)$"}  # mid-pattern: a check
    c = Constraint.json_schema(schema, model=smol)
    assert c.checks is not None
    row = np.zeros(smol.n_vocab, dtype=np.float32)
    tokens = smol.tokenize('"x' + "ylophone" * 12, special=False)
    with pytest.raises(Rollback):
        for t in tokens[: STUCK_STEPS + 8]:
            c.process(row.copy(), [])
            c.commit(t)
    # generating, a reply is valid or a named error, never cut at max_tokens
    try:
        reply = Conversation(smol, max_tokens=200).send("Write the word xylophone.",
                                                        schema=schema)
    except ChecksExhausted:
        return
    assert re.search(schema["pattern"], json.loads(reply.text))


@pytest.mark.parametrize(("pattern", "bad"), [('^[^"]+$', 'a"b'), (r"^[^\\]+$", "a\\b")])
def test_a_negated_class_of_a_quote_or_backslash_is_checked(smol: Model, pattern: str,
                                                           bad: str) -> None:
    # llguidance's JSON string lexer lets an escaped quote or backslash through such a class
    c = Constraint.json_schema({"type": "string", "pattern": pattern}, model=smol)
    assert accepts(c, smol, "ab")
    assert not accepts(c, smol, bad)


def test_format_with_an_empty_name_is_an_annotation() -> None:
    Constraint.json_schema({"type": "string", "format": ""})


# ----------------------------------------------------------- found in review
def test_a_string_that_can_end_well_again_is_not_rolled_back(smol: Model) -> None:
    c = Constraint.json_schema({"type": "string", "pattern": "^a?(?=.*X)"}, model=smol)
    assert c.checks is not None  # a lookahead past the value's start: a check
    row = np.zeros(smol.n_vocab, dtype=np.float32)
    for text in ('"', "abc"):
        for t in smol.tokenize(text, special=False):
            c.process(row.copy(), [])
            c.commit(t)
    c.process(row.copy(), [])  # every end of "abc fails: its count starts
    for t in smol.tokenize("X" + " word" * 24, special=False):
        c.commit(t)
        c.process(row.copy(), [])  # "abcX..." may end: never rolled back
    assert c.rollbacks == 0


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 50, "not": {"const": "a"}},
    {"type": "object", "patternProperties": {"\\<a": {"type": "integer"},
                                            "<a": {"type": "string"}}},
])
def test_rewrites_that_would_change_meaning_are_left_to_checks(schema: dict[str, Any]
                                                               ) -> None:
    assert Constraint.json_schema(schema).checks is not None


def test_two_pattern_keys_reading_alike_keep_both_schemas(smol: Model) -> None:
    schema = {"type": "object", "patternProperties": {"\\<a": {"type": "integer"},
                                                      "<a": {"type": "string"}}}
    c = Constraint.json_schema(schema, model=smol)
    assert not accepts(c, smol, {"<a": "xx"})


def test_an_escaped_quote_in_a_negated_class_is_checked(smol: Model) -> None:
    c = Constraint.json_schema({"type": "string", "pattern": '^[^\\"]*$'}, model=smol)
    assert accepts(c, smol, "ab")
    assert not accepts(c, smol, 'a"b')


def test_a_cycle_relaxed_keeps_the_siblings_keys_writable(smol: Model) -> None:
    node = {"type": "object", "properties": {
        "name": {"type": "string"},
        "child": {"$ref": "#/$defs/node", "properties": {"depth": {"type": "integer"}},
                  "required": ["depth"]}}, "required": ["name"]}
    c = Constraint.json_schema({"$defs": {"node": node}, "$ref": "#/$defs/node"}, model=smol)
    assert accepts(c, smol, {"name": "a", "child": {"name": "b", "depth": 1}})
    assert not accepts(c, smol, {"name": "a", "child": {"name": "b"}})
