"""Test processors (a recorder around any processor, an allow-list mask, a no-op, a bias),
a bounded Verdict, a biased model wrapper and a scripted vLLM-style HTTP server: the tools
that let a test force what a real model would only probably do."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

import httpx
import numpy as np
from pydantic import BaseModel, Field

from chatkit import Constraint, LogitProcessor, SeqChunk
from chatkit.tools.definition import tool


class AllowList:
    """Masks every token outside ``allowed`` (a fixed set)."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = sorted(allowed)

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        keep = logits[self.allowed].copy()
        logits[:] = -np.inf
        logits[self.allowed] = keep

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class NoOp:
    """A processor that constrains nothing: the positive control for constraint tests."""

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        pass

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class Recorder:
    """Wraps a processor and records every call made through the seam."""

    def __init__(self, inner: LogitProcessor) -> None:
        self.inner = inner
        self.commits: list[int] = []
        self.process_calls = 0
        self.resets = 0

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        self.process_calls += 1
        self.inner.process(logits, history)

    def commit(self, token: int) -> None:
        self.commits.append(token)
        self.inner.commit(token)

    def reset(self) -> None:
        self.resets += 1
        self.inner.reset()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # is_stopped, forced_tokens, ... of the wrapped one


class Chain:
    """Runs processors in order (e.g. an adversarial bias, then the constraint)."""

    def __init__(self, *procs: LogitProcessor) -> None:
        self.procs = procs

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        for p in self.procs:
            p.process(logits, history)

    def commit(self, token: int) -> None:
        for p in self.procs:
            p.commit(token)

    def reset(self) -> None:
        for p in self.procs:
            p.reset()


