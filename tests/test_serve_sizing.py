"""``chatkit serve``'s KV layout: one pool for short contexts, a stream per sequence for long
ones (an agent's), the flags that choose it, and the ones that do not go together."""

from __future__ import annotations

import pytest

from chatkit.errors import UsageError
from chatkit.serve.sizing import (
    MATMUL_ATTENTION_MAX_BYTES,
    POOL_MAX_CTX_PER_SEQ,
    KVLayout,
    flash_attn,
    kv_layout,
)


def _layout(kv: str | None = None, *, reproducible: bool = False, cache_seqs: int | None = None,
            ctx: int = 1024, n_seq_max: int = 4) -> KVLayout:
    return kv_layout(kv, reproducible=reproducible, cache_seqs=cache_seqs, ctx_per_seq=ctx,
                     n_seq_max=n_seq_max)


def test_short_contexts_get_one_pool_and_long_ones_a_stream_per_sequence() -> None:
    short = _layout(ctx=POOL_MAX_CTX_PER_SEQ)
    assert (short.kv_unified, short.cache_seqs, short.swa_full, short.reproducible) == (
        True, 4, True, False)
    assert "one pool" in short.why and str(POOL_MAX_CTX_PER_SEQ) in short.why
    long = _layout(ctx=POOL_MAX_CTX_PER_SEQ + 1)
    # a stream per sequence: no cache sequences, window checkpoints instead of swa_full, and
    # large prefill steps (the replies need not equal the same request served alone)
    assert (long.kv_unified, long.cache_seqs, long.swa_full, long.reproducible) == (
        False, 0, False, False)
    assert "a stream per sequence" in long.why and "--kv" in long.why


def test_the_flags_choose_and_say_so() -> None:
    assert _layout("streams", ctx=512).kv_unified is False
    assert "--kv streams" in _layout("streams").why
    pool = _layout("pool", ctx=32768, cache_seqs=2)
    assert (pool.kv_unified, pool.cache_seqs) == (True, 2)
    exact = _layout(reproducible=True, ctx=512)
    assert (exact.kv_unified, exact.reproducible) == (False, True)
    assert exact.swa_full and "swa_full" in exact.why  # a resumed prefix as alone (below)
    assert _layout(n_seq_max=250).cache_seqs == 6  # 256 sequence ids in all


@pytest.mark.parametrize(("kv", "reproducible", "cache_seqs", "ctx", "match"), [
    ("pool", True, None, 512, "--reproducible"),
    ("streams", False, 2, 512, "--cache-seqs"),
    (None, True, 1, 512, "--cache-seqs"),
    (None, False, 1, POOL_MAX_CTX_PER_SEQ + 1, "--cache-seqs"),
])
def test_flags_that_do_not_go_together_are_refused_by_name(
        kv: str | None, reproducible: bool, cache_seqs: int | None, ctx: int,
        match: str) -> None:
    with pytest.raises(UsageError, match=match):
        _layout(kv, reproducible=reproducible, cache_seqs=cache_seqs, ctx=ctx)
    # --cache-seqs 0 goes with anything that is not a pool
    if cache_seqs:
        _layout(None if kv == "pool" else kv, reproducible=reproducible, cache_seqs=0, ctx=ctx)


def test_flash_attention_is_off_on_the_cpu_for_long_contexts_while_its_scratch_is_small(
) -> None:
    """Serve's own choice (no ``--flash-attn``): off on the CPU with a stream per sequence
    (the measured case), llama.cpp's choice (None) with one pool, a GPU, an unknown head
    count, or scores above the bound; the flag wins, except ``off`` with ``--reproducible``
    (on: its batch-invariant attention)."""
    long = _layout(ctx=32768)

    def choose(flag: str | None = None, layout: KVLayout = long, ctx: int = 32768,
               heads: int | None = 4, on_gpu: bool = False) -> tuple[bool | None, str]:
        return flash_attn(flag, layout=layout, ctx_per_seq=ctx, heads=heads, on_gpu=on_gpu)

    off, why = choose()
    assert off is False and "off" in why and "512 MiB" in why  # 2 x 32768 x 512 x 4 x 4 B
    for kept in (choose(layout=_layout(ctx=4096)), choose(on_gpu=True), choose(heads=None)):
        assert kept[0] is None and "llama.cpp decides" in kept[1] and "--flash-attn" in kept[1]
    big = 32  # a 7B model's heads at 32k: 4 GiB of scores a step
    assert 2 * 32768 * 512 * big * 4 > MATMUL_ATTENTION_MAX_BYTES
    assert choose(heads=big)[0] is None
    assert choose(ctx=4096, heads=big, layout=_layout("streams", ctx=4096))[0] is False
    assert choose(heads=8)[0] is False  # 2 x 32768 x 512 x 8 x 4 B: 1 GiB, the bound itself
    assert choose(heads=9)[0] is None  # 1.125 GiB
    for flag, given in (("on", True), ("off", False), ("auto", None)):
        assert choose(flag, layout=_layout(ctx=1024)) == (given, f"--flash-attn {flag}")
    exact = _layout(reproducible=True)
    for flag in (None, "on", "auto"):
        assert choose(flag, layout=exact)[0] is True
    with pytest.raises(UsageError, match="--reproducible"):
        choose("off", layout=exact)


@pytest.mark.gemma
def test_the_heads_come_from_the_gguf_header() -> None:
    from chatkit.engine.gguf_header import attention_heads
    from chatkit.engine.vocab import default_model_path
    from tests.conftest import gemma_path

    assert attention_heads(default_model_path()) == 9  # SmolLM2-135M
    assert attention_heads(gemma_path()) == 4  # Gemma 3 270M


_RESUMED_AS_ALONE = """
import sys
from chatkit import Model
from chatkit.serve.sizing import kv_layout
layout = kv_layout(None, reproducible=True, cache_seqs=None, ctx_per_seq=1536, n_seq_max=1)
model = Model.load(sys.argv[1], n_ctx=1536, n_seq_max=1, kv_unified=layout.kv_unified,
                   swa_full=layout.swa_full, batch_invariant=layout.reproducible)
text = model.tokenize("Rules follow. " + "Run the tests after a change. " * 160, special=False)
ask = model.tokenize(" OK. Shorter, please. Now tell me which rule is first.", special=False)
reply = model.tokenize(" Something else entirely, a long answer that goes on. " * 40,
                       special=False)
same = 0
for n, r in ((650, 400), (1000, 60)):  # past Gemma's 512-token window
    model.seq_rm(0)
    alone = model.prefill(0, text[:n] + ask)
    model.seq_rm(0)
    model.prefill(0, text[:n] + reply[:r])
    model.seq_rm(0, n, -1)  # the next request resumes after the cached prefix
    assert model.resumable(0, n) == n
    same += bool((model.prefill(0, ask, pos=n) == alone).all())
print(same)
"""


@pytest.mark.gemma
@pytest.mark.bitwise
def test_reproducible_resumes_a_sliding_window_prefix_as_the_prompt_alone() -> None:
    """``--reproducible``'s layout on Gemma 3 (a 512-token sliding window): a prompt resumed
    after a cached prefix whose reply was cut back has the logits of the same prompt
    prefilled alone. Without ``swa_full`` the window's ring holds the resumed rows in other
    cells and the logits differ. In a fresh process: batch-invariant kernels are switched
    once per process."""
    from tests.conftest import gemma_path, in_fresh_process

    same, stderr = in_fresh_process(_RESUMED_AS_ALONE, str(gemma_path()))
    assert same == "2", stderr
