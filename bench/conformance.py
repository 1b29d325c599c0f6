"""Conformance replay: does the Constraint accept exactly the valid instances?

    python3 dev.py bench conformance [--suite] [--maskbench] [--limit N]

For each schema of the JSON-Schema-Test-Suite (draft2020-12; ``optional/`` and
remote refs excluded: network) and of MaskBench (real-world schemas): compile
with chatkit (a refusal means "not covered"), then feed every instance,
serialised compactly and tokenized with SmolLM2, through the Constraint. A
valid instance must be accepted to completion; an invalid one rejected.
Reported: coverage, passes, false accepts (invalid accepted: must be 0 or
explained) and false rejects (often serialisation: e.g. ``1.0`` for an
integer), plus compile and mask times beside raw llguidance on the same schemas and states.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np

from chatkit import ChatkitError, Constraint, Model, SchemaInvalid
from chatkit.grammar import meta_schema as schema_module
from chatkit.grammar.schema import json_options

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ROOT / "bench" / "corpora"


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def accepts(c: Constraint, model: Model, text: str) -> bool:
    """Accepted: the grammar takes every token and ends, and (a schema with value checks)
    every check passes at the value boundaries the tokens cross, the stop token's
    included."""
    return c.accepts(model.tokenize(text, special=False))


class Tally:
    def __init__(self) -> None:
        self.groups = 0
        self.covered = 0
        self.instances = 0
        self.passes = 0
        self.false_accepts: list[str] = []
        self.false_rejects: list[str] = []
        self.refusals: dict[str, int] = defaultdict(int)
        self.invalid: list[str] = []
        """Each schema refused as invalid, with the reason (a valid one is a bug)."""

    def row(self, name: str) -> str:
        return (f"| {name} | {self.covered}/{self.groups} | {self.passes}/{self.instances} "
                f"| {len(self.false_accepts)} | {len(self.false_rejects)} |")


def raw_compile(model: Model, schema: Any) -> float | None:
    """Seconds raw llguidance takes to compile ``schema`` and build the model's matcher (the
    same compile options as chatkit), or None if it fails."""
    tok = model.llg_tokenizer(model.eot_id)
    t0 = time.perf_counter()
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), overrides=json_options())  # type: ignore[arg-type]
        matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    except ValueError:
        return None
    elapsed = time.perf_counter() - t0
    return None if matcher.is_error() else elapsed


COMPILE_ROUNDS = 5


def compile_times(model: Model, schema: Any) -> tuple[float, float] | None:
    """Median seconds, over ``COMPILE_ROUNDS`` alternating rounds, of chatkit's compile (each
    time as a schema new to the process: the meta-schema check's memo cleared) and of raw
    llguidance's; None if llguidance fails."""
    ours: list[float] = []
    raw: list[float] = []
    for r in range(COMPILE_ROUNDS):
        for side in ("raw", "ours") if r % 2 else ("ours", "raw"):
            if side == "raw":
                elapsed = raw_compile(model, schema)
                if elapsed is None:
                    return None
                raw.append(elapsed)
            else:
                schema_module._checked_keys.clear()
                t0 = time.perf_counter()
                Constraint.json_schema(schema, model=model)
                ours.append(time.perf_counter() - t0)
    return statistics.median(ours), statistics.median(raw)


def replay(model: Model, schema: Any, tests: list[tuple[Any, bool, str]], tally: Tally,
           times: dict[str, list[float]] | None = None, name: str = "") -> None:
    tally.groups += 1
    try:
        c = Constraint.json_schema(schema, model=model)
    except ChatkitError as exc:
        tally.refusals[type(exc).__name__ + ":" + str(getattr(exc, "keyword", ""))] += 1
        if isinstance(exc, SchemaInvalid):
            reason = " ".join(str(exc).split())
            tally.invalid.append(f"{name}: {reason[:160]}")
        return
    if times is not None:
        pair = compile_times(model, schema)
        if pair is not None:  # both compile it
            times["compile"].append(pair[0])
            times["raw_compile"].append(pair[1])
    tally.covered += 1
    for data, valid, label in tests:
        tally.instances += 1
        try:
            ok = accepts(c, model, compact(data))
        except ChatkitError:
            ok = False
        if ok == valid:
            tally.passes += 1
        elif ok:
            tally.false_accepts.append(label)
        else:
            tally.false_rejects.append(label)


def suite(model: Model, rejects: bool = False) -> list[str]:
    base = CORPORA / "json-schema-test-suite" / "draft2020-12"
    rows = []
    total = Tally()
    for path in sorted(base.glob("*.json")):
        if path.stem in ("refRemote",):  # needs a network registry: excluded
            continue
        tally = Tally()
        for group in json.loads(path.read_text()):
            tests = [(t["data"], t["valid"], f"{path.stem}: {group['description']} / "
                      f"{t['description']}") for t in group["tests"]]
            replay(model, group["schema"], tests, tally,
                   name=f"{path.stem}: {group['description']}")
        for attr in ("groups", "covered", "instances", "passes"):
            setattr(total, attr, getattr(total, attr) + getattr(tally, attr))
        total.false_accepts += tally.false_accepts
        total.false_rejects += tally.false_rejects
        total.invalid += tally.invalid
        for reason, n in tally.refusals.items():
            total.refusals[f"{reason} ({path.stem})"] += n
        rows.append(tally.row(path.stem))
    out = ["| keyword | schemas covered | instances right | false accepts | false rejects |",
           "|---|---|---|---|---|", *rows, total.row("**all**")]
    refused = sorted(total.refusals.items(), key=lambda kv: (-kv[1], kv[0]))
    out += ["", "Refused: " + ", ".join(f"{k} x{v}" for k, v in refused)]
    out += ["", "Refused as invalid (each must be invalid or admit nothing):"]
    out += [f"- {x}" for x in total.invalid]
    if total.false_accepts:
        out += ["", "False accepts:"] + [f"- {x}" for x in total.false_accepts]
    if rejects:
        out += ["", "False rejects:"] + [f"- {x}" for x in total.false_rejects]
    return out


