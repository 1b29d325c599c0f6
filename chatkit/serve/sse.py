"""One stream driver for every wire API: a request's lane events in, SSE text out.

:func:`drive` is the only loop that turns the engine loop's events into a streamed
response; each API says only what its events look like (a :class:`WireStream`: OpenAI's
chat and completion chunks, the Responses API's typed events, Anthropic's named events).
What the driver does for all of them alike:

- a keep-alive ``ping`` after ``PING_SECONDS`` without an event (a long prefill: clients
  such as Claude Code resend a request whose stream stays silent);
- a reply with markup (tool calls, think blocks) read into parts as it is written, and the
  parsed reply's remainder sent when its lane ends; a reply cut at ``max_tokens`` mid-markup
  ends with what was read, never as raw markup text;
- a client that disconnects closes the generator, which cancels every lane's turn;
- an error after the 200 went out becomes the API's error event, then the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any, Protocol, TypeVar

from ..errors import RequestError
from .lanes import Lane, Lanes
from .openai_api import translate_error

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")

PING_SECONDS = 10.0
"""A keep-alive ping after this long without an event (Claude Code resends a request whose
stream stays silent through a long prefill)."""

COMMENT_PING = ": ping\n\n"
"""A keep-alive as an SSE comment line, which every SSE client skips (OpenAI-shaped streams)."""

T = TypeVar("T")


class WireStream(Protocol):
    """What one wire API writes for a streamed request, in the order the driver calls it."""

    schema_param: str
    """The endpoint's schema field, named in an error event."""

    def start(self) -> Iterable[str]:
        """Events before any token (a role chunk, ``message_start``, ``response.created``)."""

    def text(self, i: int, delta: str) -> Iterable[str]:
        """Lane ``i`` wrote plain text."""

    def parts(self, i: int, parts: list[dict[str, Any]]) -> Iterable[str]:
        """Lane ``i``'s markup read into chat-delta parts (content, reasoning, tool calls)."""

    def lane_end(self, i: int, lane: Lane) -> Iterable[str]:
        """Lane ``i`` ended: ``lane.reply`` is set, or None when cut at ``max_tokens``."""

    def finish(self) -> Iterable[str]:
        """Every lane ended: the closing events (usage, a stop reason)."""

    def ping(self) -> str:
        """A keep-alive event."""

    def failed(self, err: RequestError) -> Iterable[str]:
        """The stream failed after the 200: the API's error event."""

    def done(self) -> Iterable[str]:
        """The last text of every stream, failed or not (OpenAI's ``[DONE]``)."""



class OpenAIChunks:
    """Base of OpenAI's chunk streams (chat, completions): a comment line as the ping (every
    client skips it), the error body as a data line, ``[DONE]`` last."""

    def ping(self) -> str:
        return COMMENT_PING

    def failed(self, err: RequestError) -> list[str]:
        return [sse_data(err.body())]

    def done(self) -> list[str]:
        return ["data: [DONE]\n\n"]


class StreamEvents(Protocol):
    """A wire API's writer of named events (the Responses API's, Anthropic's)."""

    def parts(self, parts: list[dict[str, Any]]) -> Iterable[str]: ...

    def failed(self, err: RequestError) -> str: ...


class NamedEvents:
    """Base of the one-lane streams of named events (Responses, Messages): markup parts go
    to the API's writer, the stream ends with its last event."""

    def __init__(self, events: StreamEvents) -> None:
        self.events = events

    def parts(self, i: int, parts: list[dict[str, Any]]) -> Iterable[str]:
        return self.events.parts(parts)

    def lane_end(self, i: int, lane: Lane) -> list[str]:
        return []

    def failed(self, err: RequestError) -> list[str]:
        return [self.events.failed(err)]

    def done(self) -> list[str]:
        return []


def sse_data(data: dict[str, Any]) -> str:
    """One SSE ``data:`` line of JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def drive(lanes: Lanes, running: list[Lane], wire: WireStream, rid: str, *,
                ping_every: float | None = None) -> AsyncIterator[str]:
    """The SSE text of a streamed request whose lanes ``running`` are on ``lanes``;
    ``rid`` names it in the log. ``ping_every``: seconds of silence before a ping
    (default ``PING_SECONDS``)."""
    try:
        for event in wire.start():
            yield event
        source = lanes.events(running)
        async for item in with_pings(source, PING_SECONDS if ping_every is None else ping_every):
            if item is None:  # a long prefill: the client sees the line is alive
                yield wire.ping()
                continue
            i, delta = item
            lane = running[i]
            if delta is not None:
                events = (wire.text(i, delta) if lane.deltas is None
                          else wire.parts(i, lane.deltas.feed(delta)))
            elif lane.reply is not None and lane.deltas is not None:
                # what the parsed reply says that was not sent, then the lane's end
                events = [*wire.parts(i, lane.deltas.finish(lane.reply)),
                          *wire.lane_end(i, lane)]
            else:
                events = wire.lane_end(i, lane)
            for event in events:
                yield event
        for event in wire.finish():
            yield event
    except Exception as exc:  # after the 200 went out: an error event, then the end
        err = translate_error(exc, schema_param=wire.schema_param)
        _log.error("stream %s failed: %s", rid, err.message)
        for event in wire.failed(err):
            yield event
    for event in wire.done():
        yield event


async def with_pings(source: AsyncIterator[T], every: float) -> AsyncIterator[T | None]:
    """``source``'s items, and None whenever ``every`` seconds pass without one; leaving
    closes ``source`` (which cancels its turns)."""
    it = aiter(source)
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(it))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        closer = getattr(it, "aclose", None)
        if closer is not None:
            await closer()
