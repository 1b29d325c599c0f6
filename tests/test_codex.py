"""Codex CLI (npm ``@openai/codex``) against ``chatkit serve`` on the Gemma GGUF, over the
Responses API with a custom provider (docs/serving.md, "Codex CLI"): the model's
``exec_command`` call comes back as a ``function_call``, Codex runs the command in its
shell, sends the ``function_call_output`` back, and the next request is served.

What is proven is the protocol, not the 270M model's judgement: Codex's ``goals`` and
``multi_agent`` tools are turned off and its long base instructions replaced by three
sentences (``model_instructions_file``) so that the shell tool is the likely call (under
Codex's own instructions the tiny model may call ``request_user_input`` or write text
until the deadline, whatever the server does); a session
is judged once Codex has run two commands the model called (the second one's request
carried the first one's output), with no API error on the way. The tiny model does not
know when to stop calling, so the session is then ended here; one that ends by itself
must end with ``turn.completed``. Marked ``codex``: skipped unless the CLI is found
(``CHATKIT_CODEX``, else ``codex`` on PATH)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import gemma_path
from tests.helpers import free_port, wait_until_serving

pytestmark = [pytest.mark.codex, pytest.mark.gemma]
CODEX = os.environ.get("CHATKIT_CODEX") or shutil.which("codex")
DEADLINE = 900.0
INSTRUCTIONS = ("You are a coding agent with a shell. To run a command, call the exec_command "
                "tool with the command in `cmd`, exactly as the user wrote it. After it has "
                "run, say in one sentence what it printed.\n")


@pytest.mark.skipif(CODEX is None, reason="Codex CLI not installed (CHATKIT_CODEX)")
def test_codex_runs_the_shell_commands_the_model_calls(tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "codex"
    home.mkdir()
    (home / "instructions.md").write_text(INSTRUCTIONS)
    (home / "config.toml").write_text(
        f'model_instructions_file = "{home / "instructions.md"}"\n'
        'model = "gemma"\nmodel_provider = "chatkit"\napproval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n[model_providers.chatkit]\nname = "chatkit"\n'
        f'base_url = "http://127.0.0.1:{port}/v1"\nwire_api = "responses"\n'
        'env_key = "CHATKIT_KEY"\n')
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "chatkit"), "serve", "--model", str(gemma_path()),
         "--name", "gemma", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    events: list[dict[str, object]] = []
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", server, timeout=300)
        assert CODEX is not None
        client = subprocess.Popen(
            [CODEX, "exec", "--skip-git-repo-check", "--json", "--disable", "goals",
             "--disable", "multi_agent", "Run the shell command: echo hello-from-codex"],
            env={**os.environ, "CODEX_HOME": str(home), "CHATKIT_KEY": "local"},
            cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        assert client.stdout is not None
        start, ran = time.monotonic(), 0
        for line in client.stdout:
            events.append(json.loads(line))
            item = events[-1].get("item")
            if events[-1]["type"] == "item.completed" and isinstance(item, dict) \
                    and item.get("type") == "command_execution":
                ran += 1
            if ran >= 2 or time.monotonic() - start > DEADLINE:
                break
        client.terminate()
        client.wait(timeout=60)
        client.stdout.close()
    finally:
        server.terminate()
        server.wait(timeout=60)
    failures = [e for e in events if e["type"] in ("error", "turn.failed")]
    assert not failures, failures
    ran_items = [e for e in events if e["type"] == "item.completed"
                 and isinstance(e.get("item"), dict)
                 and e["item"].get("type") == "command_execution"]  # type: ignore[union-attr]
    ended = any(e["type"] == "turn.completed" for e in events)
    assert len(ran_items) >= 2 or (ran_items and ended), events[-5:]
