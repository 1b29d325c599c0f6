"""MCP tools against a real MCP server (tests/fixtures/mcp_server.py, the mcp SDK's
MCPServer) started as a subprocess over stdio, and over streamable HTTP on loopback.

The model's part is forced where a verdict would otherwise depend on what it writes: the
first call is a named ``tool_choice`` and ``tool_call_threshold=1.0`` makes the turns after
it answer, so every run ends the same way on any build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import anyio
import pytest
from pydantic import BaseModel, Field

from chatkit import (
    Conversation,
    MCPToolset,
    Model,
    ToolDefinitionError,
    ToolServerError,
    tool,
)
from tests.helpers import free_port, wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "fixtures" / "mcp_server.py"
COMMAND = [sys.executable, str(SERVER)]


class Answer(BaseModel):
    answer: int = Field(ge=0, le=100_000)


def server_processes() -> list[int]:
    """Live processes running the fixture server (zombies excluded)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        if str(SERVER).encode() in cmdline and state != "Z":
            found.append(int(pid))
    return found


@pytest.fixture
def no_leftover_server() -> Iterator[None]:
    before = set(server_processes())
    yield
    deadline = time.monotonic() + 10
    while set(server_processes()) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(server_processes()) - before == set(), "an MCP server process was left behind"


@pytest.fixture(scope="module")
def quiet() -> Iterator[TextIO]:
    """Where the servers' own logs go."""
    with open(os.devnull, "w") as sink:
        yield sink


@pytest.fixture(scope="module")
def stdio(quiet: TextIO) -> Iterator[MCPToolset]:
    with MCPToolset.stdio(COMMAND, timeout=2, stderr=quiet) as server:
        yield server


def run_forced(smol: Model, tools: list, choice: str, text: str = "Go.", **kw):  # type: ignore[no-untyped-def]
    """The agent loop with the forced tool and one other MCP tool (every tool's definition
    in the prompt would not leave room in SmolLM2's 1,024-token sequence)."""
    tools = [t for t in tools if t.name in {choice, "weather"} or not t.name.isalpha()
             or t.name == "local_note"]
    conv = Conversation(smol)
    reply = conv.run(text, tools=tools, tool_choice=choice, tool_call_threshold=1.0,
                     max_steps=3, max_tokens=128, **kw)  # 8 tools' prompt: ~840 of 1,024
    results = [m for m in conv.messages if m.role == "tool"]
    return reply, results


def test_tools_are_listed_and_become_grammars(stdio: MCPToolset, smol: Model) -> None:
    tools = stdio.tools()
    assert {t.name for t in tools} >= {"add", "weather", "fail", "stall", "die", "picture"}
    add = next(t for t in tools if t.name == "add")
    assert add.definition.description == "Add two whole numbers."
    schema = add.definition.parameters_schema
    assert schema["properties"]["a"]["maximum"] == 1000
    assert schema["additionalProperties"] is False
    # the call is produced under the grammar: arguments valid whatever the model wanted
    reply = Conversation(smol).send("Add some numbers.", tools=tools, tool_choice="add",
                                    max_tokens=64)
    (call,) = reply.tool_calls
    assert call.name == "add" and set(call.arguments) == {"a", "b"}
    assert all(0 <= v <= 1000 for v in call.arguments.values())


def test_run_calls_a_tool_feeds_back_the_result_and_answers_under_a_schema(
        stdio: MCPToolset, smol: Model) -> None:
    @tool
    def local_note(text: str) -> str:
        """Write a note (a Python tool beside the MCP ones)."""
        return "noted"

    reply, results = run_forced(smol, [*stdio.tools(), local_note], "add",
                                "What is 2 plus 3?", schema=Answer)
    assert isinstance(reply.parsed, Answer)
    (result,) = results
    assert result.name == "add" and set(json.loads(result.content)) == {"total"}


def test_an_is_error_result_is_an_error_response(stdio: MCPToolset, smol: Model) -> None:
    reply, (result,) = run_forced(smol, stdio.tools(), "fail")
    assert "failed on purpose" in json.loads(result.content)["error"]
    assert reply.finish_reason in ("stop", "length")  # the loop went on to an answer


def test_a_call_past_the_timeout_is_an_error_response(stdio: MCPToolset, smol: Model) -> None:
    started = time.monotonic()
    _, (result,) = run_forced(smol, stdio.tools(), "stall")
    assert json.loads(result.content) == {"error": "timed out after 2 s"}
    assert time.monotonic() - started < 20  # the 30 s tool did not hold the loop


def test_content_a_text_model_cannot_take_is_refused_by_name(stdio: MCPToolset,
                                                             smol: Model) -> None:
    _, (result,) = run_forced(smol, stdio.tools(), "picture")
    assert "image content" in json.loads(result.content)["error"]


