"""The llguidance Constraint on both real models (BPE SmolLM2, SentencePiece Gemma)."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import numpy as np
import pytest

from chatkit import Constraint, LogitProcessor, Model, Sampler, SamplingParams, generate
from chatkit.errors import GrammarInvalid
from tests.helpers import Boost, Chain, NoOp, Recorder, chat_prompt

VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "note": {"type": "string", "maxLength": 16},
    },
    "required": ["answer", "score", "note"],
    "additionalProperties": False,
}
REGEX = r"(yes|no), [0-9]{1,3} (apples|pears)"
LARK = """
start: item | item "," item | item "," item "," item
item: NAME "=" NUM
NAME: /[a-z]{1,8}/
NUM: /[0-9]{1,2}/
"""
LARK_RE = r"[a-z]{1,8}=[0-9]{1,2}(,[a-z]{1,8}=[0-9]{1,2}){0,2}"

PROMPTS = {
    "json": "Is the sky green? Answer as JSON with answer, score and note.",
    "regex": "How many apples do you have?",
    "lark": "List some variables with small values.",
}
SEEDS = [None, 1, 2, 3]  # None = greedy
# Every text the three grammars admit fits (a token is at least one byte): VERDICT's note is
# at most 16 characters of at most 6 bytes (\uXXXX), 137 bytes in all; REGEX, LARK < 40.
MAX_TOKENS = 160


def _params(seed: int | None) -> SamplingParams:
    if seed is None:
        return SamplingParams()
    return SamplingParams(temperature=0.9, top_p=0.95, seed=seed)


def _check(kind: str, text: str) -> bool:
    if kind == "json":
        try:
            jsonschema.validate(json.loads(text), VERDICT)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    pattern = REGEX if kind == "regex" else LARK_RE
    return re.fullmatch(pattern, text) is not None


def _constraint(kind: str, model: Model) -> Constraint:
    if kind == "json":
        return Constraint.json_schema(VERDICT, model=model)
    if kind == "regex":
        return Constraint.regex(REGEX, model=model)
    return Constraint.lark(LARK, model=model)


@pytest.mark.parametrize("kind", ["json", "regex", "lark"])
def test_constrained_output_matches(any_model: Model, kind: str) -> None:
    """Greedy and seeded sampling; the grammar completes and forces the stop token."""
    base = _constraint(kind, any_model)
    prompt = chat_prompt(any_model, PROMPTS[kind])
    for seed in SEEDS:
        c = base.clone()
        rec = Recorder(c)
        g = generate(any_model, prompt, Sampler(_params(seed), rec), max_tokens=MAX_TOKENS)
        assert _check(kind, g.text), (seed, g.text)
        assert g.finish_reason == "constraint_complete", (seed, g.text)
        assert g.stop_token == c.stop_token == any_model.eot_id
        assert rec.commits == [*g.tokens, g.stop_token]  # one commit per selection


def test_no_op_processor_is_caught(smol: Model) -> None:
    """Positive control: unconstrained, a model that wants a token none of the grammars
    admits first ("Hello": not JSON, not yes/no, not lower case; forced by a bias, since a
    model's own slips are not certain) yields output the check rejects, every time; the
    same bias under the real constraint does not."""
    hello = smol.tokenize("Hello", special=False)
    failures = 0
    for kind in ("json", "regex", "lark"):
        prompt = chat_prompt(smol, PROMPTS[kind])
        for seed in SEEDS[:2]:
            g = generate(smol, prompt, Sampler(_params(seed), Chain(Boost(hello), NoOp())),
                         max_tokens=48)
            failures += not _check(kind, g.text)
            c = _constraint(kind, smol)
            g = generate(smol, prompt, Sampler(_params(seed), Chain(Boost(hello), c)),
                         max_tokens=MAX_TOKENS)
            assert _check(kind, g.text), (kind, seed, g.text)
    assert failures == 6


def test_reset_rearms_the_same_instance(smol: Model) -> None:
    c = _constraint("regex", smol)
    prompt = chat_prompt(smol, PROMPTS["regex"])
    texts = []
    for _ in range(2):
        c.reset()
        texts.append(generate(smol, prompt, Sampler(SamplingParams(), c), max_tokens=32).text)
    assert texts[0] == texts[1] and _check("regex", texts[0])


def _control_ids(model: Model) -> list[int]:
    return [t for t in range(model.n_vocab) if model.is_control(t)]


def test_control_tokens_never_inside_json_string(any_model: Model) -> None:
    """The model is pushed hard towards every control token; none is selected mid-string."""
    controls = _control_ids(any_model)
    c = Constraint.json_schema({"type": "string", "maxLength": 24}, model=any_model)
    for seed in SEEDS:
        c.reset()
        proc: LogitProcessor = Chain(Boost(controls, 50.0), c)
        prompt = chat_prompt(any_model, "Say something.")
        # at most 24 characters of at most 6 bytes, and the quotes: < 160 tokens
        g = generate(any_model, prompt, Sampler(_params(seed), proc), max_tokens=160)
        assert not set(g.tokens) & set(controls), g.tokens
        assert c.is_stopped() and g.stop_token == any_model.eot_id
        json.loads(g.text)


def test_control_token_text_is_allowed_as_characters(any_model: Model) -> None:
    c = Constraint.json_schema({"type": "string"}, model=any_model)
    marker = any_model.detokenize([any_model.eot_id])
    as_text = any_model.tokenize(json.dumps(f"a{marker}b"), special=False)
    assert c.valid_prefix_len(as_text) == len(as_text)
    head = any_model.tokenize('"a', special=False)
    assert c.valid_prefix_len([*head, any_model.eot_id]) == len(head)


def test_padding_ids_never_selected(gemma: Model) -> None:
    bits = np.unpackbits(gemma.grammar_token_words().view(np.uint8), bitorder="little",
                         count=gemma.n_vocab)
    padding = np.flatnonzero(bits == 0)
    assert padding.size > 0  # Gemma's vocabulary carries unused ids
    c = Constraint.json_schema({"type": "string", "maxLength": 12}, model=gemma)
    row = np.zeros(gemma.n_vocab, dtype=np.float32)
    row[padding] = 100.0
    c.process(row, [])
    assert np.all(row[padding] == -np.inf)
    for seed in SEEDS[:2]:
        c.reset()
        g = generate(gemma, chat_prompt(gemma, "Name a colour."),
                     Sampler(_params(seed), Chain(Boost(padding.tolist()), c)), max_tokens=24)
        assert not set(g.tokens) & set(padding.tolist())


def test_stop_token_forced_at_completion(any_model: Model) -> None:
    c = Constraint.regex("yes", model=any_model)
    for tok in any_model.tokenize("yes", special=False):
        row = np.random.default_rng(tok).normal(size=any_model.n_vocab).astype(np.float32)
        c.process(row, [])
        c.commit(tok)
    row = np.random.default_rng(0).normal(size=any_model.n_vocab).astype(np.float32)
    c.process(row, [])
    assert np.flatnonzero(np.isfinite(row)).tolist() == [any_model.eot_id]
    assert c.is_accepting()


def test_configured_stop_token(smol: Model) -> None:
    c = Constraint.regex("no", model=smol, stop_token=smol.eos_id)
    for tok in smol.tokenize("no", special=False):
        c.commit(tok)
    row = np.zeros(smol.n_vocab, dtype=np.float32)
    c.process(row, [])
    assert np.flatnonzero(np.isfinite(row)).tolist() == [smol.eos_id]


def test_refused_token_raises_constraint_error(smol: Model) -> None:
    from chatkit import ConstraintError

    c = Constraint.regex("[0-9]+", model=smol)
    with pytest.raises(ConstraintError):
        c.commit(smol.tokenize("x", special=False)[0])


def test_clone_is_independent(smol: Model) -> None:
    a = Constraint.regex("(ab)+", model=smol)
    b = a.clone()
    a.commit(smol.tokenize("ab", special=False)[0])
    assert b.valid_prefix_len(smol.tokenize("ab", special=False)) == 1
    assert b is not a and b.model is a.model


@pytest.mark.parametrize("text", ["<think>\nHmm.\n</think>\n\nHi there",
                                  "<think>Hmm.</think>Hi there"])
def test_a_draft_crosses_a_think_blocks_text_close(smol: Model, text: str) -> None:
    """llguidance's validate_tokens stops at the token completing a hidden stop string
    although the matcher takes what follows: valid_prefix_len (a speculative draft's check,
    the tests' refusals) goes on past it, and agrees with committing token by token."""
    c = Constraint.lark('start: think close "Hi there"\n'
                        'close: "\\n\\n" | ""\n'
                        'think[capture, stop="</think>", max_tokens=64]: /(?s:.*)/\n',
                        model=smol)
    tokens = smol.tokenize(text.removeprefix("<think>").lstrip("\n"), special=False)
    assert c.valid_prefix_len(tokens) == len(tokens)
    for t in tokens:
        assert c.allows(t)
        c.commit(t)
    assert c.is_accepting()
    c.reset()
    wrong = smol.tokenize("Hmm.</think>Hi where", special=False)
    assert c.valid_prefix_len(wrong) == len(wrong) - 1


def test_forced_tokens_follow_the_grammar(smol: Model) -> None:
    c = Constraint.json_schema(
        {"type": "object", "properties": {"decision": {"enum": ["approve"]}},
         "required": ["decision"], "additionalProperties": False}, model=smol)
    forced = c.forced_tokens()
    assert forced and smol.detokenize(forced).startswith('{"')
    assert c.valid_prefix_len(forced) == len(forced)


@pytest.mark.parametrize("schema", [{"type": "string", "format": "date"}, {"type": "boolean"}])
def test_json_constraint_reader_round_trip(smol: Model, schema: dict[str, Any]) -> None:
    c = Constraint.json_schema(schema, model=smol)
    g = generate(smol, chat_prompt(smol, "Give a value."), Sampler(SamplingParams(), c),
                 max_tokens=32)
    assert c.reader is not None
    c.reader.read(g.text)


CYCLE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                       "maxItems": 2}}, "required": ["v"],
    "additionalProperties": False}}, "$ref": "#/$defs/node"}


