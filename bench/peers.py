"""Side by side with the peers: chatkit vs llama-cpp-python's GBNF grammars and outlines.

    python3 dev.py bench peers [--schemas N] [--max-tokens N] [--reps N] [--plot PNG]

For the fixture schemas, on SmolLM2 (49k vocab) and Gemma-3-270M (262k), greedy,
same max tokens, one run, all engines in one process on the same GGUF, the
schemas x engines loop repeated (default 3 times) and medians reported:

- llama.cpp's raw loop (``llama_decode`` + argmax, nothing else): the limit,
- llama-cpp-python unconstrained (its high-level completion API),
- llama-cpp-python constrained (``LlamaGrammar.from_json_schema``, GBNF),
- outlines 1.x on llama-cpp-python (``outlines.from_llamacpp``, ``JsonSchema``,
  its default outlines-core backend); its unconstrained baseline is
  llama-cpp-python's, the engine it drives,
- chatkit unconstrained, constrained, constrained + speculative.

Columns: time to first token (grammar compile included; one-time per-model
set-up such as tokenizer tables and numba's JIT is warmed up first and printed
apart), output tokens/s, ratio to the same engine's unconstrained run, and how
many outputs validate with ``jsonschema``.

outlines runs its mask inside llama-cpp-python's sampler callback, where an
exception (e.g. numba missing) is swallowed and generation goes on
unconstrained. So every outlines step is checked: the processor must run once
per sampled token and leave at least one token masked, else the run is
reported as NOT CONSTRAINED. The outlines and matplotlib packages come from
the ``bench`` extra (``dev.py bench`` installs it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import os
import platform
import statistics
import time
from datetime import date
from pathlib import Path
from typing import Any

import jsonschema
import llama_cpp
import numpy as np
from decode import gemma_path, raw_loop

from chatkit import Constraint, Model, Sampler, generate
from chatkit.engine.compute import run_on_compute

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = sorted((ROOT / "tests" / "fixtures" / "schemas").glob("*.json"))
WARMUP_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}},
                 "required": ["ok"]}
_KV: dict[int, list[int]] = {}
KEYS = [("llama.cpp", "raw decode loop"),
        ("llama-cpp-python", "unconstrained"), ("llama-cpp-python", "GBNF json_schema"),
        ("outlines", "JsonSchema (outlines-core)"),
        ("chatkit", "unconstrained"), ("chatkit", "constrained"),
        ("chatkit", "constrained + speculative")]
# What each row's ratio divides by: the same engine unconstrained (outlines drives
# llama-cpp-python's sampler, so that is its baseline).
BASELINE = {"llama.cpp": KEYS[0], "llama-cpp-python": KEYS[1], "outlines": KEYS[1],
            "chatkit": KEYS[4]}


def prompt_text(schema: dict[str, Any], chat: bool) -> str:
    text = "Answer with one JSON value for this schema: " + json.dumps(schema)
    if chat:
        return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return text + "\nJSON: "


def valid(text: str, schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


class OutlinesGuard:
    """Counts outlines' processor calls and the steps it really masked (see the docstring)."""

    def __init__(self) -> None:
        from outlines.backends.outlines_core import OutlinesCoreLogitsProcessor

        self.cls = OutlinesCoreLogitsProcessor
        self.original = OutlinesCoreLogitsProcessor.process_logits
        self.calls = self.masked = self.errors = 0
        guard = self

        def process_logits(proc: Any, input_ids: Any, logits: Any) -> Any:
            guard.calls += 1
            try:
                out = guard.original(proc, input_ids, logits)
            except BaseException:
                guard.errors += 1
                raise
            guard.masked += bool(np.isneginf(out).any())
            return out

        self.cls.process_logits = process_logits  # type: ignore[method-assign]

    def constrained(self, tokens: int) -> bool:
        return self.errors == 0 and self.calls >= tokens and self.masked == self.calls

    def reset(self) -> None:
        self.calls = self.masked = self.errors = 0


def stream_run(chunks: Any, t0: float) -> dict[str, Any]:
    """Times a llama-cpp-python text stream: one chunk per sampled token (stop tokens are
    not yielded), then one closing chunk with the finish reason, not counted."""
    first = None
    parts = []
    for chunk in chunks:
        if first is None:
            first = time.perf_counter() - t0
        parts.append(chunk)
    total = time.perf_counter() - t0
    first = first if first is not None else total
    return {"ttft": first, "tokens": len(parts) - 1, "decode_s": max(1e-9, total - first),
            "text": "".join(parts)}


def llama_cpp_run(llm: Any, prompt: str, schema: dict[str, Any] | None,
                  max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    grammar = None
    if schema is not None:
        with contextlib.redirect_stderr(io.StringIO()):
            grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    chunks = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0,
                                   grammar=grammar, stream=True)
    return stream_run((c["choices"][0]["text"] for c in chunks), t0)


