"""OpenAI's Responses API (``POST /v1/responses``) as a translation over the chat path.

A Responses body is translated into the Chat Completions body it means (``to_chat_body``),
checked by the same code (``openai_api.parse_chat``) and run by the same turns; the reply
comes back as a ``response`` object (``response_body``) or as the Responses stream's events
(``ResponseStream``). Stateless: ``previous_response_id`` and ``conversation`` are refused by
name (send the whole conversation as ``input``); ``store`` is accepted and nothing is
stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RequestError
from ..messages import Reply
from .anthropic_api import log_once
from .openai_api import bad, new_id

__all__: list[str] = []

# Fields the chat path has no use for and that change nothing here; anything else that is
# not translated is refused by name.
_ACCEPTED = frozenset({"model", "input", "instructions", "text", "tools", "tool_choice",
                       "max_output_tokens", "temperature", "top_p", "parallel_tool_calls",
                       "stream", "store", "metadata", "user", "reasoning", "truncation",
                       "service_tier", "prompt_cache_key", "safety_identifier", "seed",
                       "stream_options", "include", "top_logprobs", "max_tool_calls",
                       "background", "tool_call_threshold", "client_metadata"})
_INCLUDES = frozenset({"reasoning.encrypted_content"})
"""``include`` values accepted: reasoning items are returned as text (nothing is encrypted,
so there is nothing more to include; Codex CLI asks for it on every request)."""
_REFUSED = {
    "previous_response_id": "this server keeps no responses: send the whole conversation "
                            "as input",
    "conversation": "this server keeps no conversations: send the whole conversation as "
                    "input",
    "prompt": "prompt templates are not supported",
}


def to_chat_body(body: Any) -> dict[str, Any]:
    """The Chat Completions body a Responses body means; ``RequestError`` naming the field
    that has no equivalent here."""
    if not isinstance(body, Mapping):
        raise bad("the body must be a JSON object")
    for key, why in _REFUSED.items():
        if body.get(key) is not None:
            raise bad(why, key, "unsupported_parameter")
    for key in body:
        if key not in _ACCEPTED:
            raise bad(f"{key} is not supported by this server's /v1/responses", key,
                      "unsupported_parameter")
    if body.get("background"):
        raise bad("background responses are not supported", "background",
                  "unsupported_parameter")
    include = body.get("include") or []
    if not isinstance(include, list) or not set(include) <= _INCLUDES:
        raise bad("include may only hold reasoning.encrypted_content (reasoning is returned "
                  "as text; no logprobs)", "include", "unsupported_parameter")
    if body.get("top_logprobs"):
        raise bad("logprobs are not returned", "top_logprobs", "unsupported_parameter")
    if body.get("max_tool_calls") is not None:
        raise bad("max_tool_calls is not supported (parallel_tool_calls: false allows one)",
                  "max_tool_calls", "unsupported_parameter")
    chat: dict[str, Any] = {"messages": _messages(body)}
    for src, dst in (("model", "model"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("parallel_tool_calls", "parallel_tool_calls"), ("stream", "stream"),
                     ("max_output_tokens", "max_tokens"), ("seed", "seed"),
                     ("tool_call_threshold", "tool_call_threshold")):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if "temperature" not in chat:
        chat["temperature"] = 1.0
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") in ("none", "minimal"):
        chat["reasoning_effort"] = "none"
    elif reasoning is not None and not isinstance(reasoning, Mapping):
        raise bad("reasoning must be an object", "reasoning")
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
        if not chat["tools"]:
            del chat["tools"]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise bad("tool_choice must be auto, none, required or {type: function, name}",
                      "tool_choice")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None and not (choice == "auto" and "tools" not in chat):
        chat["tool_choice"] = choice
    if "tools" not in chat:
        chat.pop("parallel_tool_calls", None)
    return chat


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or parts of input_text / output_text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}.content must be a string or an array of text parts", "input")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise bad(f"{where}.content[{i}]: a {kind or 'malformed'} part is not supported "
                      "(text only)", "input", "unsupported_content")
    return "".join(texts)


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise bad("input must be a string or a non-empty array of items", "input")
    reasoning: str | None = None
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad(f"{where}.role must be user, system, developer or assistant",
                          "input")
            message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                                       "content": _text(item.get("content"), where)}
            if role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            if message["role"] == "system" and messages and messages[-1]["role"] == "system":
                messages[-1]["content"] += "\n\n" + message["content"]
                continue
            messages.append(message)
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning is not None:
                    message["reasoning_content"], reasoning = reasoning, None
                messages.append(message)
        elif kind == "function_call_output":
            messages.append(_call_output(item, where))
        elif kind == "reasoning":
            reasoning = _reasoning(item, where)
        else:
            raise bad(f"{where}: {kind!r} items are not supported (messages, function_call, "
                      "function_call_output and reasoning are)", "input", "unsupported_item")
    return messages


def _call_output(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call_output`` input item as a tool message (400 without a call id);
    an output no call asked for (Codex CLI's goal notes: a name, no call id) is user text."""
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(output, str):
        output = _text(output, where) if isinstance(output, list) else json.dumps(output)
    if call_id is None and isinstance(item.get("name"), str):
        log_once("uncalled output", "/v1/responses: a function_call_output without "
                 "call_id is read as user text")
        return {"role": "user", "content": f"{item['name']}: {output}"}
    if not isinstance(call_id, str):
        raise bad(f"{where}: a function_call_output needs a call_id", "input")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call`` input item as a chat tool call (400 when malformed)."""
    name, call_id = item.get("name"), item.get("call_id")
    arguments = item.get("arguments", "{}")
    if not all(isinstance(v, str) for v in (name, call_id, arguments)):
        raise bad(f"{where}: a function_call needs name, call_id and arguments "
                  "(strings)", "input")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _reasoning(item: Mapping[str, Any], where: str) -> str:
    """A ``reasoning`` input item's text: its summary (or content) parts, joined."""
    parts = item.get("summary") or item.get("content") or []
    if not isinstance(parts, list) or not all(
            isinstance(p, Mapping) and isinstance(p.get("text", ""), str)
            for p in parts):
        raise bad(f"{where}: a reasoning item's summary is an array of "
                  "{type, text} parts", "input")
    return "".join(p.get("text", "") for p in parts)


