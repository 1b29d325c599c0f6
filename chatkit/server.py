"""``chatkit serve``: an OpenAI-compatible HTTP server that keeps chatkit's guarantees.

Starlette + uvicorn (the optional ``serve`` extra): the same ASGI stack vLLM,
SGLang and llama-cpp-python serve on, without FastAPI's request models — bodies
are checked by :mod:`chatkit.openai_api`, so a refusal names the OpenAI field
(and, for a schema, the keyword and JSON path) in OpenAI's error shape.

Every request is planned first (template, tokens, grammar: refusals are a 400
before any token), then its turns go to the model's engine loop
(:mod:`chatkit.scheduler`), which batches them with every other request's turns
step by step. ``n`` > 1 is ``n`` lanes, one seed each. Streaming is SSE; a reply
with tools or a think block is sent whole at its end (its markup is parsed into
``tool_calls`` / ``reasoning_content`` first), a plain or JSON reply token by
token. A client that disconnects cancels its turns at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .concurrency import run_blocking
from .constraints import Constraint
from .conversation import Conversation
from .engine import StepEngine
from .errors import ContextOverflow, EngineBusy, Truncated
from .messages import Reply
from .openai_api import (
    MAX_BODY_DEPTH,
    ChatRequest,
    CompletionRequest,
    RequestError,
    ServerLimits,
    assistant_message,
    bad,
    chat_logprobs,
    check_body,
    completion_logprobs,
    finish_reason,
    new_id,
    now,
    parse_chat,
    parse_completion,
    translate_error,
    usage_body,
)
from .responses_api import (
    Output,
    ResponseStream,
    output_items,
    response_body,
    to_chat_body,
    usage_object,
)
from .sampling import Sampler
from .scheduler import Ticket, engine_loop
from .stream_deltas import ReplyDeltas
from .turn import KVState, Turn, TurnOptions, common_prefix, plan_completion

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")


@dataclass
class _Lane:
    """One choice of a response, as it streams."""

    ticket: Ticket
    hold: bool
    """The raw text carries markup (tool calls, a think block): parsed, not sent as is."""
    text: str = ""
    reply: Reply[Any] | None = None
    finish: str | None = None
    deltas: ReplyDeltas | None = None
    """For a held lane: its markup read as it is written (``stream_deltas``)."""
    logprobs_sent: int = 0
    """Tokens whose logprobs a stream has sent."""


class KVPool:
    """Prefix reuse across requests: each turn borrows the idle KV claim whose tokens share
    the longest prefix with its prompt (a multi-turn client's next request finds its
    conversation still in a sequence; ``usage.prompt_tokens_details.cached_tokens``)."""

    def __init__(self, size: int) -> None:
        self._states = [KVState(owner=-(i + 1)) for i in range(size)]
        self._busy: set[int] = set()
        self._lock = threading.Lock()

    def borrow(self, prompt: Sequence[int]) -> KVState:
        with self._lock:
            free = [s for s in self._states if s.owner not in self._busy]
            if not free:  # more turns than claims: a fresh one, not kept afterwards
                return KVState(owner=-(len(self._states) + 1 + len(self._busy)))
            best = max(free, key=lambda s: common_prefix(s.tokens, prompt))
            self._busy.add(best.owner)
            return best

    def give_back(self, state: KVState) -> None:
        with self._lock:
            self._busy.discard(state.owner)


class ChatkitServer:
    """The ASGI application around one engine (``app``)."""

    def __init__(self, model: StepEngine, *, name: str, api_key: str | None = None,
                 limits: ServerLimits | None = None, max_queue: int | None = None) -> None:
        self.model = model
        self.name = name
        self.api_key = api_key
        self.limits = limits or ServerLimits()
        self.loop = engine_loop(model)
        if max_queue is not None:
            self.loop.max_queue = max_queue
        self.kv = KVPool(2 * model.n_seq_max)
        self.created = now()
        self.app = self._build()

    # ------------------------------------------------------------------ app
    def _build(self) -> Starlette:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self._guard(self.models), methods=["GET"]),
            Route("/v1/chat/completions", self._guard(self.chat), methods=["POST"]),
            Route("/v1/completions", self._guard(self.completions), methods=["POST"]),
            Route("/v1/responses", self._guard(self.responses), methods=["POST"]),
        ])

    def _guard(self, handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        """API key check and error translation around a handler."""
        from starlette.responses import JSONResponse

        async def guarded(request: Request) -> Response:
            try:
                if self.api_key is not None:
                    given = request.headers.get("authorization", "")
                    token = given[7:] if given.lower().startswith("bearer ") else ""
                    if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                        raise RequestError(401, "invalid or missing API key",
                                           type="authentication_error", code="invalid_api_key")
                response: Response = await handler(request)
                return response
            except Exception as exc:
                err = translate_error(exc)
                if err.status >= 500:
                    _log.error("%s %s: %s", request.method, request.url.path, err.message,
                               exc_info=not isinstance(exc, RequestError))
                return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

        return guarded

    async def health(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "model": self.name, "running": self.loop.running,
                             "queued": self.loop.queued,
                             "context_per_sequence": self.model.n_ctx_seq,
                             "sequences": self.model.n_seq_max})

    async def models(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [
            {"id": self.name, "object": "model", "created": self.created,
             "owned_by": "chatkit", "max_model_len": self.model.n_ctx_seq}]})

    async def _body(self, request: Request) -> Any:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"the body exceeds {limit} bytes", code="body_too_large")
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > limit:
                raise RequestError(413, f"the body exceeds {limit} bytes",
                                   code="body_too_large")
        try:
            body = json.loads(data)
        except RecursionError:
            raise bad(f"the body nests deeper than {MAX_BODY_DEPTH} levels",
                      code="body_too_deep") from None
        except ValueError as exc:
            raise bad(f"the body is not JSON: {exc}") from exc
        check_body(body)
        return body

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.name:
            raise RequestError(404, f"model {name!r} is not served here (this server serves "
                               f"{self.name!r})", code="model_not_found")

    # ------------------------------------------------------------- planning
    def _plan_chat_lane(self, req: ChatRequest, lane: int) -> Turn:
        s = req.sampling
        conv = Conversation(self.model, messages=req.history, no_think=req.no_think,
                            sampling=s.params(lane),
                            stop=s.stop, max_tokens=s.max_tokens or self.limits.max_tokens)
        options: TurnOptions = {}
        if req.tools:
            options["tools"] = req.tools
            options["tool_choice"] = req.tool_choice
            options["parallel_tool_calls"] = req.parallel_tool_calls
            if req.tool_call_threshold is not None and req.tool_choice == "auto":
                # the extension decides "auto" only: a forced or "none" choice has no
                # first-token decision to make (an agent sends it on every turn)
                options["tool_call_threshold"] = req.tool_call_threshold
        try:
            turn = conv.plan(req.text, req.schema, **options)
        except ContextOverflow as exc:
            room = exc.n_ctx - exc.prompt_tokens
            source = f" ({self.limits.context_source})" if self.limits.context_source else ""
            if s.max_tokens is None and room < 1:
                raise RequestError(400, f"the prompt ({exc.prompt_tokens} tokens) does not fit "
                                   f"one sequence's context ({exc.n_ctx} tokens{source})",
                                   param="messages", code="context_length_exceeded") from exc
            if s.max_tokens is not None:
                raise RequestError(400, f"the prompt ({exc.prompt_tokens} tokens) plus "
                                   f"max_tokens ({s.max_tokens}) exceed one sequence's context "
                                   f"({exc.n_ctx} tokens{source})", param="messages",
                                   code="context_length_exceeded") from exc
            conv.max_tokens = room  # the default max_tokens shrinks to what fits
            turn = conv.plan(req.text, req.schema, **options)
        return _checked_start(turn, s.logprobs)

    def _plan_completion_lane(self, req: CompletionRequest, lane: int) -> Turn:
        model = self.model
        s = req.sampling
        prompt = (model.tokenize(req.prompt, special=True, add_bos=model.add_bos)
                  if isinstance(req.prompt, str) else list(req.prompt))
        constraint = None
        if req.grammar is not None:
            kind, text = req.grammar
            constraint = Constraint.regex(text) if kind == "regex" else Constraint.lark(text)
        max_tokens = s.max_tokens or min(self.limits.max_tokens,
                                         max(1, model.n_ctx_seq - len(prompt)))
        plan = plan_completion(model, prompt, sampler=Sampler(s.params(lane)),
            max_tokens=max_tokens, schema=req.schema, constraint=constraint,
            stop=s.stop or None)
        return _checked_start(Turn(model, plan, KVState(owner=0), lambda added: None),
                              s.logprobs)

    async def _start(self, plan_lane: Callable[[int], Turn], n: int) -> list[_Lane]:
        """Plan every lane (refusals: 400 before any token), borrow KV claims, submit."""
        turns = [await run_blocking(self.model, plan_lane, i) for i in range(n)]
        lanes: list[_Lane] = []
        try:
            for turn in turns:
                turn.kv = self.kv.borrow(turn.plan.prompt)
                try:
                    ticket = self.loop.submit(turn)
                except EngineBusy:
                    self.kv.give_back(turn.kv)
                    raise
                # the claim comes back when the loop lets go of the turn, whatever happens
                ticket.on_close.append(functools.partial(self.kv.give_back, turn.kv))
                hold = bool(turn.plan.tools) or turn.plan.thinking
                lanes.append(_Lane(ticket, hold=hold, deltas=ReplyDeltas(
                    thinking=turn.plan.thinking, tools=bool(turn.plan.tools)) if hold else None))
        except EngineBusy:
            for lane in lanes:
                lane.ticket.cancel()
            raise
        return lanes

    async def _events(self, lanes: list[_Lane]) -> AsyncIterator[tuple[int, str | None]]:
        """Merged (lane, text delta) events; (lane, None) when a lane ends (its ``reply`` or
        ``finish`` is then set). Errors other than a cut at max_tokens propagate as they
        are (named), after the request timeout ``TimeoutError``. One asyncio task per
        lane feeds a queue, so nothing here yields inside a cancel scope; leaving (a
        disconnect, an error) cancels every lane's turn."""
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

        async def pump(i: int, lane: _Lane) -> None:
            try:
                async with contextlib.aclosing(lane.ticket.adeltas()) as deltas:
                    async for delta in deltas:
                        queue.put_nowait((i, delta))
                lane.reply = lane.ticket.reply
                queue.put_nowait((i, None))
            except Truncated as exc:
                lane.text, lane.finish = exc.text, "length"
                queue.put_nowait((i, None))
            except Exception as exc:
                queue.put_nowait((i, exc))

        tasks = [asyncio.create_task(pump(i, lane)) for i, lane in enumerate(lanes)]
        deadline = asyncio.get_running_loop().time() + self.limits.request_timeout
        try:
            ended = 0
            while ended < len(lanes):
                left = deadline - asyncio.get_running_loop().time()
                i, item = await asyncio.wait_for(queue.get(), timeout=max(left, 0.0))
                if isinstance(item, Exception):
                    raise item
                ended += item is None
                yield i, item
        finally:
            for lane in lanes:
                lane.ticket.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _until_disconnect(self, request: Request, lanes: list[_Lane]) -> None:
        """A non-streaming request: cancel its turns when the client goes away."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                for lane in lanes:
                    lane.ticket.cancel()
                return

    async def _collect(self, request: Request, lanes: list[_Lane]) -> None:
        """Run a non-streaming request's lanes to their end (text into each lane)."""
        watcher = asyncio.create_task(self._until_disconnect(request, lanes))
        try:
            async for i, delta in self._events(lanes):
                if delta is not None and lanes[i].finish is None:
                    lanes[i].text += delta
        finally:
            watcher.cancel()

    # ----------------------------------------------------------------- chat
    async def chat(self, request: Request) -> Response:
        from starlette.responses import JSONResponse, StreamingResponse

        req = parse_chat(await self._body(request), self.limits)
        self._check_model(req.model)
        lanes = await self._start(lambda i: self._plan_chat_lane(req, i), req.sampling.n)
        rid, created = new_id("chatcmpl"), now()
        if req.sampling.stream:
            return StreamingResponse(self._chat_sse(lanes, rid, created, req),
                                     media_type="text/event-stream")
        await self._collect(request, lanes)
        choices = []
        for i, lane in enumerate(lanes):
            reply = lane.reply
            text = reply.text if reply is not None else lane.text
            choices.append({"index": i, "message": assistant_message(reply, text),
                            "finish_reason": finish_reason(reply.finish_reason)
                            if reply is not None else "length",
                            "logprobs": self._chat_logprobs(lane, req.sampling)})
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created,
                             "model": self.name, "choices": choices,
                             "usage": self._usage(lanes)})

    def _chat_logprobs(self, lane: _Lane, sampling: Any, *, since: int = 0
                       ) -> dict[str, Any] | None:
        """The choice's ``logprobs`` (tokens from ``since`` on), None when not asked."""
        if sampling.logprobs is None:
            return None
        entries = lane.ticket.turn.decoder.logprobs[since:]
        lane.logprobs_sent = since + len(entries)
        return {"content": chat_logprobs(self.model, entries), "refusal": None}

    def _usage(self, lanes: list[_Lane]) -> dict[str, Any]:
        first = lanes[0].ticket.turn
        dec = first.decoder
        completion = sum(len(lane.ticket.turn.decoder.tokens) for lane in lanes)
        return usage_body(len(first.plan.prompt), completion, dec.reuse)

    async def _chat_sse(self, lanes: list[_Lane], rid: str, created: int,
                        req: ChatRequest) -> AsyncIterator[str]:
        def chunk(i: int, delta: dict[str, Any], finish: str | None = None) -> str:
            logprobs = (self._chat_logprobs(lanes[i], req.sampling,
                                            since=lanes[i].logprobs_sent)
                        if "content" in delta or finish is not None else None)
            return _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                         "model": self.name, "choices": [{"index": i, "delta": delta,
                                                          "finish_reason": finish,
                                                          "logprobs": logprobs}]})

        try:
            for i in range(len(lanes)):
                yield chunk(i, {"role": "assistant", "content": ""})
            async for i, delta in self._events(lanes):
                lane = lanes[i]
                if delta is not None:
                    if lane.deltas is None:
                        yield chunk(i, {"content": delta})
                    else:  # markup read as it is written (to the last delta, cut or not)
                        for part in lane.deltas.feed(delta):
                            yield chunk(i, part)
                    continue
                reply = lane.reply
                if reply is None:  # cut at max_tokens
                    yield chunk(i, {}, "length")
                    continue
                if lane.deltas is not None:  # what the parsed reply says that was not sent
                    for part in lane.deltas.finish(reply):
                        yield chunk(i, part)
                yield chunk(i, {}, finish_reason(reply.finish_reason))
            if req.sampling.include_usage:
                yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                            "model": self.name, "choices": [], "usage": self._usage(lanes)})
        except Exception as exc:  # after the 200 went out: an error event, then the end
            err = translate_error(exc)
            _log.error("stream %s failed: %s", rid, err.message)
            yield _sse(err.body())
        yield "data: [DONE]\n\n"

    # ------------------------------------------------------------ responses
    async def responses(self, request: Request) -> Response:
        """``POST /v1/responses``: the body translated to a chat request
        (``responses_api.to_chat_body``), run as one, answered as a ``response`` object or
        the Responses stream's events."""
        from starlette.responses import JSONResponse, StreamingResponse

        raw = await self._body(request)
        req = parse_chat(to_chat_body(raw), self.limits)
        self._check_model(req.model)
        try:
            lanes = await self._start(lambda i: self._plan_chat_lane(req, i), 1)
        except Exception as exc:
            raise translate_error(exc, schema_param="text.format") from exc
        rid, created = new_id("resp"), now()
        if req.sampling.stream:
            return StreamingResponse(self._responses_sse(lanes, rid, created, raw),
                                     media_type="text/event-stream")
        await self._collect(request, lanes)
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

    def _responses_usage(self, lanes: list[_Lane]) -> dict[str, Any]:
        chat = self._usage(lanes)
        return usage_object(chat["prompt_tokens"], chat["completion_tokens"],
                            chat["prompt_tokens_details"]["cached_tokens"])

    async def _responses_sse(self, lanes: list[_Lane], rid: str, created: int,
                             raw: Any) -> AsyncIterator[str]:
        stream = ResponseStream(rid, created, self.name, raw)
        lane = lanes[0]
        try:
            for event in stream.start():
                yield event
            async for _, delta in self._events(lanes):
                if delta is None:
                    continue
                if lane.deltas is None:
                    for event in stream.delta(delta):
                        yield event
                else:  # markup read as it is written (to the last delta, cut or not)
                    for event in stream.parts(lane.deltas.feed(delta)):
                        yield event
            reply = lane.reply
            if reply is not None and lane.deltas is not None:
                for event in stream.parts(lane.deltas.finish(reply)):
                    yield event
            for event in stream.finish(reply, self._responses_usage(lanes)):
                yield event
        except Exception as exc:  # after the 200 went out: response.failed
            err = translate_error(exc)
            _log.error("stream %s failed: %s", rid, err.message)
            yield stream.failed(err)

    # ---------------------------------------------------------- completions
    async def completions(self, request: Request) -> Response:
        from starlette.responses import JSONResponse, StreamingResponse

        req = parse_completion(await self._body(request), self.limits)
        self._check_model(req.model)
        try:
            lanes = await self._start(lambda i: self._plan_completion_lane(req, i),
                                      req.sampling.n)
        except Exception as exc:
            raise translate_error(exc, schema_param="structured_outputs" if req.grammar
                                  else "response_format") from exc
        rid, created = new_id("cmpl"), now()

        sent = [0] * len(lanes)  # token ids already sent per lane (streaming)

        def choice(i: int, text: str, finish: str | None) -> dict[str, Any]:
            out: dict[str, Any] = {"index": i, "text": text, "finish_reason": finish,
                                   "logprobs": None}
            if req.sampling.logprobs is not None:
                lane = lanes[i]
                entries = lane.ticket.turn.decoder.logprobs
                since = lane.logprobs_sent if req.sampling.stream else 0
                out["logprobs"] = completion_logprobs(self.model, entries[since:])
                lane.logprobs_sent = len(entries)
            if req.return_token_ids:
                # streaming: the ids sampled since the last chunk (as vLLM does); else all
                tokens = lanes[i].ticket.turn.decoder.tokens
                now_sent = len(tokens)
                out["token_ids"] = list(tokens[sent[i] : now_sent] if req.sampling.stream
                                        else tokens)
                sent[i] = now_sent
            return out

        def lane_finish(lane: _Lane) -> str:
            return finish_reason(lane.reply.finish_reason) if lane.reply else "length"

        def body(choices: list[dict[str, Any]], usage: bool) -> dict[str, Any]:
            out = {"id": rid, "object": "text_completion", "created": created,
                   "model": self.name, "choices": choices}
            if usage:
                out["usage"] = self._usage(lanes)
            if req.return_token_ids:
                out["prompt_token_ids"] = list(lanes[0].ticket.turn.plan.prompt)
            return out

        if not req.sampling.stream:
            await self._collect(request, lanes)
            return JSONResponse(body([
                choice(i, lane.reply.text if lane.reply else lane.text, lane_finish(lane))
                for i, lane in enumerate(lanes)], True))

        async def sse() -> AsyncIterator[str]:
            try:
                async for i, delta in self._events(lanes):
                    if delta is not None:
                        yield _sse(body([choice(i, delta, None)], False))
                    else:
                        yield _sse(body([choice(i, "", lane_finish(lanes[i]))], False))
                if req.sampling.include_usage:
                    yield _sse({**body([], True)})
            except Exception as exc:
                yield _sse(translate_error(exc).body())
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def serve(model: StepEngine, *, name: str, host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, limits: ServerLimits | None = None,
          max_queue: int | None = None) -> None:
    """Run the server until interrupted (uvicorn, one process: one engine, one loop)."""
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        _log.warning("serving on %s without --api-key: anyone who can reach it may use it",
                     host)
    server = ChatkitServer(model, name=name, api_key=api_key, limits=limits,
                           max_queue=max_queue)
    uvicorn.run(server.app, host=host, port=port, log_level="info", access_log=False)


def _checked_start(turn: Turn, logprobs: int | None = None) -> Turn:
    """A grammar that compiles but fails at its first token (too large for llguidance's
    limits) is the request's fault: refused now, a 400, instead of a 500 after the 200.
    ``logprobs``: record them (not for tool calls or think blocks: their tokens are
    markup the client never sees)."""
    constraint = turn.plan.constraint
    if constraint is not None:
        constraint.check_start()
    if logprobs is not None:
        if turn.plan.tools or turn.plan.thinking:
            raise bad("logprobs are not returned for replies with tools or a think block",
                      "logprobs", "unsupported_parameter")
        turn.plan.sampler.logprobs = logprobs
    return turn
