"""Speculative decoding is lossless: exactly on a deterministic fake model, and token for
token on the real SmolLM2 inside the bitwise-equal regime (short contexts, <= 8 rows)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from chatkit import Constraint, Model, Sampler, SamplingParams, SeqChunk, generate
from chatkit.decode.speculative import ConstrainedSource, CostGate, PromptLookupSource
from tests.helpers import Recorder, chat_prompt

VOCAB = 64
STOP = 0


class FakeModel:
    """Logits are a pure function of the token history: any evaluation order gives the same
    rows, so speculative and plain decoding must agree exactly."""

    eos_id = STOP
    eot_id = STOP
    n_vocab = VOCAB

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.kv: dict[int, list[int]] = {}
        self.calls: list[int] = []

    def _row(self, history: Sequence[int]) -> np.ndarray:
        seed = hash(tuple(history)) & 0xFFFFFFFF
        row = np.random.default_rng(seed).normal(0, 2, VOCAB).astype(np.float32)
        row[STOP] -= 3.0 if len(history) < 30 else -6.0  # stops eventually
        return row

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        self.kv[seq] = self.kv.get(seq, [])[:p0]

    def decode(self, chunks: Sequence[SeqChunk]) -> list[np.ndarray]:
        out = []
        for c in chunks:
            kv = self.kv.setdefault(c.seq_id, [])
            assert len(kv) == c.pos, (len(kv), c.pos)  # the KV bookkeeping must be exact
            rows = []
            for t in c.tokens:
                kv.append(t)
                rows.append(self._row(kv))
            self.calls.append(len(c.tokens))
            keep = rows if c.logits == "all" else rows[-1:] if c.logits == "last" else []
            out.append(np.stack(keep) if keep else np.empty((0, VOCAB), np.float32))
        return out

    def prefill(self, seq: int, tokens: Sequence[int], pos: int = 0, *, chunk: int = 32) -> Any:
        return self.decode([SeqChunk(seq, pos, tokens, "last")])[0][0].copy()

    def detokenize(self, ids: Sequence[int]) -> str:
        return " ".join(map(str, ids))


class RandomDraft:
    """Proposes the true continuation with some probability, else garbage."""

    def __init__(self, oracle: list[int], seed: int) -> None:
        self.oracle = oracle
        self.rng = np.random.default_rng(seed)
        self.truncations = 0

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        n = len(history)
        out = []
        for j in range(k):
            good = n + j < len(self.oracle) and self.rng.random() < 0.7
            out.append(self.oracle[n + j] if good else int(self.rng.integers(1, VOCAB)))
        return out

    def truncated(self, n: int) -> None:
        self.truncations += 1


class ParityMask:
    """A plain-mask processor: only even tokens (and the stop token)."""

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        logits[1::2] = -np.inf

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=3)],
                         ids=["greedy", "seeded"])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("max_tokens", [7, 40])
def test_fake_model_speculation_is_exact(params: SamplingParams, masked: bool,
                                         max_tokens: int) -> None:
    prompt = [5, 9, 12]
    plain_rec = Recorder(ParityMask()) if masked else None
    plain = generate(FakeModel(), prompt, Sampler(params, plain_rec),  # type: ignore[arg-type]
                     max_tokens=max_tokens)
    oracle = prompt + plain.tokens + [STOP]
    for seed in range(4):
        rec = Recorder(ParityMask()) if masked else None
        model = FakeModel()
        spec = generate(model, prompt, Sampler(params, rec), max_tokens=max_tokens,  # type: ignore[arg-type]
                        draft=RandomDraft(oracle, seed), draft_k=4)
        assert spec.tokens == plain.tokens
        assert spec.finish_reason == plain.finish_reason
        assert spec.kv_tokens == plain.kv_tokens  # rejected drafts left the KV cache
        if masked:
            assert rec is not None and plain_rec is not None
            assert rec.commits == plain_rec.commits  # one commit per sampled token, same log
        assert max(model.calls) > 1  # batches of draft rows were really verified


# ---------------------------------------------------------------- real model
SCHEMA = {"type": "object", "properties": {
    "decision": {"enum": ["approve", "reject", "abstain"]},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    "reasons": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2}},
    "required": ["decision", "confidence", "reasons"], "additionalProperties": False}


@pytest.mark.bitwise  # verify chunks of <= 8 rows against one token at a time
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=2)],
                         ids=["greedy", "seeded"])
def test_constrained_speculation_equals_plain_on_smollm2(smol: Model,
                                                          params: SamplingParams) -> None:
    prompt = chat_prompt(smol, "Judge: tests were deleted.")
    base = Constraint.json_schema(SCHEMA, model=smol)
    plain_rec = Recorder(base.clone())
    plain = generate(smol, prompt, Sampler(params, plain_rec), max_tokens=60)
    c = base.clone()
    rec = Recorder(c)
    source = ConstrainedSource(c, PromptLookupSource())
    before = smol.stats.decode_calls
    spec = generate(smol, prompt, Sampler(params, rec), max_tokens=60, draft=source)
    assert spec.tokens == plain.tokens and spec.text == plain.text
    assert rec.commits == plain_rec.commits
    assert source.forced > 0  # grammar-forced spans were drafted...
    assert smol.stats.decode_calls - before < len(spec.tokens)  # ...and saved forward passes


@pytest.mark.bitwise
def test_unconstrained_speculation_equals_plain(smol: Model) -> None:
    prompt = chat_prompt(smol, "Repeat exactly: alpha beta gamma alpha beta gamma alpha beta")
    plain = generate(smol, prompt, Sampler(), max_tokens=30)
    spec = generate(smol, prompt, Sampler(), max_tokens=30, draft=PromptLookupSource())
    assert spec.tokens == plain.tokens


def test_invalid_drafts_are_pruned_before_verification(smol: Model) -> None:
    class Garbage:
        def propose(self, history: Sequence[int], k: int) -> list[int]:
            return smol.tokenize(" hello world again", special=False)[:k]

        def truncated(self, n: int) -> None:
            pass

    c = Constraint.json_schema(SCHEMA, model=smol)
    source = ConstrainedSource(c, Garbage())
    c.commit(smol.tokenize("{", special=False)[0])
    # no forced span right after '{'? then the garbage draft is pruned to nothing
    draft = source.propose([], 4)
    assert c.valid_prefix_len(draft) == len(draft)
    assert source.pruned + source.forced > 0


def test_stop_and_max_tokens_inside_a_draft() -> None:
    prompt = [5, 9, 12]
    plain = generate(FakeModel(), prompt, Sampler(), max_tokens=100)  # type: ignore[arg-type]
    assert plain.finish_reason == "stop"
    oracle = prompt + plain.tokens + [STOP, 7, 7, 7]  # the draft runs past the stop token

    class Perfect:
        def propose(self, history: Sequence[int], k: int) -> list[int]:
            return oracle[len(history) : len(history) + k]

        def truncated(self, n: int) -> None:
            pass

    spec = generate(FakeModel(), prompt, Sampler(), max_tokens=100,  # type: ignore[arg-type]
                    draft=Perfect(), draft_k=6)
    assert spec.tokens == plain.tokens and spec.finish_reason == "stop"
    cut = generate(FakeModel(), prompt, Sampler(), max_tokens=5,  # type: ignore[arg-type]
                   draft=Perfect(), draft_k=6)
    assert cut.tokens == plain.tokens[:5] and cut.finish_reason == "length"


def test_cost_gate_switches_off_and_back_on() -> None:
    gate = CostGate(pause=3)
    for _ in range(5):
        gate.record(4, 0)
    assert [gate.allow() for _ in range(4)] == [False, False, False, True]  # probes again
    good = CostGate(pause=3)
    for _ in range(5):
        good.record(4, 4)
    assert all(good.allow() for _ in range(5))


def test_the_default_gate_ignores_the_clock() -> None:
    """Reproducible drafting: the same acceptance history, timed fast or slow, gives the
    same decisions (a verdict lane cannot depend on machine load)."""
    decisions = []
    for seconds in (0.001, 10.0):
        gate = CostGate(pause=3)
        gate.record(0, 0, seconds=0.010, tokens=1)
        seen = []
        for accepted in (4, 4, 1, 0, 4, 2, 0, 0, 4):
            seen.append(gate.allow())
            gate.record(4, accepted, seconds=seconds, tokens=accepted + 1)
        decisions.append(seen)
    assert decisions[0] == decisions[1] and False in decisions[0]


def test_cost_gate_learns_from_step_timings() -> None:
    # Accepting everything, which the cost model calls a win: measured slower, it stops.
    slow = CostGate(pause=3, per_token_cost=0.43, timed=True)
    slow.record(0, 0, seconds=0.010, tokens=1)  # plain: 100 tok/s
    for _ in range(3):
        slow.record(4, 4, seconds=0.080, tokens=5)  # verify: 62 tok/s
    assert [slow.allow() for _ in range(4)] == [False, False, False, True]
    # Accepting half, which the model at a high per-row cost calls a loss: measured
    # faster, it keeps speculating.
    fast = CostGate(per_token_cost=0.9, pause=3, timed=True)
    fast.record(0, 0, seconds=0.010, tokens=1)
    for _ in range(3):
        fast.record(4, 2, seconds=0.015, tokens=3)  # 200 tok/s
    assert all(fast.allow() for _ in range(5))
    assert fast.plain_rate == pytest.approx(100) and fast.spec_rate == pytest.approx(200)


@pytest.mark.bitwise
def test_conversation_speculative_equals_plain(smol: Model) -> None:
    from chatkit import Conversation
    from tests.helpers import VERDICT_MAX_TOKENS, Verdict

    prompt, most = "Judge: the moon is cheese.", VERDICT_MAX_TOKENS
    plain = Conversation(smol).send(prompt, schema=Verdict, max_tokens=most)
    spec = Conversation(smol).send(prompt, schema=Verdict, max_tokens=most, speculative=True)
    assert spec.text == plain.text and isinstance(spec.parsed, Verdict)
    assert spec.usage.accepted_draft_tokens > 0  # the grammar's forced key spans
    stream = Conversation(smol).stream(prompt, schema=Verdict, max_tokens=most,
                                       speculative=True)
    assert "".join(stream) == plain.text


@pytest.mark.bitwise
def test_cli_speculative_flag() -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    schema = root / "tests/fixtures/schemas/verdict.json"
    # verdict.json's longest document is < 1,200 bytes (tests/test_cli.py)
    outs = [subprocess.run([sys.executable, "-m", "chatkit", "run", "--prompt", "Judge it.",
                            "--json-schema", f"@{schema}", "--max-tokens", "1200", *flag],
                           capture_output=True, text=True, timeout=120, check=True).stdout
            for flag in ([], ["--speculative"])]
    assert json.loads(outs[0]) == json.loads(outs[1])


@pytest.mark.bitwise  # verify chunks against one token at a time, short contexts
def test_speculative_turns_verify_inside_the_engine_loops_steps(smol: Model) -> None:
    """The engine loop (``chatkit serve``) runs speculative turns' verify chunks in its
    batched steps: several turns' drafts in one forward pass, each reply the plain one."""
    from chatkit import Conversation, engine_loop
    from chatkit.chat.turn import SPEC_K
    from tests.helpers import VERDICT_MAX_TOKENS, Verdict

    prompts = ["Judge: the moon is cheese.", "Judge: water is wet.", "Judge: cats bark."]
    plain = [Conversation(smol).send(p, schema=Verdict, max_tokens=VERDICT_MAX_TOKENS).text
             for p in prompts]
    loop = engine_loop(smol)
    steps_before, shared_before = loop.stats.steps, loop.stats.shared_steps
    rows = []
    decode = smol.decode

    def recording(chunks: Any) -> Any:
        rows.append(sum(len(c.tokens) for c in chunks if c.logits == "all"))
        return decode(chunks)

    smol.decode = recording  # type: ignore[method-assign]
    try:
        turns = [Conversation(smol).plan(p, Verdict, max_tokens=VERDICT_MAX_TOKENS,
                                         speculative=True) for p in prompts]
        with smol.lock:  # all three start together
            tickets = [loop.submit(turn) for turn in turns]
        texts = ["".join(t.deltas()) for t in tickets]
    finally:
        del smol.decode
    assert texts == plain
    assert all(t.reply is not None and t.reply.usage.accepted_draft_tokens > 0
               for t in tickets)
    assert max(rows) > 1 + SPEC_K  # two turns' verify chunks (<= 1 + SPEC_K rows) in one step
    assert loop.stats.shared_steps > shared_before and loop.stats.steps > steps_before


