"""Cold start in a new process: imports, model load and the first token, chatkit (constrained)
vs llama-cpp-python (unconstrained, its high-level API), on both models.

chatkit's first constrained token needs llguidance's tokenizer over the vocabulary: the
vocabulary table is cached on disk per model file (``~/.cache/chatkit``; here a temporary
``CHATKIT_CACHE_DIR``), the tokenizer itself is rebuilt per process (alongside the weights
when the cache is there). Columns:

- llama-cpp-python, same prompt: ``Llama(...)`` then ``create_completion(ids, max_tokens=1)``
  where ``ids`` are the token ids chatkit's turn evaluates (its chat template around the
  question), read once per model by an untimed probe process. Same ``n_ctx`` (512),
  ``n_batch`` (512) and threads (every core: chatkit's default; llama-cpp-python's own
  default is half of them) as chatkit. This is the comparison the ratio uses.
- llama-cpp-python, raw prompt: the same but the bare question (4-5 tokens, no template),
  as this bench measured before; for reference only.
- chatkit: ``Model.load`` then ``Conversation.stream(question, schema=..., max_tokens=16)``,
  timed at its first text delta (the first constrained token: the prompt prefilled and one
  token sampled under the grammar mask). Until 2026-11-30 this bench timed ``send`` minus
  the generation after the first token, which also counted the reply's validation.
- chatkit, empty cache: the first process ever to load the model file.
- chatkit, cached: every later process. The ratio is this over the same-prompt peer.
- ``--baseline DIR``: another chatkit tree (e.g. a copy from before a change), cached.

Both sides run with ``GOMP_SPINCOUNT=1000``: chatkit sets it (model.py, "Threads" in the
README) and llama-cpp-python would otherwise spin 300,000 times at each OpenMP barrier,
which under load costs it seconds. Both import from compiled bytecode, as installed packages
do: ``PYTHONPYCACHEPREFIX`` points at a temporary directory (nothing is written into the
tree) and an untimed run of each side fills it; without it a checkout under
``PYTHONDONTWRITEBYTECODE=1`` compiles chatkit's sources in every process (~50 ms) while
llama-cpp-python's come precompiled. Every figure is a new process; within a repetition the
columns run in an order that rotates between repetitions (so load from other processes
spreads over all of them); medians. The machine's load average is printed before and after:
the overlap of the tokenizer build with the load needs a free core to pay off.

    python3 dev.py bench coldstart [--reps 5] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTION = "Is it sunny?"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
LENGTH = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "why": {"type": "string", "maxLength": 10}},
          "required": ["ok", "why"], "additionalProperties": False}
"""A string with ``maxLength``: llguidance's sliced tokenizer serves its masks."""
N_CTX = 512

CHATKIT = rf"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from chatkit import Conversation, Model
model = Model.load(sys.argv[2] or None, n_ctx={N_CTX}, n_seq_max=1)
t1 = time.perf_counter()
schema = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {SCHEMA!r}
stream = Conversation(model).stream({QUESTION!r}, schema=schema, max_tokens=32)
deltas = iter(stream)
next(deltas)
t2 = time.perf_counter()
for _ in deltas:
    pass
assert stream.reply is not None and isinstance(stream.reply.parsed, dict)
print(json.dumps({{"load": t1 - t0, "to_first": t2 - t0, "reply": time.perf_counter() - t0}}))
"""

PROBE = rf"""
import json, sys
sys.path.insert(0, sys.argv[1])
from chatkit import Conversation, Model
seen = []
decode = Model.decode
def recording(self, chunks):
    for chunk in chunks:
        seen.extend(chunk.tokens)
    return decode(self, chunks)
Model.decode = recording
model = Model.load(sys.argv[2] or None, n_ctx={N_CTX}, n_seq_max=1)
reply = Conversation(model).send({QUESTION!r}, schema={SCHEMA!r}, max_tokens=16)
n = reply.usage.prompt_tokens
assert len(seen) >= n, (len(seen), n)
print(json.dumps(seen[:n]))
"""

PEER = rf"""
import json, os, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
n = os.cpu_count() or 1
llm = Llama(model_path=sys.argv[2], n_ctx={N_CTX}, n_batch=512, n_threads=n, n_threads_batch=n,
            verbose=False)
