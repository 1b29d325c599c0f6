"""Do replies depend on what else runs on the model? Greedy, the fixture schemas.

Each schema's reply is produced alone (one conversation on a fresh model), then with all of
them at once: from one thread each, from one anyio task each, and through send_batch; also
speculative against plain. Counts replies equal to the alone reply, for the unified KV cache
(llama.cpp's cells shared by every sequence) and for per-sequence KV streams
(``kv_unified=False``, chatkit's default).

    python3 dev.py bench reproducible
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from datetime import date
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import Conversation, Model, send_batch  # noqa: E402

SCHEMAS = sorted((ROOT / "tests" / "fixtures" / "schemas").glob("*.json"))
PROMPT = "Give one example value, as JSON."


def schema(i: int) -> dict[str, Any]:
    return json.loads(SCHEMAS[i].read_text())  # type: ignore[no-any-return]


def reply_text(conv: Conversation, i: int, **kw: Any) -> str:
    try:
        return conv.send(PROMPT, schema=schema(i), max_tokens=96, **kw).text
    except Exception as exc:  # a Truncated reply still has a comparable text
        return f"{type(exc).__name__}:{getattr(exc, 'text', '')}"


def run(unified: bool, n: int) -> dict[str, int]:
    model = Model.load(n_ctx=4096, n_seq_max=n, kv_unified=unified)
    alone = [reply_text(Conversation(model), i) for i in range(n)]
    again = [reply_text(Conversation(model), i) for i in range(n)]
    threaded: list[str] = [""] * n

    def worker(i: int) -> None:
        threaded[i] = reply_text(Conversation(model), i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tasked: list[str] = [""] * n

    async def tasks() -> None:
        async def one(i: int) -> None:
            try:
                r = await Conversation(model).asend(PROMPT, schema=schema(i), max_tokens=96)
                tasked[i] = r.text
            except Exception as exc:
                tasked[i] = f"{type(exc).__name__}:{getattr(exc, 'text', '')}"

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)

    anyio.run(tasks)
    batch = send_batch([(Conversation(model), PROMPT, {"schema": schema(i)}) for i in range(n)],
                       max_tokens=96, return_exceptions=True)
    batched = [getattr(r, "text", f"{type(r).__name__}:{getattr(r, 'text', '')}")
               for r in batch]
    spec = [reply_text(Conversation(model), i, speculative=True) for i in range(n)]
    model.close()
    return {name: sum(a == b for a, b in zip(alone, got, strict=True))
            for name, got in (("alone twice", again), ("threads", threaded),
                              ("tasks", tasked), ("send_batch", batched),
                              ("speculative", spec))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", type=int, default=8)
    args = ap.parse_args()
    n = min(args.n, len(SCHEMAS))
    rows = {"unified KV (kv_unified=True)": run(True, n),
            "KV stream per sequence (kv_unified=False)": run(False, n)}
    print(f"{date.today()}, SmolLM2-135M Q4_1, greedy, {n} fixture schemas, max 96 tokens; "
          f"replies equal to the same reply sent alone")
    cols = list(next(iter(rows.values())))
    print("| KV cache | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[c]}/{n}" for c in cols) + " |")


if __name__ == "__main__":
    main()
