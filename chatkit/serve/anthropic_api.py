"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``) as a
translation over the chat path, as the Responses API is.

A Messages body is translated into the Chat Completions body it means (``to_chat_body``),
checked by the same code (``openai_api.parse_chat``) and run by the same turns, so
``tool_choice`` (``auto`` / ``any`` / ``tool`` / ``none``, ``disable_parallel_tool_use``)
and ``output_config.format`` are enforced by the grammar as the OpenAI endpoints' are. The
reply comes back as a ``message`` (``message_body``) or as the Messages stream's named
events (``MessageStream``); errors in Anthropic's envelope (``error_body``).

Stated rules for what the chat path has no equivalent of:

- ``system``: a string or text blocks, joined by a blank line; Claude Code's per-request
  billing nonce (``cch=<hex>;``) is normalised so the prompt prefix stays reusable.
- A ``system`` message inside ``messages`` (Claude Code's reminders and agent lists) is
  folded into the user turn or tool result before it; before any turn it joins the
  system prompt; after an assistant turn it joins the next user turn (after its tool
  results), or becomes one. Never hoisted to the top from later in the conversation.
  The ``ctx`` role (context recent Claude Code versions send) is folded the same way;
  the ``msg`` role is user text. Each is logged once.
- Blocks: ``text``; ``tool_use`` (assistant) and ``tool_result`` (user: a string or
  blocks; ``is_error`` prefixes ``Error:``); ``thinking`` becomes the assistant's
  reasoning; ``redacted_thinking`` is dropped (nothing here can read it); a
  ``tool_reference`` in a tool result becomes the text ``Tool NAME is available.``;
  ``image`` and ``document`` blocks (in a user turn or a tool result) become a short
  text placeholder, logged once per kind, since the model reads text only; where such
  blocks are the whole of the last user turn, the question cannot be answered: a 400
  naming the block. Every other block is a 400 naming it.
- ``tool_use_id``: as Anthropic checks it, each ``tool_result`` answers a ``tool_use`` of
  the assistant turn just before, and each ``tool_use`` followed by a user turn is
  answered there (400s naming the ids).
- Tools: custom tools (``input_schema``; ``strict`` and ``defer_loading`` accepted: every
  tool is always enforced and always offered); server tools (``web_search_...``,
  ``bash_...``: a ``type`` and no ``input_schema``) are accepted and not offered to the
  model, which cannot run them (logged once per type); a ``tool_choice`` naming one is
  a 400 naming it.
- ``stop_sequences`` end the text; beside tools they end the text before any call (a
  call is never cut).
- ``thinking``: ``disabled`` turns the template's thinking off; ``enabled`` (its
  ``budget_tokens`` the think budget) and ``adaptive`` leave it on.
- Fields that change nothing here (``metadata``, ``cache_control``, ``context_management``,
  ``service_tier``, ...) are accepted; an unknown field is logged once and ignored (Claude
  Code sends new ones often; at most ``MAX_LOGGED`` names are remembered).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RequestError
from ..messages import Reply
from .openai_api import bad, new_id

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")

_IGNORED = frozenset({"metadata", "cache_control", "context_management", "service_tier",
                      "inference_geo", "container", "mcp_servers", "diagnostics", "speed",
                      "betas", "anthropic_version"})
_TRANSLATED = frozenset({"model", "messages", "system", "max_tokens", "stop_sequences",
                         "temperature", "top_p", "top_k", "stream", "tools", "tool_choice",
                         "thinking", "output_config", "output_format"})
MAX_LOGGED = 256
"""Most distinct names (unknown fields, roles, block and tool kinds) logged once each; past
it nothing more is remembered or logged (the set never grows from client input beyond)."""
_logged: set[str] = set()
_BILLING_NONCE = re.compile(r"\bcch=[0-9a-fA-F]+;")
_SIGNING_KEY = secrets.token_bytes(32)

