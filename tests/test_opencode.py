"""opencode (npm ``opencode-ai``) against ``chatkit serve`` on the Gemma GGUF, over chat
completions with an OpenAI-compatible provider (docs/serving.md, "opencode"): the model's
``write`` call comes back as a streamed tool call, opencode writes the file, sends the
result back, and the next request is served from the cached prefix.

What is proven is the protocol, not the 270M model's judgement, which under opencode's own
system prompt often answers in text: opencode runs without the tools that run commands,
fetch or start sub-agents (``OFF``), and the agent's model options carry chatkit's
``tool_call_threshold: 0`` (so ``tool_choice: auto`` opens a call; what the call says is
the model's). A session where no write completes is tried again (``SESSIONS``). A session
is judged once opencode has written a file the model named and the result went back (a
second step), with no API error; the tiny model does not know when to stop writing, so the
session is then ended here. Marked ``opencode``: skipped unless the CLI is found
(``CHATKIT_OPENCODE``, else ``opencode`` on PATH)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import gemma_path
from tests.helpers import free_port, wait_until_serving

pytestmark = [pytest.mark.opencode, pytest.mark.gemma]
OPENCODE = os.environ.get("CHATKIT_OPENCODE") or shutil.which("opencode")
SESSIONS = 3
DEADLINE = 600.0
OFF = ("bash", "webfetch", "task", "skill", "question")
"""Tools turned off: nothing that runs commands, fetches, or starts sub-agents. The file tools
stay on (opencode 1.18 sends no ``write`` tool when ``edit`` is off)."""


def _config(port: int) -> dict[str, Any]:
    """Two providers on the one server: the agent's model with chatkit's
    ``tool_call_threshold`` 0 in its request options (opencode sends a model's options in
    the body; under ``tool_choice: auto`` the turn then opens a call), and a plain one for
    opencode's title requests, which carry no tools (the threshold is refused there)."""
    base = {"npm": "@ai-sdk/openai-compatible",
            "options": {"baseURL": f"http://127.0.0.1:{port}/v1", "apiKey": "local"}}
    return {"provider": {
        "chatkit": {**base, "name": "chatkit", "models": {"gemma": {
            "name": "Gemma", "tool_call": True, "options": {"tool_call_threshold": 0},
            "limit": {"context": 32768, "output": 1024}}}},
        "chatkit-titles": {**base, "name": "chatkit titles", "models": {"gemma": {
            "name": "Gemma", "limit": {"context": 32768, "output": 64}}}}},
        "model": "chatkit/gemma", "small_model": "chatkit-titles/gemma", "autoupdate": False,
        "share": "disabled", "tools": dict.fromkeys(OFF, False)}


def _session(work: Path, home: Path) -> list[dict[str, Any]]:
    """One ``opencode run``, its JSON events until two writes completed (or it ended)."""
    assert OPENCODE is not None
    # opencode takes its project directory from $PWD, not from its working directory
    env = {**os.environ, "PWD": str(work), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_DATA_HOME": str(home / ".data"), "XDG_CACHE_HOME": str(home / ".cache")}
    client = subprocess.Popen(
        [OPENCODE, "run", "--format", "json", "--model", "chatkit/gemma",
         "Use the write tool to write the word DONE into the file notes.txt."],
        env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    assert client.stdout is not None
    events: list[dict[str, Any]] = []
    start = time.monotonic()
    for line in client.stdout:
        events.append(json.loads(line))
        if _answered(events) or time.monotonic() - start > DEADLINE:
            break
    client.terminate()
    client.wait(timeout=60)
    client.stdout.close()
    return events


def _answered(events: list[dict[str, Any]]) -> bool:
    """A write completed and a later step started (its result went back to the server)."""
    done = [i for i, e in enumerate(events) if e.get("type") == "tool_use"
            and e["part"].get("tool") == "write"
            and e["part"]["state"].get("status") == "completed"]
    return bool(done) and any(e.get("type") == "step_start" for e in events[done[0] + 1:])


def _writes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["part"]["state"] for e in events if e.get("type") == "tool_use"
            and e["part"].get("tool") == "write"
            and e["part"]["state"].get("status") == "completed"]


@pytest.mark.skipif(OPENCODE is None, reason="opencode not installed (CHATKIT_OPENCODE)")
def test_opencode_writes_the_file_the_model_names(tmp_path: Path) -> None:
    port = free_port()
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "opencode.json").write_text(json.dumps(_config(port)))
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "chatkit"), "serve", "--model", str(gemma_path()),
         "--name", "gemma", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_serving(f"http://127.0.0.1:{port}/health", server, timeout=300)
        for _ in range(SESSIONS):  # the model may answer in text: that proves nothing
            events = _session(work, home)
            if _writes(events) or any(e.get("type") == "error" for e in events):
                break
    finally:
        server.terminate()
        server.wait(timeout=60)
    errors = [e for e in events if e.get("type") == "error"]
    assert not errors, errors
    writes = _writes(events)
    assert writes, [e.get("type") for e in events]
    written = writes[0]["input"]
    target = Path(written["filePath"])  # as the model wrote it (a newline is a character)
    target = target if target.is_absolute() else work / target
    last = [w["input"]["content"] for w in writes
            if w["input"]["filePath"] == written["filePath"]][-1]
    assert target.read_text() == last  # opencode ran the model's call
    assert _answered(events), [e.get("type") for e in events]  # the result went back
