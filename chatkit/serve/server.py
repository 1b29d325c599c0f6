"""``chatkit serve``: an OpenAI-compatible HTTP server that keeps chatkit's guarantees.

Starlette + uvicorn (the optional ``serve`` extra): the same ASGI stack vLLM,
SGLang and llama-cpp-python serve on, without FastAPI's request models — bodies
are checked by :mod:`chatkit.serve.openai_api`, so a refusal names the OpenAI field
(and, for a schema, the keyword and JSON path) in OpenAI's error shape.

Every request is planned first (template, tokens, grammar: refusals are a 400
before any token), then its turns go to the model's engine loop
(:mod:`chatkit.chat.scheduler`), which batches them with every other request's turns
step by step. ``n`` > 1 is ``n`` lanes, one seed each. Streaming is SSE; a reply
with tools or a think block is sent whole at its end (its markup is parsed into
``tool_calls`` / ``reasoning_content`` first), a plain or JSON reply token by
token. A client that disconnects cancels its turns at the next step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..chat.scheduler import engine_loop
from ..engine.protocols import StepEngine
from ..errors import RequestError
from ..templates import ChatTemplate
from .anthropic_routes import AnthropicRoutes
from .http import guarded, http_error, read_body, wants_anthropic
from .lanes import Lane, Lanes
from .metrics import metrics_endpoint, open_metrics
from .openai_api import (
    ChatRequest,
    ServerLimits,
    assistant_message,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    new_id,
    now,
    parse_chat,
    parse_completion,
    translate_error,
)
from .responses_api import (
    Output,
    ResponseStream,
    output_items,
    response_body,
    to_chat_body,
    usage_object,
)
from .sse import COMMENT_PING, NamedEvents, OpenAIChunks, drive, sse_data

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")


class ChatkitServer:
    """The ASGI application around one engine (``app``); ``template`` for every chat request
    (default: the model's), ``tool_format`` its dialect (default: detected)."""

    def __init__(self, model: StepEngine, *, name: str, api_key: str | None = None,
                 limits: ServerLimits | None = None, max_queue: int | None = None,
                 template: ChatTemplate | None = None, tool_format: str | None = None) -> None:
        self.model, self.name, self.api_key = model, name, api_key
        self.limits = limits or ServerLimits()
        self.loop = engine_loop(model)
        self.loop.max_queue = self.loop.max_queue if max_queue is None else max_queue
        self.lanes = Lanes(model, self.loop, self.limits, template=template,
                           tool_format=tool_format)
        self.created = now()
        self.anthropic = AnthropicRoutes(model, name, self.lanes, self.limits, self.created)
        self.metrics = open_metrics(model, self.loop, self.lanes)
        self.app = self._build()

    def _build(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        key, get, post = self.api_key, ["GET"], ["POST"]
        app = Starlette(routes=[
            Route("/health", self.health, methods=get),
            Route("/metrics", guarded(metrics_endpoint(self.metrics), None), methods=get),
            Route("/v1/models", guarded(self.models, key), methods=get),
            Route("/v1/chat/completions", guarded(self.chat, key), methods=post),
            Route("/v1/completions", guarded(self.completions, key), methods=post),
            Route("/v1/responses", guarded(self.responses, key), methods=post),
            *self.anthropic.routes(key)],
            exception_handlers={404: http_error, 405: http_error})
        return self.metrics.wrap(app) if self.metrics is not None else app

    async def health(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "model": self.name, "running": self.loop.running,
                             "queued": self.loop.queued, "sequences": self.model.n_seq_max,
                             "context_per_sequence": self.model.n_ctx_seq})

    async def models(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        if wants_anthropic(request):  # Anthropic's shape
            return JSONResponse(self.anthropic.models_body())
        return JSONResponse({"object": "list", "data": [{
            "id": self.name, "object": "model", "created": self.created, "owned_by": "chatkit",
            "max_model_len": self.model.n_ctx_seq}]})

    # ----------------------------------------------------------------- chat
    async def chat(self, request: Request) -> Response:
        from starlette.responses import JSONResponse, StreamingResponse

        req = parse_chat(await read_body(request, self.limits.max_body_bytes), self.limits)
        _check_model(self.name, req.model)
        lanes = await self.lanes.start(lambda i: self.lanes.plan_chat(req, i), req.sampling.n)
        rid, created = new_id("chatcmpl"), now()
        if req.sampling.stream:
            wire = _ChatWire(self, lanes, rid, created, req)
            return StreamingResponse(drive(self.lanes, lanes, wire, rid),
                                     media_type="text/event-stream")
        await self.lanes.collect(request, lanes)
        choices = []
        for i, lane in enumerate(lanes):
            reply = lane.reply
            text = reply.text if reply is not None else lane.text
            choices.append({"index": i, "message": assistant_message(reply, text, lane.cut()),
                            "finish_reason": finish_reason(reply.finish_reason)
                            if reply is not None else "length",
                            "logprobs": self.choice_logprobs(lane, req.sampling)})
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created,
                             "model": self.name, "choices": choices,
                             "usage": self.lanes.usage(lanes)})

    def choice_logprobs(self, lane: Lane, sampling: Any, *, since: int = 0
                       ) -> dict[str, Any] | None:
        """The choice's ``logprobs`` (tokens from ``since`` on), None when not asked."""
        if sampling.logprobs is None:
            return None
        return {"content": chat_logprobs(self.model, Lanes.logprobs(lane, since)),
                "refusal": None}

    # ------------------------------------------------------------ responses
    async def responses(self, request: Request) -> Response:
        """``POST /v1/responses``: the body translated to a chat request
        (``responses_api.to_chat_body``), run as one, answered as a ``response`` object or
        the Responses stream's events."""
        from starlette.responses import JSONResponse, StreamingResponse

        raw = await read_body(request, self.limits.max_body_bytes)
        req = parse_chat(to_chat_body(raw), self.limits)
        _check_model(self.name, req.model)
        try:
            lanes = await self.lanes.start(lambda i: self.lanes.plan_chat(req, i), 1)
        except Exception as exc:
            raise translate_error(exc, schema_param="text.format") from exc
        rid, created = new_id("resp"), now()
        if req.sampling.stream:
            wire = _ResponsesWire(ResponseStream(rid, created, self.name, raw),
                                  lambda: self._responses_usage(lanes), lanes[0])
            return StreamingResponse(drive(self.lanes, lanes, wire, rid),
                                     media_type="text/event-stream")
        await self.lanes.collect(request, lanes)
        lane, usage = lanes[0], self._responses_usage(lanes)
        if lane.reply is None and lane.deltas is not None:
            # cut at max_output_tokens inside markup: the items read from it so far
            builder = ResponseStream(rid, created, self.name, raw)
            for _ in builder.parts(lane.deltas.feed(lane.text)):
                pass
            for _ in builder.finish(None, usage):
                pass
            output = Output(builder.items, True)
        else:
            output = output_items(lane.reply, lane.text)
        return JSONResponse(response_body(rid, created, self.name, raw, output, usage))

    def _responses_usage(self, lanes: list[Lane]) -> dict[str, Any]:
        chat = self.lanes.usage(lanes)
        return usage_object(chat["prompt_tokens"], chat["completion_tokens"],
                            chat["prompt_tokens_details"]["cached_tokens"])

    # ---------------------------------------------------------- completions
    async def completions(self, request: Request) -> Response:
        from starlette.responses import JSONResponse, StreamingResponse

        req = parse_completion(await read_body(request, self.limits.max_body_bytes), self.limits)
        _check_model(self.name, req.model)
        param = "structured_outputs" if req.grammar else "response_format"
        try:
            lanes = await self.lanes.start(lambda i: self.lanes.plan_completion(req, i),
                                           req.sampling.n)
        except Exception as exc:
            raise translate_error(exc, schema_param=param) from exc
        rid, created = new_id("cmpl"), now()
        sent = [0] * len(lanes)  # token ids already sent per lane (streaming)

        def choice(i: int, text: str, finish: str | None) -> dict[str, Any]:
            out: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish,
                                   "logprobs": None}
            if req.sampling.logprobs is not None:
                since = lanes[i].logprobs_sent if req.sampling.stream else 0
                out["logprobs"] = completion_logprobs(self.model, Lanes.logprobs(lanes[i], since))
            if req.return_token_ids:
                # streaming: the ids sampled since the last chunk (as vLLM does); else all
                tokens = lanes[i].ticket.turn.tokens
                now_sent = len(tokens)
                out["token_ids"] = list(tokens[sent[i] : now_sent] if req.sampling.stream
                                        else tokens)
                sent[i] = now_sent
            return out

        def body(choices: list[dict[str, Any]], usage: bool) -> dict[str, Any]:
            out = {"id": rid, "object": "text_completion", "created": created,
                   "model": self.name, "choices": choices}
            if usage:
                out["usage"] = self.lanes.usage(lanes)
            if req.return_token_ids:
                out["prompt_token_ids"] = list(lanes[0].ticket.turn.prompt)
            return out

        if not req.sampling.stream:
            try:
                await self.lanes.collect(request, lanes)
            except Exception as exc:  # a grammar past its limits mid-reply: still its field
                raise translate_error(exc, schema_param=param) from exc
            return JSONResponse(body([
                choice(i, lane.reply.text if lane.reply else lane.text, _lane_finish(lane))
                for i, lane in enumerate(lanes)], True))

        wire = _CompletionWire(
            param, lambda i, text, finish: body([choice(i, text, finish)], False),
            lambda: body([], True) if req.sampling.include_usage else None)
        return StreamingResponse(drive(self.lanes, lanes, wire, rid),
                                 media_type="text/event-stream")


