"""What the llama.cpp build under chatkit runs on: its backends, devices and CPU features.

Read from llama.cpp itself (``llama_print_system_info``, ``llama_supports_gpu_offload``
and ggml's device registry), never from the machine's own ``/proc/cpuinfo``: what matters
is what the build compiled in and found, not what the CPU could do.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from ..errors import InvalidParameter
from .lowlevel import llama_cpp, submodule

__all__ = ["BuildInfo", "Device", "Placement"]

_log = logging.getLogger("chatkit")

_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}


@dataclass(frozen=True)
class Device:
    """One device llama.cpp can place tensors on (ggml's device registry)."""

    name: str
    description: str
    kind: str
    """``cpu``, ``gpu`` (dedicated memory), ``igpu`` (host memory), ``accel`` (used beside
    the CPU, e.g. BLAS) or ``meta``."""
    memory_free: int
    memory_total: int


@dataclass(frozen=True)
class BuildInfo:
    """The llama.cpp build's backends and what each reports.

    ``features`` maps a backend's name (``CPU``, ``CUDA``, ...) to the features it
    reports (``{"AVX2": "1", "AMX_INT8": "1", ...}``: for the CPU, what was compiled in).
    """

    features: dict[str, dict[str, str]]
    devices: tuple[Device, ...]
    gpu_offload: bool
    """llama.cpp can offload layers (a GPU or other offload backend is built in)."""
    max_devices: int

    @property
    def amx_kernels(self) -> bool:
        """The CPU backend carries llama.cpp's AMX matrix kernels (built with AMX enabled,
        as ``-march=native`` does on an Intel CPU with AMX). Their buffer type is one of
        llama.cpp's "extra" buffer types, and in the llama.cpp that llama-cpp-python 0.3.36
        vendors it executes tile instructions with no tile configuration loaded: SIGILL on
        any decode of more than a few dozen tokens (llama.cpp PR #26954, open)."""
        return self.features.get("CPU", {}).get("AMX_INT8", "0") not in {"", "0"}

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind in {"gpu", "igpu"})

    def describe(self) -> list[str]:
        """Lines for ``chatkit info``."""
        lines = [f"gpu offload: {'yes' if self.gpu_offload else 'no (CPU-only build)'}"]
        for backend, feats in self.features.items():
            on = [k for k, v in feats.items() if v not in {"", "0"}]
            lines.append(f"backend {backend}: {' '.join(on) if on else '-'}")
        for i, d in enumerate(self.devices):
            mem = (f", {d.memory_free / 2**30:.1f} / {d.memory_total / 2**30:.1f} GiB free"
                   if d.memory_total else "")
            lines.append(f"device {i}: {d.name} ({d.kind}) {d.description}{mem}")
        if self.amx_kernels:
            lines.append("note: this build carries llama.cpp's AMX kernels; Model.load turns "
                         "llama.cpp's extra buffer types off (README, 'Build options')")
        return lines


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """``"CPU : SSE3 = 1 | AVX2 = 1 | "`` -> ``{"CPU": {"SSE3": "1", "AVX2": "1"}}``.

    llama.cpp writes each backend's name, `` : `` and its ``NAME = value |`` pairs one
    after another on one line; a backend's name is the word before `` : ``."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        if " : " in part:  # "<previous pair or nothing> <Backend> : <first pair>"
            head, _, part = part.partition(" : ")
            current = out.setdefault(head.split()[-1] if head.split() else head, {})
        if current is None:
            continue
        name, eq, value = part.partition("=")
        if eq:
            current[name.strip()] = value.strip()
    return out


def _devices() -> tuple[Device, ...]:
    try:
        _ggml = submodule("_ggml")  # llama-cpp-python's handle on libggml
        lib = _ggml.libggml
        lib.ggml_backend_dev_count.restype = ctypes.c_size_t
        lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        lib.ggml_backend_dev_get.restype = ctypes.c_void_p
        for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_char_p
        lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
        lib.ggml_backend_dev_type.restype = ctypes.c_int
        lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p,
                                                ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)]
        lib.ggml_backend_dev_memory.restype = None
        found = []
        for i in range(int(lib.ggml_backend_dev_count())):
            dev = lib.ggml_backend_dev_get(i)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            found.append(Device(
                name=(lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                description=(lib.ggml_backend_dev_description(dev) or b"").decode(
                    errors="replace"),
                kind=_DEVICE_KINDS.get(int(lib.ggml_backend_dev_type(dev)), "other"),
                memory_free=int(free.value), memory_total=int(total.value)))
        return tuple(found)
    except (ImportError, OSError, AttributeError) as exc:  # an unusual build or binding
        _log.info("llama.cpp's device list is not readable here (%s)", exc)
        return ()


@cache
def read_build_info() -> BuildInfo:
    """The llama.cpp build's backends, devices and CPU features (read once per process;
    ``chatkit.engine.model.build_info`` is the same with chatkit's llama.cpp log sink set)."""
    raw = llama_cpp.llama_print_system_info()
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    return BuildInfo(features=parse_system_info(text), devices=_devices(),
                     gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
                     max_devices=int(llama_cpp.llama_max_devices()))


SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
"""``split_mode`` names (llama.h's ``llama_split_mode``): ``none`` one GPU (``main_gpu``),
``layer`` layers and KV spread over the GPUs, ``row`` rows too (tensor parallelism where
the backend has it), ``tensor`` llama.cpp's tensor-parallel split."""


@dataclass(frozen=True)
class Placement:
    """Where a model's layers run and which llama.cpp options chose it (``Model.placement``).

    ``n_gpu_layers`` is what llama.cpp was given (-1: every layer); ``on_gpu`` whether any
    layer is offloaded; ``extra_buffer_types`` whether llama.cpp may repack weights into its
    extra CPU buffer types (AMX, repacked Q4_0/Q4_K/IQ4_NL); ``batch_invariant`` whether
    the CPU kernels were chosen so that a row's logits do not depend on how many rows its
    forward pass carries (:func:`batch_invariant_kernels`); ``reason`` says why, in words,
    as it was logged at load."""

    n_gpu_layers: int
    on_gpu: bool
    main_gpu: int
    split_mode: str
    flash_attn: bool | None
    offload_kqv: bool
    extra_buffer_types: bool
    reason: str
    batch_invariant: bool = False


def plan_placement(info: BuildInfo, *, n_gpu_layers: int | None, main_gpu: int,
                   split_mode: str, tensor_split: Sequence[float] | None,
                   flash_attn: bool | None, offload_kqv: bool,
                   extra_buffer_types: bool | None,
                   batch_invariant: bool = False) -> Placement:
    """Check the placement options against the build (``InvalidParameter`` naming the
    first bad one) and decide what llama.cpp is given. Pure: no llama.cpp call.
    ``batch_invariant`` turns the extra buffer types off (their repacked K-quant weights
    take one kernel for whole groups of four rows and another for the rest) and flash
    attention on over a Q8_0 V cache (:data:`INVARIANT_V_TYPE`), so ``extra_buffer_types=True``
    or ``flash_attn=False`` beside it is refused."""
    _check_options(n_gpu_layers=n_gpu_layers, main_gpu=main_gpu, split_mode=split_mode,
                   flash_attn=flash_attn, offload_kqv=offload_kqv,
                   extra_buffer_types=extra_buffer_types)
    if not isinstance(batch_invariant, bool):
        raise InvalidParameter("batch_invariant", f"must be True or False, got "
                               f"{batch_invariant!r}")
    if batch_invariant and extra_buffer_types:
        raise InvalidParameter("extra_buffer_types", "batch_invariant=True repacks no "
                               "weights (repacked K-quants take another kernel for the rows "
                               "left over from groups of four); leave it None or False")
    if batch_invariant and flash_attn is False:
        raise InvalidParameter("flash_attn", "batch_invariant=True attends with llama.cpp's "
                               "flash attention (one kernel for every step's shape over its "
                               "Q8_0 V cache; without it the matmul's kernel changes with the "
                               "rows of a step); leave it None or True")
    if tensor_split is not None:
        _check_tensor_split(tensor_split, info.max_devices)
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
    if batch_invariant:
        extra, flash_attn = False, True
        where += ("; batch-invariant CPU kernels: llama.cpp's extra buffer types and its tiled "
                  "K-quant matmul off, flash attention over a Q8_0 V cache")
    elif extra_buffer_types is None:
        extra = not info.amx_kernels
        if not extra:
            where += ("; llama.cpp's extra buffer types off: this build carries its AMX "
                      "kernels, which crash with SIGILL (llama.cpp PR #26954)")
    else:
        extra = extra_buffer_types
    return Placement(n_gpu_layers=layers, on_gpu=layers != 0, main_gpu=main_gpu,
                     split_mode=split_mode, flash_attn=flash_attn, offload_kqv=offload_kqv,
                     extra_buffer_types=extra, reason=where, batch_invariant=batch_invariant)


