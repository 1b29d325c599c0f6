"""OpenAI's chat and completions API, translated: request bodies to chatkit turns, replies
to response bodies and stream chunks, chatkit errors to OpenAI's error shape.

Pure data and logic (no web framework): :mod:`chatkit.serve.server` puts it on HTTP. Every
refusal is a :class:`RequestError` carrying the HTTP status and the OpenAI error fields
(``message``, ``type``, ``param``, ``code``), decided before any token.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..decode.sampling import SamplingParams
from ..errors import ChatkitError, InvalidParameter, RequestError, ToolDefinitionError
from ..messages import FinishReason, Message, Reply, messages_from_openai
from ..tools.definition import Tool
from ..tools.options import TOOL_CHOICES

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for (``chatkit serve`` flags set some)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 1024
    max_tools: int = 128
    max_tokens: int | None = None
    """Cap on ``max_tokens`` / ``max_completion_tokens``, also the default (None: the
    context). A request asking for more, or for more than its prompt leaves room for, is
    served with the smaller number (as llama-server and Anthropic's API do), never
    refused; a reply that reaches it ends with ``finish_reason: length``."""
    max_n: int = 8
    request_timeout: float = 600.0
    """Seconds from admission to the last token; then 504 (or an error event)."""
    context_source: str = ""
    """Where each sequence's context size came from, for context errors (``chatkit serve``
    says which flags)."""
    speculative: bool = False
    """Every request's reply is decoded with grammar-drafted speculation (``chatkit serve
    --speculative``): verify steps ride in the engine loop's batched steps."""


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> RequestError:
    return RequestError(400, message, param=param, code=code)


MAX_BODY_DEPTH = 128
"""Deepest nesting of arrays and objects a request body may have (a JSON Schema nesting 32
subschemas, chatkit's own limit, is about 70 levels of JSON inside a body)."""


def check_body(body: Any) -> None:
    """Refuse by name (400) a body nested deeper than ``MAX_BODY_DEPTH`` or holding a string
    that is not valid Unicode (a lone surrogate such as ``\\ud800``, which JSON can spell
    but no model can be given). One walk, iterative."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise bad(f"invalid Unicode at {path or '/'}: a lone surrogate",
                          path.lstrip("/").replace("/", ".") or None,
                          "invalid_unicode") from None
        elif isinstance(value, dict | list):
            if depth >= MAX_BODY_DEPTH:
                raise bad(f"the body nests deeper than {MAX_BODY_DEPTH} levels",
                          code="body_too_deep")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                where = f"{path}/{key}"
                if isinstance(key, str):
                    stack.append((key, where, depth + 1))
                stack.append((item, where, depth + 1))


def translate_error(exc: BaseException, *, schema_param: str = "response_format"
                    ) -> RequestError:
    """A chatkit error as the HTTP error a client should see (never a 200): the status and
    OpenAI's fields are the error class's data (see :mod:`chatkit.errors`); ``schema_param``
    names the endpoint's schema field. A timeout is 504, any other exception 500."""
    if isinstance(exc, RequestError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, ChatkitError):
        status = exc.http_status
        message = f"{name}: {exc}" if status >= 500 else f"{exc.message_prefix}{exc}"
        return RequestError(status, message, type=exc.error_type, code=exc.api_code(),
                            param=exc.api_param(schema_param), headers=exc.http_headers)
    if isinstance(exc, TimeoutError):
        return RequestError(504, "the request timed out", type="server_error", code="timeout")
    return RequestError(500, f"internal error ({name})", type="server_error",
                        code="internal_error")


