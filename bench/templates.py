"""The chat-template conformance matrix: 22 real families x 10 contexts.

For each template x context: "exact" (chatkit's rendering equals the reference renderer's
golden byte for byte), "raised" (the reference raised and chatkit raised TemplateError with
the template's message), or what differs. Then, per family, what follows from the template:
tool-call format, thinking switch, system role, end-of-turn marker.

    python3 dev.py bench templates
"""

from __future__ import annotations

import json
import sys
from datetime import date, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chatkit import ChatTemplate, TemplateError  # noqa: E402
from chatkit.tools.detect import detect_dialect  # noqa: E402

CORPUS = ROOT / "tests" / "corpora" / "chat-templates"
NOW = datetime(2024, 7, 26)
SHORT = {"injection": "inj", "injection_objargs": "inj-obj", "simple": "simple",
         "system": "system", "thinking_off": "th-off", "thinking_off_nogen": "th-off-ng",
         "thinking_on": "th-on", "thinking_on_nogen": "th-on-ng", "tool_use": "tools",
         "tool_use_objargs": "tools-obj"}


def outcome(t: ChatTemplate, family: str, ctx: str) -> str:
    base = CORPUS / "goldens" / f"{family}--{ctx}"
    variables = json.loads((CORPUS / "contexts" / f"{ctx}.json").read_text())
    try:
        text = "".join(s.text for s in t.render_context(variables, now=NOW))
        error = None
    except TemplateError as exc:
        text, error = None, str(exc)
    if Path(f"{base}.txt").exists():
        return "exact" if text == Path(f"{base}.txt").read_text() else "DIFFERS"
    want = Path(f"{base}.error").read_text().strip().split(": ", 1)[-1]
    return "raised" if error is not None and want in error else "NOT RAISED"


def main() -> None:
    families = sorted(p.stem for p in (CORPUS / "templates").glob("*.jinja"))
    contexts = sorted(SHORT)
    counts = {"exact": 0, "raised": 0}
    rows = []
    for family in families:
        t = ChatTemplate.from_string((CORPUS / "templates" / f"{family}.jinja").read_text(),
                                     name=family)
        cells = [outcome(t, family, c) for c in contexts]
        for c in cells:
            counts[c] = counts.get(c, 0) + 1
        rows.append((family, cells, t))
    print(f"{date.today()}; {len(families)} templates x {len(contexts)} contexts; "
          f"exact {counts['exact']}, raised as the reference {counts['raised']}, "
          f"other {sum(v for k, v in counts.items() if k not in ('exact', 'raised'))}")
    print("| family | " + " | ".join(SHORT[c] for c in contexts) + " |")
    print("|---" * (len(contexts) + 1) + "|")
    for family, cells, _ in rows:
        print(f"| {family} | " + " | ".join(cells) + " |")
    print()
    print("| family | tools= (call format) | thinking switch | system role | end of turn |")
    print("|---|---|---|---|---|")
    for family, _, t in rows:
        dialect = detect_dialect(t)
        tools = f"`{dialect.name}`" if dialect else (
            "refused: no format chatkit writes" if t.mentions_tools else "none")
        thinking = "`enable_thinking`" if t.supports_thinking else "-"
        system = "yes" if t.supports_system else "folded into the first user message"
        eot = f"`{t.end_of_turn}`" if t.end_of_turn else "the model's EOS"
        print(f"| {family} | {tools} | {thinking} | {system} | {eot} |")


if __name__ == "__main__":
    main()