def _text_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, Mapping):
        raise bad("text must be an object", "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise bad("text.format must be an object", "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if "schema" not in fmt:
            raise bad("text.format json_schema needs a schema", "text.format")
        return {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt["schema"],
            "strict": fmt.get("strict", False)}}
    raise bad(f"text.format type must be text, json_object or json_schema, not {kind!r}",
              "text.format")


_HOSTED = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter",
                     "image_generation", "computer_use_preview", "mcp", "local_shell",
                     "namespace", "custom", "tool_search"})
"""Tool kinds run by OpenAI's servers or needing a format of their own: accepted and not
offered to the model (logged once per kind), as a text model without them would."""


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad("tools must be an array", "tools")
    tools = []
    for i, item in enumerate(raw):
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind in _HOSTED:
            log_once(f"tool {kind}", "/v1/responses: %r tools are not offered to the model "
                     "(this server does not run them)", kind)
            continue
        if kind != "function":
            raise bad(f"tools[{i}]: {kind or 'malformed'!r} tools are not supported (function "
                      "tools are)", "tools", "unsupported_tool")
        tools.append({"type": "function", "function": {
            k: item[k] for k in ("name", "description", "parameters", "strict") if k in item}})
    return tools


# ---------------------------------------------------------------------- output
@dataclass
class Output:
    """A finished lane as Responses output items, with the ids the stream used."""

    items: list[dict[str, Any]]
    incomplete: bool


