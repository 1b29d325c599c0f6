"""Tool turns as templates write them, on any folder of chat templates.

    python3 dev.py bench toolturns [--dir FOLDER]

For each ``*.jinja`` template (by default both corpora under tests/corpora): is it served
(a dialect record, or one derived from its renderings), does it get the generic fallback
(no tool syntax), or is it refused (and what it rendered); for a served one, whether the
``auto`` grammar accepts the template's own rendering of the four turn shapes (one call; two
parallel calls; a sentence then a call; reasoning then a call, where it writes each), parses
them back, and the history re-renders byte for byte (``tests/test_tool_turns.py``'s check,
on a byte tokenizer: no model). Point ``--dir`` at templates outside the corpus (a serving
project's examples, a model's own ``chat_template.jinja``) to see how detection generalises.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import ChatkitError, ChatTemplate  # noqa: E402
from chatkit.tools.detect import _detect  # noqa: E402
from chatkit.tools.dialects import DIALECTS  # noqa: E402
from tests.test_tool_turns import SHAPES, check_turn, served  # noqa: E402


def verdict(path: Path) -> tuple[str, str]:
    """(served as / generic / refused / error, the first failing shape or "")."""
    source = path.read_text(encoding="utf-8")
    try:
        template = ChatTemplate.from_string(source, name=path.stem)
        found = _detect(source)
    except ChatkitError as exc:
        return "error", str(exc)[:120]
    d = served(source)
    if d is None:
        return ("generic", "") if not template.mentions_tools else \
            ("refused", repr(found)[:120])
    fails = [why for shape in SHAPES if (why := check_turn(template, d, shape))]
    kind = d.name if d.name in DIALECTS and DIALECTS[d.name].call == d.call else "derived"
    return kind, fails[0][:120] if fails else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, action="append",
                    help="a folder of *.jinja templates (repeatable; default: tests/corpora)")
    args = ap.parse_args()
    folders = args.dir or [ROOT / "tests/corpora/chat-templates/templates",
                           ROOT / "tests/corpora/tool-templates/templates"]
    paths = sorted(p for f in folders for p in f.glob("*.jinja"))
    counts = {"served": 0, "four shapes": 0, "generic": 0, "refused": 0, "error": 0}
    print("| template | verdict | first failing shape |")
    print("|---|---|---|")
    for path in paths:
        kind, why = verdict(path)
        group = kind if kind in ("generic", "refused", "error") else "served"
        counts[group] += 1
        counts["four shapes"] += group == "served" and not why
        print(f"| {path.stem} | {kind} | {why.replace('|', '/')} |")
    print(f"\n{date.today()}: {len(paths)} templates; "
          + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