def test_the_tool_list_follows_the_server(smol: Model, no_leftover_server: None,
        quiet: TextIO) -> None:
    with MCPToolset.stdio(COMMAND, stderr=quiet) as server:
        assert "extra" not in {t.name for t in server.tools()}
        assert server.call("grow", {}) == '{"result": "grown"}'
        deadline = time.monotonic() + 10
        while "extra" not in {t.name for t in server.tools()}:
            assert time.monotonic() < deadline, "tools/list_changed was not honoured"
            time.sleep(0.05)


def test_a_server_that_dies_mid_run_is_named(smol: Model, no_leftover_server: None,
        quiet: TextIO) -> None:
    with MCPToolset.stdio(COMMAND, stderr=quiet) as server:
        with pytest.raises(ToolServerError) as info:
            run_forced(smol, server.tools(), "die")
        assert info.value.server == server.name and "gone" in str(info.value)
        with pytest.raises(ToolServerError):  # a call on a dead session: named, not a
            server.call("add", {"a": 1, "b": 2})  # tool error the model would be shown

        async def acall() -> str:
            return await server.acall("add", {"a": 1, "b": 2})

        with pytest.raises(ToolServerError):
            anyio.run(acall)


def test_an_input_schema_chatkit_cannot_enforce_is_refused_when_made(
        no_leftover_server: None, quiet: TextIO) -> None:
    with MCPToolset.stdio([*COMMAND, "--bad"], stderr=quiet) as server:
        with pytest.raises(ToolDefinitionError) as info:
            server.tools()
        assert info.value.tool == "tag" and "uniqueItems" in str(info.value)
    with MCPToolset.stdio([*COMMAND, "--bad"], exclude=["tag"],
                          stderr=quiet) as server:
        assert "tag" not in {t.name for t in server.tools()}


def test_a_server_that_cannot_start_is_named(no_leftover_server: None) -> None:
    with pytest.raises(ToolServerError) as info:
        MCPToolset.stdio("chatkit-no-such-program --x", connect_timeout=10).open()
    assert "could not connect" in str(info.value)


def test_a_server_that_never_answers_is_stopped() -> None:
    """It starts but never completes ``initialize``: refused after ``connect_timeout``, and
    its process does not outlive the refusal."""
    marker = "chatkit-never-initializes"
    command = [sys.executable, "-c", f"import time; time.sleep(120)  # {marker}"]
    started = time.monotonic()
    with pytest.raises(ToolServerError, match="no session within 2"):
        MCPToolset.stdio(command, connect_timeout=2).open()
    assert time.monotonic() - started < 20
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the server's process was left running"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([*COMMAND, "--http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_until_serving(url, proc, timeout=60, ok=lambda r: True)  # any answer: it is up
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_streamable_http_with_arun(http_url: str, smol: Model) -> None:
    async def main() -> tuple[object, list[str]]:
        async with MCPToolset.http(http_url) as server:
            conv = Conversation(smol)
            reply = await conv.arun("What is 4 plus 4?", tools=await server.atools(),
                                    tool_choice="add", tool_call_threshold=1.0,
                                    max_steps=3, max_tokens=128, schema=Answer)
            return reply.parsed, [m.content for m in conv.messages if m.role == "tool"]

    parsed, contents = anyio.run(main)
    assert isinstance(parsed, Answer)
    assert set(json.loads(contents[0])) == {"total"}


def test_cli_runs_the_agent_loop_with_mcp_tools(no_leftover_server: None) -> None:
    command = " ".join(COMMAND)
    schema = json.dumps(Answer.model_json_schema())
    ok = subprocess.run([sys.executable, "-m", "chatkit", "run", "--mcp", command, "--prompt",
                         "What is 2 plus 3?", "--tool-choice", "add",
                         "--tool-call-threshold", "1", "--json", "--json-schema", schema],
                        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    Answer.model_validate(out["parsed"])
    assert out["tool_results"][0]["name"] == "add"
    dead = subprocess.run([sys.executable, "-m", "chatkit", "run", "--mcp", command,
                           "--prompt", "Stop.", "--tool-choice", "die"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert dead.returncode == ToolServerError.exit_code and dead.stdout == ""
    assert dead.stderr.startswith("chatkit: ToolServerError: MCP server")
    assert len(dead.stderr.strip().splitlines()) == 1


def test_mcp_options_without_mcp_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from chatkit.cli import main

    assert main(["run", "--prompt", "x", "--tool-choice", "add"]) == 2
    assert "need --mcp" in capsys.readouterr().err


def test_ctrl_c_leaves_no_server_behind(no_leftover_server: None) -> None:
    """A process that opened a toolset without ``with`` and is interrupted: the server's
    process ends with it (the toolset closes at interpreter exit), even a server that does
    not exit by itself when its stdin closes."""
    import signal

    script = ("import sys, time\n"
              "from chatkit import MCPToolset\n"
              f"server = MCPToolset.stdio({[*COMMAND, '--linger']!r}).open()\n"
              "server.tools()\n"
              "print('ready', flush=True)\n"
              "time.sleep(120)\n")
    # SIGINT as a terminal delivers it, even when this suite runs in the background (a
    # shell's `&` starts it with SIGINT ignored, which children inherit)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert server_processes()  # the server runs
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
