"""The Anthropic endpoints on the server's lanes: ``POST /v1/messages``,
``POST /v1/messages/count_tokens`` and the models list in Anthropic's shape (the
translation itself is :mod:`.anthropic_api`)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..engine.concurrency import run_blocking
from ..engine.protocols import StepEngine
from ..errors import ContextOverflow, RequestError
from . import anthropic_api
from .http import guarded, read_body
from .lanes import Lane, Lanes
from .openai_api import (
    ChatRequest,
    ServerLimits,
    new_id,
    parse_chat,
    translate_error,
)
from .sse import NamedEvents, drive

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__: list[str] = []


class AnthropicRoutes:
    """The handlers; any requested model name is served by the loaded model, and echoed."""

    def __init__(self, model: StepEngine, name: str, lanes: Lanes, limits: ServerLimits,
                 created: int) -> None:
        self.model = model
        self.name = name
        self.lanes = lanes
        self.limits = limits
        self.created = created

    def routes(self, api_key: str | None) -> list[Any]:
        """The Starlette routes, behind the key, errors in Anthropic's envelope."""
        from starlette.routing import Route

        return [Route("/v1/messages", guarded(self.messages, api_key, anthropic=True),
                      methods=["POST"]),
                Route("/v1/messages/count_tokens",
                      guarded(self.count_tokens, api_key, anthropic=True), methods=["POST"])]

    def models_body(self) -> dict[str, Any]:
        info = {"type": "model", "id": self.name, "display_name": self.name,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
                "max_input_tokens": self.model.n_ctx_seq, "max_tokens": self.limits.max_tokens}
        return {"data": [info], "has_more": False, "first_id": self.name,
                "last_id": self.name}

    def _messages_request(self, raw: Any) -> ChatRequest:
        """A Messages body as a checked chat request; any model name is served (and
        echoed), logged once per name (``anthropic_api.log_once``: bounded)."""
        req = parse_chat(anthropic_api.to_chat_body(raw), self.limits)
        if req.model is not None and req.model != self.name:
            anthropic_api.log_once(f"model {req.model}", "/v1/messages: model %r is served "
                                   "by %r", req.model, self.name)
        return req

    async def _start_messages(self, req: ChatRequest) -> list[Lane]:
        try:
            return await self.lanes.start(lambda i: self.lanes.plan_chat(req, i), 1)
        except Exception as exc:
            overflow = _overflow(exc)
            if overflow is not None:
                raise RequestError(400, anthropic_api.overflow_message(
                    overflow.prompt_tokens, overflow.n_ctx)) from exc
            raise translate_error(exc, schema_param="output_config.format") from exc

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages``: Anthropic's Messages API over the chat path
        (``anthropic_api``)."""
        from starlette.responses import JSONResponse, StreamingResponse

        raw = await read_body(request, self.limits.max_body_bytes)
        req = self._messages_request(raw)
        model = req.model or self.name
        lanes = await self._start_messages(req)
        mid = new_id("msg")
        if req.sampling.stream:
            wire = _MessagesWire(anthropic_api.MessageStream(mid, model), self.lanes, lanes)
            return StreamingResponse(drive(self.lanes, lanes, wire, mid),
                                     media_type="text/event-stream")
        await self.lanes.collect(request, lanes)
        lane = lanes[0]
        usage = anthropic_api.usage_of(self.lanes.usage(lanes))
        return JSONResponse(anthropic_api.message_body(mid, model, lane.reply, lane.text, usage,
                                                       lane.capped, lane.cut()))

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the prompt the same body would be rendered
        to (template, tools, system), counted exactly; nothing is decoded."""
        from starlette.responses import JSONResponse

        raw = await read_body(request, self.limits.max_body_bytes)
        if isinstance(raw, dict):
            raw = {**raw, "max_tokens": 1, "stream": False}
        req = self._messages_request(raw)
        try:
            turn = await run_blocking(self.model, self.lanes.plan_chat, req, 0)
        except Exception as exc:
            overflow = _overflow(exc)
            if overflow is not None:  # counted all the same: the client decides to compact
                return JSONResponse({"input_tokens": overflow.prompt_tokens})
            raise translate_error(exc, schema_param="output_config.format") from exc
        return JSONResponse({"input_tokens": len(turn.prompt)})



def _overflow(exc: BaseException) -> ContextOverflow | None:
    """The ContextOverflow behind ``exc`` (planning raises it as a 400 in OpenAI's words)."""
    for e in (exc, exc.__cause__):
        if isinstance(e, ContextOverflow):
            return e
    return None


class _MessagesWire(NamedEvents):
    """Anthropic's named events (:class:`anthropic_api.MessageStream`) for
    :func:`.sse.drive`: ``message_start`` then a ``ping``, as Anthropic's stream."""

    schema_param = "output_config.format"

    def __init__(self, stream: anthropic_api.MessageStream, lanes: Lanes,
                 running: list[Lane]) -> None:
        super().__init__(stream)
        self.stream, self.lanes, self.running = stream, lanes, running

    def start(self) -> Iterator[str]:
        yield from self.stream.start(len(self.running[0].ticket.turn.prompt))
        yield self.stream.ping()

    def text(self, i: int, delta: str) -> Iterable[str]:
        return self.stream.text(delta)

    def finish(self) -> Iterable[str]:
        lane = self.running[0]
        usage = anthropic_api.usage_of(self.lanes.usage(self.running))
        return self.stream.finish(lane.reply, usage, lane.capped)

    def ping(self) -> str:
        return self.stream.ping()
