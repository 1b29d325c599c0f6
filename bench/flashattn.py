"""Flash attention on and off, paired: what ``chatkit serve``'s CPU default rests on.

    python3 dev.py bench flashattn [--tokens N] [--model gemma|smollm2] [--decode N]

``chatkit serve`` turns llama.cpp's flash attention off on the CPU with a stream per sequence
(``chatkit/serve/sizing.py``), because llama.cpp's matmul attention prefilled an agent's long
prompt faster there (docs/benchmarks.md, "Flash attention on the CPU"). This measures it on
the host at hand. Two contexts of one model are loaded side by side, flash attention on and
off, each a stream of ``--tokens`` cells; one prompt of that length is evaluated in 512-token
steps, the two contexts alternating step by step (the one that goes first alternating too), so
the host's drift hits both alike. Printed: seconds per quarter of the prompt and in all,
prefill tokens/s, then decoding ``--decode`` tokens one at a time at that depth (greedy),
alternating likewise, and what serve's rule decides for this model and length.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import Model, SeqChunk, build_info  # noqa: E402
from chatkit.engine.gguf_header import attention_heads  # noqa: E402
from chatkit.serve import sizing  # noqa: E402

STEP = 512


def model_path(name: str) -> Path | None:
    """The model's GGUF (None: the embedded default, SmolLM2)."""
    from tests.conftest import gemma_path

    return gemma_path() if name == "gemma" else None


def order(i: int) -> tuple[bool, bool]:
    """Which context goes first at step ``i`` (flash attention on, off): alternating."""
    return (True, False) if i % 2 == 0 else (False, True)


def prompt_tokens(model: Model, n: int) -> list[int]:
    text = ("def read(path):\n    with open(path) as f:\n        return f.read()\n"
            "# The tests run after every change; a failing one is read before the fix.\n")
    tokens = model.tokenize(text * (n // 20 + 1), special=False)[:n]
    assert len(tokens) == n, "the prompt is shorter than asked"
    return tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=16_384, help="prompt length (cells a context)")
    ap.add_argument("--model", choices=["gemma", "smollm2"], default="gemma")
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded at depth")
    args = ap.parse_args()
    path = model_path(args.model)
    n_ctx = args.tokens + args.decode + 8
    models = {fa: Model.load(path, n_ctx=n_ctx, n_seq_max=1, n_batch=STEP, flash_attn=fa)
              for fa in (True, False)}
    heads = attention_heads(models[True].path)
    try:
        tokens = prompt_tokens(models[True], args.tokens)
        quarter = -(-len(tokens) // 4)
        spent = {fa: [0.0] * 4 for fa in models}
        last = {fa: np.zeros(0, dtype=np.float32) for fa in models}
        for i, start in enumerate(range(0, len(tokens), STEP)):
            chunk = tokens[start:start + STEP]
            for fa in order(i):
                t0 = time.perf_counter()
                rows = models[fa].decode([SeqChunk(0, start, chunk, "last")])
                spent[fa][start // quarter] += time.perf_counter() - t0
                last[fa] = rows[0][0]
        tok = {fa: int(np.argmax(last[fa])) for fa in models}
        decode = {fa: 0.0 for fa in models}
        for i in range(args.decode):
            for fa in order(i):
                t0 = time.perf_counter()
                row = models[fa].decode([SeqChunk(0, len(tokens) + i, [tok[fa]], "last")])[0][0]
                decode[fa] += time.perf_counter() - t0
                tok[fa] = int(np.argmax(row))
    finally:
        for m in models.values():
            m.close()
    layout = sizing.kv_layout(None, reproducible=False, cache_seqs=None, ctx_per_seq=n_ctx,
                              n_seq_max=1)
    choice, why = sizing.flash_attn(None, layout=layout, ctx_per_seq=n_ctx, heads=heads,
                                    on_gpu=False)
    info = build_info()
    cpu = next((d.description for d in info.devices if d.kind == "cpu"), platform.machine())
    print(f"{date.today()}, {args.model}, {cpu}, AMX kernels "
          f"{'in' if info.amx_kernels else 'not in'} this build")
    print(f"prompt {len(tokens)} tokens in {STEP}-token steps, alternating; "
          f"decode {args.decode} tokens at depth")
    print("| flash attention | " + " | ".join(f"quarter {q + 1} s" for q in range(4))
          + " | prefill s | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for fa in models:
        total = sum(spent[fa])
        print(f"| {'on' if fa else 'off'} | "
              + " | ".join(f"{s:.2f}" for s in spent[fa])
              + f" | {total:.2f} | {len(tokens) / total:.0f} | {args.decode / decode[fa]:.1f} |")
    prefill = sum(spent[True]) / sum(spent[False])
    print(f"speed with flash attention off, against on: prefill {prefill:.3f}x, "
          f"decode {decode[True] / decode[False]:.3f}x")
    print(f"chatkit serve's rule here: {choice} ({why})")


if __name__ == "__main__":
    main()
