"""Every command and code block in README.md runs, as written, on the real model.

The README's fenced blocks are read from the file, so an edited snippet is the tested
snippet. Python blocks run in README order in one namespace, as a reader following the
guide runs them (later blocks use the tour's ``model``, ``conv`` and ``Verdict``); shell
blocks run with ``chatkit`` taken from this venv. The only edits the tests make: a free
port for the README's 8000 (and a remote engine's URL from ``CHATKIT_VLLM_URL``).
Assertions are the contract (an exit status, a parsed object), never a model's wording.

Blocks that cannot run here are named in ``NOT_RUN`` with the reason;
``test_every_block_is_planned`` fails on a block no test knows about.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port, wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUNNING = ROOT / "docs" / "running.md"  # the reference blocks the README points to
BIN = Path(sys.executable).parent


def blocks(path: Path = README) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of each fenced block with a language."""
    out: list[tuple[str, int, str]] = []
    lang, start, lines = None, 0, []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, lines = line[3:].strip(), n + 1, []
            else:
                if lang:
                    out.append((lang, start, "\n".join(lines) + "\n"))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


def find(lang: str, marker: str) -> tuple[int, str]:
    path = RUNNING if marker in IN_RUNNING else README
    hits = [(n, text) for kind, n, text in blocks(path) if kind == lang and marker in text]
    assert len(hits) == 1, f"{len(hits)} {lang} blocks contain {marker!r}"
    return hits[0]


# Each block a test runs, by a line it contains (one block each).
PYTHON = {
    "tour": "class Verdict(BaseModel):",
    "batch": "from chatkit import send_batch, quorum",
    "probabilities": "probabilities=True",
    "partials": ".partials():",
    "tools": "from chatkit import MaxStepsExceeded, tool",
    "mcp": "from chatkit import MCPToolset",
    "speculative": "speculative=True",
    "gpu": "model.placement.reason",
    "openai": "from openai import OpenAI",
    "remote": "RemoteEngine(",
}
SHELL = {
    "commands": "python3 dev.py test    # ruff",
    "build": "CMAKE_ARGS=",
    "run": "chatkit run --prompt",
    "serve": "chatkit serve --port 8000",
    "curl": "curl -s localhost:8000",
}
IN_RUNNING = {"model.placement.reason", "CMAKE_ARGS="}  # blocks in docs/running.md
NOT_RUN = {
    "python3 dev.py test": "the command that runs this test (.ci/run calls it)",
    "CMAKE_ARGS=": "each line builds llama.cpp for a backend this machine lacks (CUDA, "
                   "Metal, Vulkan, OpenBLAS); test_build_options_reach_dev_py checks dev.py "
                   "takes them",
    "pip install -e": "the set-up installed the serve extra already",
}


def test_the_readme_is_a_guide_not_a_reference() -> None:
    """Reference material lives in docs/: the README stays a user's guide of <= 450 lines."""
    assert len(README.read_text().splitlines()) <= 450


def test_every_block_is_planned() -> None:
    markers = [*PYTHON.values(), *SHELL.values()]
    for lang, n, text in blocks():
        if lang in {"python", "sh"}:
            assert any(m in text for m in markers), f"README.md:{n}: a {lang} block no test runs"
    for marker in markers:
        path = RUNNING if marker in IN_RUNNING else README
        assert sum(marker in text for _, _, text in blocks(path)) == 1, marker


def _exec(name: str, namespace: dict[str, Any], replace: dict[str, str] | None = None) -> None:
    n, text = find("python", PYTHON[name])
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    # README.md's own line numbers in tracebacks: pad with blank lines
    code = compile("\n" * (n - 1) + text, str(README), "exec", dont_inherit=True)
    exec(code, namespace)


@pytest.fixture(scope="module")
def guide() -> dict[str, Any]:
    """The tour's namespace after the tour, batch, tools and speculative blocks ran."""
    namespace: dict[str, Any] = {"__name__": "readme"}
    for name in ("tour", "batch", "partials", "probabilities", "tools", "mcp", "speculative"):
        _exec(name, namespace)
    return namespace


def test_tour_blocks_run_in_order(guide: dict[str, Any]) -> None:
    from chatkit import Reply

    verdict = guide["Verdict"]
    assert isinstance(guide["v"], verdict)  # the tour's schema reply: a Verdict
    assert guide["s"].reply is not None and isinstance(guide["again"].messages, list)
    replies = guide["replies"]
    assert isinstance(replies[0], Reply | Exception) and len(replies) == 3
    assert not any(isinstance(r, Exception) for r in replies)  # bounded schemas complete
    assert isinstance(replies[2].parsed, guide["Contact"])
    result = guide["result"]
    assert result.decision in {"approve", "reject", "abstain"} or result.tie
    assert guide["early"] == guide["partial_verdict"].decision  # the stream's final object
    dist, exact = guide["dist"], guide["exact"]
    assert abs(sum(dist.probabilities.values()) + dist.unaccounted - 1) < 1e-6
    assert exact.decision in {"approve", "reject", "abstain"} and exact.margin is not None
    assert guide["answer"] is None or isinstance(guide["answer"], Reply)
    assert guide["final"].finish_reason  # resume after the executor's results
    calls = [m for m in guide["trip"].messages if m.role == "tool"]
    assert calls and calls[0].name == "forecast"  # the MCP tool ran, its result fed back
    assert isinstance(guide["reply"].parsed, verdict)  # the speculative send


