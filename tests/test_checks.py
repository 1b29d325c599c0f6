"""Keywords the grammar cannot express, enforced by value checks with rollback.

The contract: a schema whose keywords llguidance refuses compiles to a relaxed grammar plus
checks (``Constraint.checks``); a complete document is accepted iff the grammar accepts it
and every check passes at its value boundaries (0 false accepts on the official test
suite's instances); while decoding, a token completing a failing value is masked, and when
nothing is left the reply rolls back (counted in ``usage.rollbacks``), with
``ChecksExhausted`` past the budget and never an invalid success.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from chatkit import (
    ChatkitError,
    ChecksExhausted,
    Constraint,
    Conversation,
    Model,
    RemoteUnsupported,
    SchemaUnsupported,
    Truncated,
)
from chatkit.decode.decoding import Decoder
from chatkit.decode.sampling import Sampler
from chatkit.grammar.guard import Scan
from chatkit.grammar.value_checks import Checks
from chatkit.remote.engine import RemoteEngine

from .helpers import Biased, chat_prompt, free_port

SUITE = Path(__file__).resolve().parent.parent / "bench" / "corpora" / "json-schema-test-suite" \
    / "draft2020-12"

# One fixture per keyword: a schema, and a prompt that gives the model a reason to write it.
FIXTURES: dict[str, tuple[dict[str, Any], str]] = {
    "oneOf": ({"type": "object", "properties": {"n": {"oneOf": [
        {"type": "integer", "multipleOf": 2}, {"type": "integer", "multipleOf": 3}]}},
        "required": ["n"]}, "Pick a number n divisible by 2 or by 3 but not both."),
    "not": ({"type": "object", "properties": {"colour": {"type": "string",
             "enum": ["red", "green", "blue"], "not": {"pattern": "^r"}}},
             "required": ["colour"]}, "Name a colour that is not red."),
    "uniqueItems": ({"type": "object", "properties": {"tags": {
        "type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
        "uniqueItems": True, "minItems": 3, "maxItems": 3}}, "required": ["tags"]},
        "List the tags a, b and c."),
    "contains": ({"type": "object", "properties": {"xs": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "contains": {"const": 7}, "minItems": 1, "maxItems": 4}}, "required": ["xs"]},
        "Give a few digits, one of them 7."),
    "if/then/else": ({"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog"]}, "sound": {"enum": ["meow", "woof"]}},
        "required": ["kind", "sound"],
        "if": {"properties": {"kind": {"const": "cat"}}},
        "then": {"properties": {"sound": {"const": "meow"}}},
        "else": {"properties": {"sound": {"const": "woof"}}}}, "An animal and its sound."),
    "dependentRequired": ({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "email": {"type": "string",
                                                              "maxLength": 24},
        "phone": {"type": "string", "maxLength": 12}},
        "required": ["name"], "dependentRequired": {"email": ["phone"]}},
        "A contact: name, email and phone."),
    "propertyNames": ({"type": "object",  # two keywords: a check, not the key grammar
                       "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 6},
                       "additionalProperties": {"type": "integer"}, "minProperties": 1,
                       "maxProperties": 3}, "Count some fruits by name."),
    "format": ({"type": "object", "properties": {"pointer": {
        "type": "string", "format": "json-pointer", "maxLength": 20}},
        "required": ["pointer"]}, "A JSON pointer to the first user's name."),
    "minProperties": ({"type": "object", "properties": {
        "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "minProperties": 2}, "Give two or three of a, b, c as numbers."),
}


# ------------------------------------------------------------------ compiling
@pytest.mark.parametrize("keyword", sorted(FIXTURES))
def test_each_keyword_compiles_with_a_check_where_it_was(keyword: str) -> None:
    schema, _ = FIXTURES[keyword]
    checks = Constraint.json_schema(schema).checks
    assert checks is not None
    want = keyword.split("/")[0]
    assert want in checks.keywords
    assert checks.checks, "every relaxed keyword has a place where it is checked"


def test_a_check_moves_up_where_the_schema_does_not_fix_the_location() -> None:
    schema = {"type": "object", "properties": {
        "fixed": {"type": "array", "uniqueItems": True},
        "either": {"anyOf": [{"type": "string"}, {"type": "integer", "not": {"const": 3}}]},
        "each": {"type": "array", "items": {"type": "array", "uniqueItems": True}}}}
    checks = Constraint.json_schema(schema).checks
    assert checks is not None
    assert sorted((c.pattern, c.pointer) for c in checks.checks) == [
        (("each", None), "/properties/each/items"),
        (("either",), "/properties/either"),  # under anyOf: the branch's holder
        (("fixed",), "/properties/fixed"),
    ]


def test_a_recursive_definition_is_checked_deep_where_the_cycle_is_cut() -> None:
    schema = {"$defs": {"node": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    checks = Constraint.json_schema(schema).checks
    assert checks is not None
    patterns = {c.pattern for c in checks.checks}
    assert ("tags",) in patterns and ("kids", None) in patterns


def test_dynamic_scope_is_checked_on_the_whole_document() -> None:
    schema = {"$defs": {"x": {"$dynamicAnchor": "x", "type": "string"}}, "type": "object",
              "properties": {"a": {"$dynamicRef": "#x"}}}
    checks = Constraint.json_schema(schema).checks
    assert checks is not None
    assert ((), "") in {(c.pattern, c.pointer) for c in checks.checks}


def test_overlapping_pattern_properties_are_checked() -> None:
    schema = {"type": "object", "patternProperties": {"a": {"type": "string"},
                                                      "b": {"type": "integer"}},
              "additionalProperties": False}
    checks = Constraint.json_schema(schema).checks
    assert checks is not None and checks.relaxed == {"": ("patternProperties",)}


def test_an_unknown_format_is_an_annotation_or_refused(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    schema = {"type": "string", "format": "textarea"}
    with caplog.at_level(logging.INFO, logger="chatkit"):
        c = Constraint.json_schema(schema)
    assert c.checks is None  # nothing to check: JSON Schema makes it an annotation
    assert "textarea" in caplog.text
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema(schema, unknown_formats="refuse")
    assert info.value.keyword == "format"


def test_a_keyword_no_check_enforces_is_still_refused() -> None:
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema({"$ref": "https://example.com/remote.json"})
    assert info.value.keyword == "$ref"


# ------------------------------------------------------------------ scanning
def _ends(text: bytes, chunks: list[bytes]) -> list[tuple[Any, ...]]:
    scan = Scan()
    done: list[Any] = []
    base = 0
    for chunk in chunks:
        scan.feed(chunk, base, [], done)
        base += len(chunk)
    scan.end(base, done)
    return [(path, text[start:end]) for path, start, end, _, kind in done if kind != -2]


def test_the_scan_finds_every_value_end_at_any_chunking() -> None:
    doc = {"a": [1, -2.5e3, "x,]}\"", {"b": None, "c\\\"": [True, False, []]}], "d": {},
           "e": "\u00e9\u4e2d"}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    whole = _ends(text, [text])
    assert [p for p, _ in whole][-1] == ()
    assert all(json.loads(v) is not None or v == b"null" for _, v in whole)
    assert (("a", 2), b'"x,]}\\""') in whole and (("a", 3, 'c\\"', 2), b"[]") in whole
    rng = random.Random(5)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _ends(text, chunks) == whole


# ------------------------------------------------------------------ replaying
def _accepts(c: Constraint, model: Model, data: Any) -> bool:
    return c.accepts(model.tokenize(json.dumps(data, separators=(",", ":"), ensure_ascii=False),
                                    special=False))


CHECKED_FILES = ("not", "oneOf", "if-then-else", "uniqueItems", "contains", "minContains",
                 "maxContains", "dependentRequired", "dependentSchemas", "propertyNames",
                 "maxProperties", "unevaluatedItems")


def _replay(model: Model) -> tuple[list[str], list[str]]:
    refused: list[str] = []
    false_accepts: list[str] = []
    for name in CHECKED_FILES:
        for group in json.loads((SUITE / f"{name}.json").read_text()):
            try:
                c = Constraint.json_schema(group["schema"], model=model)
            except ChatkitError as exc:
                refused.append(f"{name}: {group['description']}: {type(exc).__name__}")
                continue
            for case in group["tests"]:
                if _accepts(c, model, case["data"]) and not case["valid"]:
                    false_accepts.append(f"{name}: {group['description']} / "
                                         f"{case['description']}")
    return refused, false_accepts


def test_no_invalid_instance_of_the_test_suite_is_accepted(smol: Model) -> None:
    refused, false_accepts = _replay(smol)
    assert false_accepts == []
    assert refused == [  # the only refusal: a schema that admits nothing
        "oneOf: oneOf with boolean schemas, all false: SchemaInvalid"]


def test_the_replay_sees_a_broken_check(smol: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Checks, "passes", lambda self, check, text: True)
    monkeypatch.setattr(Checks, "unique_so_far", lambda self, text: True)
    _, false_accepts = _replay(smol)
    assert len(false_accepts) > 20


# ------------------------------------------------------------------ decoding
def _letter_tokens(model: Model, letter: str) -> list[int]:
    return [t for t in range(model.n_vocab) if model.token_bytes(t) in
            (letter.encode(), b'"' + letter.encode())]


UNIQUE_XY = {"type": "array", "items": {"enum": ["x", "y"]}, "uniqueItems": True,
             "minItems": 2, "maxItems": 2}


def _decode(engine: Any, model: Model, c: Constraint) -> Decoder:
    dec = Decoder(engine, chat_prompt(model, "Two letters."), Sampler(processor=c),
                  max_tokens=40, seq_id=0)
    dec.start()
    while not dec.done:
        dec.step()
    return dec


def test_a_failing_value_rolls_back_and_the_reply_is_valid(smol: Model) -> None:
    """The model insists on "x" (biased): the second "x" cannot close, the reply rolls
    back to that item and bans "x" there: ["x","y"], one rollback, KV consistent."""
    c = Constraint.json_schema(UNIQUE_XY, model=smol)
    dec = _decode(Biased(smol, _letter_tokens(smol, "x")), smol, c)
    text = smol.detokenize(dec.tokens)
    assert json.loads(text) == ["x", "y"]
    assert dec.rollbacks >= 1 and c.rollbacks == dec.rollbacks
    assert dec.kv_tokens() == dec.prompt + dec.tokens[: len(dec.kv_tokens()) - len(dec.prompt)]


@pytest.mark.bitwise  # a continued sequence against a fresh prefill, row for row
def test_the_kv_cache_after_a_rollback_holds_exactly_the_tokens_kept(smol: Model) -> None:
    """The cells a rollback dropped are gone: the rolled-back sequence, continued to the end
    of the reply, gives the same last row as the reply's tokens evaluated afresh in
    another sequence (the same chunked, bitwise-safe prefill)."""
    c = Constraint.json_schema(UNIQUE_XY, model=smol)
    dec = _decode(Biased(smol, _letter_tokens(smol, "x")), smol, c)
    assert dec.rollbacks >= 1
    held = dec.kv_tokens()
    whole = dec.prompt + dec.tokens + [smol.eot_id]  # one more token to evaluate, at least
    assert whole[: len(held)] == held
    with smol.lock:
        continued = smol.prefill(0, whole[len(held):], len(held))
        smol.seq_rm(1, 0, -1)
        fresh = smol.prefill(1, whole, 0)
        smol.seq_rm(1, 0, -1)
    assert np.array_equal(continued, fresh)


def test_an_exhausted_budget_is_a_named_error(smol: Model) -> None:
    impossible = {"type": "array", "items": {"const": "x"}, "uniqueItems": True,
                  "minItems": 2}  # a valid schema no document satisfies
    c = Constraint.json_schema(impossible, model=smol, max_rollbacks=5)
    with pytest.raises(ChecksExhausted) as info:
        _decode(smol, smol, c)
    assert info.value.rollbacks <= 5 and "uniqueItems" in info.value.keywords


@pytest.mark.parametrize("keyword", sorted(FIXTURES))
@pytest.mark.parametrize("name", ["smol", "gemma"])
def test_fixture_replies_are_valid_or_named(keyword: str, name: str,
                                            request: pytest.FixtureRequest) -> None:
    model: Model = request.getfixturevalue(name)
    schema, prompt = FIXTURES[keyword]
    conv = Conversation(model, system="Answer in JSON.")
    try:
        reply = conv.send(prompt, schema=schema, max_tokens=80)
    except (ChecksExhausted, Truncated) as exc:
        assert conv.messages == []
        assert exc.usage is not None and exc.usage.rollbacks >= 0
        return
    jsonschema.validate(json.loads(reply.text), schema,
                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    assert reply.usage.rollbacks >= 0


def test_lockstep_and_speculative_replies_equal_plain_ones(smol: Model) -> None:
    """Every decode path rolls back the same way: the model insists on "x" (biased)."""
    from chatkit import send_batch

    biased = Biased(smol, _letter_tokens(smol, "x"))
    prompts = ["Two letters.", "Two more letters."]
    plain = [Conversation(biased).send(p, schema=UNIQUE_XY, max_tokens=40) for p in prompts]
    spec = [Conversation(biased).send(p, schema=UNIQUE_XY, max_tokens=40, speculative=True)
            for p in prompts]
    batch = send_batch([(Conversation(biased), p) for p in prompts], schema=UNIQUE_XY,
                       max_tokens=40)
    assert all(r.usage.rollbacks >= 1 and json.loads(r.text) == ["x", "y"] for r in plain), \
        [(r.text, r.usage.rollbacks) for r in plain]
    for other in (spec, batch):
        assert [(r.text, r.usage.rollbacks) for r in other] == \
            [(r.text, r.usage.rollbacks) for r in plain]


def test_a_checked_reply_streams_once_complete(smol: Model) -> None:
    biased = Biased(smol, _letter_tokens(smol, "x"))
    stream = Conversation(biased).stream("Two letters.", schema=UNIQUE_XY, max_tokens=40)
    deltas = [d for d in stream if d]
    assert deltas == ['["x","y"]']  # nothing a rollback took back was ever sent
    assert stream.reply.usage.rollbacks >= 1


def test_a_remote_engine_refuses_a_checked_schema_before_any_request(smol: Model) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # a request would be RemoteError
    engine = RemoteEngine(dead, kind="vllm", model="m", vocab=smol, retries=0)
    with pytest.raises(RemoteUnsupported, match="uniqueItems"):
        Conversation(engine).send("x", schema=FIXTURES["uniqueItems"][0])


def test_a_checked_schema_after_a_think_block(smol: Model) -> None:
    """Under a thinking template the checks start where the document does, after the think
    block; a rollback there keeps the thoughts."""
    biased = Biased(smol, _letter_tokens(smol, "x"))
    conv = Conversation(biased, template="qwen3", think_budget=16)
    reply = conv.send("Two letters.", schema=UNIQUE_XY, max_tokens=60)
    assert json.loads(reply.text) == ["x", "y"] and reply.usage.rollbacks >= 1
    assert reply.reasoning


def test_async_replies_roll_back_as_sync_ones_do(smol: Model) -> None:
    import asyncio

    biased = Biased(smol, _letter_tokens(smol, "x"))
    sync = Conversation(biased).send("Two letters.", schema=UNIQUE_XY, max_tokens=40)
    async_ = asyncio.run(Conversation(biased).asend("Two letters.", schema=UNIQUE_XY,
                                                    max_tokens=40))
    assert (async_.text, async_.usage.rollbacks) == (sync.text, sync.usage.rollbacks)
    assert sync.usage.rollbacks >= 1


def test_a_rollback_bans_the_token_that_chose_not_the_bytes_forced(smol: Model) -> None:
    """Where the grammar forces bytes (the key's opening quote), a token inside them was no
    choice (another would write the same bytes), a token reaching past them was: `".` (the
    quote and the key's first character) is where a rollback bans."""
    names = {"type": "object", "propertyNames": {"pattern": "^[a-z]+$", "maxLength": 8},
             "additionalProperties": {"type": "integer"}, "minProperties": 1}
    c = Constraint.json_schema(names, model=smol)
    for text in ("{", '".'):
        (token,) = [t for t in range(smol.n_vocab) if smol.token_bytes(t) == text.encode()]
        c.commit(token)
    guard = c._guard
    assert guard is not None and guard.choices == [False, True]


NOT_ONE = {"type": "integer", "not": {"const": 1}}


@pytest.mark.parametrize(("schema", "invalid"), [
    # a $ref cycle: B reaches the relaxed node only through A
    ({"type": "object", "properties": {"first": {"$ref": "#/$defs/A"},
                                       "second": {"$ref": "#/$defs/B"}},
      "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"},
                                                       "n": NOT_ONE}},
                "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}}}},
     [{"first": {"b": {"a": {"n": 1}}}}, {"second": {"a": {"n": 1}}}]),
    # $refs the local resolver does not follow (percent-encoded, $id-relative)
    ({"type": "object", "properties": {"p": {"$ref": "#/$defs/a%20b"}},
      "$defs": {"a b": {"type": "object", "properties": {"n": NOT_ONE}}}},
     [{"p": {"n": 1}}]),
    ({"$id": "http://example.com/root.json", "type": "object",
      "properties": {"p": {"$ref": "item.json"}},
      "$defs": {"i": {"$id": "item.json", "type": "object", "properties": {"n": NOT_ONE}}}},
     [{"p": {"n": 1}}]),
])
def test_no_relaxed_keyword_escapes_its_check(smol: Model, schema: dict[str, Any],
                                              invalid: list[Any]) -> None:
    c = Constraint.json_schema(schema, model=smol)
    for data in invalid:
        assert not _accepts(c, smol, data), data


