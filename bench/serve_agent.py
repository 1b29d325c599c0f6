"""The agent workload of ``bench serve`` (``--workload agent``): what a coding agent sends.

    python3 dev.py bench serve --workload agent [--sessions 2] [--servers chatkit,llama-server]

A session is three streamed chat requests with tools on the Gemma 3 270M GGUF: a ~16k-token
system prompt (an agent's instructions; each session's own, so every first turn is cold),
three function tools, the user's task; then the same request with a scripted assistant call
and its tool result appended, twice (the history is the same for every server, whatever
its model wrote, so the prompts are equal token for token). Each turn's time to first
token (any delta: text, a call, reasoning), its decode speed (completion tokens over the
time after the first) and the cached prompt tokens the server reports are printed, per
server: ``chatkit serve`` (no flag but the port and two sequences) and llama.cpp's
``llama-server`` (``--jinja``, ``-np 2``, the same context per slot). Sessions alternate
between the servers, in an order that rotates. What a second turn costs is the point: an
agent's next request repeats the whole prompt before it, and a server that keeps the
prefix evaluates only what was appended. Each turn says what the server wrote (a call or
text): a turn's first delta comes after its first token for text, but only once a call's
name is written for a call (under the generic fallback, ``{"tool_calls": [{"name": "...``,
about 15 tokens on Gemma), so turns that wrote different things do not compare. The
Gemma GGUF carries no chat template: llama-server renders it as ChatML, without the tools.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import openai

PROMPT_TOKENS = 16_000
MAX_TOKENS = 64
CTX_PER_SEQ = 32_768

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a file of the repository",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "run", "description": "Run a shell command in the repository",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
]

RULES = [
    "Read a file before you change it, and change only what the task needs.",
    "Run the tests after every change; a change that breaks a test is not done.",
    "Prefer the standard library; a new dependency needs a reason the user accepts.",
    "Keep functions short, name things for what they mean, and write docstrings that "
    "state the contract: arguments, what is raised, what it costs.",
    "Never print secrets, tokens or keys, and never commit them.",
    "When a command fails, read its output before you try again; do not repeat a "
    "failing command unchanged.",
    "Explain what you did in one short paragraph when the task is done.",
]
APP = "\n".join(["import json", "", "", "def total(items):",
                 "    return sum(i['price'] * i['qty'] for i in items)", ""]
                + [f"def rule_{k}(x):\n    return x + {k}\n" for k in range(40)])
PYTEST = ("F.....\n" + "=" * 35 + " FAILURES " + "=" * 35 + "\n"
          "____ test_total ____\n    assert total([{'price': 2, 'qty': 3}]) == 7\n"
          "E   assert 6 == 7\n1 failed, 5 passed in 0.04s")


def system_prompt(session: int, count: Any) -> str:
    """An agent's instructions of about ``PROMPT_TOKENS`` tokens, opening with the
    session's number (so no server holds any of it before the session's first turn)."""
    parts = [f"Session {session}. You are a coding agent working in a Python repository."]
    k = 0
    while True:
        parts.append(f"Rule {k + 1}: {RULES[k % len(RULES)]} (section {k // len(RULES) + 1})")
        k += 1
        if k % 50 == 0 and count("\n".join(parts)) >= PROMPT_TOKENS:
            return "\n".join(parts)


def turns(system: str) -> list[list[dict[str, Any]]]:
    """The three requests' messages: the task, then a read and its result, then a test run
    and its result appended (scripted: the same for every server)."""
    first: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": "The test of total() in src/app.py fails. Find out why "
                                    "and fix it."}]

    def call(i: int, name: str, args: dict[str, str], result: str) -> list[dict[str, Any]]:
        return [{"role": "assistant", "content": "", "tool_calls": [{
                    "id": f"call_{i}", "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)}}]},
                {"role": "tool", "tool_call_id": f"call_{i}", "content": result}]

    second = first + call(1, "read_file", {"path": "src/app.py"}, APP)
    third = second + call(2, "run", {"command": "pytest -q"}, PYTEST)
    return [first, second, third]


def one_turn(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, float]:
    t0 = time.perf_counter()
    first: float | None = None
    usage: Any = None
    called = False
    stream = client.chat.completions.create(
        model="m", messages=messages, tools=TOOLS, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}, temperature=0, max_tokens=MAX_TOKENS)
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            d = c.delta
            called = called or bool(d.tool_calls)
            if first is None and (d.content or d.tool_calls
                                  or getattr(d, "reasoning_content", None)):
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    first = total if first is None else first
    details = getattr(usage, "prompt_tokens_details", None)
    completion = usage.completion_tokens if usage is not None else 0
    return {"ttft": first, "total": total, "prompt": usage.prompt_tokens if usage else 0,
            "cached": (details.cached_tokens or 0) if details is not None else 0,
            "completion": completion, "called": float(called),
            "tok_s": (completion - 1) / (total - first) if completion > 1 and total > first
            else 0.0}


def start(kind: str, path: Path, port: int) -> Any:
    from serve import Server, llama_server_binary

    if kind == "llama-server":
        cmd = [llama_server_binary(), "-m", str(path), "--port", str(port), "--jinja",
               "-np", "2", "-c", str(2 * CTX_PER_SEQ), "--alias", "m",
               "-t", str(os.cpu_count() or 1)]
    else:
        cmd = [sys.executable, "-m", "chatkit", "serve", "--model", str(path), "--port",
               str(port), "--n-seq-max", "2", "--ctx-per-seq", str(CTX_PER_SEQ), "--name", "m"]
    return Server(kind, path, port, cmd)


def main(kinds: list[str], sessions: int) -> None:
    import llama_cpp
    from serve import free_port

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.conftest import gemma_path

    path = gemma_path()
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=False))

    print(f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, Gemma 3 270M "
          f"Q4_K_M, greedy, max_tokens {MAX_TOKENS}, ~{PROMPT_TOKENS} system tokens, "
          f"{len(TOOLS)} tools, {sessions} sessions of 3 turns, load average before: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    servers = {k: start(k, path, free_port()) for k in kinds}
    results: dict[str, list[list[dict[str, float]]]] = {k: [] for k in kinds}
    try:
        for server in servers.values():  # warm-up: a short tool turn
            with openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0,
                               timeout=900) as c:
                one_turn(c, [{"role": "user", "content": "hi"}])
        for s in range(sessions):
            system = system_prompt(s, count)
            for kind in kinds[s % len(kinds):] + kinds[: s % len(kinds)]:
                with openai.OpenAI(base_url=servers[kind].base + "/v1", api_key="x",
                                   max_retries=0, timeout=900) as c:
                    session = [one_turn(c, m) for m in turns(system)]
                results[kind].append(session)
                print(f"{kind:14s} session {s}: " + "; ".join(
                    f"turn {i + 1} ttft {t['ttft']:.2f} s ({'a call' if t['called'] else 'text'}"
                    f"), {t['tok_s']:.1f} tok/s, prompt {t['prompt']:.0f} (cached "
                    f"{t['cached']:.0f})"
                    for i, t in enumerate(session)), flush=True)
    finally:
        for server in servers.values():
            server.close()
    report(results)


def report(results: dict[str, list[list[dict[str, float]]]]) -> None:
    def med(kind: str, turn: int, key: str) -> float:
        return statistics.median(s[turn][key] for s in results[kind])

    print("\n| server | turn 1 TTFT s | turn 2 TTFT s | turn 3 TTFT s | turn 2 / turn 1 | "
          "decode tok/s | turn 2 cached / prompt |")
    print("|---|---|---|---|---|---|---|")
    for kind in results:
        t1, t2, t3 = (med(kind, i, "ttft") for i in range(3))
        print(f"| {kind} | {t1:.2f} | {t2:.2f} | {t3:.2f} | {t2 / t1:.3f}x | "
              f"{statistics.median(t['tok_s'] for s in results[kind] for t in s):.1f} | "
              f"{med(kind, 1, 'cached'):.0f} / {med(kind, 1, 'prompt'):.0f} |")
    if {"chatkit", "llama-server"} <= set(results):
        def speed(kind: str) -> float:
            return statistics.median(t["tok_s"] for s in results[kind] for t in s)

        print("\nchatkit vs llama-server (> 1: chatkit faster): " + ", ".join(
            f"turn {i + 1} TTFT {med('llama-server', i, 'ttft') / med('chatkit', i, 'ttft'):.2f}x"
            for i in range(3)) + f", decode tok/s {speed('chatkit') / speed('llama-server'):.2f}x")
