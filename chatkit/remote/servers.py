"""One dialect per kind of server: the request body it takes, how its result reads, and
what it can be asked to enforce (``Capabilities``). ``chatkit.remote.engine.RemoteEngine`` sends
and retries; the dialect knows the server's shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..engine.protocols import GenerateRequest, GenerateResult
from ..errors import RemoteError
from ..grammar.schema import closed_objects, subschemas
from ..messages import messages_to_openai

__all__: list[str] = []

Finish = Literal["stop_token", "length"]


@dataclass(frozen=True)
class Capabilities:
    """What a kind of server can be asked to enforce."""

    token_prompts: bool
    """Takes token-id prompts (chatkit renders the template); else chat messages."""
    grammar: bool
    """Takes llguidance Lark: tools, thinking + schema, regex, Lark and JSON schemas."""
    json_schema: bool
    """Takes a JSON schema."""
    schema_ignores: frozenset[str] = frozenset()
    """JSON Schema keywords the server accepts but does not enforce (or rejects): a schema
    using one is refused before the request, where the server has no grammar."""
    every_property_required: bool = False
    """The server's schema mode needs every property required (OpenAI's strict mode)."""
    string_formats: frozenset[str] | None = None
    """The ``format`` values it enforces (None: every one chatkit accepts)."""
    integer_bounds_only: bool = False
    """``minimum``/``maximum`` are enforced on integers only (llama.cpp's own converter)."""
    lengths_with_pattern: bool = True
    """``minLength``/``maxLength`` are enforced beside a ``pattern`` (GBNF converters drop
    them there)."""


# llama-cpp-python 0.3.36's JSON-schema-to-GBNF converter (llama_cpp/llama_grammar.py,
# SchemaConverter.visit) reads type, properties, required, additionalProperties, items,
# prefixItems, minItems, maxItems, enum, const, anyOf / oneOf (as anyOf), $ref, pattern,
# minLength / maxLength (only without a pattern) and the formats below; everything else
# is accepted and silently dropped.
_GBNF_IGNORES = frozenset({
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minProperties", "maxProperties", "patternProperties", "propertyNames",
    "dependentRequired", "dependentSchemas", "dependencies", "uniqueItems", "contains",
    "minContains", "maxContains", "allOf", "not", "if", "then", "else",
    "unevaluatedProperties", "unevaluatedItems"})
# OpenAI's structured outputs (strict): "Supported schemas" lists what it takes; these it
# rejects, and every property must be required.
_STRICT_REJECTS = frozenset({
    "allOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
    "dependencies", "patternProperties", "unevaluatedProperties", "unevaluatedItems",
    "propertyNames", "minProperties", "maxProperties", "uniqueItems", "contains",
    "minContains", "maxContains"})

# llama-server built without llguidance (llama.cpp's default; b11434's common/json-schema.cpp)
# reads type, properties, required, additionalProperties, items, prefixItems, min/maxItems,
# enum, const, anyOf / oneOf (as anyOf), allOf, $ref, pattern, min/maxLength, the formats
# below, and minimum / maximum (exclusive too) on integers; it drops the rest.
_LLAMA_GBNF_IGNORES = frozenset({
    "multipleOf", "minProperties", "maxProperties", "patternProperties", "propertyNames",
    "dependentRequired", "dependentSchemas", "dependencies", "uniqueItems", "contains",
    "minContains", "maxContains", "not", "if", "then", "else", "unevaluatedProperties",
    "unevaluatedItems"})
_DATE_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
LLAMA_SERVER_GBNF = Capabilities(True, False, True, _LLAMA_GBNF_IGNORES,
                                 string_formats=_DATE_FORMATS, integer_bounds_only=True,
                                 lengths_with_pattern=False)
"""A llama-server without llguidance: JSON schemas through its own converter only."""

CAPABILITIES: dict[str, Capabilities] = {
    "vllm": Capabilities(True, True, True),
    "chatkit": Capabilities(True, True, True),
    "sglang": Capabilities(True, True, True),
    "llama-server": Capabilities(True, True, True),
    "openai": Capabilities(False, False, True, _STRICT_REJECTS, every_property_required=True),
    "llama-cpp-python": Capabilities(False, False, True, _GBNF_IGNORES,
                                     string_formats=frozenset({"date", "time", "date-time",
                                                               "uuid", "uuid1", "uuid2",
                                                               "uuid3", "uuid4", "uuid5"}),
                                     lengths_with_pattern=False),
}

def schema_refusal(caps: Capabilities, schema: Any) -> str | None:
    """What in ``schema`` a server of these capabilities would not enforce (None: all of
    it), as words for ``RemoteUnsupported``."""
    for path, node in subschemas(schema):
        where = path or "/"
        ignored = sorted(caps.schema_ignores & node.keys())
        if ignored:
            return f"the JSON Schema keyword {ignored[0]!r} at {where}"
        bounds = sorted({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
                        & node.keys())
        if caps.integer_bounds_only and bounds and node.get("type") != "integer":
            return f"the JSON Schema keyword {bounds[0]!r} at {where} (integers only)"
        if ("pattern" in node and not caps.lengths_with_pattern
                and {"minLength", "maxLength"} & node.keys()):
            return f"minLength/maxLength beside a pattern at {where}"
        fmt = node.get("format")
        if caps.string_formats is not None and fmt is not None \
                and fmt not in caps.string_formats:
            return f"the string format {fmt!r} at {where}"
        props = node.get("properties")
        if caps.every_property_required and isinstance(props, dict):
            required = node.get("required", [])
            optional = [name for name in props if name not in required]
            if optional:
                return (f"the optional property {optional[0]!r} at {where} (strict mode "
                        "needs every property required)")
    return None


_UNENFORCED = {"tools": "tool calls (the Hermes tool grammar)",
               "think+schema": "thinking + schema (one two-phase grammar)",
               "regex": "a regex", "lark": "a Lark grammar", "json_schema": "a JSON schema"}


def refusal(caps: Capabilities, request: GenerateRequest) -> str | None:
    """What in the request's grammar a server of these capabilities cannot enforce, in
    words for ``RemoteUnsupported``; None: all of it (or no grammar)."""
    what = request.grammar_kind
    if what is None or caps.grammar:
        return None
    if what == "json_schema" and caps.json_schema:
        return schema_refusal(caps, request.schema)
    return _UNENFORCED.get(what, what)


def finish_result(where: str, tokens: list[int], reason: Any, request: GenerateRequest,
                  prompt_tokens: int, cached: int) -> GenerateResult:
    """The tokens without a trailing stop token, and why the engine stopped
    (``RemoteError`` naming ``where`` for a finish reason other than stop or length)."""
    if reason not in ("stop", "length"):
        raise RemoteError(where, f"finish_reason {reason!r} (neither a stop nor "
                          "the length limit): the reply cannot be trusted as complete")
    if tokens and tokens[-1] in request.stop_ids:
        tokens = tokens[:-1]
        finish: Finish = "stop_token"
    else:
        finish = "length" if reason == "length" or len(tokens) >= request.max_tokens \
            else "stop_token"
    return GenerateResult(tokens=tokens, finish=finish, prompt_tokens=prompt_tokens,
                          cached_prompt_tokens=cached)


def _sampling(request: GenerateRequest) -> dict[str, Any]:
    sampling: dict[str, Any] = {"temperature": request.temperature, "top_p": request.top_p}
    if request.seed is not None:
        sampling["seed"] = request.seed
    return sampling


def _schema_sent(request: GenerateRequest) -> Any:
    """The request's schema closed as chatkit's own grammar closes it."""
    schema = request.schema
    return closed_objects(schema) if isinstance(schema, dict) else schema


Tokenize = Callable[[str], list[int]]
"""Plain-text tokenization with the engine's vocabulary (for servers that answer text)."""


class ServerKind:
    """A kind of server: where requests go (``path``), their body, how the answer reads,
    and what the server enforces (``capabilities``). Token-prompt dialects stream token ids
    when ``streams_tokens``."""

    path = ""
    streams_tokens = False

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.capabilities = CAPABILITIES[kind]

    @property
    def needs_probe(self) -> bool:
        """The server must be asked what it enforces before a constrained request."""
        return False

    def body(self, request: GenerateRequest, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def result(self, data: Any, request: GenerateRequest, where: str,
               tokenize: Tokenize) -> GenerateResult:
        """The answer as a GenerateResult (``KeyError``, ``TypeError``... when it has not
        the API's shape; ``RemoteError`` for an untrustworthy finish)."""
        raise NotImplementedError


class Completions(ServerKind):
    """vLLM's ``/v1/completions`` with token ids in and out (``chatkit serve`` too)."""

    path = "/v1/completions"
    streams_tokens = True

    def body(self, request: GenerateRequest, model: str) -> dict[str, Any]:
        body = {"model": model, "prompt": list(request.prompt),
                "max_tokens": request.max_tokens, "return_token_ids": True,
                "stop_token_ids": sorted(request.stop_ids), "skip_special_tokens": False,
                **_sampling(request)}
        if request.grammar is not None:
            body["structured_outputs"] = {"grammar": request.grammar}
        return body

    def result(self, data: Any, request: GenerateRequest, where: str,
               tokenize: Tokenize) -> GenerateResult:
        choice = data["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        usage = data.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return finish_result(where, tokens, choice.get("finish_reason"), request,
                             int(usage.get("prompt_tokens", len(request.prompt))), int(cached))


class SGLang(ServerKind):
    """SGLang's native ``/generate`` (``input_ids``, ``ebnf`` with ``%llguidance``)."""

    path = "/generate"

    def body(self, request: GenerateRequest, model: str) -> dict[str, Any]:
        params = {"max_new_tokens": request.max_tokens,
                  "stop_token_ids": sorted(request.stop_ids), "skip_special_tokens": False,
                  **_sampling(request)}
        if request.grammar is not None:
            params["ebnf"] = "%llguidance {}\n" + request.grammar
        return {"input_ids": list(request.prompt), "sampling_params": params}

    def result(self, data: Any, request: GenerateRequest, where: str,
               tokenize: Tokenize) -> GenerateResult:
        meta = data.get("meta_info", {})
        tokens = [int(t) for t in data["output_ids"]]
        reason = (meta.get("finish_reason") or {}).get("type")
        return finish_result(where, tokens, "length" if reason == "length" else "stop",
                             request, int(meta.get("prompt_tokens", 0)),
                             int(meta.get("cached_tokens", 0)))


class LlamaServer(ServerKind):
    """llama.cpp's ``/completion``: llguidance Lark when built with it (asked once, by
    :meth:`probe_body`), else JSON schemas through its own converter."""

    path = "/completion"

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._probed = False

    @property
    def needs_probe(self) -> bool:
        return not self._probed

    def probe_body(self, prompt: list[int]) -> dict[str, Any]:
        """A one-token request with an llguidance grammar: a 200 says llguidance is built
        in (``/props`` does not say)."""
        return {"prompt": prompt, "n_predict": 1, "cache_prompt": False,
                "grammar": '%llguidance {}\nstart: "a"'}

    def probed(self, llguidance: bool) -> None:
        self._probed = True
        self.capabilities = CAPABILITIES["llama-server"] if llguidance else LLAMA_SERVER_GBNF

    def body(self, request: GenerateRequest, model: str) -> dict[str, Any]:
        body = {"prompt": list(request.prompt), "n_predict": request.max_tokens,
                "return_tokens": True, "cache_prompt": True, **_sampling(request)}
        if request.grammar is not None and self.capabilities.grammar:
            body["grammar"] = "%llguidance {}\n" + request.grammar
        elif request.grammar is not None:  # its own converter (only a schema gets here)
            body["json_schema"] = _schema_sent(request)
        return body

    def result(self, data: Any, request: GenerateRequest, where: str,
               tokenize: Tokenize) -> GenerateResult:
        reason = "length" if data.get("stop_type") == "limit" else "stop"
        prompt_tokens = int(data.get("tokens_evaluated", len(request.prompt)))
        cached = int(data.get("tokens_cached", 0))
        if self.capabilities is LLAMA_SERVER_GBNF and request.grammar is not None:
            # GBNF picks tokens llguidance's mask would not (a non-canonical split of
            # forced bytes): the text is replayed, and the second reader checks it
            text = data["content"]
            return GenerateResult(tokens=tokenize(text),
                                  finish="length" if reason == "length" else "stop_token",
                                  prompt_tokens=prompt_tokens, cached_prompt_tokens=cached,
                                  text=text)
        tokens = [int(t) for t in data["tokens"]]
        return finish_result(where, tokens, reason, request, prompt_tokens, cached)


class Chat(ServerKind):
    """``/v1/chat/completions`` with messages (the server renders its own template) and a
    JSON schema as ``response_format`` (llama-cpp-python's server)."""

    path = "/v1/chat/completions"

    def body(self, request: GenerateRequest, model: str) -> dict[str, Any]:
        body = {"model": model, "max_tokens": request.max_tokens,
                "messages": messages_to_openai(request.messages), **_sampling(request)}
        if request.schema is not None:
            body["response_format"] = self.response_format(_schema_sent(request))
        return body

    def response_format(self, schema: Any) -> dict[str, Any]:
        """llama-cpp-python's shape: json_object with the schema beside it."""
        return {"type": "json_object", "schema": schema}

    def result(self, data: Any, request: GenerateRequest, where: str,
               tokenize: Tokenize) -> GenerateResult:
        choice = data["choices"][0]
        text = choice["message"]["content"] or ""
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise RemoteError(where, f"finish_reason {reason!r}: the reply cannot be "
                              "trusted as complete")
        usage = data.get("usage") or {}
        return GenerateResult(tokens=tokenize(text),
                              finish="length" if reason == "length" else "stop_token",
                              prompt_tokens=int(usage.get("prompt_tokens", 0)), text=text)


class OpenAIChat(Chat):
    """OpenAI's chat completions: the schema as strict ``json_schema``."""

    def response_format(self, schema: Any) -> dict[str, Any]:
        return {"type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": schema}}


KINDS: dict[str, type[ServerKind]] = {
    "vllm": Completions, "chatkit": Completions, "sglang": SGLang,
    "llama-server": LlamaServer, "openai": OpenAIChat, "llama-cpp-python": Chat}
"""The dialect of each kind of server (``RemoteEngine(kind=...)``)."""
