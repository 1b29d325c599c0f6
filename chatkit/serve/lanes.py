"""The engine side of a server request: its lanes (``n`` choices), each a planned turn
in the model's engine loop, with a KV claim borrowed for prefix reuse across requests.

:class:`Lanes` plans a request's lanes (every refusal before any token), submits them,
merges their text deltas, and reads their usage and logprobs from the turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..chat.conversation import Conversation
from ..chat.options import TurnOptions
from ..chat.plan import THINK_BUDGET, plan_completion
from ..chat.scheduler import EngineLoop, Ticket
from ..chat.turn import KVState, Turn, TurnView
from ..decode.sampling import Sampler
from ..engine.concurrency import run_blocking
from ..engine.protocols import SequenceLeases, StepEngine
from ..errors import ContextOverflow, EngineBusy, RequestError, Truncated
from ..grammar.constraints import Constraint
from ..messages import Reply
from ..templates import ChatTemplate
from ..tools.options import check_threshold
from .openai_api import (
    ChatRequest,
    CompletionRequest,
    ServerLimits,
    bad,
    usage_body,
)
from .stream_deltas import ReplyDeltas, read_cut

if TYPE_CHECKING:
    from starlette.requests import Request

__all__: list[str] = []


def _deltas(turn: TurnView) -> ReplyDeltas:
    """The stream reader of a held turn: its think block (a tool turn's is optional unless
    the prompt opened it) and its calls in the turn's dialect."""
    plan, dialect = turn.plan, turn.dialect
    think = plan.tool_thinking and dialect is not None and dialect.reasoning is not None
    markers = dialect.reasoning if think and dialect is not None and dialect.reasoning \
        else ("", "")
    return ReplyDeltas(thinking=turn.thinking or (think and plan.think_opened),
                       tools=turn.has_tools, dialect=dialect, tool_list=turn.tools,
                       think_open="" if plan.think_opened else markers[0],
                       think_close=markers[1])


@dataclass
class Lane:
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
    started: float = 0.0
    """When its request started (``time.monotonic()``)."""

    @property
    def capped(self) -> bool:
        """The lane's ``max_tokens`` was shrunk to the room its prompt left."""
        return self.ticket.turn.context_capped

    def cut(self) -> tuple[str, str, list[dict[str, Any]]] | None:
        """A held lane cut at ``max_tokens``, read through its markup (``read_cut``); None
        for a finished or plain-text lane."""
        if self.reply is not None or self.deltas is None:
            return None
        return read_cut(self.deltas, self.text)


class KVPool:
    """Requests' KV claims. A request owns its sequence only while it runs: when it ends,
    the sequence is left to nobody with its tokens recorded (``release_seq``), and the next
    request's prompt is routed to the idle sequence sharing its longest prefix
    (``StepEngine.lease_seq``: copied into a free sequence with one KV pool, else that
    sequence itself), so a multi-turn client's next request finds its conversation and a
    service's requests find their shared system prompt
    (``usage.prompt_tokens_details.cached_tokens``)."""

    FIRST_OWNER = -(1 << 40)
    """Owner ids count down from here (conversations and scratch leases use others)."""

    def __init__(self, model: SequenceLeases) -> None:
        self.model = model
        self._ids = itertools.count()

    def borrow(self, prompt: Sequence[int]) -> KVState:
        return KVState(owner=self.FIRST_OWNER - next(self._ids))

    def give_back(self, state: KVState) -> None:
        self.model.release_seq_owner(state.owner)


