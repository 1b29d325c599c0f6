"""Lockstep batch benchmark: aggregate tokens/s of N conversations, side by side.

    python3 dev.py bench batch [--tokens N] [--reps R]

For N = 1, 2, 4, 8 on SmolLM2, in one run: a raw llama.cpp loop (prompts
prefilled, then one llama_decode per step with one token per sequence and an
argmax, no SDK), chatkit lockstep ``send_batch``, and the same conversations
sent one after another; unconstrained and under a JSON schema. Every number is
end to end (prefill included) and generation is forced to run the full token
budget, so all configurations produce the same number of tokens. Then the
quorum's shared prefix: N lanes with the prefix evaluated once and copied
vs N independent prefills.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from typing import Any

import numpy as np

from chatkit import Conversation, Model, SamplingParams, SeqChunk, send_batch

SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 40},
                             "minItems": 40}},
    "required": ["items"],
    "additionalProperties": False,
}
TOPICS = ["the sea", "mountains", "cities", "forests", "deserts", "rivers", "the sky", "islands"]
SYSTEM = "You are a knowledgeable assistant who writes long, detailed answers."


def prompts(n: int) -> list[str]:
    return [f"Write many facts about {TOPICS[i % len(TOPICS)]}." for i in range(n)]


def conversations(model: Model, n: int) -> list[Conversation]:
    return [Conversation(model, system=SYSTEM, sampling=SamplingParams()) for _ in range(n)]


def raw(model: Model, n: int, tokens: int) -> float:
    """Aggregate tokens/s of the plain llama.cpp loop (prefill + lockstep argmax decode)."""
    conv = Conversation(model, system=SYSTEM)
    ids = [conv.prompt_ids(p) for p in prompts(n)]
    model.clear()
    last = []
    for s, p in enumerate(ids):
        last.append(int(np.argmax(model.prefill(s, p))))
    pos = [len(p) for p in ids]
    t0 = time.perf_counter()  # decode only: the limit of one-token-per-sequence steps
    for _ in range(tokens - 1):
        rows = model.decode([SeqChunk(s, pos[s], (last[s],)) for s in range(n)])
        for s in range(n):
            last[s] = int(np.argmax(rows[s][0]))
            pos[s] += 1
    elapsed = time.perf_counter() - t0
    model.clear()
    return n * (tokens - 1) / elapsed


def run_chatkit(model: Model, n: int, tokens: int, lockstep: bool, schema: Any) -> float:
    model.clear()
    convs = conversations(model, n)
    opts: dict[str, Any] = {"max_tokens": tokens}
    if schema is not None:
        opts["schema"] = schema
    t0 = time.perf_counter()
    if lockstep:
        replies = send_batch([(c, p) for c, p in zip(convs, prompts(n), strict=True)],
                             return_exceptions=True, **opts)
    else:
        replies = []
        for c, p in zip(convs, prompts(n), strict=True):
            try:
                replies.append(c.send(p, **opts))
            except Exception as exc:  # Truncated is expected: the budget ends the reply
                replies.append(exc)
    elapsed = time.perf_counter() - t0
    produced = sum(r.usage.completion_tokens if hasattr(r, "usage") else tokens for r in replies)
    return produced / elapsed


def lockstep_decode_only(model: Model, n: int, tokens: int, schema: Any) -> float:
    """Decode-phase tokens/s of send_batch: a full run minus a 1-token run (the prefill)."""
    def timed(budget: int) -> float:
        model.clear()
        opts: dict[str, Any] = {"max_tokens": budget}
        if schema is not None:
            opts["schema"] = schema
        convs = conversations(model, n)
        t0 = time.perf_counter()
        send_batch([(c, p) for c, p in zip(convs, prompts(n), strict=True)],
                   return_exceptions=True, **opts)
        return time.perf_counter() - t0

    return n * (tokens - 1) / max(1e-9, timed(tokens) - timed(1))


def quorum_prefix(model: Model, lanes: int) -> tuple[float, float]:
    """Seconds to prefill ``lanes`` copies of one prompt: shared once + seq_cp vs each alone."""
    conv = Conversation(model, system=SYSTEM * 4)
    ids = conv.prompt_ids("Review this change: it deletes all tests.")
    model.clear()
    t0 = time.perf_counter()
    model.prefill(0, ids[:-1])
    for s in range(1, lanes):
        model.seq_cp(0, s, 0, len(ids) - 1)
    for s in range(lanes):
        model.decode([SeqChunk(s, len(ids) - 1, ids[-1:])])
    shared = time.perf_counter() - t0
    model.clear()
    t0 = time.perf_counter()
    for s in range(lanes):
        model.prefill(s, ids)
    alone = time.perf_counter() - t0
    model.clear()
    return shared, alone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model = Model.load(n_ctx=8192, n_seq_max=8, kv_unified=True)  # lanes copy the prefix
    ns = [1, 2, 4, 8]
    cols = ["raw", "lock_unc", "seq_unc", "lock_con", "seq_con", "lock_dec"]
    res: dict[tuple[int, str], list[float]] = {(n, c): [] for n in ns for c in cols}
    run_chatkit(model, 2, 8, True, SCHEMA)  # warm-up (compiles the schema once)
    for _ in range(args.reps):
        for n in ns:
            res[(n, "raw")].append(raw(model, n, args.tokens))
            res[(n, "lock_unc")].append(run_chatkit(model, n, args.tokens, True, None))
            res[(n, "seq_unc")].append(run_chatkit(model, n, args.tokens, False, None))
            res[(n, "lock_con")].append(run_chatkit(model, n, args.tokens, True, SCHEMA))
            res[(n, "seq_con")].append(run_chatkit(model, n, args.tokens, False, SCHEMA))
            res[(n, "lock_dec")].append(lockstep_decode_only(model, n, args.tokens, None))
    med = {k: statistics.median(v) for k, v in res.items()}
    print(f"{date.today()}, SmolLM2-135M Q4_1, 2 cores; {args.tokens} tokens per conversation, "
          f"end to end, median of {args.reps}")
    print("| N | raw decode limit tok/s | lockstep decode tok/s | lockstep/raw "
          "| lockstep e2e tok/s | sequential e2e tok/s | lockstep/sequential "
          "| constrained lockstep e2e tok/s | constrained/unconstrained |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in ns:
        r, ld = med[(n, "raw")], med[(n, "lock_dec")]
        lu, su, lc = med[(n, "lock_unc")], med[(n, "seq_unc")], med[(n, "lock_con")]
        print(f"| {n} | {r:.1f} | {ld:.1f} | {ld / r:.2f} | {lu:.1f} | {su:.1f} "
              f"| {lu / su:.2f} | {lc:.1f} | {lc / lu:.2f} |")
    print()
    print("| lanes | prefix once + seq_cp | independent prefills | speed-up |")
    print("|---|---|---|---|")
    for lanes in (2, 4, 8):
        times = [quorum_prefix(model, lanes) for _ in range(args.reps)]
        shared = statistics.median(t[0] for t in times)
        alone = statistics.median(t[1] for t in times)
        print(f"| {lanes} | {shared * 1000:.0f} ms | {alone * 1000:.0f} ms "
              f"| {alone / shared:.2f}x |")


if __name__ == "__main__":
    main()
