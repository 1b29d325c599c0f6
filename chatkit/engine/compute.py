"""One thread runs every llama.cpp forward pass of the process.

llama.cpp's CPU backend computes with OpenMP, and libgomp keeps a team of worker
threads per thread that has started a parallel region, for as long as that thread
lives. Two live teams fight over the cores: a one-token decode took twice as long or
more once a second, idle, thread had decoded once (docs/benchmarks.md has the figures).
So every ``Model.decode`` (the engine loop's steps, ``send_batch``, speculation,
``generate``) runs on this one thread, whichever thread asks; the caller waits (a hop,
small against a forward pass). The engine loops run here too, one step of each in
turn, between calls from other threads, so their steps need no hop at all. Benchmarks
that drive another llama.cpp wrapper in the same process run it here too
(:func:`run_on_compute`), so both use the same team.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

__all__: list[str] = []

_log = logging.getLogger("chatkit")

R = TypeVar("R")


class _Call:
    __slots__ = ("args", "done", "error", "fn", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.fn: Callable[..., Any] | None = None
        self.args: tuple[Any, ...] = ()
        self.value: Any = None
        self.error: BaseException | None = None


_jobs: queue.SimpleQueue[_Call | Tickable] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_start_lock = threading.Lock()
_local = threading.local()


class Tickable(Protocol):
    """A scheduler the compute thread steps between calls (the engine loop)."""

    def tick(self) -> bool:
        """One round of work; False when nothing could be done just now."""
        ...

    def retire(self) -> bool:
        """True (and unregistered) when there is no work left."""
        ...


WAIT_WHEN_STALLED = 0.005
"""Seconds to wait for a call when every active scheduler is stalled (e.g. all KV
sequences leased elsewhere)."""


def _serve(jobs: queue.SimpleQueue[_Call | Tickable]) -> None:
    active: list[Tickable] = []
    progressed = True
    while True:
        try:
            item = jobs.get(block=not active or not progressed,
                            timeout=None if not active else WAIT_WHEN_STALLED)
            while True:
                if isinstance(item, _Call):
                    _execute(item)
                elif item not in active:
                    active.append(item)
                item = jobs.get_nowait()
        except queue.Empty:
            pass
        progressed = False
        for loop in list(active):
            try:
                progressed = loop.tick() or progressed
                if loop.retire():
                    active.remove(loop)
            except Exception:  # never let the compute thread die: every decode waits on it
                _log.exception("a scheduler failed on the compute thread; dropped")
                active.remove(loop)


def _execute(call: _Call) -> None:
    try:
        assert call.fn is not None
        call.value = call.fn(*call.args)
    except BaseException as exc:
        call.error = exc
    finally:
        call.fn, call.args = None, ()
        call.done.set()


def activate(loop: Tickable) -> None:
    """Have the compute thread step ``loop`` until its ``retire()`` says it is done."""
    compute_thread()
    _jobs.put(loop)


def compute_thread() -> threading.Thread:
    """The compute thread (started on first use; a daemon)."""
    global _thread
    if _thread is None:
        with _start_lock:
            if _thread is None:
                _thread = threading.Thread(target=_serve, args=(_jobs,), daemon=True,
                                           name="chatkit-compute")
                _thread.start()
    return _thread


def run_on_compute(fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)`` on the compute thread (directly when already there); its exception
    is re-raised here."""
    thread = compute_thread()
    if threading.current_thread() is thread:
        return fn(*args)
    call: _Call | None = getattr(_local, "call", None)
    if call is None:
        call = _local.call = _Call()
    call.done.clear()
    call.fn, call.args = fn, args
    _jobs.put(call)
    call.done.wait()
    if call.error is not None:
        error, call.error = call.error, None
        raise error
    value, call.value = call.value, None
    return value  # type: ignore[no-any-return]
