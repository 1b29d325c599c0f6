"""Claude Code (npm ``@anthropic-ai/claude-code``) in headless mode against ``chatkit serve``
on the Gemma GGUF: a turn completes with no API error. Gemma 3's own template has no tool
format (tools would be ``ToolFormatUnsupported``), so the server runs the bundled ``hermes``
template (``--chat-template hermes``). The command is the one
docs/serving.md gives. Marked ``claude_code``: skipped unless the CLI is found
(``CHATKIT_CLAUDE``, else ``claude`` on PATH); it takes minutes on 2 cores (Claude Code's
prompt is thousands of tokens, with ~20 tools)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import gemma_path
from tests.helpers import free_port, wait_until_serving

pytestmark = [pytest.mark.claude_code, pytest.mark.gemma]
CLAUDE = os.environ.get("CHATKIT_CLAUDE") or shutil.which("claude")


@pytest.mark.skipif(CLAUDE is None, reason="Claude Code not installed (CHATKIT_CLAUDE)")
def test_claude_code_completes_a_headless_turn(tmp_path: Path) -> None:
    port, key = free_port(), "local-key"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "chatkit"), "serve", "--model", str(gemma_path()),
         "--chat-template", "hermes", "--n-seq-max", "1", "--ctx-per-seq", "32768",
         "--port", str(port), "--api-key", key],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", server, timeout=300)
        env = {**os.environ, "HOME": str(tmp_path), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
               "ANTHROPIC_API_KEY": key, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64",
               "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
        assert CLAUDE is not None
        done = subprocess.run([CLAUDE, "-p", "Reply with one word: hello.", "--max-turns", "1"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        out = done.stdout + done.stderr
        # a text answer (exit 0), or a tool use that ends the one allowed turn
        assert "API Error" not in out, out[-3000:]
        assert done.returncode == 0 or "Reached max turns (1)" in out, out[-3000:]
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        if server.stderr is not None:
            server.stderr.close()
