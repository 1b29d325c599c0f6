"""Typed chat messages, replies and usage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .decoding import FinishReason

__all__ = ["Message", "Reply", "Role", "ToolCall", "Usage"]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made (filled in by the tools layer)."""

    id: str
    """Stable id within the conversation, echoed by the tool result."""
    name: str
    """The tool's name."""
    arguments: dict[str, Any]
    """The validated arguments as plain JSON data."""
    parsed: Any = None
    """The arguments as the tool's Pydantic model instance, when it has one."""


@dataclass(frozen=True)
class Message:
    """One turn of a conversation. ``content`` is always message content, never markup."""

    role: Role
    """Who speaks: system, user, assistant or tool."""
    content: str
    """The text; rendered as content, so it can never become control tokens."""
    reasoning: str | None = None
    """An assistant's think text (not sent back to the model on later turns)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant's tool calls."""
    tool_call_id: str | None = None
    """For a tool result: the id of the call it answers."""
    name: str | None = None
    """For a tool result: the tool's name."""


@dataclass(frozen=True)
class Usage:
    """Token counts and timings of one reply."""

    prompt_tokens: int
    """Prompt length in tokens."""
    completion_tokens: int
    """Reply tokens generated (the stop token excluded)."""
    cached_prompt_tokens: int
    """Prompt tokens reused from the KV cache (not evaluated again)."""
    prompt_seconds: float
    """Time to the first reply token (prefill included)."""
    total_seconds: float
    """Wall time of the whole reply."""
    draft_tokens: int = 0
    """Speculative draft tokens verified (``speculative=True``)."""
    accepted_draft_tokens: int = 0
    """... and accepted."""

    @property
    def evaluated_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens


@dataclass(frozen=True)
class Reply:
    """An assistant reply: the text and what chatkit made of it."""

    text: str
    """The reply text (for a thinking turn: the answer after the think block)."""
    finish_reason: FinishReason
    """stop | length | constraint_complete | dead_end | tool_calls."""
    usage: Usage
    """Token counts and timings."""
    parsed: Any = None
    """For ``schema=``: the validated value (a Pydantic instance for a model class)."""
    reasoning: str | None = None
    """The think text of a thinking turn, when there was one."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Tool calls made in this reply."""