class Lanes:
    """Runs requests' lanes on one engine loop (``loop``) with a pool of KV claims."""

    def __init__(self, model: StepEngine, loop: EngineLoop, limits: ServerLimits, *,
                 template: ChatTemplate | None = None, tool_format: str | None = None) -> None:
        self.model = model
        self.template = template
        self.tool_format = tool_format
        self.loop = loop
        self.limits = limits
        self.kv = KVPool(model)
        self._open: set[asyncio.Queue[tuple[int, Any]]] = set()
        """The event queues of the requests running now (:meth:`abort` ends them)."""
        self.on_finish: Callable[[Lane, float, float | None], None] | None = None
        """Called when a lane ends with its reply: (lane, its request's start, its first
        text's time or None), monotonic times (the metrics)."""

    def plan_chat(self, req: ChatRequest, lane: int) -> Turn:
        s = req.sampling
        conv = Conversation(self.model, messages=req.history, no_think=req.no_think,
                            sampling=s.params(lane), template=self.template,
                            think_budget=req.think_budget or THINK_BUDGET,
                            stop=s.stop, max_tokens=self._max_tokens(s.max_tokens),
                            fit_max_tokens=True)
        options: TurnOptions = {"tool_choice": req.tool_choice}
        if self.limits.speculative:
            options["speculative"] = True
        if s.stop:
            options["stop"] = s.stop  # refused beside a schema or tools (by name)
        if req.tools:
            options["tools"] = req.tools
            options["parallel_tool_calls"] = req.parallel_tool_calls
            if self.tool_format is not None:
                options["tool_format"] = self.tool_format
        if req.tool_call_threshold is not None:
            # the extension decides "auto" only: beside a forced or "none" choice (an agent
            # sends it on every turn) it is checked, then left out
            check_threshold(req.tool_call_threshold, choice="auto", has_tools=bool(req.tools),
                            local=True)
            if req.tool_choice == "auto":
                options["tool_call_threshold"] = req.tool_call_threshold
        try:
            turn = conv.plan(req.text, req.schema, **options)
        except ContextOverflow as exc:  # the prompt alone fills the context
            raise self._overflow(exc) from exc
        return checked_start(turn, s.logprobs)

    def _max_tokens(self, asked: int | None) -> int:
        """The turn's ``max_tokens`` before it is fitted to the prompt: what was asked
        (already within the cap), else the cap, else the whole context."""
        return asked or self.limits.max_tokens or self.model.n_ctx_seq

    def _overflow(self, exc: ContextOverflow) -> RequestError:
        source = f" ({self.limits.context_source})" if self.limits.context_source else ""
        return RequestError(400, f"the prompt ({exc.prompt_tokens} tokens) does not fit one "
                            f"sequence's context ({exc.n_ctx} tokens{source})",
                            param="messages", code="context_length_exceeded")

    def plan_completion(self, req: CompletionRequest, lane: int) -> Turn:
        model = self.model
        s = req.sampling
        prompt = (model.tokenize(req.prompt, special=True, add_bos=model.add_bos)
                  if isinstance(req.prompt, str) else list(req.prompt))
        constraint = None
        if req.grammar is not None:
            kind, text = req.grammar
            constraint = Constraint.regex(text) if kind == "regex" else Constraint.lark(text)
        try:
            plan = plan_completion(model, prompt, sampler=Sampler(s.params(lane)),
                max_tokens=self._max_tokens(s.max_tokens), schema=req.schema,
                constraint=constraint, stop=s.stop or None, fit_max_tokens=True)
        except ContextOverflow as exc:
            raise self._overflow(exc) from exc
        if self.limits.speculative:
            plan = dataclasses.replace(plan, speculative=True)
        return checked_start(Turn(model, plan, KVState(owner=0), lambda added: None),
                              s.logprobs)

    async def start(self, plan_lane: Callable[[int], Turn], n: int) -> list[Lane]:
        """Plan every lane (refusals: 400 before any token), borrow KV claims, submit."""
        started = time.monotonic()
        turns = [await run_blocking(self.model, plan_lane, i) for i in range(n)]
        lanes: list[Lane] = []
        try:
            for turn in turns:
                turn.kv = self.kv.borrow(turn.prompt)
                try:
                    ticket = self.loop.submit(turn)
                except EngineBusy:
                    self.kv.give_back(turn.kv)
                    raise
                # the claim comes back when the loop lets go of the turn, whatever happens
                ticket.on_close.append(functools.partial(self.kv.give_back, turn.kv))
                hold = turn.has_tools or turn.thinking
                lanes.append(Lane(ticket, hold=hold, deltas=_deltas(turn) if hold else None,
                                  started=started))
        except EngineBusy:
            for lane in lanes:
                lane.ticket.cancel()
            raise
        return lanes

    async def events(self, lanes: list[Lane]) -> AsyncIterator[tuple[int, str | None]]:
        """Merged (lane, text delta) events; (lane, None) when a lane ends (its ``reply`` or
        ``finish`` is then set). Errors other than a cut at max_tokens propagate as they
        are (named), after the request timeout ``TimeoutError``. One asyncio task per
        lane feeds a queue, so nothing here yields inside a cancel scope; leaving (a
        disconnect, an error) cancels every lane's turn."""
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

        async def pump(i: int, lane: Lane) -> None:
            first: float | None = None
            try:
                async with contextlib.aclosing(lane.ticket.adeltas()) as deltas:
                    async for delta in deltas:
                        if first is None:
                            first = time.monotonic()
                        queue.put_nowait((i, delta))
                lane.reply = lane.ticket.reply
                if self.on_finish is not None:
                    self.on_finish(lane, lane.started, first)
                queue.put_nowait((i, None))
            except Truncated as exc:
                lane.text, lane.finish = exc.text, "length"
                queue.put_nowait((i, None))
            except Exception as exc:
                queue.put_nowait((i, exc))

        tasks = [asyncio.create_task(pump(i, lane)) for i, lane in enumerate(lanes)]
        deadline = asyncio.get_running_loop().time() + self.limits.request_timeout
        self._open.add(queue)
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
            self._open.discard(queue)
            for lane in lanes:
                lane.ticket.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def abort(self, exc: Exception) -> None:
        """End every running request with ``exc`` (raised where it reads its events: a
        stream sends it as its error event). On the event loop's thread."""
        for queue in self._open:
            queue.put_nowait((0, exc))

    async def _until_disconnect(self, request: Request, lanes: list[Lane]) -> None:
        """A non-streaming request: cancel its turns when the client goes away."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                for lane in lanes:
                    lane.ticket.cancel()
                return

    async def collect(self, request: Request, lanes: list[Lane]) -> None:
        """Run a non-streaming request's lanes to their end (text into each lane)."""
        watcher = asyncio.create_task(self._until_disconnect(request, lanes))
        try:
            async for i, delta in self.events(lanes):
                if delta is not None and lanes[i].finish is None:
                    lanes[i].text += delta
        finally:
            watcher.cancel()

    def usage(self, lanes: list[Lane]) -> dict[str, Any]:
        """The request's usage, OpenAI's shape: the prompt once, every lane's tokens."""
        first = lanes[0].ticket.turn
        completion = sum(len(lane.ticket.turn.tokens) for lane in lanes)
        return usage_body(len(first.prompt), completion, first.reuse)

    @staticmethod
    def logprobs(lane: Lane, since: int = 0) -> list[Any]:
        """The lane's logprob entries from token ``since`` on (noted as sent)."""
        entries = lane.ticket.turn.logprobs[since:]
        lane.logprobs_sent = since + len(entries)
        return entries

def checked_start(turn: Turn, logprobs: int | None = None) -> Turn:
    """A grammar that compiles but fails at its first token (too large for llguidance's
    limits) is the request's fault: refused now, a 400, instead of a 500 after the 200.
    ``logprobs``: record them (not for tool calls or think blocks: their tokens are
    markup the client never sees)."""
    turn.check_start()
    if logprobs is not None:
        if turn.has_tools or turn.thinking:
            raise bad("logprobs are not returned for replies with tools or a think block",
                      "logprobs", "unsupported_parameter")
        turn.record_logprobs(logprobs)
    return turn
