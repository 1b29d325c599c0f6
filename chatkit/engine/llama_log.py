"""llama.cpp's process-wide log and backend: chatkit's log sink, a GIL-free mute window, the
one-time backend init, and the recent lines that name a failed load."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

from .backends import BuildInfo, read_build_info
from .lowlevel import llama_cpp

__all__ = ["build_info"]

_lines: deque[str] = deque(maxlen=64)
llama_log = logging.getLogger("chatkit.llama_cpp")
"""The logger llama.cpp's lines go to, at DEBUG."""


def _log_sink(level: int, text: bytes | None, user_data: Any) -> None:
    """llama.cpp log sink: keep the recent lines (for load errors) and hand them to the
    ``chatkit.llama_cpp`` logger at DEBUG; print nothing."""
    if text:
        line = text.decode("utf-8", errors="replace").rstrip("\n")
        _lines.append(line)
        if line:
            llama_log.debug("%s", line)


_log_callback = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)(_log_sink)

_backend_lock = threading.Lock()
_backend_ready = False


def ensure_backend() -> None:
    """Set chatkit's log sink and init llama.cpp's backend, once per process."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _backend_ready = True


def build_info() -> BuildInfo:
    """The llama.cpp build's backends, devices and CPU features (``chatkit info`` prints
    them), with chatkit's llama.cpp log sink set first."""
    ensure_backend()
    return read_build_info()


def forget_lines() -> None:
    """Drop the kept lines (before a load whose failure :func:`last_error` names)."""
    _lines.clear()


def last_error(default: str) -> str:
    """The last kept line that reads like an error, else ``default``."""
    for line in reversed(_lines):
        low = line.lower()
        if "error" in low or "failed" in low or "invalid" in low:
            return line.strip()
    return default


def _gil_free_log_sink() -> Any | None:
    """A C function llama.cpp can call as its log sink without taking Python's GIL, for the
    window where a load overlaps the llguidance tokenizer build (which holds the GIL for
    its whole length): with chatkit's Python sink each of llama.cpp's log calls during a
    load and context creation would wait for that build to finish.

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


quiet_sink = _gil_free_log_sink()
"""The GIL-free sink :func:`muted` installs; None where there is none."""
_quiet_lock = threading.Lock()
_quiet_depth = 0


def muted_depth() -> int:
    """How many :func:`muted` windows are open now (0: chatkit's sink is set)."""
    with _quiet_lock:
        return _quiet_depth


@contextlib.contextmanager
def muted(sink: Any) -> Iterator[None]:
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
