"""Codex CLI (npm ``@openai/codex``) against ``chatkit serve`` on the Gemma GGUF, over the
Responses API with a custom provider (docs/serving.md, "Codex CLI"): the model's
``exec_command`` call comes back as a ``function_call``, Codex runs the command in its
shell, sends the ``function_call_output`` back, and the next request is served.

What is proven is the protocol, not the 270M model's judgement: Codex's ``goals`` and
``multi_agent`` tools are turned off and its long base instructions replaced by three
sentences (``model_instructions_file``) so that the shell tool is the likely call (under
Codex's own instructions the tiny model may call ``request_user_input`` or write text
until the deadline, whatever the server does). A session where the model answers in text
without a call is tried again (``SESSIONS``); the first with a command is judged once Codex
has run two commands the model called (the second one's request carried the first one's
output), with no API error in any session. The tiny model does not
know when to stop calling, so the session is then ended here; one that ends by itself
must end with ``turn.completed``. Marked ``codex``: skipped unless the CLI is found
(``CHATKIT_CODEX``, else ``codex`` on PATH)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gemma_path
from tests.helpers import free_port, wait_until_serving

pytestmark = [pytest.mark.codex, pytest.mark.gemma]
CODEX = os.environ.get("CHATKIT_CODEX") or shutil.which("codex")
DEADLINE = 300.0
"""Seconds one session may take (then Codex is ended)."""
SESSIONS = 3
"""Sessions tried until the model calls the shell tool (the tiny model may answer in text at
once, which proves nothing about the protocol; the first session with a command is judged)."""
INSTRUCTIONS = ("You are a coding agent with a shell. To run a command, call the exec_command "
                "tool with the command in `cmd`, exactly as the user wrote it. After it has "
                "run, say in one sentence what it printed.\n")


def _commands(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "item.completed"
            and isinstance(e.get("item"), dict) and e["item"].get("type") == "command_execution"]


def _session(home: Path, cwd: Path) -> list[dict[str, Any]]:
    """One ``codex exec``: its JSON events until it ends, the model has called two
    commands, or ``DEADLINE`` passes (Codex and its commands are then ended)."""
    assert CODEX is not None
    client = subprocess.Popen(
        [CODEX, "exec", "--skip-git-repo-check", "--json", "--disable", "goals",
         "--disable", "multi_agent", "Run the shell command: echo hello-from-codex"],
        env={**os.environ, "CODEX_HOME": str(home), "CHATKIT_KEY": "local"},
        cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert client.stdout is not None

    def end() -> None:  # Codex, and any command the model started that has not returned
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGTERM)

    watchdog = threading.Timer(DEADLINE, end)  # a command that never returns prints nothing
    watchdog.start()
    events: list[dict[str, Any]] = []
    try:
        for line in client.stdout:
            events.append(json.loads(line))
            if len(_commands(events)) >= 2:
                break
    finally:
        watchdog.cancel()
        end()
        client.wait(timeout=60)
        client.stdout.close()
    return events


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
    sessions: list[list[dict[str, Any]]] = []
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", server, timeout=300)
        while len(sessions) < SESSIONS and not (sessions and _commands(sessions[-1])):
            sessions.append(_session(home, tmp_path))
    finally:
        server.terminate()
        server.wait(timeout=60)
    failures = [e for events in sessions for e in events if e["type"] in ("error", "turn.failed")]
    assert not failures, failures
    events = sessions[-1]
    ran = _commands(events)
    ended = any(e["type"] == "turn.completed" for e in events)
    assert len(ran) >= 2 or (ran and ended), events[-5:]
