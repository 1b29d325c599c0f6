"""Remote engines: the same Conversation, tools, batches and lanes on a serving engine.

chatkit keeps the parts that go wrong on servers: it renders the chat template
segment-safely, tokenizes, and builds the grammar, all locally from the same model's
vocabulary (``Model.load_vocab``); the engine is asked only to sample under that
grammar from those token ids. Its tokens then go through the turn's own grammar again
(:meth:`chatkit.turn.Turn.begin_replay`: a token outside it is ``SchemaViolation``) and the
second reader. What a ``kind`` of server cannot enforce is refused by name before any
request (``RemoteUnsupported``); it is never sent unenforced.

==============  ==============  =========================================================
kind            prompt          constraints it enforces
==============  ==============  =========================================================
vllm            token ids       all, as llguidance Lark (``structured_outputs.grammar``;
                                needs ``--structured-outputs-config.backend guidance``)
chatkit         token ids       all (``chatkit serve``'s ``/v1/completions``, same fields)
sglang          token ids       all, as ``ebnf`` with ``%llguidance`` (``--grammar-backend
                                llguidance``) — written from SGLang's docs, not run here
llama-server    token ids       all, as ``grammar`` with ``%llguidance`` (a llama.cpp
                                built with llguidance) — from its docs, not run here
openai          messages (the   a JSON schema only, as ``response_format`` json_schema
                server renders) (tools, regex, Lark, thinking + schema: refused)
llama-cpp-      messages        a JSON schema only, as ``response_format`` json_object +
python                          schema (its server's shape)
==============  ==============  =========================================================

HTTP is httpx (a pooled sync client per engine; async calls open a client per call
unless one is given), with a timeout, and retries with exponential backoff on 429 and
503 only. Cancelling an async call aborts its request. Failures are ``RemoteError``
(server down, timeout, other status, a body that is not the API's, a finish reason other
than stop or length); the conversation is unchanged on every error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import anyio
import httpx

from .engine import GenerateRequest, GenerateResult, Vocabulary
from .errors import InvalidParameter, RemoteError, RemoteUnsupported
from .messages import messages_to_openai
from .schema import closed_objects, subschemas
from .vocab_holder import HoldsVocabulary

__all__ = ["RemoteEngine"]

_log = logging.getLogger("chatkit")

V = TypeVar("V")

Kind = Literal["vllm", "chatkit", "sglang", "llama-server", "openai", "llama-cpp-python"]


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

RETRY_STATUS = frozenset({429, 503})
MAX_RETRY_WAIT = 30.0
"""Seconds a retry waits at most, whatever ``Retry-After`` says."""


class RemoteEngine(HoldsVocabulary):
    """A served model as a chatkit engine (``Vocabulary`` + ``GenerateEngine``).

    ``vocab`` is the same model's vocabulary (``Model.load_vocab(gguf)``, or a loaded
    ``Model``); ``model`` the id the server serves it under; ``n_ctx`` the tokens one
    request may hold (prompt and reply). ``Conversation(engine)`` then works as with a
    local ``Model``: send / stream / asend / astream, schemas, regex, Lark, tools and the
    agent loop, thinking, ``send_batch`` and ``quorum`` (concurrent requests; the server
    batches them). ``speculative=True`` is refused (the server decodes).

    Sync calls share one pooled ``httpx.Client``. Async calls open a client per call (an
    event loop owns its connections), unless ``async_client`` (yours to close, bound to
    your event loop) is given to pool them.
    """

    def __init__(self, base_url: str, *, kind: Kind, model: str, vocab: Vocabulary,
                 api_key: str | None = None, n_ctx: int = 4096, timeout: float = 300.0,
                 retries: int = 3, backoff: float = 0.5, max_connections: int = 64,
                 async_client: httpx.AsyncClient | None = None) -> None:
        if kind not in CAPABILITIES:
            raise InvalidParameter("kind", f"one of {', '.join(CAPABILITIES)}, not {kind!r}")
        if n_ctx < 2:
            raise InvalidParameter("n_ctx", f"must be >= 2, got {n_ctx}")
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self.capabilities = CAPABILITIES[kind]
        self._probed: Capabilities | None = None
        self.model = model
        self._hold(vocab)
        self.retries = retries
        self.backoff = backoff
        self.n_ctx_seq = n_ctx
        self.returns_token_ids = self.capabilities.token_prompts
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_connections,
                              max_keepalive_connections=max_connections)
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 10.0))
        self._client = httpx.Client(headers=headers, limits=limits, timeout=self._timeout)
        self._aclient = async_client
        self._headers, self._limits = headers, limits

    def __repr__(self) -> str:
        return f"RemoteEngine({self.kind}, {self.base_url!r}, model={self.model!r})"

    @property
    def name(self) -> str:
        return f"{self.model}@{self.base_url}"

    def close(self) -> None:
        self._client.close()

    def cache(self, key: Any, build: Callable[[], V]) -> V:
        """Memoise ``build()`` for this engine's lifetime, in its vocabulary's cache."""
        return self.vocab.cache(("remote", key), build)

    # -------------------------------------------------------------- requests
    def _llama_server_capabilities(self) -> Capabilities:
        """What this llama-server enforces, asked once: a one-token request with an
        llguidance grammar answers whether it was built with llguidance (not in
        ``/props``); without, JSON schemas go through llama.cpp's own converter."""
        if self._probed is None:
            url = self.base_url + "/completion"
            body = {"prompt": self.tokenize("a", special=False), "n_predict": 1,
                    "cache_prompt": False,
                    "grammar": '%llguidance {}\nstart: "a"'}
            with _http_errors(url):
                response = self._client.post(url, json=body)
            llguidance = response.status_code == 200
            if not llguidance and "llguidance" not in response.text:
                self._json(url, response)  # another failure: RemoteError with its words
            self._probed = CAPABILITIES["llama-server"] if llguidance else LLAMA_SERVER_GBNF
            # without llguidance its tokens follow GBNF, not chatkit's mask: text replay
            self.returns_token_ids = llguidance
            _log.info("llama-server at %s %s llguidance", self.base_url,
                      "has" if llguidance else "has no")
        return self._probed

    def check(self, request: GenerateRequest) -> None:
        """Refuse, before any request, what this kind cannot enforce."""
        if self.kind == "llama-server" and request.grammar_kind is not None:
            self.capabilities = self._llama_server_capabilities()
        caps, what = self.capabilities, request.grammar_kind
        if what is None or caps.grammar:
            return
        if what == "json_schema" and caps.json_schema:
            refused = schema_refusal(caps, request.schema)
            if refused is None:
                return
            raise RemoteUnsupported(self.kind, refused)
        names = {"tools": "tool calls (the Hermes tool grammar)",
                 "think+schema": "thinking + schema (one two-phase grammar)",
                 "regex": "a regex", "lark": "a Lark grammar",
                 "json_schema": "a JSON schema"}
        raise RemoteUnsupported(self.kind, names.get(what, what))

    def _body(self, request: GenerateRequest) -> tuple[str, dict[str, Any]]:
        sampling: dict[str, Any] = {"temperature": request.temperature,
                                    "top_p": request.top_p}
        if request.seed is not None:
            sampling["seed"] = request.seed
        grammar = request.grammar
        if self.kind in ("vllm", "chatkit"):
            body = {"model": self.model, "prompt": list(request.prompt),
                    "max_tokens": request.max_tokens, "return_token_ids": True,
                    "stop_token_ids": sorted(request.stop_ids), "skip_special_tokens": False,
                    **sampling}
            if grammar is not None:
                body["structured_outputs"] = {"grammar": grammar}
            return "/v1/completions", body
        if self.kind == "sglang":
            body = {"input_ids": list(request.prompt), "sampling_params": {
                "max_new_tokens": request.max_tokens, "stop_token_ids": sorted(request.stop_ids),
                "skip_special_tokens": False, **sampling}}
            if grammar is not None:
                body["sampling_params"]["ebnf"] = "%llguidance {}\n" + grammar
            return "/generate", body
        if self.kind == "llama-server":
            body = {"prompt": list(request.prompt), "n_predict": request.max_tokens,
                    "return_tokens": True, "cache_prompt": True, **sampling}
            if grammar is not None and self.capabilities.grammar:
                body["grammar"] = "%llguidance {}\n" + grammar
            elif grammar is not None:  # its own converter (check() let only a schema by)
                body["json_schema"] = (closed_objects(request.schema)
                                       if isinstance(request.schema, dict) else request.schema)
            return "/completion", body
        # openai / llama-cpp-python: the server renders its own template from the messages
        body = {"model": self.model, "max_tokens": request.max_tokens,
                "messages": messages_to_openai(request.messages), **sampling}
        if request.schema is not None:
            # closed as chatkit's own grammar closes it (schema.close_objects)
            sent = (closed_objects(request.schema) if isinstance(request.schema, dict)
                    else request.schema)
            body["response_format"] = (
                {"type": "json_schema", "json_schema": {"name": "answer", "strict": True,
                                                        "schema": sent}}
                if self.kind == "openai" else {"type": "json_object", "schema": sent})
        return "/v1/chat/completions", body

    def _result(self, url: str, data: Any, request: GenerateRequest) -> GenerateResult:
        """The server's body as tokens (or text) and a finish, or ``RemoteError``."""
        try:
            if self.kind in ("vllm", "chatkit"):
                choice = data["choices"][0]
                tokens = [int(t) for t in choice["token_ids"]]
                usage = data.get("usage") or {}
                cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                          or 0)
                return self.finish_result(tokens, choice.get("finish_reason"), request,
                                    int(usage.get("prompt_tokens", len(request.prompt))),
                                    int(cached))
            if self.kind == "sglang":
                meta = data.get("meta_info", {})
                tokens = [int(t) for t in data["output_ids"]]
                reason = (meta.get("finish_reason") or {}).get("type")
                return self.finish_result(tokens, "length" if reason == "length" else "stop",
                                    request, int(meta.get("prompt_tokens", 0)),
                                    int(meta.get("cached_tokens", 0)))
            if self.kind == "llama-server":
                reason = "length" if data.get("stop_type") == "limit" else "stop"
                if self.capabilities is LLAMA_SERVER_GBNF and request.grammar is not None:
                    # GBNF picks tokens llguidance's mask would not (a non-canonical split of
                    # forced bytes): the text is replayed, and the second reader checks it
                    text = data["content"]
                    return GenerateResult(
                        tokens=self.tokenize(text, special=False),
                        finish="length" if reason == "length" else "stop_token",
                        prompt_tokens=int(data.get("tokens_evaluated", len(request.prompt))),
                        cached_prompt_tokens=int(data.get("tokens_cached", 0)), text=text)
                tokens = [int(t) for t in data["tokens"]]
                return self.finish_result(tokens, reason, request,
                                    int(data.get("tokens_evaluated", len(request.prompt))),
                                    int(data.get("tokens_cached", 0)))
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            reason = choice.get("finish_reason")
            if reason not in ("stop", "length"):
                raise RemoteError(url, f"finish_reason {reason!r}: the reply cannot be "
                                  "trusted as complete")
            finish: Literal["stop_token", "length"] = (
                "length" if reason == "length" else "stop_token")
            usage = data.get("usage") or {}
            return GenerateResult(tokens=self.tokenize(text, special=False), finish=finish,
                                  prompt_tokens=int(usage.get("prompt_tokens", 0)), text=text)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise RemoteError(url, f"the response is not {self.kind}'s API shape ({exc!r}): "
                              f"{json.dumps(data)[:300]}") from None

    def finish_result(self, tokens: list[int], reason: Any, request: GenerateRequest,
                      prompt_tokens: int, cached: int) -> GenerateResult:
        """The tokens without a trailing stop token, and why the engine stopped."""
        if reason not in ("stop", "length"):
            raise RemoteError(self.base_url, f"finish_reason {reason!r} (neither a stop nor "
                              "the length limit): the reply cannot be trusted as complete")
        if tokens and tokens[-1] in request.stop_ids:
            tokens = tokens[:-1]
            finish: Literal["stop_token", "length"] = "stop_token"
        else:
            finish = "length" if reason == "length" or len(tokens) >= request.max_tokens \
                else "stop_token"
        return GenerateResult(tokens=tokens, finish=finish, prompt_tokens=prompt_tokens,
                              cached_prompt_tokens=cached)

    # ----------------------------------------------------------- GenerateEngine
    def generate(self, request: GenerateRequest) -> GenerateResult:
        """One completion (sync, pooled connection, retried on 429 / 503)."""
        self.check(request)
        path, body = self._body(request)
        url = self.base_url + path
        for attempt in range(self.retries + 1):
            with _http_errors(url):
                response = self._client.post(url, json=body)
            if response.status_code in RETRY_STATUS and attempt < self.retries:
                time.sleep(self._delay(response, attempt))
                continue
            return self._result(url, self._json(url, response), request)
        raise AssertionError("unreachable")

    async def agenerate(self, request: GenerateRequest) -> GenerateResult:
        """``generate`` for async code; cancelling the task aborts the request."""
        self.check(request)
        path, body = self._body(request)
        url = self.base_url + path
        if self._aclient is not None:
            return await self._apost(self._aclient, url, body, request)
        async with httpx.AsyncClient(headers=self._headers, timeout=self._timeout) as client:
            return await self._apost(client, url, body, request)

    async def _apost(self, client: httpx.AsyncClient, url: str, body: dict[str, Any],
                     request: GenerateRequest) -> GenerateResult:
        for attempt in range(self.retries + 1):
            with _http_errors(url):
                response = await client.post(url, json=body, headers=self._headers)
            if response.status_code in RETRY_STATUS and attempt < self.retries:
                await anyio.sleep(self._delay(response, attempt))
                continue
            return self._result(url, self._json(url, response), request)
        raise AssertionError("unreachable")

    # ---------------------------------------------------------------- streaming
    def stream(self, request: GenerateRequest) -> Iterator[list[int] | GenerateResult]:
        """Token ids as the server streams them (SSE; kinds vllm and chatkit), then the
        GenerateResult. Other kinds: one request, then everything at once."""
        if self.kind not in ("vllm", "chatkit"):
            result = self.generate(request)
            yield list(result.tokens)
            yield result
            return
        url, body = self._stream_body(request)
        for attempt in range(self.retries + 1):
            with _http_errors(url), self._client.stream("POST", url, json=body) as response:
                if response.status_code in RETRY_STATUS and attempt < self.retries:
                    response.read()
                    time.sleep(self._delay(response, attempt))
                    continue
                if response.status_code != 200:
                    response.read()
                    self._json(url, response)  # raises the named error
                parser = _SSE(self, url, request)
                for line in response.iter_lines():
                    yield from parser.line(line)
                yield parser.end()
                return

    async def astream(self, request: GenerateRequest
                      ) -> AsyncIterator[list[int] | GenerateResult]:
        """``stream`` for async code; cancelling the task closes the connection."""
        if self.kind not in ("vllm", "chatkit"):
            result = await self.agenerate(request)
            yield list(result.tokens)
            yield result
            return
        url, body = self._stream_body(request)
        async with contextlib.AsyncExitStack() as stack:
            client = self._aclient
            if client is None:
                client = await stack.enter_async_context(
                    httpx.AsyncClient(headers=self._headers, timeout=self._timeout))
            for attempt in range(self.retries + 1):
                with _http_errors(url):
                    async with client.stream("POST", url, json=body,
                                             headers=self._headers) as response:
                        if response.status_code in RETRY_STATUS and attempt < self.retries:
                            await response.aread()
                            await anyio.sleep(self._delay(response, attempt))
                            continue
                        if response.status_code != 200:
                            await response.aread()
                            self._json(url, response)
                        parser = _SSE(self, url, request)
                        async for line in response.aiter_lines():
                            for piece in parser.line(line):
                                yield piece
                        yield parser.end()
                        return

    def _stream_body(self, request: GenerateRequest) -> tuple[str, dict[str, Any]]:
        self.check(request)
        path, body = self._body(request)
        return self.base_url + path, {**body, "stream": True,
                                      "stream_options": {"include_usage": True}}

    def _delay(self, response: httpx.Response, attempt: int) -> float:
        after = response.headers.get("retry-after", "")
        wait = float(after) if after.replace(".", "", 1).isdigit() else 0.0
        return min(MAX_RETRY_WAIT, max(wait, self.backoff * 2.0**attempt))

    def _json(self, url: str, response: httpx.Response) -> Any:
        if response.status_code != 200:
            detail = response.text[:500]
            try:
                detail = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise RemoteError(url, f"HTTP {response.status_code}: {detail}",
                              status=response.status_code)
        try:
            return response.json()
        except ValueError:
            raise RemoteError(url, f"a 200 whose body is not JSON: {response.text[:200]!r}"
                              ) from None


