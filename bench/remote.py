"""chatkit on a remote engine: local chatkit vs chatkit over vLLM vs vLLM's own chat endpoint.

    CHATKIT_VLLM_URL=http://127.0.0.1:8011 python3 dev.py bench remote [--model smollm2]

Same model (SmolLM2-135M: the GGUF locally, its Hugging Face conversion in vLLM's CPU
build), same machine, one run, greedy. Workloads: the fixture schemas, and tool prompts
(``tool_choice`` required, named and auto, with two tools). Paths:

- local chatkit: ``Conversation(Model.load(gguf))``;
- chatkit over vLLM: ``Conversation(RemoteEngine(url, kind="vllm", vocab=Model.load_vocab(gguf)))``
  — the template, tokens and grammar made here, vLLM samples under the Lark grammar;
- vLLM's own ``/v1/chat/completions`` with ``response_format: json_schema`` (strict) and
  ``tools`` / ``tool_choice`` (the openai SDK).

Per path: outputs valid (schema-valid JSON; a call to an offered tool with schema-valid
arguments, and, for required/named, a call at all), requests refused by name (an HTTP 4xx
or a chatkit refusal), silently unenforced (a 200 whose output is invalid), cut at
max_tokens, p50 latency and output tokens/s. vLLM must be started first (docs/remote.md,
"Scale-out"), with ``--enable-auto-tool-choice --tool-call-parser hermes`` for its own
tool calls (without them it refuses every tools request); nothing else should run
meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import date
from typing import Any

import openai
from peers import SCHEMAS, valid

from chatkit import (
    ChatkitError,
    Conversation,
    Model,
    RemoteEngine,
    SamplingParams,
    Tool,
    Truncated,
    UserError,
)
from chatkit.engine.model import default_model_path

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "convert", "description": "Convert an amount between currencies",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number", "minimum": 0},
            "to": {"type": "string", "pattern": "^[A-Z]{3}$"}},
            "required": ["amount", "to"], "additionalProperties": False}}},
]
TOOL_PROMPTS = ["What's the weather in Paris, in celsius?", "Convert 20 dollars to EUR.",
                "Is it raining in Oslo?", "How many yen is 5 euros?"]
CHOICES: list[Any] = ["required", {"type": "function", "function": {"name": "convert"}}, "auto"]


def prompt(schema: dict[str, Any]) -> str:
    return "Answer with one JSON value for this schema: " + json.dumps(schema)


def valid_calls(calls: list[tuple[str, str]], choice: Any) -> bool:
    """Every call names an offered tool with schema-valid arguments; required/named: >= 1."""
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    if choice != "auto" and not calls:
        return False
    if isinstance(choice, dict) and any(n != choice["function"]["name"] for n, _ in calls):
        return False
    return all(name in by_name and valid(args, by_name[name]) for name, args in calls)


def chatkit_path(engine: Any, max_tokens: int) -> list[dict[str, Any]]:
    tools = [Tool.from_schema(t["function"]["name"], t["function"]["parameters"],
                              t["function"]["description"]) for t in TOOLS]
    rows = []
    jobs: list[tuple[str, Any, Any]] = [("schema", s, None) for s in
                                        (json.loads(p.read_text()) for p in SCHEMAS)]
    jobs += [("tools", p, c) for p in TOOL_PROMPTS for c in CHOICES]
    for kind, item, choice in jobs:
        conv = Conversation(engine, sampling=SamplingParams(temperature=0.0))
        t0 = time.perf_counter()
        row: dict[str, Any] = {"kind": kind}
        try:
            if kind == "schema":
                r = conv.send(prompt(item), schema=item, max_tokens=max_tokens)
                row["valid"] = valid(r.text, item)
            else:
                name = choice if isinstance(choice, str) else choice["function"]["name"]
                r = conv.send(item, tools=tools, tool_choice=name, max_tokens=max_tokens)
                row["valid"] = valid_calls([(c.name, json.dumps(c.arguments))
                                            for c in r.tool_calls], choice)
            row["tokens"] = r.usage.completion_tokens
        except Truncated:
            row.update(valid=False, cut=True, tokens=max_tokens)
        except UserError as exc:
            row.update(valid=False, refused=type(exc).__name__, tokens=0)
        except ChatkitError as exc:  # SchemaViolation etc.: caught, named, never a success
            row.update(valid=False, error=type(exc).__name__, tokens=0)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def vllm_own(client: openai.OpenAI, model: str, max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    jobs: list[tuple[str, Any, Any]] = [("schema", s, None) for s in
                                        (json.loads(p.read_text()) for p in SCHEMAS)]
    jobs += [("tools", p, c) for p in TOOL_PROMPTS for c in CHOICES]
    for kind, item, choice in jobs:
        t0 = time.perf_counter()
        row: dict[str, Any] = {"kind": kind}
        try:
            if kind == "schema":
                r = client.chat.completions.create(
                    model=model, temperature=0, max_tokens=max_tokens,
                    messages=[{"role": "user", "content": prompt(item)}],
                    response_format={"type": "json_schema", "json_schema": {
                        "name": "answer", "schema": item, "strict": True}})  # type: ignore[arg-type]
                text = r.choices[0].message.content or ""
                row["valid"] = valid(text, item)
            else:
                r = client.chat.completions.create(
                    model=model, temperature=0, max_tokens=max_tokens, tools=TOOLS,  # type: ignore[arg-type]
                    tool_choice=choice, messages=[{"role": "user", "content": item}])
                calls = [(c.function.name, c.function.arguments)
                         for c in r.choices[0].message.tool_calls or ()]
                row["valid"] = valid_calls(calls, choice)
            row["cut"] = r.choices[0].finish_reason == "length"
            row["silent"] = not row["valid"] and not row["cut"]
            row["tokens"] = r.usage.completion_tokens if r.usage else 0
        except openai.BadRequestError as exc:
            row.update(valid=False, refused=f"HTTP 400: {str(exc)[:80]}", tokens=0)
        except openai.APIError as exc:
            row.update(valid=False, error=str(exc)[:80], tokens=0)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def summary(name: str, rows: list[dict[str, Any]]) -> str:
    n = len(rows)
    valid = sum(r["valid"] for r in rows)
    refused = sum(1 for r in rows if r.get("refused"))
    silent = sum(1 for r in rows if r.get("silent"))
    cut = sum(1 for r in rows if r.get("cut"))
    errors = sum(1 for r in rows if r.get("error"))
    lat = statistics.median(r["seconds"] for r in rows)
    tok_s = sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)
    by = {k: f"{sum(r['valid'] for r in rows if r['kind'] == k)}/"
             f"{sum(1 for r in rows if r['kind'] == k)}" for k in ("schema", "tools")}
    return (f"| {name} | {valid}/{n} | {by['schema']} | {by['tools']} | {refused} | {silent} | "
            f"{cut} | {errors} | {lat * 1000:.0f} | {tok_s:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("CHATKIT_VLLM_URL"))
    ap.add_argument("--model", default=os.environ.get("CHATKIT_VLLM_MODEL", "smollm2"))
    ap.add_argument("--max-tokens", type=int, default=160)
    args = ap.parse_args()
    if not args.url:
        raise SystemExit("start vLLM and pass --url (or CHATKIT_VLLM_URL); docs/remote.md")
    path = default_model_path()
    print(f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, SmolLM2-135M, "
          f"greedy, max_tokens {args.max_tokens}, vLLM at {args.url}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    results = {}
    vocab = Model.load_vocab(path)
    remote = RemoteEngine(args.url, kind="vllm", model=args.model, vocab=vocab, n_ctx=2048)
    results["chatkit over vLLM (token ids + Lark grammar)"] = chatkit_path(remote,
                                                                           args.max_tokens)
    with openai.OpenAI(base_url=args.url + "/v1", api_key="x", max_retries=0) as client:
        results["vLLM's own chat endpoint (response_format / tools)"] = vllm_own(
            client, args.model, args.max_tokens)
    local = Model.load(path, n_ctx=4096, n_seq_max=1)
    results["local chatkit (llama.cpp in-process)"] = chatkit_path(local, args.max_tokens)
    print()
    print("| path | valid | schemas | tool calls | refused by name | silently unenforced | "
          "cut at max_tokens | other errors | p50 latency ms | tok/s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        print(summary(name, rows))
    print()
    for name, rows in results.items():
        bad = [r for r in rows if not r["valid"]]
        if bad:
            print(f"{name}: not valid: {json.dumps(bad)[:600]}")


if __name__ == "__main__":
    main()
