"""Executing tool calls: each called tool run concurrently under anyio (async tools as
tasks, sync tools in worker threads, each under its timeout), every call answered by a
:class:`ToolResult`.

A tool that raises becomes an error result the model sees; ``ModelRetry`` asks for a
corrected call; a tool server whose session is gone (``ToolServerError``) is raised.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

from ..errors import ToolServerError
from ..messages import ToolCall
from .definition import ModelRetry, Tool

__all__ = ["ToolResult", "execute_calls"]


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
                    value = await cast("Awaitable[object]", fn())
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