def test_refs_reused_on_many_paths_fall_back_to_one_whole_document_check() -> None:
    defs: dict[str, Any] = {"d20": {"type": "integer", "not": {"const": 1}}}
    for i in range(20):
        defs[f"d{i}"] = {"type": "object", "properties": {
            "l": {"$ref": f"#/$defs/d{i + 1}"}, "r": {"$ref": f"#/$defs/d{i + 1}"}}}
    checks = Constraint.json_schema({"$ref": "#/$defs/d0", "$defs": defs}).checks
    assert checks is not None
    assert [(c.pattern, c.pointer) for c in checks.checks] == [((), "")]  # not 2**20


def test_probabilities_of_a_checked_field_leave_out_what_its_check_refuses(smol: Model
                                                                          ) -> None:
    schema = {"type": "object", "properties": {"c": {"enum": ["red", "green", "blue"],
                                                     "not": {"const": "red"}}},
              "required": ["c"]}
    reply = Conversation(smol).send("Pick a colour: red.", schema=schema, probabilities=True)
    dist = reply.choices["/c"] if reply.choices else None
    assert dist is not None and dist.probabilities["red"] == 0.0
    assert reply.parsed["c"] != "red"


def test_an_unknown_format_after_a_think_block_is_an_annotation(smol: Model) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "format": "x-custom",
                                                     "maxLength": 8}}, "required": ["s"]}
    conv = Conversation(smol, template="qwen3", think_budget=8)
    assert "s" in conv.send("A word.", schema=schema, max_tokens=60).parsed


def test_a_subclass_builds_its_own_kind() -> None:
    class Mine(Constraint):
        pass

    assert type(Mine.json_schema({"type": "integer"})) is Mine
