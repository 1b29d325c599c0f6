"""Graceful shutdown of a real ``chatkit serve`` process (chatkit.serve.shutdown): SIGTERM
during streamed requests lets them finish, refuses new ones with 503 and ``Retry-After``,
and the process exits 0; past ``--drain-timeout`` an open stream ends with an error event."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from tests.helpers import free_port, wait_until_serving


@contextlib.contextmanager
def _serving(*flags: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A ``chatkit serve`` process and its base URL; killed at the end if still running."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "chatkit", "serve", "--port", str(port),
                             "--n-seq-max", "4", "--n-ctx", "4096", "--name", "m", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", proc)
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stream(base: str, max_tokens: int, schema: dict[str, Any] | None,
            out: list[dict[str, Any]], started: threading.Event) -> None:
    """One streamed chat request; its events (parsed) and how it ended into ``out``."""
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": max_tokens,
                            "temperature": 0,
                            "messages": [{"role": "user", "content": "Tell me a story."}]}
    if schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "s", "schema": schema}}
    events: list[Any] = []
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        if r.status_code != 200:
            started.set()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
                started.set()
    out.append({"status": r.status_code, "events": events})


def _run_streams(base: str, n: int, max_tokens: int, schema: dict[str, Any] | None = None
                 ) -> tuple[list[threading.Thread], list[dict[str, Any]]]:
    out: list[dict[str, Any]] = []
    threads = []
    for _ in range(n):
        started = threading.Event()
        t = threading.Thread(target=_stream, args=(base, max_tokens, schema, out, started))
        t.start()
        assert started.wait(120), "a stream sent nothing"
        threads.append(t)
    return threads, out


def test_sigterm_drains_streams_refuses_new_requests_and_exits_0() -> None:
    with _serving("--drain-timeout", "60") as (proc, base):
        # 4 streams that cannot end before 120 tokens (a long JSON string)
        threads, out = _run_streams(base, 4, 120, {"type": "string", "minLength": 2000})
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        refused = httpx.post(base + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert refused.json()["error"]["code"] == "server_shutting_down"
        anthropic = httpx.post(base + "/v1/messages", json={
            "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            timeout=10)
        assert anthropic.status_code == 503 and anthropic.json()["type"] == "error"
        for t in threads:
            t.join(120)
        assert proc.wait(60) == 0
        assert time.monotonic() - sent < 60
        assert len(out) == 4
        for result in out:  # every stream ran to its end: a finish reason, then [DONE]
            events = result["events"]
            assert result["status"] == 200 and events[-1] == "[DONE]"
            finishes = [c["finish_reason"] for e in events[:-1] if isinstance(e, dict)
                        for c in e.get("choices", []) if c.get("finish_reason")]
            assert finishes == ["length"], events[-3:]
            assert not any(isinstance(e, dict) and "error" in e for e in events)


def test_a_stream_past_the_drain_timeout_ends_with_an_error_event() -> None:
    with _serving("--drain-timeout", "1") as (proc, base):
        threads, out = _run_streams(base, 1, 3000, {"type": "string", "minLength": 20000})
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert proc.wait(30) == 0
        (result,) = out
        errors = [e["error"] for e in result["events"] if isinstance(e, dict) and "error" in e]
        assert [e["code"] for e in errors] == ["server_shutting_down"]