INVARIANT_V_TYPE = 8  # GGML_TYPE_Q8_0
"""The V cache's type under ``batch_invariant``. llama.cpp's CPU flash attention takes
another path for an F16 (or F32) cache by a step's shape: a lone row of one sequence over
512 cells or more is split across threads (another summation order), 64 rows of one
sequence are tiled. With K and V of different types it takes its one per-row kernel for
every shape. Q8_0 halves the V cache's memory; its rounding is the price (small: llama.cpp's
``-ctv q8_0``)."""

TILED_MM_ENV = "GGML_CPU_TILED_MM"
"""llama.cpp's switch for its tiled K-quant matmul (on unless ``0``), read once per process
at its first forward pass. The kernel takes a batch of 8 rows or more, ``vec_dot`` fewer, and
the two round differently, so a row's logits depend on the rows beside it."""

_tiled_seen_on = False
_switch_lock = threading.Lock()


def batch_invariant_kernels(wanted: bool) -> None:
    """Before a model loads: with ``wanted``, turn llama.cpp's tiled K-quant matmul off for
    this process (``GGML_CPU_TILED_MM=0``); without, note that a model may run it.

    Raises ``InvalidParameter`` (``batch_invariant``) when the environment sets
    ``GGML_CPU_TILED_MM`` to anything but 0, or when a model was loaded in this process
    before with the kernel on (whether or not it ran; setting the variable afterwards does
    not help): llama.cpp may have fixed it (load the batch-invariant model first, or start
    the process with ``GGML_CPU_TILED_MM=0``). Once off, it stays off for every model of
    the process (logged). Safe from several threads."""
    global _tiled_seen_on
    with _switch_lock:
        value = os.environ.get(TILED_MM_ENV)
        off = value is not None and _atoi(value) == 0
        if not wanted:
            if off:
                _log.info("llama.cpp's tiled K-quant matmul is off in this process (%s=%s)",
                          TILED_MM_ENV, value)
            _tiled_seen_on = _tiled_seen_on or not off
            return
        if _tiled_seen_on:
            raise InvalidParameter("batch_invariant", "a model was loaded in this process "
                                   "with llama.cpp's tiled K-quant matmul on, and llama.cpp "
                                   f"reads {TILED_MM_ENV} once; load the batch-invariant "
                                   f"model first, or start the process with {TILED_MM_ENV}=0")
        if off:
            return
        if value is not None:
            raise InvalidParameter("batch_invariant", f"the environment sets {TILED_MM_ENV}="
                                   f"{value!r}, which keeps llama.cpp's tiled K-quant matmul "
                                   "on; unset it or set 0")
        os.environ[TILED_MM_ENV] = "0"
    _log.info("llama.cpp's tiled K-quant matmul turned off for this process (%s=0): "
              "batch_invariant", TILED_MM_ENV)


def _atoi(text: str) -> int:
    """glibc's ``atoi``, as ggml reads the variable: leading digits after blanks and a sign,
    as ``strtol`` (clamped to 64 bits), then cut to a 32-bit ``int``."""
    digits = text.lstrip(" \t\n\v\f\r")
    sign = -1 if digits[:1] == "-" else 1
    digits = digits[1:] if digits[:1] in "+-" else digits
    n = 0
    for ch in digits:
        if ch not in "0123456789":
            break
        n = n * 10 + int(ch)
    n = max(-(1 << 63), min(sign * n, (1 << 63) - 1))
    return (n + (1 << 31)) % (1 << 32) - (1 << 31)


def _check_options(*, n_gpu_layers: int | None, main_gpu: int, split_mode: str,
                   flash_attn: bool | None, offload_kqv: bool,
                   extra_buffer_types: bool | None) -> None:
    """``InvalidParameter`` naming the first option of the wrong type or range."""
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


def _check_tensor_split(tensor_split: Sequence[float], max_devices: int) -> None:
    """``InvalidParameter`` unless 1 to ``max_devices`` finite proportions >= 0, one > 0."""
    if isinstance(tensor_split, str | bytes) or not isinstance(tensor_split, Sequence):
        raise InvalidParameter("tensor_split", "must be a sequence of proportions, got "
                               f"{tensor_split!r}")
    values = list(tensor_split)
    if not 1 <= len(values) <= max_devices:
        raise InvalidParameter("tensor_split", f"takes 1 to {max_devices} "
                               f"proportions (llama_max_devices), got {len(values)}")
    for v in values:
        if (isinstance(v, bool) or not isinstance(v, int | float)
                or not (0.0 <= float(v) < float("inf"))):
            raise InvalidParameter("tensor_split", "each proportion must be a finite "
                                   f"number >= 0, got {v!r}")
    if sum(float(v) for v in values) <= 0.0:
        raise InvalidParameter("tensor_split", "needs a proportion above 0")