def test_gpu_block_runs_on_any_build() -> None:
    namespace: dict[str, Any] = {"__name__": "readme"}
    _exec("gpu", namespace)
    assert namespace["model"].placement.reason


def _shell_lines(name: str) -> list[str]:
    """The block's commands: continuation lines joined, comments dropped."""
    _, text = find("sh", SHELL[name])
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.split("  #")[0].strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _argv(line: str) -> list[str]:
    argv = shlex.split(line)
    if argv[0] == "chatkit":
        argv[0] = str(BIN / "chatkit")
    return argv


def _bash(name: str, replace: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The whole block through bash, with this venv's ``chatkit`` first on PATH."""
    _, text = find("sh", SHELL[name])
    for old, new in (replace or {}).items():
        assert old in text
        text = text.replace(old, new)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-euc", text], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def test_commands_block() -> None:
    lines = _shell_lines("commands")
    assert lines == ["python3 dev.py demo", "python3 dev.py test"]
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("python3 dev.py test")
    done = subprocess.run(shlex.split(lines[0]), cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "finish: constraint_complete" in done.stdout


def test_build_options_reach_dev_py(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("chatkit_dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    monkeypatch.setattr(dev.platform, "machine", lambda: "x86_64")
    seen = set()
    for line in _shell_lines("build"):
        assign, _, command = line.partition(" python3 ")
        assert command.split()[0] == "dev.py"
        value = shlex.split(assign)[0].removeprefix("CMAKE_ARGS=")
        args = dev.cmake_args({"CMAKE_ARGS": value})
        assert args.startswith(value) and "-mno-amx-tile" in args
        seen.add(dev.wheel_dir(args))
    assert len(seen) == 4  # each backend gets its own build


def test_run_block_exits_0_with_the_closed_object() -> None:
    done = _bash("run")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out["parsed"]) == {"decision"}  # closed for generation: one rule
    assert out["finish_reason"] == "constraint_complete"


@pytest.fixture(scope="module")
def served() -> Any:
    """The README's `chatkit serve` line, on a free port instead of 8000."""
    (line,) = [x for x in _shell_lines("serve") if x.startswith("chatkit serve")]
    port = free_port()
    argv = _argv(line.replace("--port 8000", f"--port {port}"))
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base + "/health", proc,
                           why=lambda: proc.stderr.read() if proc.stderr else "")
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def test_curl_block(served: int) -> None:
    done = _bash("curl", {"localhost:8000": f"localhost:{served}"})
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert set(json.loads(body["choices"][0]["message"]["content"])) == {"decision"}


def test_openai_block(served: int, guide: dict[str, Any]) -> None:
    namespace = {"__name__": "readme", "Verdict": guide["Verdict"]}
    _exec("openai", namespace, {"127.0.0.1:8000": f"127.0.0.1:{served}"})
    assert isinstance(namespace["v"].choices[0].message.parsed, guide["Verdict"])


@pytest.mark.vllm
@pytest.mark.skipif(not os.environ.get("CHATKIT_VLLM_URL"),
                    reason="needs a vLLM server serving SmolLM2 (CHATKIT_VLLM_URL)")
def test_remote_block(guide: dict[str, Any]) -> None:
    namespace = {"__name__": "readme", "Verdict": guide["Verdict"]}
    _exec("remote", namespace, {"http://10.0.0.5:8000": os.environ["CHATKIT_VLLM_URL"]})
    assert isinstance(namespace["v"], guide["Verdict"])


def test_not_run_blocks_are_the_ones_named() -> None:
    texts = [text for lang, _, text in [*blocks(), *blocks(RUNNING)] if lang == "sh"]
    for marker in NOT_RUN:
        assert any(marker in t for t in texts), f"NOT_RUN names {marker!r}, no block has it"


def test_pydantic_ai_agent_on_the_readme_server(served: int) -> None:
    """pydantic-ai's Agent with a tool and an output type against the README's serve
    command: its first request fits a sequence's context (it was a 400 with 1,024 tokens
    per sequence). The run ends with the output, at the request limit when the small model
    keeps calling, or with pydantic-ai's complaint about what the model wrote; never with
    an HTTP error."""
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    class Forecast(BaseModel):
        city: str
        rain: bool

    async def run() -> None:
        import openai

        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{served}/v1",
                                      api_key="KEY", max_retries=0) as client:
            model = OpenAIChatModel("smollm2", provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, output_type=Forecast,
                          system_prompt="You forecast the weather.")

            @agent.tool_plain
            def get_weather(city: str) -> str:
                """Weather in a city."""
                return "12 C, rain"

            try:
                result = await agent.run("Will it rain in Oslo?",
                                         usage_limits=UsageLimits(request_limit=3),
                                         model_settings={"max_tokens": 96, "temperature": 0})
                assert isinstance(result.output, Forecast)
            except (UsageLimitExceeded, UnexpectedModelBehavior):
                pass  # what the small model did; a 4xx/5xx (ModelHTTPError) is not caught

    import anyio

    anyio.run(run)