def test_a_verify_walk_stops_where_the_reply_ends() -> None:
    """``on_token`` sees each token of a verify walk as it is taken; when it ends the reply
    (a stop string's cut) the walk stops there, as plain steps would: no token past the
    cut is counted, and the KV sequence holds what the decoder says."""
    from chatkit.decode.decoding import Decoder

    prompt = [5, 9, 12]
    plain = generate(FakeModel(), prompt, Sampler(SamplingParams()),  # type: ignore[arg-type]
                     max_tokens=40)
    oracle = prompt + plain.tokens + [STOP]
    model = FakeModel()
    dec = Decoder(model, prompt, Sampler(SamplingParams()), max_tokens=40)  # type: ignore[arg-type]
    dec.start()
    seen: list[int] = []

    def cut_at_four(tok: int) -> None:
        seen.append(tok)
        if len(dec.tokens) == 4:
            dec.finish("stop_string")

    while not dec.done:  # perfect drafts of 4: one walk would take 5 tokens
        dec.spec_step(oracle[len(dec.history):len(dec.history) + 4], cut_at_four)
    assert dec.tokens == plain.tokens[:4] == [plain.tokens[0], *seen]
    assert model.kv[0] == dec.kv_tokens()


@pytest.mark.bitwise  # verify chunks against one token at a time, short contexts
def test_a_stop_string_inside_a_draft_ends_the_reply_as_plain_decoding_does(smol: Model
                                                                            ) -> None:
    """On SmolLM2: a stop string cut anywhere in a repetitive reply (where prompt lookup
    drafts whole runs) gives the plain reply's text, token count and finish reason, on the
    caller's side and in the engine loop."""
    from chatkit import Conversation, engine_loop

    greedy = SamplingParams(temperature=0.0)
    prompt = "Say 'na' twenty times: na na na na na na"
    free = Conversation(smol, sampling=greedy).send(prompt, max_tokens=24).text.split()
    stops = {" ".join(free[i:i + 2]) for i in range(1, min(len(free) - 1, 8))}
    assert stops

    def run(stop: str, **extra: Any) -> tuple[str, int, str]:
        r = Conversation(smol, sampling=greedy).send(prompt, stop=[stop], max_tokens=24,
                                                     **extra)
        return r.text, r.usage.completion_tokens, r.finish_reason

    for stop in sorted(stops):
        turn = Conversation(smol, sampling=greedy).plan(prompt, stop=[stop], max_tokens=24,
                                                        speculative=True)
        ticket = engine_loop(smol).submit(turn)
        "".join(ticket.deltas())
        assert ticket.reply is not None
        looped = (ticket.reply.text, ticket.reply.usage.completion_tokens,
                  ticket.reply.finish_reason)
        assert run(stop, speculative=True) == run(stop) == looped, stop