class _ChatWire(OpenAIChunks):
    """Chat completion chunks (one ``choices`` entry each) for :func:`.sse.drive`."""

    schema_param = "response_format"

    def __init__(self, server: ChatkitServer, lanes: list[Lane], rid: str, created: int,
                 req: ChatRequest) -> None:
        self.server, self.lanes, self.rid, self.created, self.req = (
            server, lanes, rid, created, req)

    def chunk(self, i: int, delta: dict[str, Any], finish: str | None = None) -> str:
        logprobs = (self.server.choice_logprobs(self.lanes[i], self.req.sampling,
                                               since=self.lanes[i].logprobs_sent)
                    if "content" in delta or finish is not None else None)
        return sse_data({"id": self.rid, "object": "chat.completion.chunk",
                         "created": self.created, "model": self.server.name,
                         "choices": [{"index": i, "delta": delta, "finish_reason": finish,
                                      "logprobs": logprobs}]})

    def start(self) -> list[str]:
        return [self.chunk(i, {"role": "assistant", "content": ""})
                for i in range(len(self.lanes))]

    def text(self, i: int, delta: str) -> list[str]:
        return [self.chunk(i, {"content": delta})]

    def parts(self, i: int, parts: list[dict[str, Any]]) -> list[str]:
        return [self.chunk(i, part) for part in parts]

    def lane_end(self, i: int, lane: Lane) -> list[str]:
        return [self.chunk(i, {}, _lane_finish(lane))]

    def finish(self) -> list[str]:
        if not self.req.sampling.include_usage:
            return []
        return [sse_data({"id": self.rid, "object": "chat.completion.chunk",
                          "created": self.created, "model": self.server.name, "choices": [],
                          "usage": self.server.lanes.usage(self.lanes)})]


