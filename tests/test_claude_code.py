"""Claude Code (npm ``@anthropic-ai/claude-code``) in headless mode against ``chatkit serve``
on the Gemma GGUF with no flag but the port: a whole session. Claude Code sends its
system prompt, its ``Read`` tool and the task; Gemma 3's template has no tool syntax, so the
call comes back in the generic JSON envelope as a ``tool_use``; Claude Code runs ``Read``
and sends the ``tool_result`` back; the next request is served from the cached prefix; the
session ends (an answer, or the turn limit) with no API error.

What is proven is the protocol, not the 270M model's judgement: Claude Code is given only
its ``Read`` tool (``--tools Read``) and told the path, so that the tiny model calls it;
whether it reads the right file, or answers well, is the model's business, and a session
where it answers without a call is tried again (``SESSIONS``). Marked
``claude_code``: skipped unless the CLI is found (``CHATKIT_CLAUDE``, else ``claude`` on
PATH); a few minutes on 2 cores. The commands are docs/serving.md's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gemma_path
from tests.helpers import free_port, wait_until_serving

pytestmark = [pytest.mark.claude_code, pytest.mark.gemma]
CLAUDE = os.environ.get("CHATKIT_CLAUDE") or shutil.which("claude")
SESSIONS = 3
"""Sessions tried until the model calls ``Read`` (at temperature 1 it may answer at once,
which proves nothing about the protocol; a session with a call is judged)."""


def _events(out: str) -> list[dict[str, Any]]:
    events = []
    for line in out.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


@pytest.mark.skipif(CLAUDE is None, reason="Claude Code not installed (CHATKIT_CLAUDE)")
def test_claude_code_runs_a_session_that_reads_a_file(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("The secret word is PELICAN.\n")
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "chatkit"), "serve", "--model", str(gemma_path()),
         "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", server, timeout=300)
        env = {**os.environ, "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
               "ANTHROPIC_API_KEY": "local", "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        assert CLAUDE is not None
        for _ in range(SESSIONS):  # Claude Code samples at temperature 1
            done = subprocess.run(
                [CLAUDE, "-p", f"Use the Read tool to read the file {notes}, then tell me the "
                 "secret word.", "--tools", "Read", "--max-turns", "3",
                 "--output-format", "stream-json", "--verbose"],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
            if '"tool_use"' in done.stdout or "API Error" in done.stdout + done.stderr:
                break
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        if server.stderr is not None:
            server.stderr.close()
    out = done.stdout + done.stderr
    assert "API Error" not in out, out[-3000:]
    events = _events(done.stdout)
    served = [e for e in events if e.get("type") == "assistant"]
    uses = [b for e in served for b in e["message"]["content"] if b.get("type") == "tool_use"]
    results = [b for e in events if e.get("type") == "user"
               for b in e["message"]["content"] if b.get("type") == "tool_result"]
    (result,) = [e for e in events if e.get("type") == "result"]
    assert uses and all(u["name"] == "Read" for u in uses), out[-3000:]
    assert {r["tool_use_id"] for r in results} == {u["id"] for u in uses}  # all run by it
    assert len({e["message"]["id"] for e in served}) >= 2  # the session went on after it
    assert not result.get("api_error_status"), result
    assert result["subtype"] in ("success", "error_max_turns"), result
