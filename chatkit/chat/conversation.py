"""``Conversation``: messages, an engine, and one constrained reply per ``send``.

A turn is planned by :mod:`chatkit.chat.turn` and stepped by the model's engine loop
(:mod:`chatkit.chat.scheduler`), which ``send``/``stream`` wait on from a thread and
``asend``/``astream`` from a task; speculative turns step on the caller's side, and
a remote engine's turns are requests replayed locally. The constraint is
reset at the start of every assistant turn; the KV cache keeps the
conversation's prompt, so each turn evaluates only the new suffix. The agent
loop (``run``/``arun``) lives in :mod:`chatkit.chat.agent` and drives the same turns.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypeVar, Unpack, overload

if TYPE_CHECKING:  # pydantic (~90 ms) and anyio are imported where they are used
    from pydantic import BaseModel

from ..decode.options import check_max_tokens, check_positive, stop_tuple
from ..decode.sampling import Sampler, SamplingParams
from ..engine.protocols import Engine
from ..errors import ContextOverflow, InvalidParameter
from ..grammar.constraints import Constraint, SchemaArg
from ..messages import (
    JSON,
    JSONObject,
    Message,
    Reply,
    ToolCall,
    messages_from_openai,
    messages_to_openai,
)
from ..templates import ChatTemplate
from ..tools.definition import ToolLike
from ..tools.execute import ToolResult
from .agent import arun_agent, run_agent
from .options import TurnOptions, check_options
from .plan import THINK_BUDGET, TurnContext, TurnPlan, plan_turn
from .runner import AsyncReplyStream, ReplyStream, drive, local_engine
from .turn import KVState, Turn

__all__ = ["Conversation"]

_log = logging.getLogger("chatkit")

M = TypeVar("M", bound="BaseModel")
T = TypeVar("T")
OtherSchema = JSONObject | str | bool | Constraint
"""Schemas whose parsed value is plain JSON data (``Reply[JSON]``)."""


class Conversation:
    """A chat with one model. Not thread-safe: one ``send`` at a time per conversation
    (different conversations may share a model; their steps interleave safely).

    ``sampling`` applies to every turn unless a call overrides it; the sampler's RNG
    persists across turns, so a seeded conversation reproduces. ``stop`` strings end
    free-text replies (not constrained ones; a string is one stop string).
    ``messages`` starts the conversation from earlier turns (``Message`` objects or
    OpenAI-style dicts; a leading system message becomes ``system``).
    """

    def __init__(
        self,
        model: Engine,
        *,
        system: str | None = None,
        messages: Iterable[Message | Mapping[str, JSON]] = (),
        no_think: bool = False,
        sampling: SamplingParams | None = None,
        stop: str | Sequence[str] = (),
        max_tokens: int = 512,
        template: ChatTemplate | str | None = None,
        think_budget: int = THINK_BUDGET,
        context_policy: Literal["drop_oldest"] | None = None,
        fit_max_tokens: bool = False,
    ) -> None:
        check_max_tokens(max_tokens)
        check_positive("think_budget", think_budget)
        system, history = _intake(system, messages)
        self.model, self.system = model, system
        self.no_think = no_think
        self.sampling = sampling or SamplingParams()
        self.stop = stop_tuple(stop)
        self.max_tokens = max_tokens
        self.think_budget = think_budget
        if context_policy not in (None, "drop_oldest"):
            raise InvalidParameter("context_policy",
                                   f"None or 'drop_oldest', not {context_policy!r}")
        self.context_policy = context_policy
        """None: a turn that cannot fit is ``ContextOverflow``. ``"drop_oldest"``: the oldest
        exchanges (a user message and all that answers it, tool calls and results included)
        leave the prompt until it fits; the system prompt stays, ``messages`` keeps all."""
        self.fit_max_tokens = fit_max_tokens
        """True: a ``max_tokens`` beyond the room the prompt leaves shrinks to it (as
        llama-server and Anthropic's API do); False, or no room at all: ``ContextOverflow``."""
        self.template = (ChatTemplate.bundled(template) if isinstance(template, str)
                         else template or ChatTemplate.for_model(model))
        self.messages: list[Message] = history
        """The turns so far (the system prompt is ``system``)."""
        self.sampler = Sampler(self.sampling)
        """The conversation's sampler; its RNG persists across turns."""
        self.kv = KVState(owner=id(self))
        """Which KV sequence holds this conversation's prompt, and what it holds."""
        local = local_engine(model)
        if local is not None:  # a local model's KV sequences
            weakref.finalize(self, local.release_seq_owner, id(self))

    # ------------------------------------------------------------ state as data
    def history(self) -> list[Message]:
        """The messages sent to the template: system first, then the turns."""
        return self._head() + list(self.messages)

    def _head(self) -> list[Message]:
        return [Message("system", self.system)] if self.system else []

    def to_openai(self) -> list[JSONObject]:
        """The whole history as OpenAI-style message dicts (JSON-serialisable)."""
        return messages_to_openai(self.history())

    def to_json(self) -> str:
        """The history as JSON text (``Conversation(model, messages=json.loads(text))``)."""
        return json.dumps(self.to_openai(), ensure_ascii=False)

    def add_tool_result(self, call: ToolCall | str, content: JSON, *,
                        name: str | None = None) -> None:
        """Record the result of a tool call (for callers running their own tools); then
        ``resume()`` lets the model continue. ``content`` that is not text is sent as JSON."""
        call_id = call.id if isinstance(call, ToolCall) else call
        tool_name = call.name if isinstance(call, ToolCall) else name
        if not any(c.id == call_id for m in self.messages for c in m.tool_calls):
            raise InvalidParameter("call", f"no tool call with id {call_id!r} in this conversation")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False,
                                                                   default=str)
        self.messages.append(Message("tool", text, tool_call_id=call_id, name=tool_name))

    def _record_results(self, results: Sequence[ToolResult]) -> None:
        for r in results:
            self.messages.append(Message("tool", r.content, tool_call_id=r.call.id,
                                         name=r.call.name))

    # ------------------------------------------------------------------ turns
    def plan(self, text: str | None, schema: SchemaArg = None,
             **options: Unpack[TurnOptions]) -> Turn:
        """Plan one turn without running it (every refusal happens here); ``text`` None
        continues from the last message. Drivers (``send_batch``, the engine loop) step
        the returned ``Turn``."""
        local = local_engine(self.model) is not None

        def context(start: int) -> TurnContext:
            return TurnContext(engine=self.model, template=self.template,
                               history=self._head() + self.messages[start:],
                               sampler=self.sampler, no_think=self.no_think,
                               think_budget=self.think_budget, max_tokens=self.max_tokens,
                               stop=self.stop, local=local, fit_max_tokens=self.fit_max_tokens)

        plan = _plan_fitting(context, self.messages, self.context_policy, text, schema, options)
        return Turn(self.model, plan, self.kv, self.messages.extend, local=local)

    def prompt_ids(self, text: str, schema: SchemaArg = None,
                   **options: Unpack[TurnOptions]) -> list[int]:
        """The token ids ``send(text, ...)`` would evaluate (nothing is sent)."""
        return list(self.plan(text, schema, **options).prompt)

    # --------------------------------------------------------------- sync API
    @overload
    def send(self, text: str, *, schema: type[M], **options: Unpack[TurnOptions]) -> Reply[M]:
        ...

    @overload
    def send(self, text: str, *, schema: OtherSchema | None = None,
             **options: Unpack[TurnOptions]) -> Reply[JSON]: ...

    def send(self, text: str, *, schema: SchemaArg = None,
             **options: Unpack[TurnOptions]) -> Reply[JSON]:
        """Add a user message and return the assistant's reply.

        ``schema`` is a Pydantic class (``reply.parsed`` is an instance of it), a
        JSON-schema dict/text, or a JSON Constraint; the options are ``TurnOptions``.
        Raises ``Truncated`` (cut before the constraint completed), ``SchemaViolation``
        (the second reader disagrees), refusals from the schema layer, and
        ``DecodeError``. On any error the conversation is left as it was.
        """
        return drive(self.plan(text, schema, **options))

    @overload
    def resume(self, *, schema: type[M], **options: Unpack[TurnOptions]) -> Reply[M]: ...

    @overload
    def resume(self, *, schema: OtherSchema | None = None,
               **options: Unpack[TurnOptions]) -> Reply[JSON]: ...

    def resume(self, *, schema: SchemaArg = None, **options: Unpack[TurnOptions]) -> Reply[JSON]:
        """An assistant turn with no new user message: e.g. after ``add_tool_result``."""
        return drive(self.plan(None, schema, **options))

    @overload
    def stream(self, text: str, *, schema: type[M],
               **options: Unpack[TurnOptions]) -> ReplyStream[M]: ...

    @overload
    def stream(self, text: str, *, schema: OtherSchema | None = None,
               **options: Unpack[TurnOptions]) -> ReplyStream[JSON]: ...

    def stream(self, text: str, *, schema: SchemaArg = None,
               **options: Unpack[TurnOptions]) -> ReplyStream[JSON]:
        """Like ``send``, but iterate the returned object for text deltas; its ``reply``
        holds the Reply once the iteration ends."""
        return ReplyStream(self.plan(text, schema, **options))

    @overload
    def run(self, text: str, *, schema: type[M], max_steps: int = 8,
            **options: Unpack[TurnOptions]) -> Reply[M]: ...

    @overload
    def run(self, text: str, *, schema: OtherSchema | None = None,
            max_steps: int = 8, **options: Unpack[TurnOptions]) -> Reply[JSON]: ...

    def run(self, text: str, *, schema: SchemaArg = None,
            max_steps: int = 8, **options: Unpack[TurnOptions]) -> Reply[JSON]:
        """The agent loop: send, execute the called tools, feed the results back, repeat
        until the model answers without a tool call (that Reply is returned).

        Tools run concurrently (async tools as tasks, sync tools in worker threads, each
        under its ``timeout``); a tool that raises becomes an error tool response the
        model sees; ``ModelRetry`` asks for a corrected call. ``schema`` constrains the
        final answer. Works from a thread whose event loop is running (tools then run on
        a loop of their own). Raises ``MaxStepsExceeded`` (with the transcript) after
        ``max_steps`` model turns.
        """
        tools = _agent_tools(options)
        return run_agent(lambda t, s, o: drive(self.plan(t, s, **o)), self._record_results,
                         text, tools, max_steps=max_steps, schema=schema, options=options)

    # -------------------------------------------------------------- async API
    @overload
    async def asend(self, text: str, *, schema: type[M],
                    **options: Unpack[TurnOptions]) -> Reply[M]: ...

    @overload
    async def asend(self, text: str, *, schema: OtherSchema | None = None,
                    **options: Unpack[TurnOptions]) -> Reply[JSON]: ...

    async def asend(self, text: str, *, schema: SchemaArg = None,
                    **options: Unpack[TurnOptions]) -> Reply[JSON]:
        """``send`` for async code: planning runs in a worker thread, the steps in the
        model's engine loop (shared with every other turn); the task waits without
        blocking the event loop. A remote engine is awaited over HTTP."""
        return await self._asend(text, schema, options)

    @overload
    async def aresume(self, *, schema: type[M], **options: Unpack[TurnOptions]) -> Reply[M]:
        ...

    @overload
    async def aresume(self, *, schema: OtherSchema | None = None,
                      **options: Unpack[TurnOptions]) -> Reply[JSON]: ...

    async def aresume(self, *, schema: SchemaArg = None,
                      **options: Unpack[TurnOptions]) -> Reply[JSON]:
        """``resume`` for async code."""
        return await self._asend(None, schema, options)

    async def _asend(self, text: str | None, schema: SchemaArg,
                     options: TurnOptions) -> Reply[JSON]:
        stream: AsyncReplyStream[JSON] = AsyncReplyStream(
            self.model, lambda: self.plan(text, schema, **options))
        async for _ in stream:
            pass
        assert stream.reply is not None
        return stream.reply

    @overload
    def astream(self, text: str, *, schema: type[M],
                **options: Unpack[TurnOptions]) -> AsyncReplyStream[M]: ...

    @overload
    def astream(self, text: str, *, schema: OtherSchema | None = None,
                **options: Unpack[TurnOptions]) -> AsyncReplyStream[JSON]: ...

    def astream(self, text: str, *, schema: SchemaArg = None,
                **options: Unpack[TurnOptions]) -> AsyncReplyStream[JSON]:
        """Async text deltas (``async for``); ``reply`` holds the Reply afterwards.
        Cancelling (or leaving the loop) abandons the turn: the messages are unchanged."""
        return AsyncReplyStream(self.model, lambda: self.plan(text, schema, **options))

    @overload
    async def arun(self, text: str, *, schema: type[M],
                   max_steps: int = 8, **options: Unpack[TurnOptions]) -> Reply[M]: ...

    @overload
    async def arun(self, text: str, *,
                   schema: OtherSchema | None = None, max_steps: int = 8,
                   **options: Unpack[TurnOptions]) -> Reply[JSON]: ...

    async def arun(self, text: str, *, schema: SchemaArg = None,
                   max_steps: int = 8, **options: Unpack[TurnOptions]) -> Reply[JSON]:
        """``run`` for async code."""
        tools = _agent_tools(options)
        return await arun_agent(self._asend, self._record_results, text, tools,
                                max_steps=max_steps, schema=schema, options=options)