STOP_REASONS = {"stop": "end_turn", "constraint_complete": "end_turn", "length": "max_tokens",
                "tool_calls": "tool_use"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error", 503: "overloaded_error"}


def error_body(err: RequestError) -> dict[str, Any]:
    """An error in Anthropic's envelope; the context-overflow wording Claude Code compacts on."""
    kind = ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else
                           "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message},
            "request_id": new_id("req")}


def overflow_message(prompt: int, n_ctx: int) -> str:
    """Anthropic's wording for a prompt that leaves no room for a reply (Claude Code
    compacts on it); a ``max_tokens`` the prompt leaves too little room for is shrunk,
    never refused."""
    return f"prompt is too long: {prompt} tokens > {n_ctx - 1} maximum"


# ------------------------------------------------------------------- requests
def to_chat_body(body: Any) -> dict[str, Any]:
    """The Chat Completions body a Messages body means; ``RequestError`` naming the field
    that has no equivalent here (see the module docstring for the rules)."""
    if not isinstance(body, Mapping):
        raise bad("the body must be a JSON object")
    for key in body:
        if key not in _TRANSLATED and key not in _IGNORED:
            log_once(f"field {key!r}", "/v1/messages: field %r is not supported and is ignored",
                     key)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise bad("max_tokens: an integer is required", "max_tokens")
    chat: dict[str, Any] = {"messages": _messages(body), "max_tokens": max_tokens}
    for key in ("model", "temperature", "top_p", "top_k", "stream"):
        if body.get(key) is not None:
            chat[key] = body[key]
    temperature = chat.get("temperature", 1.0)
    if isinstance(temperature, (int, float)) and not 0 <= temperature <= 1:
        raise bad(f"temperature must be in [0, 1], got {temperature}", "temperature")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad("stop_sequences must be an array of strings", "stop_sequences")
        chat["stop"] = stops
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, Mapping) else None
        if kind == "disabled":
            chat["reasoning_effort"] = "none"
        elif kind == "enabled":
            budget = thinking.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
                raise bad("thinking.budget_tokens must be a positive integer",
                          "thinking.budget_tokens")
            chat["think_budget"] = budget
        elif kind != "adaptive":
            raise bad("thinking.type must be enabled, adaptive or disabled", "thinking")
    fmt = _output_format(body)
    if fmt is not None:
        chat["response_format"] = fmt
    server_tools: set[str] = set()
    if body.get("tools") is not None:
        chat["tools"], server_tools = _tools(body["tools"])
        if not chat["tools"]:
            del chat["tools"]
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice, server_tools))
        if "tools" not in chat and chat["tool_choice"] == "auto":  # server tools only
            chat.pop("tool_choice")
            chat.pop("parallel_tool_calls", None)
    return chat


def log_once(key: str, message: str, *args: Any) -> None:
    """Log ``message`` at INFO the first time ``key`` is seen (at most ``MAX_LOGGED``
    keys are remembered; past that nothing more is logged)."""
    if key in _logged or len(_logged) >= MAX_LOGGED:
        return
    _logged.add(key)
    _log.info(message, *args)


def _system_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(
            isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
            for b in value):
        text = "\n\n".join(b["text"] for b in value)
    else:
        raise bad(f"{where} must be a string or an array of text blocks", where)
    return _BILLING_NONCE.sub("cch=00000;", text)


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.get("system") is not None:
        system = _system_text(body["system"], "system")
        if system:
            out.append({"role": "system", "content": system})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty array", "messages")
    pending: list[str] = []  # system text after an assistant turn, for the next user turn
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise bad(f"{where} must be an object", "messages")
        role = m.get("role")
        if role in ("ctx", "msg"):
            log_once(f"role {role}", "/v1/messages: role %r is read as %s", role,
                     "user text" if role == "msg" else "a system message in place")
        if role in ("system", "ctx"):
            _fold_system(out, pending, _system_text(m.get("content"), f"{where}.content"))
        elif role in ("user", "msg"):
            _user(out, m.get("content"), where, pending, last=i == len(raw) - 1)
            pending = []
        elif role == "assistant":
            _assistant(out, m.get("content"), where)
        else:
            raise bad(f"{where}.role must be user, assistant or system", "messages")
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    _check_tool_ids(raw)
    return out


