"""Every example in examples/ runs and does what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def run(name: str) -> str:
    return subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                          text=True, timeout=300, check=True, cwd=ROOT).stdout


def test_every_example_is_covered() -> None:
    assert EXAMPLES == ["demo.py", "extraction.py", "mcp_tools.py", "multi_turn.py",
                        "quorum_lanes.py", "tools_agent.py", "tools_parallel.py",
                        "tools_pydantic.py", "verdict_lane.py"]


def test_demo_prints_a_schema_valid_reply() -> None:
    out = run("demo.py")
    text = next(line for line in out.splitlines() if line.startswith("text:"))[len("text:"):]
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from demo import Planet
    finally:
        sys.path.pop(0)
    Planet.model_validate_json(text.strip())
    assert "finish: constraint_complete" in out


def test_extraction() -> None:
    import json

    data = json.loads(run("extraction.py"))
    assert set(data) == {"name", "age", "city", "email"}


def test_multi_turn_reuses_the_cache() -> None:
    out = run("multi_turn.py")
    reused = [int(line.split(",")[1].split()[0]) for line in out.splitlines()
              if "reused from cache" in line]
    assert reused[0] == 0 and reused[1] > 0
    assert "summary: topic=" in out


def test_verdict_lane() -> None:
    lines = [x for x in run("verdict_lane.py").splitlines() if x.startswith("lane ")]
    assert len(lines) == 3
    for line in lines:  # a verdict, or a named error: never an empty success
        assert any(word in line for word in ("approve", "reject", "abstain", "Truncated"))


def test_quorum_lanes() -> None:
    out = run("quorum_lanes.py")
    lanes = [x for x in out.splitlines() if x.startswith("lane ")]
    assert len(lanes) == 5
    assert "decision: " in out and "votes: " in out
    reused = [int(x.rsplit(":", 1)[1].strip(" )")) for x in lanes if "reused" in x]
    assert reused and max(reused) > 0  # the shared prefix was copied, not recomputed


def test_tools_agent() -> None:
    out = run("tools_agent.py")
    assert " calls " in out and "\ntool: " in out and "final: " in out


def test_tools_pydantic() -> None:
    import json

    data = json.loads(run("tools_pydantic.py"))
    assert set(data) == {"title", "priority", "component"} and 1 <= data["priority"] <= 5


def test_tools_parallel() -> None:
    out = run("tools_parallel.py")
    n = int(out.split(" calls:")[0])
    assert 1 <= n <= 3 and out.count("-> 22 C in") == n


def test_mcp_tools() -> None:
    """The MCP example: a real MCP server (the example itself, over stdio), its tool
    called, the result fed back, an answer under a schema; no server left running."""
    out = run("mcp_tools.py")
    assert out.startswith("tool forecast: ") and "Bergen" in out
    answer = next(line for line in out.splitlines() if line.startswith("answer: Plan("))
    assert "umbrella=" in answer