def outlines_run(om: Any, guard: OutlinesGuard, prompt: str, schema: dict[str, Any],
                 max_tokens: int) -> dict[str, Any]:
    import outlines
    from outlines.types import JsonSchema

    guard.reset()
    t0 = time.perf_counter()
    gen = outlines.Generator(om, JsonSchema(json.dumps(schema)))
    r = stream_run(gen.stream(prompt, max_tokens=max_tokens, temperature=0.0), t0)
    r["constrained"] = guard.constrained(r["tokens"])
    return r


def ours_run(model: Model, prompt: str, schema: dict[str, Any] | None, max_tokens: int,
             speculative: bool) -> dict[str, Any]:
    from chatkit.decode.speculative import ConstrainedSource, PromptLookupSource

    t0 = time.perf_counter()
    c = Constraint.json_schema(schema, model=model) if schema is not None else None
    ids = model.tokenize(prompt, special=True, add_bos=model.add_bos)
    draft = (ConstrainedSource(c, PromptLookupSource()) if c is not None else None) \
        if speculative else None
    # Reuse the cached prompt prefix, as llama-cpp-python's Llama does between calls.
    cached = _KV.get(id(model), [])
    reuse = 0
    while reuse < min(len(cached), len(ids)) and cached[reuse] == ids[reuse]:
        reuse += 1
    gen = generate(model, ids, Sampler(processor=c), max_tokens=max_tokens, draft=draft,
                   reuse=reuse)
    _KV[id(model)] = gen.kv_tokens
    total = time.perf_counter() - t0
    first = (gen.first_token_seconds + (total - gen.seconds))
    return {"ttft": first, "tokens": len(gen.tokens), "decode_s": max(1e-9, total - first),
            "text": gen.text}


def raw_run(model: Model, prompt: str, max_tokens: int) -> dict[str, Any]:
    ids = model.tokenize(prompt, special=True, add_bos=model.add_bos)
    ms = raw_loop(model, ids, max_tokens)
    _KV[id(model)] = []  # the raw loop cleared the cache
    return {"ttft": float("nan"), "tokens": max_tokens - 1,
            "decode_s": ms * (max_tokens - 1) / 1000, "text": ""}


def run(key: tuple[str, str], schema: dict[str, Any], prompt: str, max_tokens: int,
        model: Model, llm: Any, om: Any, guard: OutlinesGuard) -> dict[str, Any]:
    engine, mode = key
    constrained = None if mode in {"unconstrained", "raw decode loop"} else schema
    # The peers run on chatkit's compute thread: libgomp keeps a thread team per thread that
    # has decoded, and two live teams slow each other 2-3x (chatkit/engine/compute.py).
    if engine == "llama.cpp":
        return run_on_compute(raw_run, model, prompt, max_tokens)
    if engine == "chatkit":
        return ours_run(model, prompt, constrained, max_tokens, "speculative" in mode)
    if engine == "outlines":
        return run_on_compute(outlines_run, om, guard, prompt, schema, max_tokens)
    return run_on_compute(llama_cpp_run, llm, prompt, constrained, max_tokens)


