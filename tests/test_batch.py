"""Lockstep send_batch and quorum lanes on the real SmolLM2 (n_seq_max=4 in the fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from chatkit import (
    Constraint,
    Conversation,
    Model,
    SamplingParams,
    SharedProcessorError,
    Truncated,
    asend_batch,
    quorum,
    send_batch,
)
from tests.helpers import VERDICT_MAX_TOKENS, NoOp, Verdict

SYSTEM = "You judge claims."
CLAIMS = ["the sky is green", "water is wet", "cats bark", "fire is cold", "ice is hot",
          "two plus two is four"]
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=5)
MOST = VERDICT_MAX_TOKENS  # every Verdict the grammar admits fits: replies end by themselves


def convs(model: Model, n: int, sampling: SamplingParams | None = None) -> list[Conversation]:
    return [Conversation(model, system=SYSTEM, sampling=sampling) for _ in range(n)]


@pytest.mark.bitwise  # lockstep batch rows against each conversation alone
@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_batch_equals_sequential_with_more_items_than_sequences(
    smol: Model, sampling: SamplingParams | None
) -> None:
    assert len(CLAIMS) > smol.n_seq_max  # some items wait for a free sequence
    alone = [c.send(f"Judge: {x}.", schema=Verdict, max_tokens=MOST).text
             for c, x in zip(convs(smol, len(CLAIMS), sampling), CLAIMS, strict=True)]
    replies = send_batch([(c, f"Judge: {x}.") for c, x in
                          zip(convs(smol, len(CLAIMS), sampling), CLAIMS, strict=True)],
                         schema=Verdict, max_tokens=MOST)
    assert [r.text for r in replies] == alone
    assert all(isinstance(r.parsed, Verdict) for r in replies)


def test_one_forward_pass_per_step(smol: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[int]] = []
    real = smol.decode

    def spy(chunks: Any) -> Any:
        calls.append([len(c.tokens) for c in chunks])
        return real(chunks)

    monkeypatch.setattr(smol, "decode", spy)
    replies = send_batch([(c, f"Judge: {x}.") for c, x in zip(convs(smol, 4), CLAIMS[:4],
                                                                 strict=True)],
                         schema=Verdict, max_tokens=MOST)
    steps = [c for c in calls if all(n == 1 for n in c)]
    assert max(len(c) for c in steps) == 4  # four sequences, one token each, one decode
    longest = max(r.usage.completion_tokens for r in replies)
    assert len(steps) <= longest + 1
    assert all(sum(c) <= 32 for c in calls)  # prefill packed in the bitwise-equal regime


@pytest.mark.bitwise
def test_mixed_constraints_in_one_batch(smol: Model) -> None:
    specs: list[dict[str, Any]] = [
        {"schema": Verdict},
        {"constraint": Constraint.regex("(yes|no)")},
        {"max_tokens": 12},
    ]
    texts = ["Judge: snow is white.", "Is snow white?", "Say hello."]
    alone = [c.send(t, **spec).text
             for c, t, spec in zip(convs(smol, 3), texts, specs, strict=True)]
    specs[1] = {"constraint": Constraint.regex("(yes|no)")}
    got = send_batch([(c, t, spec) for c, t, spec in zip(convs(smol, 3), texts, specs,
                                                          strict=True)])
    assert [r.text for r in got] == alone
    assert got[1].text in {"yes", "no"}


def test_shared_processor_guard(smol: Model) -> None:
    before = smol.stats.decode_calls
    c = Constraint.regex("(yes|no)")
    a, b = convs(smol, 2)
    with pytest.raises(SharedProcessorError):
        send_batch([(a, "x", {"constraint": c}), (b, "y", {"constraint": c})])
    with pytest.raises(SharedProcessorError):
        send_batch([(a, "x"), (a, "y")])
    with pytest.raises(SharedProcessorError):
        send_batch([(a, "x"), (b, "y")], constraint=NoOp())  # no clone(): cannot be shared
    assert smol.stats.decode_calls == before  # refused before any decode
    # Given once for the batch, a Constraint is cloned per stream: fine.
    replies = send_batch([(a, "Is it day?"), (b, "Is it night?")], constraint=c)
    assert all(r.text in {"yes", "no"} for r in replies)


def test_a_failing_lane_does_not_fail_the_others(smol: Model) -> None:
    a, b, c = convs(smol, 3)
    items: list[Any] = [(a, "Judge: sun is hot."), (b, "Judge: moon is cheese.",
                                                     {"max_tokens": 3}),
                        (c, "Judge: rain is wet.")]
    results = send_batch(items, schema=Verdict, max_tokens=MOST, return_exceptions=True)
    assert isinstance(results[1], Truncated)
    assert isinstance(results[0].parsed, Verdict) and isinstance(results[2].parsed, Verdict)
    assert b.messages == [] and len(a.messages) == 2
    with pytest.raises(Truncated):
        send_batch([(x, "Judge: snow.", {"max_tokens": 3}) for x in convs(smol, 2)],
                   schema=Verdict)


def test_asend_batch_equals_send_batch(smol: Model) -> None:
    def items() -> list[Any]:
        return [(c, f"Judge: {x}.") for c, x in zip(convs(smol, 2), CLAIMS[:2], strict=True)]

    sync = [r.text for r in send_batch(items(), schema=Verdict, max_tokens=MOST)]

    async def main() -> list[str]:
        return [r.text for r in await asend_batch(items(), schema=Verdict, max_tokens=MOST)]

    assert anyio.run(main) == sync


@pytest.fixture(scope="module")
def unified() -> Iterator[Model]:
    """One shared KV pool: prefix copies between sequences (kv_unified=True)."""
    model = Model.load(n_ctx=2048, n_seq_max=4, kv_unified=True)
    yield model
    model.close()


@pytest.mark.bitwise  # prefix copies and lanes in lockstep against each lane alone
def test_quorum_shares_the_prefix_and_votes(unified: Model) -> None:
    smol = unified
    prompt = "Review: a pull request that deletes all tests to make CI green."
    result = quorum(smol, prompt, schema=Verdict, lanes=3, system=SYSTEM, max_tokens=MOST)
    assert len(result.verdicts) == 3
    valid = [v for v in result.verdicts if v is not None]
    assert sum(result.votes.values()) == len(valid) == 3 - len(result.failures)
    assert result.tie or result.decision in {"approve", "reject", "abstain"}
    cached = [r.usage.cached_prompt_tokens for r in result.replies if not isinstance(r, Exception)]
    assert cached[0] == 0 and all(n > 0 for n in cached[1:])  # prefix evaluated once, copied
    # each lane equals the same conversation sent alone
    for i, r in enumerate(result.replies):
        lane = Conversation(smol, system=SYSTEM, max_tokens=MOST,
                            sampling=SamplingParams(temperature=0.7, top_p=0.95, seed=i + 1))
        assert lane.send(prompt, schema=Verdict).text == r.text  # type: ignore[union-attr]


def test_tally_reports_ties_and_dissent() -> None:
    from chatkit.chat.quorum import tally
    from chatkit.messages import Reply, Usage

    u = Usage(1, 1, 0, 0.0, 0.0)
    mk = lambda d: Reply("", "stop", u, parsed={"decision": d})  # noqa: E731
    r = tally([mk("a"), mk("b"), mk("a"), Truncated("{", 3)], "decision")
    assert r.decision == "a" and r.dissent == [1] and list(r.failures) == [3] and not r.tie
    assert tally([mk("a"), mk("b")], "decision").tie