# ------------------------------------------------------------------ requests
@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    """None: the server's default (its cap, within the context)."""
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    """vLLM's multiplicative penalty (chatkit's ``repeat_penalty``)."""
    logprobs: int | None = None
    """Return each token's log-probability with this many alternatives (None: off)."""
    top_k: int = 0
    """Sample among the k likeliest tokens (0 or -1: all; vLLM's and Anthropic's field)."""

    def seed_for(self, lane: int) -> int | None:
        """Lanes of ``n`` > 1 get one seed each (seed + lane)."""
        return None if self.seed is None else self.seed + lane

    def params(self, lane: int) -> SamplingParams:
        """The library's sampling parameters for lane ``lane``. Penalties look at the last
        64 tokens (``SamplingParams.penalty_window``), prompt included, as llama.cpp's
        server does; OpenAI counts the completion's tokens only."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p,
                              seed=self.seed_for(lane), presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty,
                              repeat_penalty=self.repetition_penalty, top_k=self.top_k)


@dataclass
class ChatRequest:
    model: str | None
    history: list[Message]
    """Every message but a final user message (the system prompt first, if any)."""
    text: str | None
    """The final user message (None: continue after a tool result or assistant turn)."""
    schema: Any = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    no_think: bool = False
    sampling: Sampling = field(default_factory=Sampling)
    tool_call_threshold: float | None = None
    """chatkit's extension: how sure the model must be of a call for ``auto`` to call
    (``tool_choice`` auto only; 1.0: answer in text)."""
    think_budget: int | None = None
    """Tokens a think block may take (None: the library's default)."""


@dataclass
class CompletionRequest:
    model: str | None
    prompt: str | list[int]
    schema: Any = None
    grammar: tuple[Literal["regex", "lark"], str] | None = None
    sampling: Sampling = field(default_factory=Sampling)
    return_token_ids: bool = False


def _get(body: Mapping[str, Any], key: str, kinds: type | tuple[type, ...],
         default: Any = None) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise bad(f"{key} must be {_kind_name(kinds)}, not a boolean", key, "invalid_type")
    if not isinstance(value, kinds):
        raise bad(f"{key} must be {_kind_name(kinds)}, not {type(value).__name__}", key,
                  "invalid_type")
    return value


def _kind_name(kinds: type | tuple[type, ...]) -> str:
    names = [k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,))]
    return " or ".join({"str": "a string", "int": "an integer", "float": "a number",
                        "bool": "a boolean", "list": "an array", "dict": "an object"}.get(n, n)
                       for n in names)


_UNSUPPORTED = {
    "logit_bias": "logit_bias is not supported (the grammar decides what may be written)",
    "audio": "audio is not supported",
    "modalities": "text is the only modality",
    "prediction": "predicted outputs are not supported",
    "functions": "the deprecated functions field is not supported; use tools",
    "function_call": "the deprecated function_call field is not supported; use tool_choice",
    "echo": "echo is not supported",
    "best_of": "best_of is not supported",
    "suffix": "suffix is not supported",
}


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    for key, why in _UNSUPPORTED.items():
        value = body.get(key)
        if value in (None, False, 0, [], {}) or (key == "modalities" and value == ["text"]):
            continue
        if key == "best_of" and value == 1:
            continue
        raise bad(why, key, "unsupported_parameter")


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    """Chat: ``logprobs: true`` with ``top_logprobs`` 0-20; completions: ``logprobs`` as the
    number of alternatives, 0-5 (the legacy API's shape). Each endpoint's own shape only."""
    value = body.get("logprobs")
    top = body.get("top_logprobs")
    if not chat:
        if top is not None:
            raise bad("top_logprobs is chat's; completions take logprobs: N (0-5)",
                      "top_logprobs")
        if isinstance(value, bool):
            raise bad("completions take logprobs: N (0-5), not a boolean", "logprobs")
    elif value is not None and not isinstance(value, bool):
        raise bad("chat takes logprobs: true with top_logprobs: N (0-20)", "logprobs")
    if value is None or value is False:
        if top not in (None, 0):
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    if value is True:
        top = 0 if top is None else top
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise bad(f"top_logprobs must be an integer in [0, 20], got {top!r}",
                      "top_logprobs")
        return int(top)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 5:
        raise bad(f"logprobs must be true/false (chat) or an integer in [0, 5] "
                  f"(completions), got {value!r}", "logprobs")
    return int(value)


def _sampling(body: Mapping[str, Any], limits: ServerLimits, *, chat: bool = True
              ) -> Sampling:
    s = Sampling()
    temperature = _get(body, "temperature", (int, float), 1.0)
    if not 0 <= temperature <= 2:
        raise bad(f"temperature must be in [0, 2], got {temperature}", "temperature")
    top_p = _get(body, "top_p", (int, float), 1.0)
    if not 0 < top_p <= 1:
        raise bad(f"top_p must be in (0, 1], got {top_p}", "top_p")
    s.temperature, s.top_p = float(temperature), float(top_p)
    top_k = _get(body, "top_k", int, 0)
    if top_k < -1:
        raise bad(f"top_k must be >= -1 (-1 or 0: off), got {top_k}", "top_k")
    s.top_k = max(top_k, 0)
    s.seed = _get(body, "seed", int)
    for key in ("presence_penalty", "frequency_penalty"):
        value = _get(body, key, (int, float), 0)
        if not -2 <= value <= 2:
            raise bad(f"{key} must be in [-2, 2], got {value}", key)
        setattr(s, key, float(value))
    s.logprobs = _logprobs(body, chat)
    repetition = _get(body, "repetition_penalty", (int, float), 1.0)
    if not 0 < repetition <= 10:
        raise bad(f"repetition_penalty must be in (0, 10], got {repetition}",
                  "repetition_penalty")
    s.repetition_penalty = float(repetition)
    stop = body.get("stop")
    if isinstance(stop, str):
        s.stop = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop) and len(stop) <= 4:
        s.stop = tuple(x for x in stop if x)
    elif stop is not None:
        raise bad("stop must be a string or up to 4 strings", "stop")
    for key in ("max_completion_tokens", "max_tokens"):
        value = _get(body, key, int)
        if value is None:
            continue
        if value < 1:
            raise bad(f"{key} must be >= 1, got {value}", key)
        s.max_tokens = value if limits.max_tokens is None else min(value, limits.max_tokens)
        break
    s.n = _get(body, "n", int, 1)
    if not 1 <= s.n <= limits.max_n:
        raise bad(f"n must be in [1, {limits.max_n}], got {s.n}", "n")
    s.stream = _get(body, "stream", bool, False)
    opts = _get(body, "stream_options", dict, {})
    s.include_usage = bool(opts.get("include_usage", False))
    return s


