"""The agent workload of ``bench serve`` (``--workload agent``): what a coding agent sends.

    python3 dev.py bench serve --workload agent [--sessions 2] [--servers chatkit,llama-server]
                                                [--chat-template FILE|none]

A session is three streamed chat requests with tools on the Gemma 3 270M GGUF: a ~16k-token
system prompt (an agent's instructions; each session's own, so every first turn is cold),
three function tools, the user's task; then the same request with a scripted assistant call
and its tool result appended, twice (the history is the same for every server, whatever
its model wrote, so the prompts are equal token for token). Each turn's time to first
token (any delta: text, a call, reasoning), its decode speed (completion tokens over the
time after the first) and the cached prompt tokens the server reports are printed, per
server: ``chatkit serve`` (no flag but the port, two sequences and the template) and
llama.cpp's ``llama-server`` (``--jinja``, ``-np 2``, the same context per slot, the same
template). Sessions alternate between the servers, in an order that rotates. What a second
turn costs is the point: an agent's next request repeats the whole prompt before it, and a
server that keeps the prefix evaluates only what was appended.

The Gemma GGUF carries no chat template, so both servers are given the same one by default
(``bench/gemma_tools.jinja``: Gemma's turns, Hermes-style ``<tool_call>`` blocks), and both
render the same prompt and write in the same markup. ``--chat-template none`` leaves each
server to its own: chatkit's generic tool fallback, llama-server's ChatML without the tools,
and then they write different things. Each turn says what its first delta was (text or a
call) and whether it called: a first delta comes after one token for text, but only once a
call's name is written for a call, so turns whose first deltas differ do not compare (the
ratios mark them).
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
TEMPLATE = Path(__file__).resolve().parent / "gemma_tools.jinja"
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
    first_call = 0.0
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
                first_call = float(bool(d.tool_calls))
    total = time.perf_counter() - t0
    first = total if first is None else first
    details = getattr(usage, "prompt_tokens_details", None)
    completion = usage.completion_tokens if usage is not None else 0
    return {"ttft": first, "total": total, "prompt": usage.prompt_tokens if usage else 0,
            "cached": (details.cached_tokens or 0) if details is not None else 0,
            "completion": completion, "called": float(called), "first_call": first_call,
            "tok_s": (completion - 1) / (total - first) if completion > 1 and total > first
            else 0.0}


def start(kind: str, path: Path, port: int, template: Path | None) -> Any:
    from serve import Server, llama_server_binary

    tmpl = ["--chat-template" + ("-file" if kind == "llama-server" else ""), str(template)]

    if kind == "llama-server":
        cmd = [llama_server_binary(), "-m", str(path), "--port", str(port), "--jinja",
               "-np", "2", "-c", str(2 * CTX_PER_SEQ), "--alias", "m",
               "-t", str(os.cpu_count() or 1)] + (tmpl if template else [])
    else:
        cmd = [sys.executable, "-m", "chatkit", "serve", "--model", str(path), "--port",
               str(port), "--n-seq-max", "2", "--ctx-per-seq", str(CTX_PER_SEQ), "--name", "m"
               ] + (tmpl if template else [])
    return Server(kind, path, port, cmd)


def main(kinds: list[str], sessions: int, template: Path | None = TEMPLATE) -> None:
    """Run ``sessions`` sessions on each server of ``kinds``, both given ``template`` (None:
    each server's own handling of a GGUF without one), and print the table."""
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
          f"{len(TOOLS)} tools, {sessions} sessions of 3 turns, template "
          f"{template.name if template else 'each server its own'}, load average before: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    servers = {k: start(k, path, free_port(), template) for k in kinds}
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
                    f"turn {i + 1} ttft {t['ttft']:.2f} s ({wrote(t)}), {t['tok_s']:.1f} "
                    f"tok/s, prompt {t['prompt']:.0f} (cached "
                    f"{t['cached']:.0f})"
                    for i, t in enumerate(session)), flush=True)
    finally:
        for server in servers.values():
            server.close()
    report(results)


def wrote(turn: dict[str, float]) -> str:
    """What a turn wrote: its first delta (text or a call) and whether it called at all."""
    first = "a call" if turn["first_call"] else "text"
    return first if turn["first_call"] or not turn["called"] else "text, then a call"


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
        ours, theirs = results["chatkit"], results["llama-server"]
        ratios = []
        for turn in range(3):
            ratio = (statistics.median(s[turn]["ttft"] for s in theirs)
                     / statistics.median(s[turn]["ttft"] for s in ours))
            same = all(a[turn]["first_call"] == b[turn]["first_call"]
                       for a in ours for b in theirs)
            ratios.append(f"{ratio:.2f}x" + ("" if same else " (first deltas differ)"))
        decode = (statistics.median(t["tok_s"] for s in ours for t in s)
                  / statistics.median(t["tok_s"] for s in theirs for t in s))
        print(f"\nchatkit vs llama-server (above 1 is chatkit faster): TTFT "
              f"{' / '.join(ratios)} on turns 1-3, decode {decode:.2f}x")