def mask_times(model: Model, c: Constraint,
               text: str) -> tuple[list[float], list[float], list[float]]:
    """Per-state mask time through Constraint.process vs raw llguidance on the same states."""
    tokens = model.tokenize(text, special=False)
    raw_tok = c._initial  # the same compiled matcher state machine
    raw = raw_tok.deep_copy()
    mask = llguidance.numpy.allocate_token_bitmask(1, model.n_vocab)
    row = np.zeros(model.n_vocab, dtype=np.float32)
    ours: list[float] = []
    theirs: list[float] = []
    applied: list[float] = []
    c.prefetch = False
    c.reset()
    for i, t in enumerate(tokens):
        c._live()
        for first in ((0, 1) if i % 2 else (1, 0)):  # alternate who goes first (warm caches)
            t0 = time.perf_counter()
            if first:
                llguidance.numpy.fill_next_token_bitmask(raw, mask)
                theirs.append(time.perf_counter() - t0)
            else:
                c._fill()
                ours.append(time.perf_counter() - t0)
        row.fill(0.0)
        t0 = time.perf_counter()
        c.process(row, [])
        applied.append(time.perf_counter() - t0)
        if not raw.consume_token(t):
            break
        c.commit(t)
    return ours, theirs, applied


def maskbench(model: Model, limit: int) -> list[str]:
    files = sorted((CORPORA / "maskbench-dev").glob("*.json"))[:limit]
    tally = Tally()
    times: dict[str, list[float]] = {"compile": [], "raw_compile": []}
    ours: list[float] = []
    theirs: list[float] = []
    applied: list[float] = []
    for path in files:
        doc = json.loads(path.read_text())
        tests = [(t["data"], t["valid"], f"{path.stem} #{i}") for i, t in enumerate(doc["tests"])]
        before = tally.covered
        replay(model, doc["schema"], tests, tally, times, name=path.stem)
        if tally.covered > before and len(ours) < 20000:
            valid = [t for t in doc["tests"] if t["valid"]]
            if valid:
                c = Constraint.json_schema(doc["schema"], model=model)
                try:
                    a, b, d = mask_times(model, c, compact(valid[0]["data"]))
                except ChatkitError:  # e.g. llguidance's lexer limit on a huge pattern
                    continue
                ours += a
                theirs += b
                applied += d
    refused = sorted(tally.refusals.items(), key=lambda kv: -kv[1])[:8]
    p = lambda xs, q: float(np.percentile(np.asarray(xs) * 1e6, q))  # noqa: E731
    ours_c, raw_c = times["compile"], times["raw_compile"]
    out = ["| corpus | schemas covered | instances right | false accepts | false rejects |",
           "|---|---|---|---|---|", tally.row(f"maskbench-dev (first {len(files)})"), "",
           f"Compile (schema + tokenizer-bound matcher; per schema the median of "
           f"{COMPILE_ROUNDS} alternating rounds), {len(ours_c)} schemas both compile, "
           f"median/p99: chatkit {statistics.median(ours_c) * 1000:.2f}/"
           f"{p(ours_c, 99) / 1000:.2f} ms; raw llguidance (grammar_from_json_schema + "
           f"LLMatcher) {statistics.median(raw_c) * 1000:.2f}/{p(raw_c, 99) / 1000:.2f} ms "
           f"(x{statistics.median(ours_c) / statistics.median(raw_c):.2f} at p50, "
           f"x{p(ours_c, 99) / p(raw_c, 99):.2f} at p99).",
           f"Mask per state, SmolLM2 (49k vocab), {len(ours)} states, p50/p99: raw llguidance "
           f"fill_next_token_bitmask {p(theirs, 50):.0f}/{p(theirs, 99):.0f} us; chatkit's "
           f"mask (same fill + padding AND) {p(ours, 50):.0f}/{p(ours, 99):.0f} us "
           f"(x{statistics.median(ours) / statistics.median(theirs):.2f} at p50); "
           f"Constraint.process, mask and apply to a logits row, "
           f"{p(applied, 50):.0f}/{p(applied, 99):.0f} us.",
           "Most frequent refusals: " + ", ".join(f"{k} x{v}" for k, v in refused),
           "", "Refused as invalid (each must be invalid or admit nothing):",
           *[f"- {x}" for x in tally.invalid]]
    if tally.false_accepts:
        out += ["", "False accepts:"] + [f"- {x}" for x in tally.false_accepts[:30]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--suite", action="store_true")
    ap.add_argument("--maskbench", action="store_true")
    ap.add_argument("--rejects", action="store_true", help="list the false rejects")
    ap.add_argument("--limit", type=int, default=400,
                    help="maskbench schemas (only the first 400, as sorted, are copied into\n"
                         "bench/corpora/maskbench-dev: a larger value reads no more)")
    args = ap.parse_args()
    both = not (args.suite or args.maskbench)
    model = Model.load(n_ctx=256, n_seq_max=1)
    print(f"{date.today()}, SmolLM2-135M tokenizer, compact JSON serialisation; "
          "corpora from bench/corpora")
    if args.suite or both:
        print("\n".join(suite(model, args.rejects)))
        print()
    if args.maskbench or both:
        print("\n".join(maskbench(model, args.limit)))


if __name__ == "__main__":
    main()
