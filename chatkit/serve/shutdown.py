"""Graceful shutdown: SIGTERM or SIGINT drains the server instead of dropping its requests.

On the first signal the server stops taking work: every new request (``/health`` too, so a
load balancer stops routing here) is answered 503 with ``Retry-After``, in the client's
API's error shape. Requests in flight run to their end for up to ``drain_timeout`` seconds;
streams still open then end with an error event (``server_shutting_down``) and requests
still waiting get that error as their answer. Then uvicorn closes its connections and the
process exits 0. A second signal exits at once (uvicorn's own shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RequestError
from . import anthropic_api
from .http import wants_anthropic

if TYPE_CHECKING:
    import uvicorn

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")

RETRY_AFTER = 5
"""Seconds a refused client is told to wait (``Retry-After``): long enough for a replacement
process to come up behind the same address."""


def shutting_down() -> RequestError:
    """The error a request refused or cut by the drain gets."""
    return RequestError(503, "the server is shutting down; retry on another instance or "
                        "after it restarts", type="server_error", code="server_shutting_down",
                        headers={"Retry-After": str(RETRY_AFTER)})


class Drain:
    """ASGI middleware around the app: counts the HTTP requests in flight (a stream until
    its last event) and, once :meth:`begin` was called, refuses new ones with 503.
    ``abort(exc)``: the app's way to end every open stream with ``exc`` (called on the
    event loop)."""

    def __init__(self, app: Any, abort: Callable[[Exception], None]) -> None:
        self.app = app
        self.inflight = 0
        self.draining = False
        self._abort = abort
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._loop = asyncio.get_running_loop()
        if self.draining:
            await self._refuse(scope, receive, send)
            return
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1

    def begin(self) -> None:
        """Refuse new requests from now on (any thread)."""
        self.draining = True

    def abort(self) -> None:
        """End what is still in flight with :func:`shutting_down` (any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._abort, shutting_down())

    @staticmethod
    async def _refuse(scope: Any, receive: Any, send: Any) -> None:
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        err = shutting_down()
        request = Request(scope, receive)
        body = anthropic_api.error_body(err) if wants_anthropic(request) else err.body()
        await JSONResponse(body, status_code=err.status, headers=err.headers)(scope, receive,
                                                                              send)


def run(app: Any, drain: Drain, *, host: str, port: int, drain_timeout: float) -> None:
    """Serve ``app`` (``drain`` wrapping it) with uvicorn until a signal; drain as the
    module docstring says, then return (the process exits 0)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info",
                                           access_log=False))
    # uvicorn installs server.handle_exit as the signal handler (SIGINT, SIGTERM)
    server.handle_exit = _Signals(server, drain, drain_timeout).handle  # type: ignore[method-assign]
    server.run()


class _Signals:
    """The signal handler: the first signal drains, then lets uvicorn shut down; a second
    one shuts down at once. (Not uvicorn's own, which re-raises the signal after its
    shutdown, so the process would die by it instead of exiting 0.)"""

    def __init__(self, server: uvicorn.Server, drain: Drain, timeout: float) -> None:
        self.server, self.drain, self.timeout = server, drain, timeout

    def handle(self, sig: int, frame: Any) -> None:
        if self.drain.draining:
            self.server.should_exit = self.server.force_exit = True
            return
        _log.info("signal %d: draining %d requests in flight (up to %g s), refusing new ones",
                  sig, self.drain.inflight, self.timeout)
        self.drain.begin()
        threading.Thread(target=self._wait, name="chatkit-drain", daemon=True).start()

    def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout
        while self.drain.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.drain.inflight:
            _log.warning("drain timeout: ending %d requests still in flight",
                         self.drain.inflight)
            self.drain.abort()
            grace = time.monotonic() + 5.0
            while self.drain.inflight and time.monotonic() < grace:
                time.sleep(0.05)
        self.server.should_exit = True
