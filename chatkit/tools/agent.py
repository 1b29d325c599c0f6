"""The agent loop behind ``Conversation.run``/``arun``: send, run the called tools,
feed their results back, repeat.

Written once as a generator (:func:`agent_steps`) that yields requests (a
model turn, or a batch of tool calls to execute) and receives their results;
a sync driver and an async driver run it (the httpx ``_auth.py`` shape). The
drivers take the conversation's turn as a callable, so this module does not
import the conversation (one-way layers: conversation -> agent -> tools).
Tools execute concurrently under anyio: async tools as tasks, sync tools in
worker threads, each under its timeout. A tool that raises becomes an error
``<tool_response>`` the model sees; ``ModelRetry`` asks for a corrected call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from ..decode.options import TurnOptions
from ..engine.concurrency import run_coroutine_sync
from ..errors import InvalidParameter, MaxStepsExceeded, ToolDefinitionError, ToolServerError
from ..grammar.constraints import SchemaArg
from ..messages import Reply, ToolCall
from .definition import ModelRetry, Tool, check_tools

__all__ = ["ToolResult", "execute_calls"]

SendTurn = Callable[[str | None, SchemaArg, TurnOptions], Reply[Any]]
"""One model turn: (new user text or None to continue, schema, options) -> Reply."""
ASendTurn = Callable[[str | None, SchemaArg, TurnOptions], Awaitable[Reply[Any]]]
Record = Callable[[Sequence["ToolResult"]], None]
"""Appends tool results to the conversation."""


@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned, as the model will see it."""

    call: ToolCall
    content: str
    """The text of the ``<tool_response>``."""
    error: bool = False
    """True when the tool raised (or timed out, or asked for a retry)."""
    started: float = 0.0
    """perf_counter() when the tool started (for concurrency checks)."""
    finished: float = 0.0


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


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    from pydantic import BaseModel  # here: a process without tools never imports pydantic

    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


async def execute_calls(calls: Sequence[ToolCall], tools: Sequence[Tool]) -> list[ToolResult]:
    """Run the calls concurrently; every call yields a result (errors included), except
    that a tool server whose session is gone (``ToolServerError``, an MCP server) is
    raised once every call has ended: the loop cannot go on without it."""
    import anyio  # here: a process without tools never imports anyio
    import anyio.to_thread

    by_name = {t.name: t for t in tools}
    results: list[ToolResult | None] = [None] * len(calls)
    gone: list[ToolServerError] = []

    async def one(i: int, call: ToolCall) -> None:
        t = by_name[call.name]
        started = time.perf_counter()
        try:
            fn = t.bind_call(call.parsed)
            with anyio.fail_after(t.timeout) if t.timeout else nullcontext():
                if t.is_async:
                    value = await fn()
                else:
                    value = await anyio.to_thread.run_sync(fn)
            results[i] = ToolResult(call, _render(value), False, started, time.perf_counter())
        except ModelRetry as exc:
            results[i] = ToolResult(call, _render({"retry": str(exc)}), True, started,
                                    time.perf_counter())
        except TimeoutError:
            results[i] = ToolResult(call, _render({"error": f"timed out after {t.timeout} s"}),
                                    True, started, time.perf_counter())
        except ToolServerError as exc:
            gone.append(exc)
        except Exception as exc:  # a failing tool is reported to the model, not raised
            results[i] = ToolResult(call, _render({"error": f"{type(exc).__name__}: {exc}"}),
                                    True, started, time.perf_counter())

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    if gone:
        raise gone[0]
    return [r for r in results if r is not None]


def _callable_tools(tools: Sequence[Any]) -> list[Tool]:
    made = check_tools(tools)
    for t in made:
        if t.function is None:
            raise ToolDefinitionError(t.name, "the agent loop needs a function to call; "
                                      "schema-only tools are for send(tools=...)")
    return made


def _start(text: str, tools: Sequence[Any], max_steps: int, schema: SchemaArg,
           options: TurnOptions) -> tuple[list[Tool], Generator[_Send | _Execute, Any, Reply[Any]]]:
    made = _callable_tools(tools)
    opts = TurnOptions(**{**options, "tools": made})
    return made, agent_steps(text, max_steps=max_steps, schema=schema, options=opts)


def run_agent(send: SendTurn, record: Record, text: str, tools: Sequence[Any], *,
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


async def arun_agent(send: ASendTurn, record: Record, text: str, tools: Sequence[Any], *,
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
