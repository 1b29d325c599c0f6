"""Typed chat messages, replies and usage: pure data (no engine import).

Messages round-trip through JSON and through OpenAI-style message dicts
(``{"role", "content", "tool_calls": [...]}`` / ``{"role": "tool",
"tool_call_id", ...}``), so a conversation's state can be stored, sent over
the wire, or rebuilt from another client's history.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeAlias, TypeVar, cast

from .errors import InvalidParameter

__all__ = ["ChoiceProbabilities", "FinishReason", "Message", "Reply", "Role", "TokenLogprob",
           "ToolCall", "Usage"]

JSON: TypeAlias = Any
"""A JSON value as ``json.loads`` returns it (an object, list, string, number, bool or
None): arbitrary by nature, the one kind of ``Any`` the public API carries (DESIGN.md)."""
JSONObject: TypeAlias = dict[str, JSON]
"""A JSON object: an OpenAI message or tool call as a dict, a call's arguments, a schema."""

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "constraint_complete", "tool_calls"]
"""stop: the model ended (stop token or stop string); length: ``max_tokens``;
constraint_complete: the grammar completed and the stop token followed;
tool_calls: the reply is tool calls."""

T = TypeVar("T", covariant=True)
P = TypeVar("P")
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made (filled in by the tools layer)."""

    id: str
    """Stable id within the conversation, echoed by the tool result."""
    name: str
    """The tool's name."""
    arguments: JSONObject
    """The validated arguments as plain JSON data."""
    parsed: object = None
    """The arguments as the tool's Pydantic model instance, when it has one."""

    def parsed_as(self, cls: type[P]) -> P:
        """``parsed``, typed: the arguments as ``cls`` (the tool's Pydantic model).
        Raises ``InvalidParameter`` when this call's arguments are not a ``cls``."""
        if not isinstance(self.parsed, cls):
            raise InvalidParameter("cls", f"call {self.name!r} has arguments of type "
                                   f"{type(self.parsed).__name__}, not {cls.__name__}")
        return self.parsed

    def to_openai(self) -> JSONObject:
        """``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name,
                             "arguments": json.dumps(self.arguments, ensure_ascii=False)}}

    @classmethod
    def from_openai(cls, data: Mapping[str, JSON]) -> ToolCall:
        """From the OpenAI shape; ``arguments`` may be JSON text or an object.
        Raises ``InvalidParameter`` on a malformed call."""
        fn = data.get("function", data)
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise InvalidParameter("tool_calls", f"a tool call needs a function name: {data!r}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError as exc:
                raise InvalidParameter("tool_calls", f"arguments are not JSON: {exc}") from exc
        if not isinstance(args, dict):
            raise InvalidParameter("tool_calls", "arguments must be a JSON object")
        return cls(id=str(data.get("id", "")), name=fn["name"], arguments=args)


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

    def to_openai(self) -> JSONObject:
        """The OpenAI chat message dict (``reasoning`` as ``reasoning_content``)."""
        out: JSONObject = {"role": self.role, "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    @classmethod
    def from_openai(cls, data: Mapping[str, JSON]) -> Message:
        """From an OpenAI chat message dict: content as a string, None, or a list of text
        parts. Raises ``InvalidParameter`` naming what is wrong."""
        if not isinstance(data, Mapping):
            raise InvalidParameter("messages", f"a message is an object, not {type(data).__name__}")
        role = data.get("role")
        if role == "developer":
            role = "system"
        if role not in _ROLES:
            raise InvalidParameter("messages", f"unknown role {role!r}")
        raw_calls = data.get("tool_calls") or ()
        if not isinstance(raw_calls, list | tuple) or not all(
                isinstance(c, Mapping) for c in raw_calls):
            raise InvalidParameter("messages", "tool_calls must be a list of objects")
        calls = tuple(ToolCall.from_openai(c) for c in raw_calls)
        reasoning = data.get("reasoning_content", data.get("reasoning"))
        return cls(role=cast(Role, role), content=_content_text(data.get("content")),
                   reasoning=reasoning if isinstance(reasoning, str) else None,
                   tool_calls=calls, tool_call_id=data.get("tool_call_id"),
                   name=data.get("name"))


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidParameter("messages", f"unsupported content part {kind!r} "
                                       "(text parts only)")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InvalidParameter("messages", f"content must be a string or text parts, not "
                           f"{type(content).__name__}")


def messages_to_openai(messages: Iterable[Message]) -> list[JSONObject]:
    """OpenAI-style message dicts (JSON-serialisable)."""
    return [m.to_openai() for m in messages]


def messages_from_openai(data: Iterable[Mapping[str, JSON] | Message]) -> list[Message]:
    """Messages from OpenAI-style dicts (``Message`` instances pass through)."""
    return [d if isinstance(d, Message) else Message.from_openai(d) for d in data]


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
    rollbacks: int = 0
    """Times a schema's value checks took tokens back (``not``, ``uniqueItems``, ...: see
    ``Constraint.json_schema``); the tokens taken back are not counted above."""

    @property
    def evaluated_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """A selected token's log-probability and the most probable alternatives, from the
    distribution it was chosen from: after the grammar's mask and the penalties, at the
    temperature in force (1 under greedy), before top-k / top-p / min-p truncation."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """(token, logprob), most probable first."""


@dataclass(frozen=True)
class ChoiceProbabilities:
    """One field's value distribution under the grammar."""

    path: str
    """The field's JSON pointer (``"/verdict"``)."""
    probabilities: dict[JSON, float]
    """Each allowed value's probability (a Python value: str, bool, int ...)."""
    chosen: JSON
    """The value the reply holds."""
    unaccounted: float = 0.0
    """Probability mass on paths pruned below ``PRUNE``: the values' probabilities sum to
    ``1 - unaccounted``."""
    forward_passes: int = 0
    """Branch tokens evaluated (the prefix not counted)."""
    temperature: float = 1.0

    @property
    def decision(self) -> JSON:
        """The most probable value."""
        return max(self.probabilities, key=lambda v: self.probabilities[v])

    @property
    def margin(self) -> float:
        """The decision's probability minus the runner-up's."""
        ps = sorted(self.probabilities.values(), reverse=True)
        return ps[0] - (ps[1] if len(ps) > 1 else 0.0)


@dataclass(frozen=True)
class Reply(Generic[T]):
    """An assistant reply: the text and what chatkit made of it.

    Generic in what ``parsed`` holds: ``send(text, schema=Verdict)`` returns a
    ``Reply[Verdict]``; a schema given as a dict or text gives ``Reply[Any]``;
    no schema gives ``Reply[None]``.
    """

    text: str
    """The reply text (for a thinking turn: the answer after the think block)."""
    finish_reason: FinishReason
    """stop | length | constraint_complete | tool_calls."""
    usage: Usage
    """Token counts and timings."""
    parsed: T
    """For ``schema=``: the validated value (a Pydantic instance for a model class)."""
    reasoning: str | None = None
    """The think text of a thinking turn, when there was one."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Tool calls made in this reply."""
    dropped_calls: int = 0
    """Tool calls dropped because they repeated an earlier call of this reply verbatim (the
    reply ended there)."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Per reply token (``logprobs=`` asked for them): its log-probability and the top
    alternatives."""
    choices: dict[str, ChoiceProbabilities] | None = None
    """Per field (JSON pointer) asked for with ``probabilities=``: its value distribution."""
    raw: str | None = None
    """The exact text the model wrote, markup included (tool calls in their dialect's
    markup, a think block); None where no reply was decoded."""
    stop_sequence: str | None = None
    """The stop string (``stop=``) that ended the reply; None when something else did."""