def _fold_system(out: list[dict[str, Any]], pending: list[str], text: str) -> None:
    """A system message inside ``messages`` joins the turn before it (a user turn or tool
    result), the system prompt before any turn, else (after an assistant turn) the next
    user turn: never hoisted to the top from later on."""
    if out and out[-1]["role"] in ("user", "tool"):
        out[-1]["content"] += "\n\n" + text
    elif not out or out[-1]["role"] == "system":
        if out:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": "system", "content": text})
    else:
        pending.append(text)


def _check_tool_ids(raw: list[Any]) -> None:
    """Anthropic's two checks: each ``tool_result`` answers a ``tool_use`` of the assistant
    turn just before it, and each ``tool_use`` that a user turn follows is answered there."""
    previous: list[str] | None = None  # ids the assistant turn just before called
    for i, m in enumerate(raw):
        role, content = m.get("role"), m.get("content")
        blocks = content if isinstance(content, list) else []
        if role == "assistant":
            previous = [b["id"] for b in blocks if b.get("type") == "tool_use"]
            continue
        if role not in ("user", "msg"):
            continue
        answered = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
        stray = [a for a in answered if a not in (previous or [])]
        if stray:
            raise bad(f"messages[{i}]: unexpected `tool_use_id` found in `tool_result` blocks: "
                      f"{', '.join(map(str, stray))}. Each `tool_result` block must have a "
                      "corresponding `tool_use` block in the previous message.", "messages")
        missing = [c for c in previous or [] if c not in answered]
        if missing:
            raise bad(f"messages[{i}]: `tool_use` ids were found without `tool_result` blocks "
                      f"immediately after: {', '.join(missing)}. Each `tool_use` block must "
                      "have a corresponding `tool_result` block in the next message.",
                      "messages")
        previous = None


def _blocks(content: Any, where: str) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, Mapping) for b in content):
        raise bad(f"{where}.content must be a string or an array of content blocks",
                  "messages")
    return content


PLACEHOLDER = "[{kind} omitted: this model reads text only]"
"""The text an ``image`` or ``document`` block becomes."""


def _refuse(block: Mapping[str, Any], where: str) -> RequestError:
    kind = block.get("type")
    return bad(f"{where}: {kind or 'malformed'!r} blocks are not supported (text, tool_use, "
               "tool_result, thinking, redacted_thinking, image and document are)", "messages",
               "unsupported_content")


def _placeholder(block: Mapping[str, Any]) -> str | None:
    """The text an image or document block stands for (None: another kind of block)."""
    kind = block.get("type")
    if kind not in ("image", "document"):
        return None
    log_once(f"block {kind}", "/v1/messages: %s blocks become a text placeholder (this "
             "server runs a text model)", kind)
    return PLACEHOLDER.format(kind=kind.capitalize())


def _user(out: list[dict[str, Any]], content: Any, where: str, pending: list[str], *,
          last: bool) -> None:
    texts: list[str] = []
    blocks = _blocks(content, where)
    if last and blocks and all(b.get("type") in ("image", "document") for b in blocks):
        kind = blocks[0].get("type")
        raise bad(f"{where}: the question is only {kind} blocks, which this server cannot "
                  "read: it runs a text model", "messages", "unsupported_content")
    for j, block in enumerate(blocks):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if texts:  # text before results: a user turn of its own
                out.append({"role": "user", "content": "\n\n".join(texts)})
                texts = []
            out.append(_tool_result(block, at))
        elif (stand_in := _placeholder(block)) is not None:
            texts.append(stand_in)
        else:
            raise _refuse(block, at)
    texts.extend(pending)
    if texts:
        text = "\n\n".join(texts)
        if out and out[-1]["role"] == "user":  # consecutive user turns merge
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": "user", "content": text})


