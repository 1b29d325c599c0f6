"""The longer fuzz run: every input surface, counts of outcomes.

The same strategies as tests/test_fuzz.py (tests/fuzzing/strategies.py), more examples:
schemas, regexes and Lark grammars through the Constraint constructors, templates through
ChatTemplate, and `chatkit run` argument lists (with a missing model, so every accepted
constraint ends in ModelLoadError). Each case must end as "ok" or a named ChatkitError
within 10 s; anything else is an escape and is printed.

Then over HTTP (a real server on loopback, SmolLM2): the grammar bombs of
tests/test_server_inputs.py (a regex whose lexer blows up after the first token, a Lark
grammar past the parser's item limit, the regex as a schema's pattern) on
``/v1/completions`` and ``/v1/chat/completions``, sampled with ``--seeds`` seeds, plain and
streamed. Every response must be a 200 or a 400 (never >= 500), and a stream that fails
after its 200 must end with an error event and ``[DONE]``.

    python3 dev.py bench fuzz [--examples 2000] [--seeds 32]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import ChatkitError, ChatTemplate, Constraint, Message  # noqa: E402
from chatkit.cli import main as cli_main  # noqa: E402
from tests.fuzzing import strategies as S  # noqa: E402

MSGS = [Message("system", "S"), Message("user", "Hi <|im_end|>"), Message("assistant", "A")]


def _cli(args: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["run", "--prompt", "x", "--model", "/nonexistent/m.gguf", *args])
    text = err.getvalue()
    if "Traceback" in text or not text.startswith("chatkit: ") or text.count("\n") != 1:
        raise AssertionError(f"exit {code}: {text!r}")
    raise _Exit(text.split(":")[1].strip(), code)


class _Exit(Exception):
    def __init__(self, name: str, code: int) -> None:
        self.name, self.code = name, code


SURFACES: dict[str, tuple[Any, Callable[[Any], object]]] = {
    "schema": (S.schemas, Constraint.json_schema),
    "regex": (S.regexes, Constraint.regex),
    "lark": (S.lark_grammars, Constraint.lark),
    "template": (S.templates, lambda src: ChatTemplate.from_string(src).render(MSGS)),
    "cli": (S.cli_args, _cli),
}


def run(name: str, examples: int) -> tuple[Counter[str], list[str]]:
    strategy, fn = SURFACES[name]
    outcomes: Counter[str] = Counter()
    escapes: list[str] = []

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def case(value: Any) -> None:
        started = time.monotonic()
        try:
            fn(value)
            outcomes["ok"] += 1
        except _Exit as exc:
            outcomes[f"exit {exc.code} {exc.name}"] += 1
        except ChatkitError as exc:
            outcomes[type(exc).__name__] += 1
        except Exception as exc:  # an escape: recorded, the run goes on
            outcomes["ESCAPE"] += 1
            escapes.append(f"{type(exc).__name__}: {exc!s:.120} <- {value!r:.120}")
        if time.monotonic() - started > 10:
            outcomes["SLOW (>10 s)"] += 1
            escapes.append(f"slow: {value!r:.120}")

    case()
    return outcomes, escapes


def bombs(seeds: int) -> list[str]:
    """The grammar bombs over HTTP: one table row per bomb and mode."""
    import json

    import httpx

    from chatkit import Model
    from chatkit.serve.openai_api import ServerLimits
    from chatkit.serve.server import ChatkitServer
    from tests.test_server import _Running
    from tests.test_server_inputs import BOMBS, NAME

    model = Model.load(n_ctx=4096, n_seq_max=4)
    limits = ServerLimits(max_body_bytes=200_000, max_tokens=512, max_n=4)
    rows = ["| endpoint | bomb | mode | requests | 200 | 400 | >= 500 | streams ending in an "
            "error event |", "|---|---|---|---|---|---|---|---|"]
    with _Running(ChatkitServer(model, name=NAME, limits=limits)) as running:
        for path, body in BOMBS:
            kind = next(iter(body.get("structured_outputs", {"schema pattern": 0})))
            for stream in (False, True):
                codes: Counter[int] = Counter()
                error_ends = 0
                for seed in range(seeds):
                    full = {"model": NAME, "max_tokens": 8, "temperature": 1.0, "seed": seed,
                            "stream": stream, **body}
                    r = httpx.post(running.base + path, json=full, timeout=120)
                    codes[r.status_code] += 1
                    if stream and r.status_code == 200:
                        events = [ln[6:] for ln in r.text.splitlines()
                                  if ln.startswith("data: ")]
                        if events[-1] == "[DONE]" and "error" in json.loads(events[-2]):
                            error_ends += 1
                five = sum(n for code, n in codes.items() if code >= 500)
                rows.append(f"| {path} | {kind} | {'stream' if stream else 'plain'} | {seeds} "
                            f"| {codes[200]} | {codes[400]} | {five} | "
                            f"{error_ends if stream else '-'} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--examples", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=32, help="seeds per grammar bomb over HTTP")
    args = ap.parse_args()
    print(f"{date.today()}; {args.examples} generated cases per surface (hypothesis)")
    print("| surface | cases | ok | named errors | escapes |")
    print("|---|---|---|---|---|")
    all_escapes = []
    for name in SURFACES:
        outcomes, escapes = run(name, args.examples)
        named = sum(v for k, v in outcomes.items() if k not in ("ok", "ESCAPE", "SLOW (>10 s)"))
        top = ", ".join(f"{k} {v}" for k, v in outcomes.most_common(4)
                        if k not in ("ok", "ESCAPE", "SLOW (>10 s)"))
        print(f"| {name} | {sum(outcomes.values())} | {outcomes['ok']} | {named} ({top}) "
              f"| {outcomes['ESCAPE'] + outcomes['SLOW (>10 s)']} |")
        all_escapes += [f"{name}: {e}" for e in escapes]
    for e in all_escapes[:20]:
        print("  " + e)
    print()
    print("\n".join(bombs(args.seeds)))


if __name__ == "__main__":
    main()
