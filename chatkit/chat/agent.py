"""The agent loop behind ``Conversation.run``/``arun``: send, run the called tools,
feed their results back, repeat.

Written once as a generator (:func:`agent_steps`) that yields requests (a
model turn, or a batch of tool calls to execute) and receives their results;
a sync driver and an async driver run it (the httpx ``_auth.py`` shape). The
drivers take the conversation's turn as a callable, so this module does not
import the conversation (conversation -> agent -> tools). The calls run in
:func:`chatkit.tools.execute.execute_calls`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.concurrency import run_coroutine_sync
from ..errors import InvalidParameter, MaxStepsExceeded, ToolDefinitionError
from ..grammar.constraints import SchemaArg
from ..messages import Reply, ToolCall
from ..tools.definition import Tool, ToolLike, check_tools
from ..tools.execute import ToolResult, execute_calls
from .options import TurnOptions

__all__: list[str] = []

SendTurn = Callable[[str | None, SchemaArg, TurnOptions], Reply[Any]]
"""One model turn: (new user text or None to continue, schema, options) -> Reply."""
ASendTurn = Callable[[str | None, SchemaArg, TurnOptions], Awaitable[Reply[Any]]]
Record = Callable[[Sequence["ToolResult"]], None]
"""Appends tool results to the conversation."""


@dataclass(frozen=True)
class _Send:
    text: str | None
    schema: SchemaArg
    options: TurnOptions


@dataclass(frozen=True)
class _Execute:
    calls: list[ToolCall]


def agent_steps(text: str, *, max_steps: int, schema: SchemaArg,
                options: TurnOptions) -> Generator[_Send | _Execute, Any, Reply[Any]]:
    """The loop's logic: yields requests, receives a Reply or a list of ToolResults."""
    if max_steps < 1:
        raise InvalidParameter("max_steps", f"must be >= 1, got {max_steps}")
    transcript: list[Any] = []
    message: str | None = text
    # A tool_call_threshold beside a forced first call is for the "auto" turns after it.
    threshold = options.get("tool_call_threshold")
    if threshold is not None and options.get("tool_choice") not in (None, "auto", "none"):
        options = TurnOptions(**{k: v for k, v in options.items()
                                 if k != "tool_call_threshold"})  # type: ignore[typeddict-item]
    else:
        threshold = None
    for _ in range(max_steps):
        reply: Reply[Any] = yield _Send(message, schema, options)
        transcript.append(reply)
        if not reply.tool_calls:
            return reply
        results: list[ToolResult] = yield _Execute(list(reply.tool_calls))
        transcript.extend(results)
        message = None  # the next turn continues from the tool results
        if options.get("tool_choice") not in (None, "none"):
            # As the OpenAI Agents SDK's reset_tool_choice: a forced choice applies to the
            # first call only, else "required" would loop until max_steps.
            options = TurnOptions(**{**options, "tool_choice": "auto"})
            if threshold is not None:
                options["tool_call_threshold"] = threshold
                threshold = None
    raise MaxStepsExceeded(max_steps, transcript)


def _callable_tools(tools: Sequence[ToolLike]) -> list[Tool]:
    made = check_tools(tools)
    for t in made:
        if t.function is None:
            raise ToolDefinitionError(t.name, "the agent loop needs a function to call; "
                                      "schema-only tools are for send(tools=...)")
    return made


def _start(text: str, tools: Sequence[ToolLike], max_steps: int, schema: SchemaArg,
           options: TurnOptions) -> tuple[list[Tool], Generator[_Send | _Execute, Any, Reply[Any]]]:
    made = _callable_tools(tools)
    opts = TurnOptions(**{**options, "tools": made})
    return made, agent_steps(text, max_steps=max_steps, schema=schema, options=opts)


def run_agent(send: SendTurn, record: Record, text: str, tools: Sequence[ToolLike], *,
              max_steps: int, schema: SchemaArg, options: TurnOptions) -> Reply[Any]:
    """The sync driver (``Conversation.run``). Tools run on an event loop of their own,
    so this works from a thread whose event loop is running too."""
    made, steps = _start(text, tools, max_steps, schema, options)
    request = next(steps)
    while True:
        try:
            if isinstance(request, _Send):
                request = steps.send(send(request.text, request.schema, request.options))
            else:
                results = run_coroutine_sync(execute_calls, request.calls, made)
                record(results)
                request = steps.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


async def arun_agent(send: ASendTurn, record: Record, text: str, tools: Sequence[ToolLike], *,
                     max_steps: int, schema: SchemaArg, options: TurnOptions) -> Reply[Any]:
    """The async driver (``Conversation.arun``)."""
    made, steps = _start(text, tools, max_steps, schema, options)
    request = next(steps)
    while True:
        try:
            if isinstance(request, _Send):
                request = steps.send(await send(request.text, request.schema, request.options))
            else:
                results = await execute_calls(request.calls, made)
                record(results)
                request = steps.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
