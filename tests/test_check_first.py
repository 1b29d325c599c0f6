"""Greedy check-first: ask the grammar about the unmasked argmax, mask only if refused.

The claim is exactness: the same tokens as masking every step. It rests on
``Constraint.allows`` never admitting a token the mask would forbid, proven here
over the whole vocabulary of both real models, state by state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chatkit import Constraint, Model, Sampler, generate
from tests.helpers import Biased, chat_prompt

SCHEMAS = sorted((Path(__file__).parent / "fixtures" / "schemas").glob("*.json"))
# verdict: after '{"decision":"approve' the mask admits only the canonical '","' while
# the matcher would also take '",'; any_of and person cross several forced key spans.
EXHAUSTIVE = ["verdict.json", "any_of.json", "person.json"]


def _schema(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS[0].parent / name).read_text())  # type: ignore[no-any-return]


def _prompt(model: Model, schema: dict[str, Any]) -> list[int]:
    return chat_prompt(model, "Answer with one JSON value for this schema: "
                       + json.dumps(schema))


def _greedy(model: Model, schema: dict[str, Any], check_first: bool,
            max_tokens: int, engine: Any = None) -> tuple[list[int], str, int]:
    """Greedy under ``schema`` (on ``engine``, a wrapper of ``model``, when given): the
    tokens, the finish reason, how many full masks were computed."""
    c = Constraint.json_schema(schema, model=model)
    c.check_first = check_first
    masks = 0
    compute = c._compute

    def counted() -> Any:
        nonlocal masks
        masks += 1
        return compute()

    c._compute = counted  # type: ignore[method-assign]
    g = generate(engine or model, _prompt(model, schema), Sampler(processor=c),
                 max_tokens=max_tokens)
    return g.tokens, g.finish_reason or "", masks


def _assert_within_mask(model: Model, c: Constraint, tokens: list[int]) -> None:
    """Replays ``tokens`` through ``c``; at each state asks ``allows`` about every token."""
    vocab = np.arange(model.n_vocab)
    admitted = 0
    for i, tok in enumerate(tokens):
        words = c._fill()
        assert words is not None
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: model.n_vocab]
        allowed = np.fromiter((c.allows(int(t)) for t in vocab), dtype=bool)
        over = np.flatnonzero(allowed & ~bits.astype(bool))
        assert over.size == 0, f"allows() admits masked tokens {over[:5]} at step {i}"
        assert allowed[c.stop_token] == bool(bits[c.stop_token])
        admitted += int(allowed.sum())
        c.commit(tok)  # still accepted: asking about every token did not move the matcher
    assert admitted > 0  # the check is not vacuous: allows() said yes somewhere


@pytest.mark.parametrize("name", EXHAUSTIVE)
def test_allows_never_exceeds_the_mask(any_model: Model, name: str) -> None:
    schema = _schema(name)
    states = 12 if any_model.n_vocab < 100_000 else 9  # ~0.4 s per state at 262k
    tokens, _, _ = _greedy(any_model, schema, check_first=False, max_tokens=states)
    _assert_within_mask(any_model, Constraint.json_schema(schema, model=any_model), tokens)


def _think_grammar() -> str:
    # The shape Conversation builds for a thinking reply under a schema: a lazy lexeme
    # with a stop string and a token budget, then JSON.
    answer = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                         "required": ["ok"]})
    return ('start: think close answer\n'
            'close: "\\n\\n" | "</think>\\n\\n"\n'
            'think[capture, stop="</think>", max_tokens=12]: /(?s:.*)/\n'
            f"answer[capture]: %json {answer}\n")


def _tools_grammar() -> str:
    from chatkit import tool
    from chatkit.tools.definition import check_tools
    from chatkit.tools.grammar import tool_grammar

    @tool
    def get_weather(city: str, unit: str = "c") -> str:
        """Weather now.

        Args:
            city: the city
            unit: c or f
        """
        return "sunny"

    return tool_grammar(check_tools([get_weather]), "required", parallel=True)


@pytest.mark.parametrize("make", [_think_grammar, _tools_grammar], ids=["think", "tools"])
def test_allows_never_exceeds_the_mask_lark(smol: Model, make: Any) -> None:
    grammar = make()
    full = Constraint.lark(grammar, model=smol)
    full.check_first = False
    g = generate(smol, chat_prompt(smol, "What is the weather in Paris? Think first."),
                 Sampler(processor=full), max_tokens=32)
    _assert_within_mask(smol, Constraint.lark(grammar, model=smol), g.tokens)


def test_stop_token_allowed_exactly_when_complete(any_model: Model) -> None:
    schema = _schema("enum.json")
    tokens, reason, _ = _greedy(any_model, schema, check_first=False, max_tokens=16)
    assert reason == "constraint_complete"
    c = Constraint.json_schema(schema, model=any_model)
    for tok in tokens:
        assert not c.allows(c.stop_token)
        c.commit(tok)
    words = c._fill()
    assert words is not None and (int(words[c.stop_token >> 5]) >> (c.stop_token & 31)) & 1
    assert c.allows(c.stop_token)  # else every completed reply would pay a full mask


@pytest.mark.parametrize("path", SCHEMAS, ids=lambda p: p.stem)
def test_check_first_equals_masking_every_step(smol: Model, path: Path) -> None:
    schema = json.loads(path.read_text())
    full, full_reason, full_masks = _greedy(smol, schema, check_first=False, max_tokens=40)
    fast, fast_reason, fast_masks = _greedy(smol, schema, check_first=True, max_tokens=40)
    assert fast == full and fast_reason == full_reason
    assert full_masks >= len(full)  # every step masked...
    assert fast_masks <= full_masks  # ...check-first never masks more


@pytest.mark.gemma
def test_check_first_equals_masking_every_step_gemma(gemma: Model) -> None:
    skipped = 0
    for path in SCHEMAS:
        schema = json.loads(path.read_text())
        full, full_reason, full_masks = _greedy(gemma, schema, check_first=False, max_tokens=24)
        fast, fast_reason, fast_masks = _greedy(gemma, schema, check_first=True, max_tokens=24)
        assert (fast, fast_reason) == (full, full_reason), path.name
        skipped += full_masks - fast_masks
    assert skipped > 0  # the fast path really ran


def test_check_first_skips_most_masks_in_free_strings(smol: Model) -> None:
    """The model is biased towards "a", which a JSON string always admits (until its
    maxLength) and structure never does: check-first keeps it without a mask inside the
    strings and masks at the structure. Four 40-character strings cannot fit in 32 tokens,
    so the 32 tokens are certain, whatever the model would write."""
    schema = {"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 4}},
        "required": ["items"], "additionalProperties": False}
    biased = Biased(smol, smol.tokenize("a", special=False))
    tokens, reason, masks = _greedy(smol, schema, check_first=True, max_tokens=32,
                                    engine=biased)
    assert len(tokens) == 32 and reason == "length"
    assert masks < len(tokens) // 2