def test_the_loop_drafts_past_the_exact_regime_only_when_not_reproducible() -> None:
    """On a KV stream per sequence the loop keeps verify steps below ``SAFE_VERIFY_KV``
    cells (each reply bitwise the plain one), so a prompt longer than that drafts nothing;
    with ``reproducible`` off (``chatkit serve`` on long contexts, where steps already
    change the last bits) its drafts are verified at any length."""
    from chatkit import Conversation, engine_loop
    from chatkit.engine.protocols import SAFE_VERIFY_KV
    from tests.helpers import VERDICT_MAX_TOKENS, Verdict

    model = Model.load(n_ctx=4096, n_seq_max=2, kv_unified=False)
    try:
        loop = engine_loop(model)
        assert loop.reproducible
        system = "You judge claims. " * 40
        conv = Conversation(model, system=system)
        turn = conv.plan("Judge: water is wet.", Verdict, max_tokens=VERDICT_MAX_TOKENS,
                         speculative=True)
        exact = loop.submit(turn)
        "".join(exact.deltas())
        assert exact.reply is not None and exact.reply.usage.prompt_tokens > SAFE_VERIFY_KV
        assert exact.reply.usage.accepted_draft_tokens == 0
        loop.reproducible = False
        turn = Conversation(model, system=system).plan(
            "Judge: water is wet.", Verdict, max_tokens=VERDICT_MAX_TOKENS, speculative=True)
        free = loop.submit(turn)
        "".join(free.deltas())
        assert free.reply is not None and free.reply.usage.accepted_draft_tokens > 0
    finally:
        model.close()