class _SSE:
    """OpenAI-style completion chunks (``data: {...}`` lines) with ``token_ids``."""

    def __init__(self, engine: RemoteEngine, url: str, request: GenerateRequest) -> None:
        self.engine, self.url, self.request = engine, url, request
        self.tokens: list[int] = []
        self.finish: Any = None
        self.usage: dict[str, Any] = {}
        self.done = False

    def line(self, line: str) -> Iterator[list[int]]:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteError(self.url, f"a stream chunk is not JSON: {data[:200]!r}") from None
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise RemoteError(self.url, f"the stream reported an error: {message}")
        self.usage = chunk.get("usage") or self.usage
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids")
            if ids is None and choice.get("text"):
                raise RemoteError(self.url, "a stream chunk has text but no token_ids "
                                  "(return_token_ids unsupported?)")
            if ids:
                if not isinstance(ids, list) or not all(
                        isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise RemoteError(self.url, f"token_ids is not a list of ids: {ids!r:.200}")
                self.tokens += ids
                yield ids
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]

    def end(self) -> GenerateResult:
        if not self.done or self.finish is None:
            raise RemoteError(self.url, "the stream was cut short (no finish_reason or no "
                              "[DONE])")
        try:
            details = self.usage.get("prompt_tokens_details") or {}
            cached = int(details.get("cached_tokens") or 0)
            prompt_tokens = int(self.usage.get("prompt_tokens", 0))
        except (TypeError, ValueError, AttributeError):
            raise RemoteError(self.url, f"usage is malformed: {self.usage!r:.200}") from None
        return self.engine.finish_result(list(self.tokens), self.finish, self.request,
                                         prompt_tokens, cached)


@contextlib.contextmanager
def _http_errors(url: str) -> Iterator[None]:
    """httpx's transport failures as ``RemoteError`` naming the URL."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise RemoteError(url, f"timed out ({exc.__class__.__name__})") from None
    except httpx.HTTPError as exc:
        raise RemoteError(url, f"unreachable, or the connection broke: {exc}") from None
