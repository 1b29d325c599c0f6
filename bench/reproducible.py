"""Do replies depend on what else runs on the model? Greedy, the fixture schemas.

Each schema's reply is produced alone (one conversation on a fresh model), then with all of
them at once: from one thread each, from one anyio task each, and through send_batch; also
speculative against plain. Counts replies equal to the alone reply, for the unified KV cache
(llama.cpp's cells shared by every sequence) and for per-sequence KV streams
(``kv_unified=False``, chatkit's default). First, the premise: a prompt's last logits when it
is prefilled in chunks of 1 to 32 rows, against 32 (``Model.prefill``'s default): the sizes
that give the same logits. Where some do not (Gemma 3 270M on the build measured), a
reply's logits depend on how its prompt was split into steps, so a prompt resumed from a
cached prefix, or prefilled beside other turns, can differ from the same prompt alone.
``--batch-invariant`` loads the model with ``Model.load(batch_invariant=True)`` (llama.cpp's
CPU kernels that keep a row's logits whatever the rows beside it: needed for K-quant weights,
such as Gemma's Q4_K_M, and for attention past ~256 cells). ``--context N`` puts a system
prompt of about N tokens before each request, so the replies decode past that.

    python3 dev.py bench reproducible [--model smollm2|gemma] [--batch-invariant]
                                      [--context N] [-n N]
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

MODELS = {"smollm2": "SmolLM2-135M Q4_1", "gemma": "Gemma-3 270M Q4_K_M"}

SCHEMAS = sorted((ROOT / "tests" / "fixtures" / "schemas").glob("*.json"))
PROMPT = "Give one example value, as JSON."


def schema(i: int) -> dict[str, Any]:
    return json.loads(SCHEMAS[i].read_text())  # type: ignore[no-any-return]


def rules(tokens: int) -> str | None:
    """A system prompt of about ``tokens`` tokens (None for 0)."""
    if tokens <= 0:
        return None
    return "Answer with these rules in mind. " + " ".join(
        f"Rule {i}: run the tests after change {i}." for i in range(tokens // 14 + 1))


def reply_text(conv: Conversation, i: int, **kw: Any) -> str:
    try:
        return conv.send(PROMPT, schema=schema(i), max_tokens=96, **kw).text
    except Exception as exc:  # a Truncated reply still has a comparable text
        return f"{type(exc).__name__}:{getattr(exc, 'text', '')}"


def model_path(name: str) -> Path | None:
    """The model's GGUF (None: the embedded default, SmolLM2)."""
    from tests.conftest import gemma_path

    return gemma_path() if name == "gemma" else None


def chunkings(path: Path | None, n_tokens: int = 600, invariant: bool = False) -> list[int]:
    """The chunk sizes (1-32) whose prefill of one prompt ends in the logits 32 gives."""
    model = Model.load(path, n_ctx=1024, n_seq_max=1, batch_invariant=invariant)
    text = "Rules follow. " + "Run the tests after a change. " * 120
    prompt = model.tokenize(text, special=False)[:n_tokens]
    model.seq_rm(0)
    ref = model.prefill(0, prompt, chunk=32)
    same = []
    for chunk in range(1, 33):
        model.seq_rm(0)
        if (model.prefill(0, prompt, chunk=chunk) == ref).all():
            same.append(chunk)
    model.close()
    return same


def run(path: Path | None, unified: bool, n: int, invariant: bool,
        context: int = 0) -> dict[str, int]:
    model = Model.load(path, n_ctx=n * (512 + context), n_seq_max=n, kv_unified=unified,
                       batch_invariant=invariant)
    system = rules(context)

    def conv() -> Conversation:
        return Conversation(model, system=system)

    alone = [reply_text(conv(), i) for i in range(n)]
    again = [reply_text(conv(), i) for i in range(n)]
    threaded: list[str] = [""] * n

    def worker(i: int) -> None:
        threaded[i] = reply_text(conv(), i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tasked: list[str] = [""] * n

    async def tasks() -> None:
        async def one(i: int) -> None:
            try:
                r = await conv().asend(PROMPT, schema=schema(i), max_tokens=96)
                tasked[i] = r.text
            except Exception as exc:
                tasked[i] = f"{type(exc).__name__}:{getattr(exc, 'text', '')}"

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)

    anyio.run(tasks)
    batch = send_batch([(conv(), PROMPT, {"schema": schema(i)}) for i in range(n)],
                       max_tokens=96, return_exceptions=True)
    batched = [getattr(r, "text", f"{type(r).__name__}:{getattr(r, 'text', '')}")
               for r in batch]
    spec = [reply_text(conv(), i, speculative=True) for i in range(n)]
    model.close()
    return {name: sum(a == b for a, b in zip(alone, got, strict=True))
            for name, got in (("alone twice", again), ("threads", threaded),
                              ("tasks", tasked), ("send_batch", batched),
                              ("speculative", spec))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--batch-invariant", action="store_true")
    ap.add_argument("--context", type=int, default=0,
                    help="tokens of system prompt before each request (about)")
    args = ap.parse_args()
    n = min(args.n, len(SCHEMAS))
    path = model_path(args.model)
    inv = args.batch_invariant
    same = chunkings(path, invariant=inv)
    ctx = args.context
    rows = {"unified KV (kv_unified=True)": run(path, True, n, inv, ctx),
            "KV stream per sequence (kv_unified=False)": run(path, False, n, inv, ctx)}
    kernels = "batch-invariant kernels" if inv else "llama.cpp's default kernels"
    print(f"{date.today()}, {MODELS[args.model]}, {kernels}: a 600-token prompt prefilled in "
          f"chunks of 1-32 rows ends in the logits 32-row chunks give for {len(same)} of 32 sizes: "
          f"{', '.join(map(str, same))}")
    print(f"{date.today()}, {MODELS[args.model]}, {kernels}, greedy, {n} fixture schemas, "
          f"a system prompt of ~{ctx} tokens, max 96 tokens; replies equal to the same reply "
          f"sent alone")
    cols = list(next(iter(rows.values())))
    print("| KV cache | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in rows.items():
        print(f"| {name} | " + " | ".join(f"{r[c]}/{n}" for c in cols) + " |")


if __name__ == "__main__":
    main()