class Boost:
    """Adds ``amount`` to the logits of ``ids``: makes the model want those tokens."""

    def __init__(self, ids: Sequence[int], amount: float = 100.0) -> None:
        self.ids = np.asarray(list(ids), dtype=np.int64)
        self.amount = amount

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        logits[self.ids] += self.amount

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class Ban:
    """Forbids ``ids`` (e.g. the stop tokens: a reply that cannot end early)."""

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = np.asarray(list(ids), dtype=np.int64)

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        logits[self.ids] = -np.inf

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class Biased:
    """A model whose every logit row has ``amount`` added to ``ids``: the model itself wants
    those tokens, before any processor (for greedy check-first, which looks at the unmasked
    argmax before it calls ``process``). Everything else is the wrapped model's."""

    def __init__(self, model: Any, ids: Sequence[int], amount: float = 100.0) -> None:
        self._model = model
        self._ids = np.asarray(list(ids), dtype=np.int64)
        self._amount = amount

    def _bias(self, rows: np.ndarray) -> np.ndarray:
        rows = np.array(rows, dtype=np.float32, copy=True)
        rows[..., self._ids] += self._amount
        return rows

    def decode(self, chunks: Sequence[SeqChunk]) -> list[np.ndarray]:
        return [self._bias(r) for r in self._model.decode(chunks)]

    def prefill(self, seq: int, tokens: Sequence[int], pos: int = 0, **kw: Any) -> np.ndarray:
        return self._bias(self._model.prefill(seq, tokens, pos, **kw))

    def cache(self, key: Any, build: Any) -> Any:
        """Its own per-engine cache: an engine loop or a compiled grammar made for the
        wrapped model would decode without the bias."""
        cached = self.__dict__.setdefault("_cache", {})
        if key not in cached:
            cached[key] = build()
        return cached[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


# A reason the grammar bounds by construction: ASCII only, so no \uXXXX escapes (maxLength
# alone counts an escape as one character), at most 40 characters.
Reason = Annotated[str, Field(pattern=r"^[A-Za-z0-9 ,.'-]{0,40}$")]


class Verdict(BaseModel):
    """tests/test_conversation.py's Verdict with bounded strings: every reply the grammar
    admits fits in ``VERDICT_MAX_TOKENS`` (a token is at least one byte), so a test of a
    code path never depends on a model closing its strings early."""

    decision: Literal["approve", "reject", "abstain"]
    confidence: float = Field(ge=0, le=1)
    reasons: list[Reason] = Field(max_length=2)


# '{"decision":"abstain","confidence":0.123456,"reasons":["<40>","<40>"]}' is 142 bytes
# (numbers carry at most 6 fractional digits: schema.NUMBER_DIGITS); the margin covers
# other spellings of a number.
VERDICT_MAX_TOKENS = 200


def chat_prompt(model, user: str, system: str | None = None) -> list[int]:  # type: ignore[no-untyped-def]
    """A prompt with segment-safe tokenization: ChatML markup for SmolLM2, plain text for Gemma."""
    if model.chat_template and "<|im_start|>" in model.chat_template:
        ids: list[int] = []
        if system:
            ids += model.tokenize("<|im_start|>system\n", special=True)
            ids += model.tokenize(system, special=False)
            ids += model.tokenize("<|im_end|>\n", special=True)
        ids += model.tokenize("<|im_start|>user\n", special=True)
        ids += model.tokenize(user, special=False)
        ids += model.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
        return ids
    return [model.bos_id, *model.tokenize(f"{system or ''}\nQ: {user}\nA:", special=False)]


def unmasked(c: Constraint) -> Constraint:
    """A no-op variant of ``c`` (mask and matcher disabled, reader kept): the positive
    control for the second reader and the lane checks."""

    class Unmasked(Constraint):
        def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
            pass

        def commit(self, token: int) -> None:
            pass

        def allows(self, token: int) -> bool:
            return True

        def is_accepting(self) -> bool:
            return True

        def is_stopped(self) -> bool:
            return True

    return Unmasked(c.kind, c.grammar, source=c.source, reader=c.reader)


class Script:
    """A real HTTP server on loopback answering with scripted responses (status, JSON body or
    raw bytes, delay); a completion body answers a streaming request as server-sent events,
    one token per event. With ``RemoteEngine(script.base, kind="vllm", ...)`` a reply's token
    ids are replayed through chatkit's own grammar, stop, tool-call and finish rules: a
    scripted model that does exactly what a test needs."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any, float]] = []
        self.requests: list[dict[str, Any]] = []
        script = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                request = json.loads(self.rfile.read(length))
                script.requests.append(request)
                status, body, delay = script.replies.pop(0)
                time.sleep(delay)
                kind = "application/json"
                if isinstance(body, bytes):
                    data = body
                elif request.get("stream") and status == 200 and "choices" in body:
                    data, kind = _events(body), "text/event-stream"
                else:
                    data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                if status == 429:
                    self.send_header("retry-after", "0")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(ids: list[int], finish: str = "stop") -> dict[str, Any]:
    """A vLLM-style completion body carrying ``ids`` as the reply's token ids."""
    return {"choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(ids)}}


def _events(body: dict[str, Any]) -> bytes:
    """A completion body as a vLLM-style event stream: one token id per event, the finish
    reason, the usage, ``[DONE]``."""
    events: list[dict[str, Any]] = []
    for choice in body["choices"]:
        i = choice["index"]
        events += [{"choices": [{"index": i, "text": "", "token_ids": [t],
                                 "finish_reason": None}]} for t in choice["token_ids"]]
        events.append({"choices": [{"index": i, "text": "", "token_ids": [],
                                    "finish_reason": choice["finish_reason"]}]})
    events.append({"choices": [], "usage": body.get("usage")})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + \
        b"data: [DONE]\n\n"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_serving(url: str, proc: subprocess.Popen[Any], *, timeout: float = 120.0,
                       ok: Callable[[httpx.Response], bool] = lambda r: r.status_code == 200,
                       why: Callable[[], str] = lambda: "the server did not start") -> None:
    """Poll ``url`` until its answer is ``ok``; fails the test (with ``why()``) when
    ``proc`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if ok(httpx.get(url, timeout=2)):
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, why()
        time.sleep(0.2)


@contextlib.contextmanager
def serving(command: list[str], base: str, health: str) -> Iterator[str]:
    """A server process started from ``command``, ``base`` once ``base + health`` answers;
    stopped on exit."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(base + health, proc)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def load_dev() -> ModuleType:
    """The repository's ``dev.py`` as a module (its set-up facts: cache paths, versions)."""
    path = Path(__file__).resolve().parent.parent / "dev.py"
    spec = importlib.util.spec_from_file_location("chatkit_dev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def openai_client(base: str, api_key: str = "unused") -> Any:
    """The openai SDK's client of a server at ``base`` (no retries: a failure is the test's)."""
    import openai

    return openai.OpenAI(base_url=base + "/v1", api_key=api_key, max_retries=0)


def answer_chat_call(client: Any, model: str, choice: Any, call: Any, *, max_tokens: int,
                     tools: list[dict[str, Any]]) -> Any:
    """The chat turn after ``choice``'s ``call`` got a result (Oslo's weather), no tools
    callable: the model answers in text."""
    return client.chat.completions.create(
        model=model, temperature=0, max_tokens=max_tokens, tools=tools,
        tool_choice="none",
        messages=[{"role": "user", "content": "Weather in Oslo?"},
                  choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}])


def answer_responses_call(client: Any, model: str, call: Any) -> Any:
    """The Responses turn after ``call`` got a result (Oslo's weather): input items only."""
    return client.responses.create(model=model, max_output_tokens=16, temperature=0, input=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "12 C, rain"}])


def stream_responses_call(client: Any, model: str, tool: dict[str, Any], max_output_tokens: int
                          ) -> tuple[list[str], Any]:
    """A Responses stream that must call ``tool`` (Rome's weather): its event types and
    the final response."""
    with client.responses.stream(model=model, input="Weather in Rome?", tools=[tool],
                                 tool_choice="required", max_output_tokens=max_output_tokens,
                                 parallel_tool_calls=False, temperature=0) as stream:
        kinds = [event.type for event in stream]
        return kinds, stream.get_final_response()


TEXT_LEADS = {"llama4-json": ("<|python_start|>", "<|python_end|>"),
              "functionary-v3.2": ("all\n", ">>>")}
"""Markup around text before calls (a dialect's ``text_lead``), as detection learns it from
Llama 4's and Functionary v3.2's templates (tests/test_tool_turns.py)."""
ATEM_REASONING = (" to=self<|message|>", "<|eom|><|start|>assistant")
"""Muse Glimmer's think block (``to=self``), as detection learns it from its template."""


@tool
def get_weather(city: Annotated[str, Field(max_length=16)],
                days: Annotated[int, Field(ge=1, le=9)] = 1) -> str:
    """Weather forecast for a city (its parameters described: Command R+'s template reads a
    description on every parameter).

    Args:
        city: The city.
        days: How many days.
    """
    return f"sunny in {city}, {days} day(s)"