def output_items(reply: Reply[Any] | None, text: str) -> Output:
    """The ``output`` array for a finished reply (``reply`` None: cut at max tokens, with
    ``text`` as written so far)."""
    items: list[dict[str, Any]] = []
    if reply is not None and reply.reasoning:
        items.append(reasoning_item(new_id("rs"), reply.reasoning))
    if reply is not None:
        for call in reply.tool_calls:
            items.append(call_item(new_id("fc"), call.id, call.name,
                                   json.dumps(call.arguments, ensure_ascii=False)))
    body = reply.text if reply is not None else text
    if body or not items:
        items.append(message_item(new_id("msg"), body))
    return Output(items, reply is None)


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id,
            "summary": [{"type": "summary_text", "text": text}]}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "role": "assistant", "status": status,
            "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_body(rid: str, created: int, model: str, request: Mapping[str, Any],
                  output: Output | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    """The ``response`` object (``output`` None: in progress, for the stream's first events)."""
    status = "in_progress" if output is None else (
        "incomplete" if output.incomplete else "completed")
    return {
        "id": rid, "object": "response", "created_at": created, "model": model,
        "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": request.get("instructions"), "metadata": request.get("metadata") or {},
        "output": output.items if output is not None else [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature", 1.0), "top_p": request.get("top_p", 1.0),
        "tool_choice": request.get("tool_choice", "auto"), "tools": request.get("tools") or [],
        "max_output_tokens": request.get("max_output_tokens"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "store": False, "usage": usage,
    }


def usage_object(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


@dataclass
class ResponseStream:
    """The Responses stream's events, numbered, as the reply is written: text deltas,
    reasoning summary deltas, function calls and their argument fragments."""

    rid: str
    created: int
    model: str
    request: Mapping[str, Any]
    sequence: int = 0
    message_id: str | None = None
    text: str = ""
    items: list[dict[str, Any]] = field(default_factory=list)
    open_reasoning: dict[str, Any] | None = None
    open_call: dict[str, Any] | None = None

    def event(self, kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def start(self) -> Iterator[str]:
        body = response_body(self.rid, self.created, self.model, self.request, None, None)
        yield self.event("response.created", response=body)
        yield self.event("response.in_progress", response=body)

    def _open_message(self) -> Iterator[str]:
        if self.message_id is None:
            self.message_id = new_id("msg")
            index = len(self.items)
            yield self.event("response.output_item.added", output_index=index,
                             item=message_item(self.message_id, "", "in_progress"))
            yield self.event("response.content_part.added", output_index=index,
                             item_id=self.message_id, content_index=0, part=text_part(""))

    def delta(self, text: str) -> Iterator[str]:
        yield from self._open_message()
        self.text += text
        yield self.event("response.output_text.delta", output_index=len(self.items),
                         item_id=self.message_id, content_index=0, delta=text, logprobs=[])

    def _close_message(self) -> Iterator[str]:
        if self.message_id is None:
            return
        index = len(self.items)
        yield self.event("response.output_text.done", output_index=index,
                         item_id=self.message_id, content_index=0, text=self.text,
                         logprobs=[])
        yield self.event("response.content_part.done", output_index=index,
                         item_id=self.message_id, content_index=0, part=text_part(self.text))
        item = message_item(self.message_id, self.text)
        yield self.event("response.output_item.done", output_index=index, item=item)
        self.items.append(item)
        self.message_id = None

    def parts(self, parts: list[dict[str, Any]]) -> Iterator[str]:
        """Deltas read from a held reply's markup (``stream_deltas.ReplyDeltas``) as the
        Responses events: reasoning summary text, function calls opened when their name is
        written and their arguments in fragments, then the message's text."""
        for part in parts:
            if "reasoning_content" in part:
                yield from self._reasoning_delta(part["reasoning_content"])
                continue
            yield from self._close_reasoning()
            if "content" in part:
                yield from self._close_call()
                yield from self.delta(part["content"])
                continue
            for tc in part.get("tool_calls", []):
                if "id" in tc:
                    yield from self._close_call()
                    index = len(self.items)
                    item = call_item(new_id("fc"), tc["id"], tc["function"]["name"], "",
                                     "in_progress")
                    self.open_call = {"item": item, "index": index}
                    yield self.event("response.output_item.added", output_index=index,
                                     item=item)
                fragment = tc["function"]["arguments"]
                if fragment and self.open_call is not None:
                    self.open_call["item"]["arguments"] += fragment
                    yield self.event("response.function_call_arguments.delta",
                                     output_index=self.open_call["index"],
                                     item_id=self.open_call["item"]["id"], delta=fragment)

    def _reasoning_delta(self, text: str) -> Iterator[str]:
        if self.open_reasoning is None:
            item = {**reasoning_item(new_id("rs"), ""), "summary": []}
            self.open_reasoning = {"item": item, "index": len(self.items), "text": ""}
            yield self.event("response.output_item.added", output_index=len(self.items),
                             item=item)
        self.open_reasoning["text"] += text
        yield self.event("response.reasoning_summary_text.delta",
                         output_index=self.open_reasoning["index"],
                         item_id=self.open_reasoning["item"]["id"], summary_index=0,
                         delta=text)

    def _close_reasoning(self) -> Iterator[str]:
        if self.open_reasoning is None:
            return
        opened, self.open_reasoning = self.open_reasoning, None
        item = reasoning_item(opened["item"]["id"], opened["text"])
        yield self.event("response.reasoning_summary_text.done",
                         output_index=opened["index"], item_id=item["id"], summary_index=0,
                         text=opened["text"])
        yield self.event("response.output_item.done", output_index=opened["index"], item=item)
        self.items.append(item)

    def _close_call(self, status: str = "completed") -> Iterator[str]:
        if self.open_call is None:
            return
        opened, self.open_call = self.open_call, None
        item = {**opened["item"], "status": status}
        yield self.event("response.function_call_arguments.done", output_index=opened["index"],
                         item_id=item["id"], arguments=item["arguments"], name=item["name"])
        yield self.event("response.output_item.done", output_index=opened["index"], item=item)
        self.items.append(item)

    def finish(self, reply: Reply[Any] | None, usage: dict[str, Any]) -> Iterator[str]:
        """The end: open items closed, then ``response.completed`` (``incomplete`` when
        the reply was cut at max_output_tokens)."""
        yield from self._close_reasoning()
        yield from self._close_call("completed" if reply is not None else "incomplete")
        if self.message_id is None and not self.items:
            yield from self._open_message()  # an empty answer is still a message
        yield from self._close_message()
        output = Output(self.items, reply is None)
        body = response_body(self.rid, self.created, self.model, self.request, output, usage)
        kind = "response.incomplete" if reply is None else "response.completed"
        yield self.event(kind, response=body)

    def failed(self, error: RequestError) -> str:
        body = response_body(self.rid, self.created, self.model, self.request,
                             Output(self.items, False), None)
        body["status"], body["error"] = "failed", {"code": error.code or "server_error",
                                                   "message": error.message}
        return self.event("response.failed", response=body)
