"""Model: one GGUF, one llama.cpp context, many KV sequences.

Built on llama-cpp-python's low-level API only: ``llama_decode`` with an
explicit batch (tokens of one or more sequences in one call), logits rows
read as numpy views, KV sequences edited with ``llama_memory_seq_rm``/``_cp``.
The vocabulary is a :class:`chatkit.engine.vocab.Vocab` over the same weights
(``model.vocab``), the KV cells and their sequence leases a
:class:`chatkit.engine.kvseqs.KVCells` (``model.kv``).

A Model is not thread-safe: one thread drives it at a time (the async
drivers serialise through a per-model capacity limiter).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import DecodeError, InvalidParameter, ModelLoadError
from .backends import (
    INVARIANT_V_TYPE,
    SPLIT_MODES,
    BuildInfo,
    Placement,
    batch_invariant_kernels,
    plan_placement,
)
from .coldstart.llg_prebuild import TokenizerPrebuild
from .compute import run_on_compute
from .delegate import Lent, LentSetting, LentValue
from .kvseqs import KVCells
from .llama_log import build_info, forget_lines, last_error
from .lowlevel import llama_cpp
from .protocols import SAFE_PREFILL_CHUNK, IncrementalDetokenizer, SeqChunk
from .vocab import LLG_SLICES as LLG_SLICES
from .vocab import Vocab, checked_gguf
from .vocab import default_model_path as default_model_path

__all__ = ["Model", "Placement", "build_info"]


MIN_N_CTX = 64
"""Smallest context accepted: a chat template's markup alone takes tens of tokens."""
MAX_N_CTX = 1 << 20

_log = logging.getLogger("chatkit")


def default_threads() -> int:
    """llama.cpp threads when ``n_threads`` is not given (see docs/running.md, "Threads")."""
    return max(1, (os.cpu_count() or 1))


@dataclass
class _Stats:
    decode_calls: int = 0
    tokens_evaluated: int = 0
    per_seq: dict[int, int] = field(default_factory=dict)


class _Progress:
    """A load's ``progress(fraction)`` as llama.cpp's progress callback (``callback``, to
    keep alive while loading); a False return cancels the load (``cancelled``)."""

    def __init__(self, progress: Callable[[float], object]) -> None:
        self.progress = progress
        self.cancelled = False
        self.callback = llama_cpp.llama_progress_callback(self._report)

    def _report(self, fraction: float, user_data: Any) -> bool:
        try:
            self.cancelled = self.progress(float(fraction)) is False
        except Exception:  # a failing callback must not unwind through C
            _log.exception("progress callback failed; loading goes on")
        return not self.cancelled