t1 = time.perf_counter()
prompt = json.loads(sys.argv[3]) if sys.argv[3] else {QUESTION!r}
llm.create_completion(prompt, max_tokens=1)
print(json.dumps({{"load": t1 - t0, "to_first": time.perf_counter() - t0}}))
"""


def run(code: str, root: Path, model: str, env: dict[str, str], *extra: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, str(root), model, *extra], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        sys.exit(f"a bench process failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another chatkit tree to time (cached)")
    args = ap.parse_args()
    from chatkit.engine.model import default_model_path
    from tests.conftest import gemma_path

    pycache = tempfile.mkdtemp(prefix="chatkit-pycache-")
    base = {**os.environ, "GOMP_SPINCOUNT": "1000", "PYTHONPYCACHEPREFIX": pycache}
    base.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"{date.today()}, {os.cpu_count()} cores, load average {load_average()}; new process "
          f"each; seconds to the first token incl. imports and model load, median of {args.reps}")
    head = ["model (prompt tokens)", "llama-cpp-python, same prompt", "llama-cpp-python, raw "
            "prompt", "chatkit, empty cache", "chatkit, cached", "chatkit, cached, maxLength"]
    if args.baseline:
        head.append(f"chatkit @ {args.baseline}, cached")
    head += ["cached / same-prompt peer", "maxLength / same-prompt peer",
             "chatkit, cached: whole reply"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for path in (default_model_path(), gemma_path()):
        warm_dir = tempfile.mkdtemp(prefix="chatkit-cache-")
        warm = {**base, "CHATKIT_CACHE_DIR": warm_dir}
        # Untimed: the probe also fills the vocabulary cache the cached columns use, and
        # every side's first run compiles its bytecode and reads the model file into the
        # page cache.
        ids = run(PROBE, ROOT, str(path), warm)
        run(PEER, ROOT, str(path), warm, ids)
        if args.baseline:
            run(CHATKIT, args.baseline, str(path), warm)  # its own cache file, if it differs
        # column: (child code, chatkit tree, extra argument, cache: "warm" or "empty")
        columns = {"peer": (PEER, ROOT, ids, "warm"), "raw": (PEER, ROOT, "", "warm"),
                   "empty": (CHATKIT, ROOT, "", "empty"), "cached": (CHATKIT, ROOT, "", "warm"),
                   "length": (CHATKIT, ROOT, json.dumps(LENGTH), "warm")}
        if args.baseline:
            columns["baseline"] = (CHATKIT, args.baseline, "", "warm")
        times: dict[str, list[float]] = {k: [] for k in columns}
        whole: list[float] = []  # the cached column's whole reply (validation included)
        names = list(columns)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[: rep % len(names)]:
                code, root, extra, cache = columns[name]
                env = warm
                if cache == "empty":
                    env = {**base, "CHATKIT_CACHE_DIR": tempfile.mkdtemp(prefix="chatkit-cache-")}
                try:
                    out = run(code, root, str(path), env, *([extra] if extra or code is PEER
                                                             else []))
                finally:
                    if cache == "empty":
                        shutil.rmtree(env["CHATKIT_CACHE_DIR"], ignore_errors=True)
                got = json.loads(out)
                times[name].append(float(got["to_first"]))
                if name == "cached":
                    whole.append(float(got["reply"]))
        shutil.rmtree(warm_dir, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        cells = [f"{path.name} ({len(json.loads(ids))})"]
        cells += [f"{med[k]:.2f}" for k in names]
        cells += [f"{med['cached'] / med['peer']:.2f}x", f"{med['length'] / med['peer']:.2f}x",
                  f"{statistics.median(whole):.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)
    shutil.rmtree(pycache, ignore_errors=True)
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