def _intake(system: str | None, messages: Iterable[Message | Mapping[str, JSON]]
            ) -> tuple[str | None, list[Message]]:
    """The system prompt and the turns of ``messages`` (a leading system message)."""
    history = messages_from_openai(messages)
    if history and history[0].role == "system":
        if system is not None:
            raise InvalidParameter("system", "given twice: as system= and in messages")
        system, history = history[0].content, history[1:]
    if any(m.role == "system" for m in history):
        raise InvalidParameter("messages", "a system message may only come first")
    return system, history


def _plan_fitting(context: Callable[[int], TurnContext], messages: Sequence[Message],
                  policy: str | None, text: str | None, schema: SchemaArg,
                  options: TurnOptions) -> TurnPlan:
    """Plan on the whole history, or (``context_policy="drop_oldest"``) on the latest
    exchanges that fit the context."""
    start = 0
    while True:
        try:
            plan = plan_turn(context(start), text, schema, options)
            break
        except ContextOverflow:
            nxt = _next_exchange(messages, start) if policy else None
            if nxt is None:
                raise
            start = nxt
    if start:
        _log.info("context_policy=%r: %d oldest messages left out of this turn's prompt",
                  policy, start)
    return plan


def _next_exchange(messages: Sequence[Message], start: int) -> int | None:
    """Index of the user message that opens the exchange after the one at ``start`` (None:
    nothing more can be left out without dropping the turn being answered)."""
    for i in range(start + 1, len(messages)):
        if messages[i].role == "user":
            return i
    return None


def _agent_tools(options: TurnOptions) -> Sequence[ToolLike]:
    check_options(dict(options))
    tools = options.get("tools")
    if not tools:
        raise InvalidParameter("tools", "the agent loop needs tools=[...]")
    return tools