def _check_sizes(**sizes: tuple[int | None, int, int]) -> None:
    """``InvalidParameter`` naming the first size that is not an integer in its range."""
    for name, (value, low, high) in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidParameter(name, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise InvalidParameter(name, f"must be in [{low}, {high}], got {value}")


def _check_load(n_ctx: int, n_seq_max: int, n_batch: int, n_threads: int | None,
                cache_seqs: int, kv_unified: bool) -> None:
    """``InvalidParameter`` for any of ``Model.load``'s sizes out of its range."""
    _check_sizes(n_ctx=(n_ctx, MIN_N_CTX, MAX_N_CTX), n_seq_max=(n_seq_max, 1, 256),
                 n_batch=(n_batch, 1, 65536),
                 n_threads=(n_threads if n_threads is not None else 1, 1, 512))
    _check_cache_seqs(cache_seqs, n_seq_max, kv_unified)


def _check_cache_seqs(cache_seqs: int, n_seq_max: int, kv_unified: bool) -> None:
    """``InvalidParameter`` unless ``cache_seqs`` fits beside ``n_seq_max`` in llama.cpp's
    256 sequence ids, and only with one KV pool."""
    _check_sizes(cache_seqs=(cache_seqs, 0, 256 - n_seq_max))
    if cache_seqs and not kv_unified:
        raise InvalidParameter("cache_seqs", "needs one KV pool (kv_unified=True): with a "
                               "stream per sequence each would take its share of n_ctx")


def _model_params(info: BuildInfo, placement: Placement, tensor_split: Sequence[float] | None,
                  progress: _Progress | None) -> tuple[Any, Any]:
    """llama.cpp's model parameters, and what they point to (keep it alive while loading);
    with ``placement.batch_invariant``, its tiled K-quant matmul turned off first
    (``InvalidParameter`` where it cannot be: :func:`batch_invariant_kernels`)."""
    batch_invariant_kernels(placement.batch_invariant)
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = placement.n_gpu_layers
    mparams.main_gpu = placement.main_gpu
    mparams.split_mode = SPLIT_MODES[placement.split_mode]
    mparams.use_extra_bufts = placement.extra_buffer_types
    split_array = None
    if tensor_split is not None:
        split_array = (ctypes.c_float * info.max_devices)(*[float(v) for v in tensor_split])
        mparams.tensor_split = split_array
    if progress is not None:
        mparams.progress_callback = progress.callback
    return mparams, split_array


def _context_params(placement: Placement, *, n_ctx: int, n_batch: int, n_seq_max: int,
                    threads: int, kv_unified: bool, swa_full: bool) -> Any:
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_seq_max = n_seq_max
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.no_perf = True
    cparams.offload_kqv = placement.offload_kqv
    cparams.flash_attn_type = {None: llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
                               True: llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                               False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
                               }[placement.flash_attn]
    if hasattr(cparams, "kv_unified"):
        cparams.kv_unified = kv_unified
    cparams.swa_full = swa_full
    if placement.batch_invariant:  # one flash-attention kernel for every step's shape
        cparams.type_v = INVARIANT_V_TYPE
    return cparams


def _load_serially(path: Path, mparams: Any, cparams: Any,
                   progress: _Progress | None) -> tuple[Any, Any]:
    """(model, context) with chatkit's log sink, or ``ModelLoadError`` naming llama.cpp's
    last error line (what was made is freed)."""
    forget_lines()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        reason = ("the progress callback cancelled the load"
                  if progress is not None and progress.cancelled
                  else last_error("llama.cpp could not load the model"))
        raise ModelLoadError(str(path), reason)
    try:
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise ModelLoadError(str(path), last_error("could not create a context"))
    except BaseException:
        llama_cpp.llama_model_free(model)
        raise
    return model, ctx


def _open(path: Path, mparams: Any, cparams: Any,
          progress: _Progress | None) -> tuple[Any, Any, TokenizerPrebuild | None]:
    """(model, context, the tokenizer build that ran alongside or None). With the
    vocabulary cached on disk, llguidance's end-of-turn tokenizer is built while llama.cpp
    loads; not with a progress callback (it is Python: the load would wait for the build at
    every call). A failed overlapped load is redone serially, for llama.cpp's message."""
    prebuild = TokenizerPrebuild.start(path) if progress is None else None
    try:
        if prebuild is not None:
            model, ctx = prebuild.load_alongside(path, mparams, cparams)
            if ctx:
                return model, ctx, prebuild
            prebuild.close()
            prebuild = None
        model, ctx = _load_serially(path, mparams, cparams, progress)
    except BaseException:
        if prebuild is not None:
            prebuild.close()
        raise
    return model, ctx, None


class Model:
    """A loaded GGUF with one llama.cpp context and ``n_seq_max`` KV sequences.

    Create with :meth:`Model.load`. Composed of its vocabulary (``vocab``: the vocabulary
    size, the logits row length with padding, special ids and the GGUF's chat template,
    copied here) and its KV cells and sequence leases (``kv``), whose methods it lends as its
    own (``model.tokenize``, ``model.lease_seq``, ...). Free with :meth:`close` (also on
    garbage collection).
    """

    vocab: Vocab
    kv: KVCells

    # the vocabulary's, lent
    name: LentValue[str] = LentValue("vocab")
    """The vocabulary's name (its model file's)."""
    tokenize = Lent("vocab", Vocab.tokenize)
    detokenize = Lent("vocab", Vocab.detokenize)
    detokenize_bytes = Lent("vocab", Vocab.detokenize_bytes)
    token_bytes = Lent("vocab", Vocab.token_bytes)
    token_attr = Lent("vocab", Vocab.token_attr)
    is_control = Lent("vocab", Vocab.is_control)
    is_eog = Lent("vocab", Vocab.is_eog)
    llg_tokenizer = Lent("vocab", Vocab.llg_tokenizer)
    special_texts = Lent("vocab", Vocab.special_texts)
    content_special_ids = Lent("vocab", Vocab.content_special_ids)
    grammar_token_words = Lent("vocab", Vocab.grammar_token_words)
    cache = Lent("vocab", Vocab.cache)
    # the KV cells' and sequence leases', lent
    kv_unified: LentValue[bool] = LentValue("kv")
    swa_full: LentValue[bool] = LentValue("kv")
    seq_wait: LentSetting[float] = LentSetting("kv")
    copies_prefixes: LentValue[bool] = LentValue("kv")
    cuts_back: LentValue[bool] = LentValue("kv")
    keeps_prefixes: LentValue[bool] = LentValue("kv")
    seq_rm = Lent("kv", KVCells.seq_rm)
    seq_cp = Lent("kv", KVCells.seq_cp)
    seq_pos_max = Lent("kv", KVCells.seq_pos_max)
    resumable = Lent("kv", KVCells.resumable)
    checkpoint = Lent("kv", KVCells.checkpoint)
    clear = Lent("kv", KVCells.clear)
    acquire_seq = Lent("kv", KVCells.acquire_seq)
    lease_seq = Lent("kv", KVCells.lease_seq)
    free_seqs = Lent("kv", KVCells.free_seqs)
    release_seq = Lent("kv", KVCells.release_seq)
    release_seq_owner = Lent("kv", KVCells.release_seq_owner)

    def __init__(self, path: Path, model: int, ctx: int, *, n_batch: int,
                 n_seq_max: int, cache_seqs: int = 0, kv_unified: bool = True,
                 swa_full: bool = False) -> None:
        self.path = path
        self._model: int | None = model
        self._ctx: int | None = ctx
        self.vocab = vocab = Vocab(path, model, owned=False)
        self.n_vocab = vocab.n_vocab
        """Length of a logits row (padding ids included)."""
        self.bos_id, self.eos_id, self.eot_id = vocab.bos_id, vocab.eos_id, vocab.eot_id
        self.add_bos = vocab.add_bos
        self.chat_template = vocab.chat_template
        """The model's own Jinja chat template, when it ships one."""
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))  # llama.cpp may round up
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx))
        """Cells one sequence can hold: n_ctx with a unified KV cache, else its share."""
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        """KV sequences leased at once (turns running together)."""
        self.n_seq_ids = n_seq_max + cache_seqs
        """Sequence ids of the context: ``n_seq_max`` plus the ``cache_seqs`` that only keep
        prefixes for later turns."""
        self.n_threads = os.cpu_count() or 1
        self.placement = Placement(n_gpu_layers=0, on_gpu=False, main_gpu=0,
                                   split_mode="layer", flash_attn=None, offload_kqv=True,
                                   extra_buffer_types=True, reason="not recorded")
        """Where the layers run (set by :meth:`load`)."""
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.lock = threading.RLock()
        """Held for every llama.cpp call sequence that must not interleave (a decode
        and the reading of its logits rows)."""
        self.stats = _Stats()
        if cache_seqs:  # each lease keeps to its share; idle prefixes fill the rest
            self.n_ctx_seq = self.n_ctx // n_seq_max
        self.kv = KVCells(model, ctx, self.lock, n_seq_ids=self.n_seq_ids, n_seq_max=n_seq_max,
                          kv_unified=kv_unified, swa_full=swa_full,
                          room=(lambda: self.n_ctx, lambda: self.n_ctx_seq) if cache_seqs
                          else None)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, *, n_ctx: int = 8192,
             n_seq_max: int = 4, n_threads: int | None = None, n_batch: int = 512,
             kv_unified: bool = False, progress: Callable[[float], object] | None = None,
             n_gpu_layers: int | None = None, main_gpu: int = 0, split_mode: str = "layer",
             tensor_split: Sequence[float] | None = None, flash_attn: bool | None = None,
             offload_kqv: bool = True, extra_buffer_types: bool | None = None,
             cache_seqs: int = 0, swa_full: bool = False, batch_invariant: bool = False) -> Model:
        """Load a GGUF (``None``: the embedded default model).

        Placement (README, "GPU offload"): ``n_gpu_layers`` None offloads every layer when the
        build has a GPU backend and runs on the CPU otherwise; -1 is every layer, 0 the CPU, N the
        first N layers; a CPU-only build runs on the CPU whatever the value. ``main_gpu``,
        ``split_mode`` (``none``, ``layer``, ``row``, ``tensor``), ``tensor_split`` (a proportion
        per device), ``flash_attn`` (None: llama.cpp decides) and ``offload_kqv`` are llama.cpp's
        own options; ``extra_buffer_types`` (None: on, except on a build carrying llama.cpp's AMX
        kernels) lets it repack weights for faster CPU kernels. The choice is logged and kept as
        :attr:`placement`. ``batch_invariant``: CPU kernels that keep a row's logits whatever rows
        share its step (no repacking; llama.cpp's tiled matmul off for the process:
        :func:`.backends.batch_invariant_kernels`; flash attention over a Q8_0 V cache).

        By default each of the ``n_seq_max`` KV sequences has its own stream of ``n_ctx /
        n_seq_max`` cells (``n_ctx_seq``), so a conversation's logits do not depend on what other
        sequences hold (docs/running.md, "Reproducibility"); ``kv_unified=True`` shares one pool of
        ``n_ctx`` cells and allows prefix copies (``seq_cp``), at the cost of last-bit differences.
        ``cache_seqs`` (one pool only): sequence ids past ``n_seq_max`` that keep finished turns'
        prefixes (``lease_seq``); each lease then keeps to ``n_ctx / n_seq_max`` cells and idle
        sequences are emptied, least recently used first, before the pool could fill. ``swa_full``:
        a sliding-window model (Gemma 3) keeps every cell in its window layers (full attention's KV
        memory), so prefixes can be kept and shared (``chatkit serve``: one pool, --reproducible).
        ``n_threads``: all. ``progress(fraction)`` is called as the weights load (returning False
        cancels: ``ModelLoadError``). Every parameter is checked (``InvalidParameter``) before
        llama.cpp sees it. Raises ``ModelNotFound`` (default model not installed) or
        ``ModelLoadError`` (missing, unreadable or corrupt file).

        With the vocabulary cached on disk (``CHATKIT_CACHE_DIR``), llguidance's end-of-turn
        tokenizer is built in a thread while llama.cpp loads (its log lines dropped); not with
        ``progress``, on a single core, or when ``chatkit.llama_cpp`` logs at DEBUG.
        """
        _check_load(n_ctx, n_seq_max, n_batch, n_threads, cache_seqs, kv_unified)
        resolved = checked_gguf(path)
        info = build_info()
        placement = plan_placement(
            info, n_gpu_layers=n_gpu_layers, main_gpu=main_gpu, split_mode=split_mode,
            tensor_split=tensor_split, flash_attn=flash_attn, offload_kqv=offload_kqv,
            extra_buffer_types=extra_buffer_types, batch_invariant=batch_invariant)
        threads = n_threads or default_threads()
        hook = _Progress(progress) if progress is not None else None
        mparams, pointed = _model_params(info, placement, tensor_split, hook)
        cparams = _context_params(placement, n_ctx=n_ctx, n_batch=n_batch,
                                  n_seq_max=n_seq_max + cache_seqs, threads=threads,
                                  kv_unified=kv_unified, swa_full=swa_full)
        made = _made(cls, resolved, *_open(resolved, mparams, cparams, hook),
                     n_seq_max=n_seq_max, cache_seqs=cache_seqs, kv_unified=kv_unified,
                     swa_full=swa_full)
        made.n_threads, made.placement = threads, placement
        _log.info("loaded %s: n_vocab=%d n_ctx=%d n_seq_max=%d n_batch=%d threads=%d; %s",
                  resolved.name, made.n_vocab, made.n_ctx, n_seq_max, made.n_batch, threads,
                  placement.reason)
        del pointed, hook
        return made

    @classmethod
    def load_vocab(cls, path: str | os.PathLike[str] | None = None) -> Vocab:
        """Only a GGUF's vocabulary and chat template (llama.cpp's ``vocab_only``: no
        weights, no context): a :class:`chatkit.engine.vocab.Vocab`, enough to render, tokenize and
        compile grammars for a remote engine serving the same model (``RemoteEngine``). It
        has no decoding methods. Raises as :meth:`load`."""
        return Vocab.load(path)

    def close(self) -> None:
        """Free the context, the batch and the weights. Idempotent."""
        if getattr(self, "_ctx", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"Model({self.path.name!r}, n_vocab={self.n_vocab}, n_ctx={self.n_ctx})"

    def incremental_detokenizer(self) -> IncrementalDetokenizer:
        """A streaming decoder that never splits a UTF-8 character across deltas."""
        return IncrementalDetokenizer(self.vocab)

    # ------------------------------------------------------------------ decode
    def decode(self, chunks: Sequence[SeqChunk]) -> list[NDArray[np.float32]]:
        """Evaluate all chunks in ONE ``llama_decode`` call.

        Returns, per chunk, a ``[rows, n_vocab]`` float32 array of the
        requested logits rows: a view into llama.cpp's output buffer (valid
        until the next decode; copy what must outlive it). Raises
        ``InvalidParameter`` when the chunks exceed ``n_batch`` tokens or name
        a bad sequence, ``DecodeError`` when llama.cpp fails (e.g. KV full).
        """
        total = sum(len(c.tokens) for c in chunks)
        if total == 0:
            raise InvalidParameter("chunks", "nothing to decode")
        if total > self.n_batch:
            raise InvalidParameter("chunks", f"{total} tokens exceed n_batch={self.n_batch}")
        b = self._batch
        wanted = _fill_batch(b, chunks, self.n_seq_ids)
        self.kv.leases.touched(c.seq_id for c in chunks)
        b.n_tokens = total
        status = run_on_compute(_llama_decode, self._ctx, b)
        if status != 0:
            reason = {1: "no KV slot for the batch (context full)", 2: "aborted"}.get(
                status, last_error("error")
            )
            raise DecodeError(status, reason)
        self.stats.decode_calls += 1
        self.stats.tokens_evaluated += total
        for c in chunks:
            self.stats.per_seq[c.seq_id] = self.stats.per_seq.get(c.seq_id, 0) + len(c.tokens)
        return [_logit_rows(self._ctx, first, rows, self.n_vocab) for first, rows in wanted]

    def prefill(self, seq_id: int, tokens: Sequence[int], pos: int = 0, *,
                chunk: int = SAFE_PREFILL_CHUNK) -> NDArray[np.float32]:
        """Evaluate a prompt suffix for one sequence in chunks; returns the last row (a copy).

        ``chunk`` defaults to the size that keeps logits bitwise equal to
        token-at-a-time evaluation (reproducibility over speed).
        """
        if not tokens:
            raise InvalidParameter("tokens", "nothing to prefill")
        step = max(1, min(chunk, self.n_batch))
        row: NDArray[np.float32] | None = None
        for start in range(0, len(tokens), step):
            part = tokens[start : start + step]
            last = start + step >= len(tokens)
            out = self.decode([SeqChunk(seq_id, pos + start, part, "last" if last else "none")])
            if last:
                row = out[0][0].copy()
        assert row is not None
        return row


def _llama_decode(ctx: Any, batch: Any) -> int:
    return int(llama_cpp.llama_decode(ctx, batch))


def _fill_batch(b: Any, chunks: Sequence[SeqChunk], n_seq_ids: int) -> list[tuple[int, int]]:
    """Write the chunks' tokens into llama.cpp's batch ``b``; per chunk, (first batch
    index of its logits rows, rows). ``InvalidParameter`` for a bad sequence id."""
    i = 0
    wanted: list[tuple[int, int]] = []
    for c in chunks:
        if not 0 <= c.seq_id < n_seq_ids:
            raise InvalidParameter("seq_id", f"{c.seq_id} not in [0, {n_seq_ids})")
        n = len(c.tokens)
        first_out = i if c.logits == "all" else i + n - 1
        rows = n if c.logits == "all" else (1 if c.logits == "last" and n else 0)
        for j, tok in enumerate(c.tokens):
            b.token[i] = tok
            b.pos[i] = c.pos + j
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = c.seq_id
            b.logits[i] = c.logits == "all" or (c.logits == "last" and j == n - 1)
            i += 1
        wanted.append((first_out, rows))
    return wanted


def _logit_rows(ctx: Any, first: int, rows: int, n_vocab: int) -> NDArray[np.float32]:
    """``rows`` logits rows from batch index ``first``: a view of llama.cpp's buffer when
    they are contiguous, else a copy."""
    if rows == 0:
        return np.empty((0, n_vocab), dtype=np.float32)
    ptr = llama_cpp.llama_get_logits_ith(ctx, first)
    if not ptr:
        raise DecodeError(-1, f"no logits for batch row {first}")
    if rows > 1:
        last = llama_cpp.llama_get_logits_ith(ctx, first + rows - 1)
        span = ctypes.addressof(last.contents) - ctypes.addressof(ptr.contents)
        if span != (rows - 1) * n_vocab * 4:
            return np.stack([_logit_rows(ctx, first + r, 1, n_vocab)[0] for r in range(rows)])
    return np.ctypeslib.as_array(ptr, shape=(rows, n_vocab))


def _made(cls: type[Model], path: Path, model: Any, ctx: Any,
          prebuild: TokenizerPrebuild | None, *, n_seq_max: int, cache_seqs: int = 0,
          kv_unified: bool = True, swa_full: bool = False) -> Model:
    """The Model over llama.cpp's model and context (freed here if that fails), with the
    tokenizer built alongside when there is one."""
    try:
        # llama.cpp caps a decode at min(n_ctx, n_batch) tokens (and aborts the process
        # past it): take the context's own figure, so decode() refuses by name first.
        made = cls(path, model, ctx, n_batch=int(llama_cpp.llama_n_batch(ctx)),
                   n_seq_max=n_seq_max, cache_seqs=cache_seqs, kv_unified=kv_unified,
                   swa_full=swa_full)
    except BaseException:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
        if prebuild is not None:
            prebuild.close()
        raise
    if prebuild is not None:
        try:
            _adopt_tokenizer(made.vocab, prebuild)
        finally:
            prebuild.close()
    return made


def _adopt_tokenizer(vocab: Vocab, prebuild: TokenizerPrebuild) -> None:
    """Put the tokenizer built alongside ``Model.load`` where ``llg_tokenizer(eot_id)``
    finds it, with the cached vocabulary table it was built from."""
    built = prebuild.finish(vocab.pointer)
    if built is None:
        return
    table, tokenizer, seconds = built
    if not vocab.adopt_tokenizer(table, tokenizer):
        _log.info("vocabulary cache of %s disagrees with the model; tokenizer discarded",
                  vocab.name)
        return
    _log.info("llguidance tokenizer for %s built in %.2f s, alongside the load", vocab.name,
              seconds)
