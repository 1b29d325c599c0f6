"""How ``chatkit serve`` sizes its engine: each sequence's context and the KV cache's layout.

Two layouts, chosen at start-up and logged with the reason:

- **one pool** (llama.cpp's unified KV cache): every sequence's cells in one pool, so a prompt
  prefix one request holds can be copied into another's sequence (a shared system prompt
  prefilled once) and idle *cache sequences* keep finished requests' prompts. Its price
  grows with the context: llama.cpp's attention spans every used cell of the pool, masked, so
  each request's prefill and decode also pay for the cells other sequences hold (measured in
  docs/benchmarks.md, "One pool or a stream per sequence": at 17k tokens a prompt prefills
  ~25% slower beside one cached 17k prefix, ~40% beside two).
- **a stream per sequence**: each sequence's attention over its own cells only, as
  llama-server's slots. Prefixes are reused by routing a request to the idle sequence that
  holds its prefix (trimmed), never copied; sliding-window models keep their window
  checkpoints instead of ``swa_full`` (``--reproducible`` loads ``swa_full``: in the
  window's ring a prompt resumed after a cached prefix lands in other cells than it would
  alone, and attention summed in another order differs in the last bits).

The default: one pool while each sequence's context is at most ``POOL_MAX_CTX_PER_SEQ``
tokens (short requests, where sharing a prefix between concurrent requests pays and the
pool's span costs little), a stream per sequence above it (an agent's long sessions).
``--kv pool|streams`` chooses; ``--reproducible`` is a stream per sequence in steps small
enough that each reply equals the same request served alone.

Flash attention follows: with a stream per sequence on the CPU, llama.cpp's matmul attention
prefills long prompts faster than its CPU flash-attention kernel (docs/benchmarks.md, "Flash
attention on the CPU"), for a scratch buffer that grows with the context, so serve turns
flash attention off there while that buffer stays small; elsewhere llama.cpp decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

__all__: list[str] = []

KV_MEMORY_SHARE = 0.5
"""Of the memory available at start-up, the share the default context's KV cache may take."""

POOL_MAX_CTX_PER_SEQ = 8192
"""The longest context per sequence that gets one KV pool by default."""

MATMUL_ATTENTION_MAX_BYTES = 1 << 30
"""The most one prefill step's attention scores may take (f32, scores and their softmax) for
serve to turn flash attention off on the CPU."""


@dataclass(frozen=True)
class KVLayout:
    """How the KV cache is laid out, as ``Model.load`` and the engine loop take it."""

    kv_unified: bool
    """One pool for every sequence (else a stream per sequence)."""
    cache_seqs: int
    """Idle sequences that only keep prompts (one pool only)."""
    swa_full: bool
    """A sliding window's layers as large as the context (one pool: prefixes copied whole;
    ``--reproducible``: a resumed prefix attends to the cells it would alone)."""
    reproducible: bool
    """Steps small enough that each reply equals the same request served alone."""
    why: str
    """The reason, for the start-up log."""


def kv_layout(kv: str | None, *, reproducible: bool, cache_seqs: int | None,
              ctx_per_seq: int, n_seq_max: int) -> KVLayout:
    """The layout for ``--kv`` (``pool``, ``streams`` or None: by ``ctx_per_seq``),
    ``--reproducible`` and ``--cache-seqs`` (None: as many as ``n_seq_max``, at most 256
    sequence ids in all). ``UsageError`` for flags that do not go together: ``--kv pool``
    with ``--reproducible``, cache sequences beside a stream per sequence."""
    check_flags(kv, reproducible=reproducible, cache_seqs=cache_seqs)
    if kv is None:
        kv = "streams" if reproducible or ctx_per_seq > POOL_MAX_CTX_PER_SEQ else "pool"
        why = ("--reproducible" if reproducible else
               f"each sequence's context is {ctx_per_seq} tokens, "
               f"{'above' if kv == 'streams' else 'at most'} {POOL_MAX_CTX_PER_SEQ}; --kv sets it")
    else:
        why = f"--kv {kv}"
    if kv == "streams":
        if cache_seqs:
            raise UsageError(f"--cache-seqs keeps prompts in one KV pool, and above "
                             f"{POOL_MAX_CTX_PER_SEQ} tokens a sequence (here {ctx_per_seq}) "
                             f"the default is a stream per sequence: --kv pool sets one pool")
        # --reproducible: a sliding window's layers keep every cell (``swa_full``), so a
        # request resumed from a kept prefix reads the cells it would alone; else checkpoints
        return KVLayout(False, 0, reproducible, reproducible,
                        f"a stream per sequence ({why}): no prefix copies between requests"
                        + ("; a sliding window's layers as large as the context (swa_full)"
                           if reproducible else ""))
    cache = cache_seqs if cache_seqs is not None else min(n_seq_max, max(0, 256 - n_seq_max))
    return KVLayout(True, cache, True, False,
                    f"one pool ({why}): prefixes copied between requests, {cache} cache "
                    f"sequences")