def _tool_result(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise bad(f"{where}: a tool_result needs tool_use_id", "messages")
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for k, part in enumerate(_blocks(content, where)):
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind == "tool_reference" and isinstance(part.get("tool_name"), str):
                parts.append(f"Tool {part['tool_name']} is available.")
            elif (stand_in := _placeholder(part)) is not None:
                parts.append(stand_in)
            else:
                raise _refuse(part, f"{where}.content[{k}]")
        text = "\n\n".join(parts)
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant(out: list[dict[str, Any]], content: Any, where: str) -> None:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(_blocks(content, where)):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            name, call_id, args = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str) \
                    or not isinstance(args, Mapping):
                raise bad(f"{at}: a tool_use needs id, name and input (an object)",
                          "messages")
            calls.append({"id": call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        else:
            raise _refuse(block, at)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    out.append(message)


def _output_format(body: Mapping[str, Any]) -> dict[str, Any] | None:
    config = body.get("output_config")
    fmt = body.get("output_format")
    if config is not None:
        if not isinstance(config, Mapping):
            raise bad("output_config must be an object", "output_config")
        fmt = config.get("format", fmt)
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema" \
            or not isinstance(fmt.get("schema"), Mapping):
        raise bad("output_config.format must be {type: json_schema, schema}",
                  "output_config.format")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def _tools(raw: Any) -> tuple[list[dict[str, Any]], set[str]]:
    """The custom tools as chat tools, and the names of the server tools left out."""
    if not isinstance(raw, list):
        raise bad("tools must be an array", "tools")
    tools, server = [], set()
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise bad(f"tools[{i}] must be an object", "tools")
        kind = item.get("type", "custom")
        if kind not in ("custom", None) or "input_schema" not in item:
            if not isinstance(kind, str) or kind in ("custom", None):
                raise bad(f"tools[{i}]: a custom tool needs input_schema", "tools")
            log_once(f"tool {kind}", "/v1/messages: server tool %r is not offered to the "
                     "model (this server does not run it)", kind)
            server.add(str(item.get("name") or kind))
            continue
        tools.append({"type": "function", "function": {
            "name": item.get("name"), "description": item.get("description", ""),
            "parameters": item["input_schema"]}})
    return tools, server


def _tool_choice(choice: Any, server_tools: set[str]) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    out: dict[str, Any] = {}
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        if choice["name"] in server_tools:
            raise bad(f"tool_choice: {choice['name']!r} is a server tool, which this server "
                      "does not run", "tool_choice", "unsupported_tool")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise bad("tool_choice must be {type: auto | any | none} or {type: tool, name}",
                  "tool_choice")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


# ------------------------------------------------------------------- replies
def signature(thinking: str) -> str:
    """A thinking block's signature: an HMAC of its text with this process's key."""
    return hmac.new(_SIGNING_KEY, thinking.encode(), hashlib.sha256).hexdigest()


def usage_of(chat_usage: Mapping[str, Any]) -> dict[str, Any]:
    """Anthropic's usage from the chat path's: input excludes the cached tokens."""
    cached = chat_usage["prompt_tokens_details"]["cached_tokens"]
    return {"input_tokens": chat_usage["prompt_tokens"] - cached,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
            "output_tokens": chat_usage["completion_tokens"]}


def content_blocks(reply: Reply[Any] | None, text: str,
                   cut: tuple[str, str, list[dict[str, Any]]] | None = None
                   ) -> list[dict[str, Any]]:
    """The reply's content: thinking, then text, then tool uses (``reply`` None: cut at
    max_tokens, ``text`` as written so far, or ``cut``: its reasoning, content and whole
    calls read through its markup)."""
    blocks: list[dict[str, Any]] = []
    if reply is None and cut is not None:
        reasoning, content, calls = cut
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning,
                           "signature": signature(reasoning)})
        if content:
            blocks.append({"type": "text", "text": content})
        blocks.extend({"type": "tool_use", "id": c["id"], "name": c["name"],
                       "input": json.loads(c["arguments"])} for c in calls)
        return blocks
    if reply is not None and reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning,
                       "signature": signature(reply.reasoning)})
    body = reply.text if reply is not None else text
    if body:
        blocks.append({"type": "text", "text": body})
    for call in reply.tool_calls if reply is not None else ():
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": call.arguments})
    return blocks


