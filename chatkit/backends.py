"""What the llama.cpp build under chatkit runs on: its backends, devices and CPU features.

Read from llama.cpp itself (``llama_print_system_info``, ``llama_supports_gpu_offload``
and ggml's device registry), never from the machine's own ``/proc/cpuinfo``: what matters
is what the build compiled in and found, not what the CPU could do.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from functools import cache

import llama_cpp

__all__ = ["BuildInfo", "Device"]

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
        from llama_cpp import _ggml  # llama-cpp-python's handle on libggml
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
    ``chatkit.model.build_info`` is the same with chatkit's llama.cpp log sink set)."""
    raw = llama_cpp.llama_print_system_info()
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)
    return BuildInfo(features=parse_system_info(text), devices=_devices(),
                     gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
                     max_devices=int(llama_cpp.llama_max_devices()))
