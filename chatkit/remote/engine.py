"""Remote engines: the same Conversation, tools, batches and lanes on a serving engine.

chatkit keeps the parts that go wrong on servers: it renders the chat template
segment-safely, tokenizes, and builds the grammar, all locally from the same model's
vocabulary (``Model.load_vocab``); the engine is asked only to sample under that
grammar from those token ids. Its tokens then go through the turn's own grammar again
(:meth:`chatkit.chat.turn.Turn.begin_replay`: a token outside it is ``SchemaViolation``) and the
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
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from typing import Any, Literal, TypeVar

import anyio
import httpx

from ..engine.protocols import GenerateRequest, GenerateResult, Vocabulary
from ..engine.vocab_holder import HoldsVocabulary
from ..errors import InvalidParameter, RemoteError, RemoteUnsupported
from .servers import KINDS, Capabilities, LlamaServer, finish_result, refusal
from .servers import LLAMA_SERVER_GBNF as LLAMA_SERVER_GBNF

__all__ = ["RemoteEngine"]

_log = logging.getLogger("chatkit")

V = TypeVar("V")

Kind = Literal["vllm", "chatkit", "sglang", "llama-server", "openai", "llama-cpp-python"]

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
        if kind not in KINDS:
            raise InvalidParameter("kind", f"one of {', '.join(KINDS)}, not {kind!r}")
        if n_ctx < 2:
            raise InvalidParameter("n_ctx", f"must be >= 2, got {n_ctx}")
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self.dialect = KINDS[kind](kind)
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
        self._headers = headers

    def __repr__(self) -> str:
        return f"RemoteEngine({self.kind}, {self.base_url!r}, model={self.model!r})"

    @property
    def name(self) -> str:
        return f"{self.model}@{self.base_url}"

    @property
    def capabilities(self) -> Capabilities:
        """What the server enforces (a llama-server's, once asked)."""
        return self.dialect.capabilities

    def close(self) -> None:
        self._client.close()

    def cache(self, key: Hashable, build: Callable[[], V]) -> V:
        """Memoise ``build()`` for this engine's lifetime, in its vocabulary's cache."""
        return self.vocab.cache(("remote", key), build)

    # -------------------------------------------------------------- requests
    def _probe(self, dialect: LlamaServer) -> None:
        """Ask a llama-server once whether it was built with llguidance; without, JSON
        schemas go through llama.cpp's own converter and its text is replayed."""
        url = self.base_url + dialect.path
        body = dialect.probe_body(self.tokenize("a", special=False))
        with _http_errors(url):
            response = self._client.post(url, json=body)
        llguidance = response.status_code == 200
        if not llguidance and "llguidance" not in response.text:
            self._json(url, response)  # another failure: RemoteError with its words
        dialect.probed(llguidance)
        # without llguidance its tokens follow GBNF, not chatkit's mask: text replay
        self.returns_token_ids = llguidance
        _log.info("llama-server at %s %s llguidance", self.base_url,
                  "has" if llguidance else "has no")

    def check(self, request: GenerateRequest) -> None:
        """Refuse, before any request, what this kind cannot enforce."""
        if (request.grammar_kind is not None and isinstance(self.dialect, LlamaServer)
                and self.dialect.needs_probe):
            self._probe(self.dialect)
        refused = refusal(self.capabilities, request)
        if refused is not None:
            raise RemoteUnsupported(self.kind, refused)

    def _prepared(self, request: GenerateRequest, *, stream: bool
                  ) -> tuple[str, dict[str, Any]]:
        """The checked request's URL and body."""
        self.check(request)
        body = self.dialect.body(request, self.model)
        if stream:
            body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        return self.base_url + self.dialect.path, body

    def _result(self, url: str, data: Any, request: GenerateRequest) -> GenerateResult:
        """The server's body as tokens (or text) and a finish, or ``RemoteError``."""
        try:
            return self.dialect.result(data, request, self.base_url,
                                       lambda text: self.tokenize(text, special=False))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise RemoteError(url, f"the response is not {self.kind}'s API shape ({exc!r}): "
                              f"{json.dumps(data)[:300]}") from None

    # ------------------------------------------------------------- sending
    def _retry_delay(self, url: str, response: httpx.Response, attempt: int) -> float | None:
        """None for a 200 (use it); seconds to wait before the next attempt for a 429 or
        503 with attempts left; else the named ``RemoteError`` (the body read already)."""
        if response.status_code == 200:
            return None
        if response.status_code in RETRY_STATUS and attempt < self.retries:
            after = response.headers.get("retry-after", "")
            wait = float(after) if after.replace(".", "", 1).isdigit() else 0.0
            return min(MAX_RETRY_WAIT, max(wait, self.backoff * 2.0**attempt))
        self._json(url, response)
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _send(self, url: str, body: dict[str, Any]) -> Iterator[httpx.Response]:
        """POST on the pooled client, retried on 429 / 503: the 200 response, its body not
        yet read; transport failures as ``RemoteError``."""
        for attempt in range(self.retries + 1):
            with _http_errors(url), self._client.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    response.read()
                delay = self._retry_delay(url, response, attempt)
                if delay is None:
                    yield response
                    return
            time.sleep(delay)

    @contextlib.asynccontextmanager
    async def _asend(self, url: str, body: dict[str, Any]) -> AsyncIterator[httpx.Response]:
        """``_send`` for async code, on ``async_client`` or a client of its own."""
        async with contextlib.AsyncExitStack() as stack:
            client = self._aclient
            if client is None:
                client = await stack.enter_async_context(
                    httpx.AsyncClient(headers=self._headers, timeout=self._timeout))
            for attempt in range(self.retries + 1):
                with _http_errors(url):
                    async with client.stream("POST", url, json=body,
                                             headers=self._headers) as response:
                        if response.status_code != 200:
                            await response.aread()
                        delay = self._retry_delay(url, response, attempt)
                        if delay is None:
                            yield response
                            return
                await anyio.sleep(delay)

    # ----------------------------------------------------------- GenerateEngine
    def generate(self, request: GenerateRequest) -> GenerateResult:
        """One completion (sync, pooled connection, retried on 429 / 503)."""
        url, body = self._prepared(request, stream=False)
        with self._send(url, body) as response:
            response.read()
        return self._result(url, self._json(url, response), request)

    async def agenerate(self, request: GenerateRequest) -> GenerateResult:
        """``generate`` for async code; cancelling the task aborts the request."""
        url, body = self._prepared(request, stream=False)
        async with self._asend(url, body) as response:
            await response.aread()
        return self._result(url, self._json(url, response), request)

    def stream(self, request: GenerateRequest) -> Iterator[list[int] | GenerateResult]:
        """Token ids as the server streams them (SSE; kinds vllm and chatkit), then the
        GenerateResult. Other kinds: one request, then everything at once."""
        if not self.dialect.streams_tokens:
            result = self.generate(request)
            yield list(result.tokens)
            yield result
            return
        url, body = self._prepared(request, stream=True)
        with self._send(url, body) as response:
            parser = _SSE(self.base_url, url, request)
            for line in response.iter_lines():
                yield from parser.line(line)
            yield parser.end()

    async def astream(self, request: GenerateRequest
                      ) -> AsyncIterator[list[int] | GenerateResult]:
        """``stream`` for async code; cancelling the task closes the connection."""
        if not self.dialect.streams_tokens:
            result = await self.agenerate(request)
            yield list(result.tokens)
            yield result
            return
        url, body = self._prepared(request, stream=True)
        async with self._asend(url, body) as response:
            parser = _SSE(self.base_url, url, request)
            async for line in response.aiter_lines():
                for piece in parser.line(line):
                    yield piece
            yield parser.end()

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

    def __init__(self, where: str, url: str, request: GenerateRequest) -> None:
        self.where, self.url, self.request = where, url, request
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
        return finish_result(self.where, list(self.tokens), self.finish, self.request,
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