def stop_reason(reply: Reply[Any] | None, capped: bool = False) -> tuple[str, str | None]:
    """``stop_reason`` and ``stop_sequence`` of a finished lane; ``capped``: its
    ``max_tokens`` was shrunk to the room the prompt left, so a cut there is
    ``model_context_window_exceeded``."""
    if reply is not None and reply.stop_sequence is not None:
        return "stop_sequence", reply.stop_sequence
    reason = "max_tokens" if reply is None else STOP_REASONS.get(reply.finish_reason,
                                                                 "end_turn")
    if reason == "max_tokens" and capped:
        return "model_context_window_exceeded", None
    return reason, None


def message_body(mid: str, model: str, reply: Reply[Any] | None, text: str,
                 usage: dict[str, Any], capped: bool = False,
                 cut: tuple[str, str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    reason, sequence = stop_reason(reply, capped)
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(reply, text, cut), "stop_reason": reason,
            "stop_sequence": sequence, "usage": usage}


@dataclass
class MessageStream:
    """The Messages stream's named events, as the SDK parses them: ``message_start``
    first, content blocks opened, grown and closed in index order, then ``message_delta``
    and ``message_stop``."""

    mid: str
    model: str
    index: int = -1
    open_kind: str | None = None
    thinking: str = ""
    sent_calls: set[str] = field(default_factory=set)

    @staticmethod
    def event(kind: str, **data: Any) -> str:
        payload = {"type": kind, **data}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def start(self, input_tokens: int) -> Iterator[str]:
        yield self.event("message_start", message={
            "id": self.mid, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}})

    def ping(self) -> str:
        return self.event("ping")

    def _open(self, kind: str, block: dict[str, Any]) -> Iterator[str]:
        yield from self._close()
        self.index += 1
        self.open_kind = kind
        yield self.event("content_block_start", index=self.index, content_block=block)

    def _close(self) -> Iterator[str]:
        if self.open_kind is None:
            return
        if self.open_kind == "thinking":
            yield self.event("content_block_delta", index=self.index, delta={
                "type": "signature_delta", "signature": signature(self.thinking)})
        yield self.event("content_block_stop", index=self.index)
        self.open_kind = None

    def text(self, delta: str) -> Iterator[str]:
        if not delta:
            return
        if self.open_kind != "text":
            yield from self._open("text", {"type": "text", "text": ""})
        yield self.event("content_block_delta", index=self.index,
                         delta={"type": "text_delta", "text": delta})

    def parts(self, parts: list[dict[str, Any]]) -> Iterator[str]:
        """Chat deltas read from a held reply's markup (``stream_deltas.ReplyDeltas``) as
        blocks: thinking, text, tool uses whose input grows in ``input_json_delta``s."""
        for part in parts:
            if "reasoning_content" in part:
                if self.open_kind != "thinking":
                    self.thinking = ""
                    yield from self._open("thinking", {"type": "thinking", "thinking": "",
                                                       "signature": ""})
                self.thinking += part["reasoning_content"]
                yield self.event("content_block_delta", index=self.index, delta={
                    "type": "thinking_delta", "thinking": part["reasoning_content"]})
            if "content" in part:
                yield from self.text(part["content"])
            for tc in part.get("tool_calls", []):
                if "id" in tc:
                    self.sent_calls.add(tc["id"])
                    yield from self._open("tool_use", {
                        "type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                        "input": {}})
                fragment = tc["function"].get("arguments") or ""
                if fragment and self.open_kind == "tool_use":
                    yield self.event("content_block_delta", index=self.index, delta={
                        "type": "input_json_delta", "partial_json": fragment})

    def finish(self, reply: Reply[Any] | None, usage: dict[str, Any], capped: bool = False
               ) -> Iterator[str]:
        yield from self._close()
        reason, sequence = stop_reason(reply, capped)
        yield self.event("message_delta", delta={"stop_reason": reason,
                                                 "stop_sequence": sequence}, usage=usage)
        yield self.event("message_stop")

    def failed(self, err: RequestError) -> str:
        return self.event("error", error=error_body(err)["error"])