def test_bound_ref_schemas_check_their_first_mask_not_a_byte_level_copy(
        smol: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound to a model, a $ref schema is checked for an empty language on the model's own
    matcher (its first mask, kept for the first step), not by compiling it again over a byte
    tokenizer; a cycle without a base case is still refused by name."""
    from chatkit import SchemaInvalid
    from chatkit.grammar import meta_schema, schema

    def no_byte_level_check(grammar: str) -> str | None:
        raise AssertionError("the bound path compiled the grammar over the byte tokenizer")

    monkeypatch.setattr(schema, "grammar_problem", no_byte_level_check)
    meta_schema._checked_keys.clear()
    with pytest.raises(SchemaInvalid, match="admits no text") as info:
        Constraint.json_schema(CYCLE, model=smol)
    assert info.value.path == ""
    c = Constraint.json_schema(TREE, model=smol)
    assert c._next.ready and c._next.pending is None  # the first step reuses the checked mask
    text = '{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}'
    row = np.zeros(smol.n_vocab, dtype=np.float32)
    c.process(row, [])
    first = smol.tokenize(text, special=False)[0]
    assert row[first] == 0 and np.isinf(row).any()
    assert accepts(c, smol, text) and not accepts(c, smol, '{"v":1,"kids":[{}]}')
    monkeypatch.undo()
    with pytest.raises(SchemaInvalid, match="admits no text"):  # unbound: the byte-level check
        Constraint.json_schema(CYCLE)


def accepts(c: Constraint, model: Model, text: str) -> bool:
    c.reset()
    tokens = model.tokenize(text, special=False)
    if c.valid_prefix_len(tokens) != len(tokens):
        return False
    for t in tokens:
        c.commit(t)
    return c.is_accepting()


def test_spare_core_is_decided_once_per_model(smol: Model) -> None:
    from types import SimpleNamespace

    from chatkit.grammar import constraints

    Constraint.regex("a", model=smol)
    decided = smol.cache(constraints._SPARE_CORE_KEY, lambda: pytest.fail("not cached"))
    assert decided == constraints._has_spare_core(smol)
    assert constraints._spare_core(SimpleNamespace()) is True  # no cache(), no n_threads


def test_explicit_grammar_limits_refuse_by_name(smol: Model) -> None:
    from chatkit import (
        Conversation,
        GrammarInvalid,
        GrammarLimits,
        Truncated,
        grammar_limits,
        set_grammar_limits,
    )

    pattern = "[a-z]{1,20}@[a-z]{1,20}\\.com"
    before = grammar_limits()
    set_grammar_limits(GrammarLimits(lexer_states=20))
    try:
        with pytest.raises(GrammarInvalid, match="limits"):
            Conversation(smol, max_tokens=20).send("Write an email.",
                                                   constraint=Constraint.regex(pattern))
    finally:
        set_grammar_limits(before)
    try:  # the defaults admit it (a model may not finish in 60 tokens: not a refusal)
        Conversation(smol, max_tokens=60).send("Write an email.",
                                               constraint=Constraint.regex(pattern))
    except Truncated:
        pass
    with pytest.raises(ValueError, match="NAME=N"):
        GrammarLimits.parse(["fuel=3"])
    assert GrammarLimits.parse(["step-items=7"]).step_items == 7


def test_a_grammar_llguidance_panics_on_is_a_named_refusal() -> None:
    """Hundreds of distinct ``%json`` sub-grammars beside a ``max_tokens`` rule make
    llguidance's Rust code panic: ``GrammarInvalid`` naming it, never a crash."""
    rules = "\n".join(f'j{i}: %json {{"type": "integer", "minimum": {i}}}' for i in range(300))
    grammar = ("start: t (" + " | ".join(f"j{i}" for i in range(300)) + ")\n"
               "t[max_tokens=5]: /a*/\n" + rules)
    with pytest.raises(GrammarInvalid, match="could not build it"):
        Constraint.lark(grammar)
