"""Hours, not seconds: ``chatkit serve`` under mixed traffic for a set time.

    python3 dev.py bench soak [--minutes 30] [--clients 8] [--sample 5] [--out bench/out/soak]

One ``chatkit serve`` (SmolLM2-135M, ``--n-seq-max 8``) on loopback; ``--clients`` threads
send, until the time is up, a random mix (seeded): chat completions streamed and not with
the fixture schemas, a shared-system-prompt verdict service (cached prefixes), a tool call
under ``tool_choice: required``, Anthropic Messages streamed and with a tool. One request
in ten is abandoned by its client (a stream closed after a few events, or a request whose
client gives up after 0.3 s, mid-prefill). The clients pause together for 10 s every 2
minutes (the bursts' idle gaps). Halfway through, the server gets SIGTERM (it drains: the
requests then refused get 503 with ``Retry-After``, which the clients honour) and a new
server starts on the same port.

Every ``--sample`` seconds it records the server's RSS, and from its ``/metrics`` the KV
cells in use, requests running and waiting and the prefix-cache hits, with the p50 latency
of the requests that finished since the last sample: a CSV and one PNG (matplotlib, the
bench extra). At the end: requests by kind, responses >= 500 other than the drain's 503,
the drain's 503s, invalid replies (a schema's reply that fails ``jsonschema``, a tool
call whose arguments fail the tool's parameters), the RSS growth of each server process
after its first 5 minutes, the KV cells at each idle gap, and the p50 latency of the last
5 minutes against the first 5.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import httpx
from peers import ROOT, SCHEMAS, valid
from serve import SHARED_SCHEMA, SHARED_SYSTEM, free_port

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
KINDS = ["chat-stream", "chat", "shared", "tool", "messages-stream", "messages-tool"]


class Soak:
    def __init__(self, minutes: float, clients: int, sample: float, out: Path) -> None:
        self.seconds, self.clients, self.sample, self.out = minutes * 60, clients, sample, out
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.schemas = [json.loads(p.read_text()) for p in SCHEMAS]
        self.lock = threading.Lock()
        self.done: list[tuple[float, str, float]] = []  # (end time, kind, seconds)
        self.counts = {k: 0 for k in ["requests", "abandoned", "5xx", "drain-503", "invalid",
                                      "refused"]}
        self.by_kind = dict.fromkeys(KINDS, 0)
        self.rows: list[dict[str, float]] = []
        self.idle_cells: list[float] = []
        self.exits: list[int | None] = []
        self.t0 = 0.0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = open(out.with_suffix(".server.log"), "w")

    # ------------------------------------------------------------ the server
    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chatkit", "serve", "--port", str(self.port), "--n-seq-max",
             "8", "--n-ctx", "16384", "--name", "m", "--drain-timeout", "30"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("chatkit serve did not start")

    def restart(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.exits.append(self.proc.wait(120))
        self.start()

    # ------------------------------------------------------------ the clients
    def request(self, rng: random.Random, j: int) -> None:
        kind = rng.choice(KINDS)
        abandon = rng.random() < 0.1
        schema = self.schemas[j % len(self.schemas)]
        path, body, check = self.body(kind, j, schema)
        t = time.monotonic()
        timeout = 0.3 if abandon and not body.get("stream") else 600
        try:
            with httpx.Client(timeout=timeout) as client:
                if body.get("stream"):
                    status, text = self.stream(client, path, body, abandon)
                else:
                    r = client.post(self.base + path, json=body)
                    status, text = r.status_code, r.text
        except httpx.TimeoutException:
            return self.count("abandoned")
        except httpx.TransportError:  # the restart's gap
            time.sleep(1)
            return self.count("refused")
        if status == 200 and text is None:
            return  # abandoned mid-stream (counted)
        self.count("requests")
        with self.lock:
            self.by_kind[kind] += 1
        if status == 503 and "shutting down" in text:
            time.sleep(5)  # Retry-After
            return self.count("drain-503")
        if status >= 500:
            print(f"  {status} on {kind}: {text[:300]}", flush=True)
            return self.count("5xx")
        if status == 200 and not check(text):
            print(f"  invalid {kind}: {text[:300]}", flush=True)
            self.count("invalid")
        with self.lock:
            self.done.append((time.monotonic(), kind, time.monotonic() - t))

    def stream(self, client: httpx.Client, path: str, body: dict[str, Any],
               abandon: bool) -> tuple[int, Any]:
        events: list[str] = []
        with client.stream("POST", self.base + path, json=body) as r:
            if r.status_code != 200:
                return r.status_code, r.read().decode()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append(line[6:])
                if abandon and len(events) >= 3:
                    self.count("abandoned")
                    return 200, None  # closed mid-stream: the server cancels the turn
        return 200, events

    def body(self, kind: str, j: int, schema: dict[str, Any]) -> tuple[str, dict[str, Any], Any]:
        ask = [{"role": "user", "content": "Answer with one JSON value: " + json.dumps(schema)}]
        fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        tool = {"name": "weather", "description": "Weather of a city", "parameters": WEATHER}
        if kind in ("chat-stream", "chat"):
            return "/v1/chat/completions", {"model": "m", "messages": ask, "max_tokens": 128,
                                            "response_format": fmt,
                                            "stream": kind == "chat-stream"}, \
                lambda t: _chat_valid(t, schema)
        if kind == "shared":
            return "/v1/chat/completions", {"model": "m", "max_tokens": 64, "messages": [
                {"role": "system", "content": SHARED_SYSTEM},
                {"role": "user", "content": f"PR #{j}: a change."}],
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "v", "schema": SHARED_SCHEMA}}}, \
                lambda t: _chat_valid(t, SHARED_SCHEMA)
        if kind == "tool":
            return "/v1/chat/completions", {"model": "m", "max_tokens": 64, "messages": [
                {"role": "user", "content": "Weather in Oslo?"}], "tool_choice": "required",
                "tools": [{"type": "function", "function": tool}]}, _tool_valid
        anthropic_tool = {"name": "weather", "description": "Weather of a city",
                          "input_schema": WEATHER}
        msg: dict[str, Any] = {"model": "m", "max_tokens": 64,
                               "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
        if kind == "messages-tool":
            msg |= {"tools": [anthropic_tool], "tool_choice": {"type": "any"}}
            return "/v1/messages", msg, _anthropic_tool_valid
        return "/v1/messages", msg | {"stream": True}, _anthropic_stream_valid

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def client(self, seed: int, stop: float) -> None:
        rng, j = random.Random(seed), seed * 100_000
        while time.monotonic() < stop:
            if (time.monotonic() - self.t0) % 120 > 110:  # the idle gap of every burst
                time.sleep(0.5)
                continue
            j += 1
            self.request(rng, j)

    # ------------------------------------------------------------ the samples
    def sampler(self, stop: float) -> None:
        last = time.monotonic()
        while time.monotonic() < stop:
            time.sleep(self.sample)
            now = time.monotonic()
            with self.lock:
                recent = [s for end, _, s in self.done if last <= end < now]
            last = now
            row = {"t": now - self.t0, "rss_mb": _rss_mb(self.proc),
                   "p50_s": statistics.median(recent) if recent else float("nan"),
                   "finished": len(recent), **_metrics(self.base)}
            self.rows.append(row)
            if (now - self.t0) % 120 > 115 and row.get("running", 1) == 0:
                self.idle_cells.append(row.get("kv_cells", float("nan")))

    def run(self) -> None:
        self.t0 = time.monotonic()
        self.start()
        stop = self.t0 + self.seconds
        threads = [threading.Thread(target=self.client, args=(i, stop), daemon=True)
                   for i in range(self.clients)]
        threads.append(threading.Thread(target=self.sampler, args=(stop,), daemon=True))
        for t in threads:
            t.start()
        time.sleep(self.seconds / 2)
        restart_at = time.monotonic() - self.t0
        self.restart()
        for t in threads:
            t.join()
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.exits.append(self.proc.wait(120))
        self.log.close()
        self.report(restart_at)

    def report(self, restart_at: float) -> None:
        with open(self.out.with_suffix(".csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=sorted({k for r in self.rows for k in r}))
            w.writeheader()
            w.writerows(self.rows)
        five = 300.0
        first = [s for end, _, s in self.done if end - self.t0 < five]
        last = [s for end, _, s in self.done if end - self.t0 > self.seconds - five]
        kinds = ", ".join(f"{k} {v}" for k, v in self.by_kind.items())
        print(f"requests {self.counts['requests']} ({kinds}); "
              f"abandoned {self.counts['abandoned']}; refused in the restart gap "
              f"{self.counts['refused']}; drain 503s {self.counts['drain-503']}; other >= 500: "
              f"{self.counts['5xx']}; invalid replies {self.counts['invalid']}; exit codes "
              f"{self.exits}")
        for name, (a, b) in {"first server": (five, restart_at),
                             "second server": (restart_at + five, self.seconds)}.items():
            rss = [r["rss_mb"] for r in self.rows if a <= r["t"] <= b and r["rss_mb"] > 0]
            if len(rss) >= 2:
                print(f"{name}: RSS {rss[0]:.0f} MB at +5 min, {rss[-1]:.0f} MB at its end "
                      f"({100 * (rss[-1] / rss[0] - 1):+.1f}%)")
        print("KV cells at the idle gaps: " + ", ".join(f"{c:.0f}" for c in self.idle_cells))
        if first and last:
            p1, p2 = statistics.median(first), statistics.median(last)
            print(f"p50 latency: first 5 min {p1:.2f} s, last 5 min {p2:.2f} s ({p2 / p1:.2f}x)")
        plot(self.rows, restart_at, self.out.with_suffix(".png"))


def _chat_valid(text: Any, schema: dict[str, Any]) -> bool:
    if isinstance(text, list):  # streamed: the content deltas joined
        chunks = [json.loads(e) for e in text]
        if any("error" in c for c in chunks):
            return False
        finish = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
        body = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c.get("choices"))
    else:
        choice = json.loads(text)["choices"][0]
        finish, body = [choice["finish_reason"]], choice["message"]["content"] or ""
    return "length" in finish or valid(body, schema)


def _tool_valid(text: Any) -> bool:
    calls = json.loads(text)["choices"][0]["message"].get("tool_calls") or []
    return bool(calls) and all(valid(c["function"]["arguments"], WEATHER) for c in calls)


def _anthropic_tool_valid(text: Any) -> bool:
    body = json.loads(text)
    uses = [b for b in body["content"] if b["type"] == "tool_use"]
    return body["stop_reason"] == "max_tokens" or (
        bool(uses) and all(valid(json.dumps(b["input"]), WEATHER) for b in uses))


def _anthropic_stream_valid(events: Any) -> bool:
    kinds = [json.loads(e).get("type") for e in events]
    return "error" not in kinds and kinds[-1] == "message_stop"


def _rss_mb(proc: subprocess.Popen[bytes] | None) -> float:
    try:
        for line in Path(f"/proc/{proc.pid if proc else 0}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _metrics(base: str) -> dict[str, float]:
    names = {"chatkit:kv_cache_used_cells": "kv_cells", "chatkit:num_requests_running":
             "running", "chatkit:num_requests_waiting": "waiting",
             "chatkit:prefix_cache_hits_total": "cached_tokens"}
    try:
        text = httpx.get(base + "/metrics", timeout=5).text
    except httpx.TransportError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = float(value)
    return out


def plot(rows: list[dict[str, float]], restart_at: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] / 60 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    series = [("rss_mb", "RSS (MB)"), ("kv_cells", "KV cells in use"),
              ("running", "requests running / waiting"), ("p50_s", "p50 latency (s)")]
    for ax, (key, label) in zip(axes, series, strict=True):
        ax.plot(t, [r.get(key, float("nan")) for r in rows], label=key)
        if key == "running":
            ax.plot(t, [r.get("waiting", float("nan")) for r in rows], label="waiting")
            ax.legend()
        ax.axvline(restart_at / 60, color="grey", linestyle=":")
        ax.set_ylabel(label)
    axes[-1].set_xlabel("minutes (dotted: SIGTERM and restart)")
    fig.suptitle("chatkit serve soak")
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path} and {path.with_suffix('.csv')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "soak"))
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{date.today()}, {platform.machine()}, {os.cpu_count()} cores, SmolLM2-135M Q4_1, "
          f"{args.clients} clients, {args.minutes:g} minutes, load average before: "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    Soak(args.minutes, args.clients, args.sample, out).run()


if __name__ == "__main__":
    main()
