"""Tool-call grammar compile times, per dialect: 1, 21 and 128 tools, cold and warm.

    python3 dev.py bench toolgrammar [--model smol|gemma] [--sizes 1,21,128] [--repeat 3]

Tools are BFCL v4's real function definitions (bench/corpora/bfcl, distinct names, in file
order). For each dialect and size, what a turn with those tools waits for before its first
token, grammar-wise, on the model's vocabulary:

- ``cold``: the Lark grammar built (``tool_grammar``), compiled by llguidance for the
  vocabulary (``Constraint.lark``, bypassing the engine's grammar cache), and the first
  token mask computed (llguidance's tokenizer for the vocabulary is built once before any
  timing: a process's first compile pays that too, see ``bench coldstart``);
- ``warm``: the same turn again: the grammar text built again (it is the cache key), the
  compiled grammar taken from the engine's cache and cloned, the first mask computed.

Each dialect's grammar is the whole turn a template of the family allows: a think block,
text before the calls (where calls open with markup), the template's JSON spacing
(``--plain``: the calls-or-text grammar alone). The median of ``--repeat`` runs is
reported, in milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from chatkit import ChatkitError, Constraint, Model
from chatkit.chat.plan import _tools_constraint
from chatkit.tools.definition import Tool
from chatkit.tools.dialects import DIALECTS, Dialect
from chatkit.tools.grammar import tool_grammar
from chatkit.tools.lark_text import Markup, markup_for

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BFCL = ROOT / "bench" / "corpora" / "bfcl"
FILES = ["BFCL_v4_simple_python.json", "BFCL_v4_multiple.json", "BFCL_v4_live_multiple.json",
         "BFCL_v4_parallel_multiple.json"]


def bfcl_tools() -> list[Tool]:
    """Every BFCL function chatkit takes as a tool, distinct names, in file order."""
    from bench.bfcl import functions  # BFCL's types mapped to JSON Schema, names sanitised

    tools: dict[str, Tool] = {}
    for name in FILES:
        for line in (BFCL / name).read_text().splitlines():
            for f in functions(json.loads(line)):
                if f["name"] not in tools:
                    try:
                        tools[f["name"]] = Tool.from_schema(f["name"], f["parameters"],
                                                            f["description"])
                    except ChatkitError:
                        continue
    return list(tools.values())


def writable(pool: list[Tool], d: Dialect, markup: Markup, n: int) -> tuple[list[Tool], int]:
    """The first ``n`` tools of ``pool`` that dialect ``d`` can write, and how many before
    the last of them it refuses by name (a parameter its markup cannot hold, e.g. an
    untyped value in Gemma 4's raw strings, a name that is not a Python identifier)."""
    kept: list[Tool] = []
    refused = 0
    for t in pool:
        if len(kept) == n:
            break
        try:
            tool_grammar([t], "auto", dialect=d, markup=markup)
        except ChatkitError:
            refused += 1
            continue
        kept.append(t)
    if len(kept) < n:
        raise SystemExit(f"{d.name}: only {len(kept)} of {len(pool)} BFCL functions writable")
    return kept, refused


def _first_mask(c: Any, n_vocab: int) -> None:
    c.process(np.zeros(n_vocab, dtype=np.float32), [])


THINK = ("<think>\n", "\n</think>\n\n")
THINK_BUDGET = 256


def turn_dialect(name: str, plain: bool) -> Dialect:
    """The record as a template of the family shapes the turn (see the module)."""
    d = DIALECTS[name]
    if plain:
        return d
    return dataclasses.replace(d, text_before=True, json_separators=(", ", ": "),
                               reasoning=d.reasoning or THINK)


def timed(model: Model, tools: list[Tool], dialect: str, cold: bool, plain: bool) -> float:
    d = turn_dialect(dialect, plain)
    budget = None if plain else THINK_BUDGET
    t0 = time.perf_counter()
    if cold:
        lark = tool_grammar(tools, "auto", parallel=True, dialect=d, markup=markup_for(model),
                            think_budget=budget)
        c = Constraint.lark(lark, model=model, stop_token=model.eos_id)
    else:
        c = _tools_constraint(model, tools, None, None, "auto", True, model.eos_id, d,
                              (budget, False))
    _first_mask(c, model.n_vocab)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", choices=("smol", "gemma"), default="smol")
    ap.add_argument("--sizes", default="1,21,128")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dialects", default=",".join(DIALECTS))
    ap.add_argument("--plain", action="store_true",
                    help="calls or text only: no think block, no text before calls")
    args = ap.parse_args()
    if args.model == "gemma":
        from tests.conftest import gemma_path

        model = Model.load(gemma_path(), n_ctx=512)
    else:
        model = Model.load(n_ctx=512)
    sizes = [int(s) for s in args.sizes.split(",")]
    pool = bfcl_tools()
    plain = args.plain
    markup = markup_for(model)
    timed(model, pool[:1], "hermes", True, plain)  # llguidance's tokenizer, markup_for: once
    rows = []
    for dialect in args.dialects.split(","):
        cells = []
        writ, refused = writable(pool, turn_dialect(dialect, plain), markup, max(sizes))
        if refused:
            print(f"  {dialect}: {refused} BFCL functions refused by name, skipped", flush=True)
        for n in sizes:
            tools = writ[:n]
            cold = statistics.median(timed(model, tools, dialect, True, plain)
                                     for _ in range(args.repeat))
            timed(model, tools, dialect, False, plain)  # into the cache
            warm = statistics.median(timed(model, tools, dialect, False, plain)
                                     for _ in range(args.repeat))
            cells.append(f"{cold:.0f} / {warm:.1f}")
        rows.append((dialect, cells))
        print(f"  {dialect}: {cells}", flush=True)
    print(f"{date.today()}, {Path(str(model.path)).name} ({model.n_vocab} tokens), "
          f"tool_choice auto, parallel calls, {'plain' if plain else 'whole-turn'} grammar, "
          f"BFCL v4 functions; median of {args.repeat}; "
          "ms cold / warm")
    print("| dialect | " + " | ".join(f"{n} tools" for n in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for dialect, cells in rows:
        print(f"| `{dialect}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
