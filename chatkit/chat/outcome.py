"""A finished turn's outcome: the checked ``Reply``, or the error that refuses it."""

from __future__ import annotations

import logging
from typing import Any

from ..decode.decoding import Decoder, decide_finish, usage_of
from ..errors import SchemaViolation, Truncated
from ..grammar.constraints import Constraint
from ..messages import Message, Reply, ToolCall
from ..tools.parser import parse_calls, split_reasoning
from .plan import TurnPlan

__all__: list[str] = []

_log = logging.getLogger("chatkit")


def reply_of(plan: TurnPlan, constraint: Constraint | None, d: Decoder, text: str, *,
             dropped_calls: int) -> tuple[Reply[Any], Message]:
    """The checked reply of a finished decode and the assistant message it adds.

    ``constraint``: the grammar that governed the reply (a turn's own: ``auto`` may
    have chosen it at the first token). Raises ``Truncated`` (cut before the grammar
    completed; it carries the partial text and the usage), ``SchemaViolation`` or
    ``ToolArgumentsInvalid``.
    """
    c = constraint
    end = d.end or "length"
    usage = usage_of(d)
    reasoning: str | None = None
    parsed: Any = None
    calls: list[ToolCall] = []
    raw = text
    if c is not None:
        if end == "length" and not c.is_accepting():
            raise Truncated(text, plan.max_tokens, usage=usage)
        if plan.thinking:
            reasoning, text = _thinking_parts(c, text)
        if plan.tools and plan.dialect is not None and plan.tool_thinking:
            think = dict(c.captures()).get("think")
            reasoning, text = split_reasoning(
                text, plan.dialect, opened=plan.think_opened,
                captured=think.decode("utf-8", errors="replace") if think is not None else None)
        if plan.tools:
            text, calls = parse_calls(text, list(plan.tools), plan.dialect)
        if c.reader is not None and not calls:
            parsed = c.reader.read(text)
    finish = decide_finish(end, grammar_done=c is not None or d.grammar_done,
                           tool_calls=bool(calls),
                           free_text=bool(plan.tools) and c is not None and c.reader is None)
    _log.debug("turn: %d prompt tokens (%d cached), %d reply tokens, first token %.3f s, "
               "total %.3f s, %s", usage.prompt_tokens, usage.cached_prompt_tokens,
               usage.completion_tokens, usage.prompt_seconds, usage.total_seconds, finish)
    message = Message("assistant", text, reasoning=reasoning, tool_calls=tuple(calls))
    logprobs = tuple(d.logprobs) if plan.logprobs is not None else None
    return Reply(text=text, finish_reason=finish, usage=usage, parsed=parsed,
                 reasoning=reasoning, tool_calls=calls, dropped_calls=dropped_calls,
                 logprobs=logprobs, raw=raw), message


def _thinking_parts(c: Constraint, text: str) -> tuple[str, str]:
    caps = dict(c.captures())
    think = caps.get("think", b"").decode("utf-8", errors="replace")
    answer = caps.get("answer")
    if answer is None:
        raise SchemaViolation(text, ["no answer after the think block"])
    return think, answer.decode("utf-8", errors="replace")