def bench_model(path: Path | None, schemas: list[tuple[str, dict[str, Any]]], max_tokens: int,
                reps: int, threads: int, guard: OutlinesGuard
                ) -> tuple[list[dict[str, Any]], list[str]]:
    import outlines

    model = Model.load(path, n_ctx=2048, n_seq_max=1, n_threads=threads)
    chat = bool(model.chat_template)
    with contextlib.redirect_stderr(io.StringIO()):
        llm = llama_cpp.Llama(str(model.path), n_ctx=2048, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
    t = time.perf_counter()
    om = outlines.from_llamacpp(llm, chat_mode=False)
    setup = {"outlines": time.perf_counter() - t}
    # One untimed warm-up per engine: tokenizer tables, numba's JIT, first-call paths.
    warm = prompt_text(WARMUP_SCHEMA, chat)
    for key in KEYS:
        t = time.perf_counter()
        run(key, WARMUP_SCHEMA, warm, 8, model, llm, om, guard)
        setup.setdefault(key[0], 0.0)
        setup[key[0]] += time.perf_counter() - t
    # reps x schemas x engines, interleaved; a rate is total tokens / total decode seconds
    # over one repetition's schemas, and the table shows medians over repetitions.
    res: dict[tuple[str, str], list[list[dict[str, Any]]]] = {k: [] for k in KEYS}
    for _ in range(reps):
        for runs in res.values():
            runs.append([])
        for name, schema in schemas:
            prompt = prompt_text(schema, chat)
            for key in KEYS:
                r = run(key, schema, prompt, max_tokens, model, llm, om, guard)
                r["valid"] = valid(r["text"], schema)
                r["cut"] = not r["valid"] and r["tokens"] >= max_tokens
                r["schema"] = name
                res[key][-1].append(r)
    rates = {k: [sum(r["tokens"] for r in rep) / sum(r["decode_s"] for r in rep) for rep in v]
             for k, v in res.items()}
    rows = []
    for (engine, mode), reps_runs in res.items():
        first = reps_runs[0]  # greedy: every repetition writes the same text
        ttfts = sorted(r["ttft"] for rep in reps_runs for r in rep)
        constrained = mode not in {"unconstrained", "raw decode loop"}
        base = rates[BASELINE[engine]]
        rows.append({
            "model": model.name, "engine": engine, "mode": mode,
            "ttft_ms": ttfts[len(ttfts) // 2] * 1000,
            "tok_s": statistics.median(rates[(engine, mode)]),
            "ratio": statistics.median(a / b for a, b in zip(rates[(engine, mode)], base,
                                                             strict=True)),
            "valid": sum(r["valid"] for r in first) if constrained else None,
            "n": len(first),
            "unmasked": sum(not r.get("constrained", True) for rep in reps_runs for r in rep),
            "cut": sum(r["cut"] for r in first),
        })
    notes = [f"{model.name}: one-time set-up (warm-up call incl. model-specific tables/JIT): "
             + ", ".join(f"{k} {v:.2f} s" for k, v in setup.items())]
    for (engine, mode), reps_runs in res.items():
        wrong = [f"{r['schema']}: {r['text'][:70]!r}" for r in reps_runs[0]
                 if mode not in {"unconstrained", "raw decode loop"}
                 and not r["valid"] and not r["cut"]]
        if wrong:
            notes.append(f"  {engine} {mode}: complete but invalid: " + "; ".join(wrong))
    llm.close()
    model.close()
    return rows, notes


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| model | engine | mode | median TTFT incl. compile | output tok/s "
           "| vs same engine unconstrained | valid |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        ttft = "-" if r["ttft_ms"] != r["ttft_ms"] else f"{r['ttft_ms']:.0f} ms"
        ok = "-" if r["valid"] is None else f"{r['valid']}/{r['n']}"
        if r["valid"] is not None and r["cut"]:
            ok += f" ({r['cut']} cut at max tokens)"
        if r["unmasked"]:
            ok += f" (NOT CONSTRAINED on {r['unmasked']} runs)"
        out.append(f"| {r['model']} | {r['engine']} | {r['mode']} | {ttft} "
                   f"| {r['tok_s']:.1f} | {r['ratio']:.2f}x | {ok} |")
    return out


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    series = list(dict.fromkeys((r["engine"], r["mode"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    width = 0.8 / len(series)
    colors = plt.get_cmap("tab10").colors
    for i, key in enumerate(series):
        vals = [next(r["tok_s"] for r in rows if r["model"] == m
                     and (r["engine"], r["mode"]) == key) for m in models]
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(models))]
        bars = ax.bar(xs, vals, width, label=f"{key[0]}: {key[1]}", color=colors[i % 10])
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(models)), [m.removesuffix(".gguf") for m in models])
    ax.set_ylabel("output tokens/s (greedy, higher is better)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--schemas", type=int, default=len(SCHEMAS))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--plot", type=Path, default=ROOT / "bench" / "out" / "peers.png",
                    help="where the plot goes (the README's is docs/peers.png: pass it to "
                         "update it; the default is untracked)")
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
        import numba  # noqa: F401  (outlines-core's numpy kernels need it)
        import outlines  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"bench peers needs the bench extra ({exc}); "
                         "run it as `python3 dev.py bench peers`") from exc
    schemas = [(p.stem, json.loads(p.read_text())) for p in SCHEMAS[: args.schemas]]
    threads = os.cpu_count() or 2
    guard = OutlinesGuard()
    title = (f"{date.today()}, {platform.machine()}, {threads} cores; greedy, "
             f"{len(schemas)} fixture schemas x {args.reps} reps, max {args.max_tokens} tokens; "
             f"llama-cpp-python {llama_cpp.__version__}, "
             f"outlines {importlib.metadata.version('outlines')}")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for path in (None, gemma_path()):
        r, n = bench_model(path, schemas, args.max_tokens, args.reps, threads, guard)
        rows += r
        notes += n
    print(title + "; tok/s = median over reps of (tokens / decode seconds, all schemas)")
    print("\n".join(markdown(rows)))
    print("\n".join(notes))
    plot(rows, args.plot, title)
    print(f"plot: {args.plot.relative_to(ROOT) if args.plot.is_relative_to(ROOT) else args.plot}")


if __name__ == "__main__":
    main()
