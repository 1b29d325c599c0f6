"""A 48-token reply on a quiet and on a busy machine, per thread setting.

Each configuration runs in a fresh process (llama.cpp's OpenMP threads read their
waiting policy when the library loads): load SmolLM2, prefill, 48 greedy tokens; the
figure is the wall time of the reply (load excluded), median of the repetitions. "busy"
runs 1 or 2 CPU-bound Python processes (a tight loop each) beside it, on this 2-core machine.

    python3 dev.py bench contention [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from chatkit import Conversation, Model
threads = None if sys.argv[2] == "default" else int(sys.argv[2])
model = Model.load(n_ctx=512, n_seq_max=1, n_threads=threads)
conv = Conversation(model)
t0 = time.perf_counter()
reply = conv.send("Write a long story about a lighthouse keeper.", max_tokens=48)
print(json.dumps({"seconds": time.perf_counter() - t0, "tokens": reply.usage.completion_tokens,
                  "threads": model.n_threads}))
"""

# (label, thread count or "default", extra environment)
CONFIGS = [
    ("chatkit default: all cores, GOMP_SPINCOUNT=1000", "default", {}),
    ("all cores, libgomp's default spin (300,000)", "default", {"GOMP_SPINCOUNT": "300000"}),
    ("all cores, OMP_WAIT_POLICY=PASSIVE", "default", {"OMP_WAIT_POLICY": "PASSIVE"}),
    ("all cores, GOMP_SPINCOUNT=100", "default", {"GOMP_SPINCOUNT": "100"}),
    ("1 thread", "1", {}),
]


def hog(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def run(threads: str, env: dict[str, str]) -> dict[str, float]:
    full = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), threads], env=full,
                         capture_output=True, text=True, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    results: dict[tuple[str, int], list[float]] = {}
    threads_used: dict[str, int] = {}
    for hogs in (0, 1, 2):
        for _ in range(args.reps):
            for label, threads, env in CONFIGS:
                procs = [multiprocessing.Process(target=hog, args=(time.time() + 600,))
                         for _ in range(hogs)]
                for p in procs:
                    p.start()
                try:
                    r = run(threads, env)
                finally:
                    for p in procs:
                        p.terminate()
                        p.join()
                results.setdefault((label, hogs), []).append(r["seconds"])
                threads_used[label] = int(r["threads"])
    print(f"{date.today()}, {os.cpu_count()} cores; SmolLM2-135M Q4_1, 48 greedy tokens "
          f"(load excluded), median of {args.reps}; busy = N CPU-bound processes beside it")
    print("| threads / waiting | quiet | 1 busy process | 2 busy processes | worst / quiet |")
    print("|---|---|---|---|---|")
    for label, _, _ in CONFIGS:
        med = [statistics.median(results[(label, h)]) for h in (0, 1, 2)]
        worst = max(max(results[(label, h)]) for h in (1, 2))
        print(f"| {label} ({threads_used[label]} thr) | {med[0]:.2f} s | {med[1]:.2f} s "
              f"| {med[2]:.2f} s | {worst / med[0]:.1f}x |")


if __name__ == "__main__":
    main()