class _CompletionWire(OpenAIChunks):
    """Text completion chunks for :func:`.sse.drive` (plain text lanes: no markup)."""

    def __init__(self, schema_param: str, chunk: Callable[[int, str, str | None], dict[str, Any]],
                 usage: Callable[[], dict[str, Any] | None]) -> None:
        self.schema_param, self.chunk, self.usage = schema_param, chunk, usage

    def start(self) -> list[str]:
        return []

    def text(self, i: int, delta: str) -> list[str]:
        return [sse_data(self.chunk(i, delta, None))]

    def parts(self, i: int, parts: list[dict[str, Any]]) -> list[str]:
        raise AssertionError("a completion lane has no markup")

    def lane_end(self, i: int, lane: Lane) -> list[str]:
        return [sse_data(self.chunk(i, "", _lane_finish(lane)))]

    def finish(self) -> list[str]:
        usage = self.usage()
        return [] if usage is None else [sse_data(usage)]


class _ResponsesWire(NamedEvents):
    """The Responses API's events (:class:`ResponseStream`) for :func:`.sse.drive`."""

    schema_param = "text.format"

    def __init__(self, stream: ResponseStream, usage: Callable[[], dict[str, Any]],
                 lane: Lane) -> None:
        super().__init__(stream)
        self.stream, self.usage, self.lane = stream, usage, lane

    def start(self) -> Iterable[str]:
        return self.stream.start()

    def text(self, i: int, delta: str) -> Iterable[str]:
        return self.stream.delta(delta)

    def finish(self) -> Iterable[str]:
        return self.stream.finish(self.lane.reply, self.usage())

    def ping(self) -> str:
        return COMMENT_PING


def _check_model(served: str, name: str | None) -> None:
    if name is not None and name != served:
        raise RequestError(404, f"model {name!r} is not served here (this server serves "
                           f"{served!r})", code="model_not_found")


def _lane_finish(lane: Lane) -> str:
    return finish_reason(lane.reply.finish_reason) if lane.reply else "length"


def serve(model: StepEngine, *, name: str, host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, limits: ServerLimits | None = None,
          max_queue: int | None = None, template: ChatTemplate | None = None,
          tool_format: str | None = None, drain_timeout: float = 30.0) -> None:
    """Run the server until SIGTERM or SIGINT (uvicorn, one process: one engine, one loop),
    then drain: new requests 503, those in flight finish within ``drain_timeout`` seconds
    (:mod:`chatkit.serve.shutdown`)."""
    from .shutdown import Drain, run

    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        _log.warning("serving on %s without --api-key: anyone who can reach it may use it",
                     host)
    server = ChatkitServer(model, name=name, api_key=api_key, limits=limits,
                           max_queue=max_queue, template=template, tool_format=tool_format)
    drain = Drain(server.app, server.lanes.abort)
    run(drain, drain, host=host, port=port, drain_timeout=drain_timeout)
