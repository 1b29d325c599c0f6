"""Every example in examples/ runs and does what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_prints_a_schema_valid_reply() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True,
                         text=True, timeout=120, check=True, cwd=ROOT).stdout
    text = next(line for line in out.splitlines() if line.startswith("text:"))[len("text:"):]
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from demo import Planet
    finally:
        sys.path.pop(0)
    Planet.model_validate_json(text.strip())
    assert "finish: constraint_complete" in out