def _response_format(value: Any, param: str = "response_format") -> Any:
    """The schema a ``response_format`` asks for (None: free text), as sent. Generation
    closes objects that make no ``additionalProperties`` decision (``schema.close_objects``:
    one rule with the library and ``chatkit run``); the answer validates against the schema
    as sent; ``additionalProperties: true`` keeps extra keys."""
    return _response_schema(value, param)


def _response_schema(value: Any, param: str) -> Any:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad(f"{param} must be an object", param)
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = value.get("schema")
        return {"type": "object"} if schema is None else schema
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping) or "schema" not in spec:
            raise bad(f"{param}.json_schema needs a schema", f"{param}.json_schema")
        return spec["schema"]
    raise bad(f"{param}.type must be text, json_object or json_schema, not {kind!r}",
              f"{param}.type")


def _tools(body: Mapping[str, Any], limits: ServerLimits) -> list[Tool]:
    raw = _get(body, "tools", list, [])
    if len(raw) > limits.max_tools:
        raise bad(f"{len(raw)} tools exceed this server's limit {limits.max_tools}", "tools")
    tools = []
    for i, item in enumerate(raw):
        fn = item.get("function") if isinstance(item, Mapping) else None
        if not isinstance(item, Mapping) or item.get("type", "function") != "function" \
                or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise bad(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}",
                      f"tools[{i}]")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        try:
            tools.append(Tool.from_schema(fn["name"], params, str(fn.get("description") or "")))
        except ToolDefinitionError as exc:
            raise RequestError(400, str(exc), param=f"tools[{i}].function.parameters",
                               code="tool_definition_invalid") from exc
    if len({t.name for t in tools}) < len(tools):
        raise bad("two tools share a name", "tools")
    return tools


