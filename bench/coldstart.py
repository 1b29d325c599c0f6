"""Cold start in a new process: model load plus the first token, chatkit (constrained) vs
llama-cpp-python (unconstrained, its high-level API), on both models.

chatkit's first constrained token needs llguidance's tokenizer over the vocabulary: the
vocabulary table is cached on disk per model file (``~/.cache/chatkit``), the tokenizer's
own trie is rebuilt per process. Rows: chatkit with an empty cache, with the cache, and
llama-cpp-python. Median of the repetitions, each a fresh process.

    python3 dev.py bench coldstart [--reps 3]
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

CHATKIT = r"""
import json, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
from chatkit import Conversation, Model
model = Model.load(sys.argv[2] or None, n_ctx=512, n_seq_max=1)
t1 = time.perf_counter()
schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
reply = Conversation(model).send("Is it sunny?", schema=schema, max_tokens=16)
print(json.dumps({"load": t1 - t0, "first": reply.usage.prompt_seconds,
                  "to_first": (t1 - t0) + (time.perf_counter() - t1 - reply.usage.total_seconds
                                            + reply.usage.prompt_seconds)}))
"""

PEER = r"""
import json, sys, time
t0 = time.perf_counter()
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[2], n_ctx=512, verbose=False)
t1 = time.perf_counter()
llm.create_completion("Is it sunny?", max_tokens=1)
print(json.dumps({"load": t1 - t0, "to_first": time.perf_counter() - t0}))
"""


def run(code: str, model: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), model], env=env,
                         capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from chatkit.model import default_model_path
    from tests.conftest import gemma_path

    print(f"{date.today()}, {os.cpu_count()} cores; new process each; seconds to the first "
          f"token incl. imports and model load, median of {args.reps}")
    print("| model | llama-cpp-python (load + 1 token) | chatkit, empty cache | chatkit, cached "
          "vocabulary | cached / llama-cpp-python |")
    print("|---|---|---|---|---|")
    for path in (default_model_path(), gemma_path()):
        cache = tempfile.mkdtemp(prefix="chatkit-cache-")
        env = {**os.environ, "CHATKIT_CACHE_DIR": cache}
        cold, warm, peer = [], [], []
        for _ in range(args.reps):
            shutil.rmtree(cache, ignore_errors=True)
            cold.append(run(CHATKIT, str(path), env)["to_first"])
            warm.append(run(CHATKIT, str(path), env)["to_first"])
            peer.append(run(PEER, str(path), env)["to_first"])
        shutil.rmtree(cache, ignore_errors=True)
        c, w, p = (statistics.median(x) for x in (cold, warm, peer))
        print(f"| {path.name} | {p:.2f} | {c:.2f} | {w:.2f} | {w / p:.2f}x |")


if __name__ == "__main__":
    main()
