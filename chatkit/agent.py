"""The agent loop: send, run the called tools, feed their results back, repeat.

Written once as a generator (:func:`agent_steps`) that yields requests (a
model turn, or a batch of tool calls to execute) and receives their results;
a sync driver and an async driver run it (the httpx ``_auth.py`` shape).
Tools execute concurrently under anyio: async tools as tasks, sync tools in
worker threads, each under its timeout. A tool that raises becomes an error
``<tool_response>`` the model sees; ``ModelRetry`` asks for a corrected call.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from pydantic import BaseModel

from ..errors import InvalidParameter, MaxStepsExceeded, ToolDefinitionError
from ..messages import Message, Reply, ToolCall
from .definition import ModelRetry, Tool, check_tools

if TYPE_CHECKING:
    from ..conversation import Conversation

__all__ = ["ToolResult", "agent_steps", "execute_calls", "run_agent"]


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
    options: dict[str, Any]


@dataclass(frozen=True)
class _Execute:
    calls: list[ToolCall]


def agent_steps(text: str, tools: Sequence[Tool], *, max_steps: int,
                options: dict[str, Any]) -> Generator[_Send | _Execute, Any, Reply]:
    """The loop's logic: yields requests, receives a Reply or a list of ToolResults."""
    if max_steps < 1:
        raise InvalidParameter("max_steps", f"must be >= 1, got {max_steps}")
    transcript: list[Any] = []
    message: str | None = text
    for _ in range(max_steps):
        reply: Reply = yield _Send(message, options)
        transcript.append(reply)
        if not reply.tool_calls:
            return reply
        results: list[ToolResult] = yield _Execute(list(reply.tool_calls))
        transcript.extend(results)
        message = None  # the next turn continues from the tool results
        if options.get("tool_choice") not in (None, "none"):
            # As the OpenAI Agents SDK's reset_tool_choice: a forced choice applies to the
            # first call only, else "required" would loop until max_steps.
            options = {**options, "tool_choice": "auto"}
    raise MaxStepsExceeded(max_steps, transcript)


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


async def execute_calls(calls: Sequence[ToolCall], tools: Sequence[Tool]) -> list[ToolResult]:
    """Run the calls concurrently; every call yields a result (errors included)."""
    by_name = {t.name: t for t in tools}
    results: list[ToolResult | None] = [None] * len(calls)

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
        except Exception as exc:  # a failing tool is reported to the model, not raised
            results[i] = ToolResult(call, _render({"error": f"{type(exc).__name__}: {exc}"}),
                                    True, started, time.perf_counter())

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    return [r for r in results if r is not None]


def _append_results(conv: Conversation, results: Sequence[ToolResult]) -> None:
    for r in results:
        conv.messages.append(Message("tool", r.content, tool_call_id=r.call.id,
                                     name=r.call.name))


def _callable_tools(tools: Sequence[Any]) -> list[Tool]:
    made = check_tools(tools)
    for t in made:
        if t.function is None:
            raise ToolDefinitionError(t.name, "the agent loop needs a function to call; "
                                      "schema-only tools are for send(tools=...)")
    return made


def _start(text: str, tools: Sequence[Any], max_steps: int, output: Any,
           options: dict[str, Any]) -> tuple[list[Tool], Generator[_Send | _Execute, Any, Reply]]:
    made = _callable_tools(tools)
    opts = {**options, "tools": made}
    if output is not None:
        opts["schema"] = output
    return made, agent_steps(text, made, max_steps=max_steps, options=opts)


def run_agent(conv: Conversation, text: str, tools: Sequence[Any], *, max_steps: int = 8,
              output: Any = None, **options: Any) -> Reply:
    """The sync driver (``Conversation.run``)."""
    made, steps = _start(text, tools, max_steps, output, options)
    request = next(steps)
    while True:
        try:
            if isinstance(request, _Send):
                reply = conv._send_turn(request.text, request.options)
                request = steps.send(reply)
            else:
                results = anyio.run(execute_calls, request.calls, made)
                _append_results(conv, results)
                request = steps.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]


async def arun_agent(conv: Conversation, text: str, tools: Sequence[Any], *,
                     max_steps: int = 8, output: Any = None, **options: Any) -> Reply:
    """The async driver (``Conversation.arun``)."""
    made, steps = _start(text, tools, max_steps, output, options)
    request = next(steps)
    while True:
        try:
            if isinstance(request, _Send):
                reply = await conv._asend_turn(request.text, request.options)
                request = steps.send(reply)
            else:
                results = await execute_calls(request.calls, made)
                _append_results(conv, results)
                request = steps.send(results)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
