"""How blocking engine work meets async code and threads.

Async drivers run each blocking step in a worker thread under one
``anyio.CapacityLimiter(1)`` per engine and event loop, so steps on one
engine run one at a time while other tasks keep running. Sync code that must
run a coroutine (the agent loop's tool calls) does so on a fresh event loop,
in a worker thread when the calling thread already runs one (Jupyter, a
FastAPI handler).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import anyio
    import anyio.lowlevel

# asyncio and anyio (~35 ms to import) are imported on first use: a process that only
# calls the sync API (``send``, ``stream``) never needs them.

__all__: list[str] = []

R = TypeVar("R")

_LIMITERS: anyio.lowlevel.RunVar[dict[int, anyio.CapacityLimiter]] | None = None
_LIMITERS_MADE = threading.Lock()


def engine_limiter(engine: object) -> anyio.CapacityLimiter:
    """The capacity limiter of ``engine`` in the running event loop."""
    global _LIMITERS
    import anyio
    import anyio.lowlevel

    if _LIMITERS is None:
        with _LIMITERS_MADE:  # one RunVar for every thread's event loop
            if _LIMITERS is None:
                _LIMITERS = anyio.lowlevel.RunVar("chatkit_limiters")
    try:
        table = _LIMITERS.get()
    except LookupError:
        table = {}
        _LIMITERS.set(table)
    if id(engine) not in table:
        table[id(engine)] = anyio.CapacityLimiter(1)
    return table[id(engine)]


async def run_blocking(engine: object, fn: Callable[..., R], *args: Any) -> R:
    """Run a blocking step in a worker thread under the engine's limiter."""
    import anyio.to_thread

    return await anyio.to_thread.run_sync(fn, *args, limiter=engine_limiter(engine))


def run_coroutine_sync(fn: Callable[..., Awaitable[R]], *args: Any) -> R:
    """``anyio.run(fn, *args)``, also from a thread whose event loop is running (there the
    coroutine runs on a new loop in a worker thread, and this thread waits for it)."""
    import asyncio

    import anyio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn, *args)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="chatkit-sync") as pool:
        return pool.submit(anyio.run, fn, *args).result()