def flash_attn(flag: str | None, *, layout: KVLayout, ctx_per_seq: int, heads: int | None,
               on_gpu: bool, n_batch: int = 512) -> tuple[bool | None, str]:
    """``--flash-attn`` (``auto``, ``on``, ``off``; None: serve decides) as ``Model.load``
    takes it (None: llama.cpp decides), and why, for the start-up log; ``--reproducible``
    is on (``UsageError`` for ``off``: ``Model.load(batch_invariant=True)``). Serve's own
    choice is off on the CPU (``on_gpu`` False) with a stream per sequence, while one
    prefill step's scores, 2 x
    ``ctx_per_seq`` x ``n_batch`` x ``heads`` f32, fit ``MATMUL_ATTENTION_MAX_BYTES``;
    llama.cpp's choice elsewhere (``heads`` None: the GGUF header does not say)."""
    if layout.reproducible:
        if flag == "off":
            raise UsageError("--reproducible attends with flash attention (over a Q8_0 V "
                             "cache, the one kernel for every step's shape), not --flash-attn "
                             "off")
        return True, "on: --reproducible (batch-invariant, over a Q8_0 V cache)"
    if flag is not None:
        return {"auto": None, "on": True, "off": False}[flag], f"--flash-attn {flag}"
    keep = "a GPU" if on_gpu else "one KV pool" if layout.kv_unified else None
    if keep is not None or not heads:
        return None, (f"llama.cpp decides ({keep or 'attention heads unknown'}; "
                      f"--flash-attn sets it)")
    scores = 2 * ctx_per_seq * n_batch * heads * 4
    size = f"{scores / 2**20:.0f} MiB of attention scores a prefill step"
    if scores > MATMUL_ATTENTION_MAX_BYTES:
        return None, (f"llama.cpp decides (off would take {size}, above "
                      f"{MATMUL_ATTENTION_MAX_BYTES // 2**20} MiB; --flash-attn sets it)")
    return False, (f"off: on the CPU, llama.cpp's matmul attention prefills long prompts "
                   f"faster than its flash attention, for {size} (--flash-attn sets it)")


def check_flags(kv: str | None, *, reproducible: bool, cache_seqs: int | None) -> None:
    """``UsageError`` for layout flags that do not go together whatever the context:
    ``--kv pool`` with ``--reproducible``, ``--cache-seqs`` with ``--kv streams`` or
    ``--reproducible`` (checked before the model is read, so a refusal names the flags)."""
    if reproducible and kv == "pool":
        raise UsageError("--reproducible is a KV stream per sequence, not --kv pool")
    if cache_seqs and (kv == "streams" or reproducible):
        raise UsageError("--cache-seqs keeps prompts in one KV pool (--kv pool, without "
                         "--reproducible); with a stream per sequence each would take a "
                         "sequence's share")


def ctx_per_seq(model: str | None, *, ctx_per_seq: int | None, n_ctx: int | None,
                n_seq_max: int) -> tuple[int, str]:
    """Each sequence's context and where it came from: ``--ctx-per-seq``, else ``--n-ctx``'s
    share, else the model's training context, shrunk (to a multiple of 256, at least 2048)
    until the f16 KV cache of ``n_seq_max`` sequences takes at most ``KV_MEMORY_SHARE`` of
    the available memory. Reads the GGUF's header (``model``: a path, or None for the
    embedded default). ``UsageError`` for both ``--ctx-per-seq`` and ``--n-ctx`` (one
    context, said two ways)."""
    if ctx_per_seq is not None and n_ctx is not None:
        raise UsageError("give --ctx-per-seq (each sequence's context) or --n-ctx (all "
                         "sequences' together), not both")
    if ctx_per_seq is not None:
        return ctx_per_seq, "--ctx-per-seq"
    if n_ctx is not None:
        return n_ctx // n_seq_max, "--n-ctx"
    from ..engine.gguf_header import kv_bytes_per_token, train_context
    from ..engine.vocab import checked_gguf

    path: Path = checked_gguf(model)
    trained = train_context(path) or 4096
    per_token, available = kv_bytes_per_token(path), available_memory()
    if per_token is None or available is None:
        return trained, "the model's training context"
    fits = int(available * KV_MEMORY_SHARE) // (per_token * n_seq_max)
    if fits >= trained:
        return trained, (f"the model's training context; KV cache at most "
                         f"{trained * per_token * n_seq_max / 2**30:.1f} GiB")
    chosen = max(2048, fits // 256 * 256)
    return chosen, (f"limited by memory: the model's training context is {trained}; "
                    f"KV cache at most {chosen * per_token * n_seq_max / 2**30:.1f} GiB "
                    f"of {available / 2**30:.1f} GiB available; --ctx-per-seq sets it")


def available_memory() -> int | None:
    """Bytes of memory available now (Linux ``MemAvailable``; elsewhere None)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