def _tool_choice(value: Any) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in TOOL_CHOICES:
            raise bad(f"tool_choice must be auto, none, required or a named function, not "
                      f"{value!r}", "tool_choice")
        return value  # checked against the tools when the turn is planned
    fn = value.get("function") if isinstance(value, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise bad("tool_choice must name a function: {type: function, function: {name}}",
                  "tool_choice")
    return name


def _no_think(body: Mapping[str, Any]) -> bool:
    kwargs = _get(body, "chat_template_kwargs", dict, {})
    if kwargs.get("enable_thinking") is False:
        return True
    effort = body.get("reasoning_effort")
    return effort == "none"


def parse_chat(body: Any, limits: ServerLimits) -> ChatRequest:
    """A ``/v1/chat/completions`` body, checked; ``RequestError`` naming the field."""
    if not isinstance(body, Mapping):
        raise bad("the body must be a JSON object")
    _refuse_unsupported(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad("messages must be a non-empty array", "messages")
    if len(raw) > limits.max_messages:
        raise bad(f"{len(raw)} messages exceed this server's limit {limits.max_messages}",
                  "messages")
    try:
        messages = messages_from_openai(raw)
    except InvalidParameter as exc:
        raise bad(str(exc), "messages") from exc
    if messages[0].role == "system":
        head, rest = [messages[0]], messages[1:]
    else:
        head, rest = [], messages
    for i, m in enumerate(rest):
        if m.role == "system":
            raise bad(f"messages[{i + len(head)}]: a system message may only come first",
                      "messages")
    text = None
    if rest and rest[-1].role == "user":
        text = rest[-1].content
        rest = rest[:-1]
    elif not rest:
        raise bad("messages need a user message", "messages")
    tools = _tools(body, limits)
    choice = _tool_choice(body.get("tool_choice"))
    schema = _response_format(body.get("response_format"))
    parallel = _get(body, "parallel_tool_calls", bool, True)
    threshold = _get(body, "tool_call_threshold", (int, float))
    if threshold is not None and not tools and 0 <= threshold <= 1:
        # an agent client sends its model's extra fields on every request, those without
        # tools too (titles, summaries): there the threshold has nothing to decide
        _log.info("tool_call_threshold without tools: nothing to decide, ignored")
        threshold = None
    budget = _get(body, "think_budget", int)
    if budget is not None and budget < 1:
        raise bad(f"think_budget must be >= 1, got {budget}", "think_budget")
    request = ChatRequest(model=_get(body, "model", str), history=head + rest, text=text,
                          schema=schema, tools=tools, tool_choice=choice,
                          parallel_tool_calls=parallel, no_think=_no_think(body),
                          sampling=_sampling(body, limits),
                          tool_call_threshold=None if threshold is None else float(threshold),
                          think_budget=budget)
    return request


def parse_completion(body: Any, limits: ServerLimits) -> CompletionRequest:
    """A ``/v1/completions`` body: ``prompt`` as text or token ids; the constraint as
    ``response_format`` or vLLM's ``structured_outputs`` (``json`` / ``regex`` /
    ``grammar`` (Lark, llguidance dialect) / ``choice``)."""
    if not isinstance(body, Mapping):
        raise bad("the body must be a JSON object")
    _refuse_unsupported(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool)
                                 for t in prompt):
            raise bad("prompt must be a string, or one array of token ids", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad("prompt must be a non-empty string, or one array of token ids", "prompt")
    request = CompletionRequest(model=_get(body, "model", str), prompt=prompt,
                                sampling=_sampling(body, limits, chat=False),
                                return_token_ids=_get(body, "return_token_ids", bool, False))
    request.schema = _response_format(body.get("response_format"))
    so = _get(body, "structured_outputs", dict, {})
    given = [k for k in ("json", "regex", "grammar", "choice") if so.get(k) is not None]
    if len(given) > 1 or (given and request.schema is not None):
        raise bad("give one constraint: response_format, or one of structured_outputs' "
                  "json / regex / grammar / choice", "structured_outputs")
    if given:
        key = given[0]
        value = so[key]
        if key == "json":
            try:
                request.schema = json.loads(value) if isinstance(value, str) else value
            except ValueError as exc:
                raise bad(f"structured_outputs.json is not JSON: {exc}",
                          "structured_outputs.json", "schema_invalid") from exc
        elif key == "choice":
            if not isinstance(value, list) or not value or not all(
                    isinstance(c, str) for c in value):
                raise bad("structured_outputs.choice must be a list of strings",
                          "structured_outputs.choice")
            request.grammar = ("lark", "start: " + " | ".join(json.dumps(c) for c in value))
        elif not isinstance(value, str):
            raise bad(f"structured_outputs.{key} must be a string", f"structured_outputs.{key}")
        else:
            request.grammar = ("regex" if key == "regex" else "lark", value)
    return request


# ----------------------------------------------------------------- responses
OpenAIFinish = Literal["stop", "length", "tool_calls"]


def finish_reason(reason: FinishReason) -> OpenAIFinish:
    """chatkit's finish reasons in OpenAI's vocabulary (clients reject others)."""
    if reason == "tool_calls":
        return "tool_calls"
    if reason == "length":
        return "length"
    return "stop"


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


def assistant_message(reply: Reply[Any] | None, text: str,
                      cut: tuple[str, str, list[dict[str, Any]]] | None = None
                      ) -> dict[str, Any]:
    """The ``message`` of a chat choice (``reply`` None: cut at max_tokens, ``text`` as is,
    or ``cut``: its reasoning, content and whole calls read through its markup)."""
    out: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if reply is None and cut is not None:
        reasoning, content, calls = cut
        out["content"] = content or (None if calls else "")
        if calls:
            out["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["name"], "arguments": c["arguments"]}} for c in calls]
        if reasoning:
            out["reasoning_content"] = reasoning
        return out
    if reply is None:
        return out
    if reply.tool_calls:
        out["content"] = reply.text or None
        out["tool_calls"] = [c.to_openai() for c in reply.tool_calls]
    if reply.reasoning is not None:
        out["reasoning_content"] = reply.reasoning
    return out


def _token_text(vocab: Any, token: int) -> tuple[str, list[int]]:
    raw = vocab.token_bytes(token)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(vocab: Any, entries: Sequence[Any]) -> list[dict[str, Any]]:
    """Chat's ``logprobs.content``: per token its text, log-probability, bytes and the
    most probable alternatives (``TokenLogprob`` entries)."""
    out = []
    for e in entries:
        text, raw = _token_text(vocab, e.token)
        top = []
        for token, lp in e.top:
            t, b = _token_text(vocab, token)
            top.append({"token": t, "logprob": lp, "bytes": b})
        out.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
    return out


def completion_logprobs(vocab: Any, entries: Sequence[Any]) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object (``text_offset`` from this chunk's
    first token)."""
    tokens, offsets, offset = [], [], 0
    for e in entries:
        text = _token_text(vocab, e.token)[0]
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_token_text(vocab, t)[0]: lp for t, lp in e.top}
                             for e in entries],
            "text_offset": offsets}


def usage_body(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached}}
