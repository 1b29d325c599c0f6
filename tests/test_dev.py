"""dev.py, the set-up: a child killed by a signal is named, build options key the wheel."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import load_dev

ROOT = Path(__file__).resolve().parent.parent


def test_a_child_killed_by_sigill_is_named_with_a_hint() -> None:
    dev = load_dev()
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    with pytest.raises(dev.ChildFailed) as info:
        dev._run(sys.executable, "-c", suicide)
    message = str(info.value)
    assert "killed by SIGILL (illegal instruction)" in message
    assert "Build options" in message  # the hint points at the documented fix
    assert info.value.code == 128 + signal.SIGILL


def test_main_prints_the_failure_and_returns_the_shell_status(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    dev = load_dev()
    monkeypatch.setattr(dev, "setup", lambda extras=("dev",): None)
    monkeypatch.setattr(dev, "PY", Path(sys.executable))
    monkeypatch.setattr(dev, "ROOT", ROOT)
    calls: list[tuple[str, ...]] = []

    def fake_run(*cmd: object, env: object = None) -> None:
        calls.append(tuple(str(c) for c in cmd))
        message, code = dev.describe_exit([str(c) for c in cmd], -signal.SIGILL)
        raise dev.ChildFailed(message, code)

    monkeypatch.setattr(dev, "_run", fake_run)
    assert dev.main(["demo"]) == 132
    err = capsys.readouterr().err
    assert err.startswith("dev.py: examples/demo.py was killed by SIGILL")
    assert calls and calls[0][1] == "examples/demo.py"


def test_exit_descriptions() -> None:
    dev = load_dev()
    py = "/x/.venv/bin/python"
    assert dev.describe_exit([py, "-m", "pytest"], 1) == ("pytest failed with exit status 1", 1)
    message, code = dev.describe_exit([py, "-m", "pytest"], -signal.SIGKILL)
    assert "pytest was killed by SIGKILL" in message and "out-of-memory" in message
    assert code == 137


def test_build_options_key_the_wheel_and_keep_amx_out(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = load_dev()
    monkeypatch.setattr(dev.platform, "machine", lambda: "x86_64")
    plain = dev.cmake_args({})
    assert "-mno-amx-tile" in plain and "CMAKE_CXX_FLAGS" in plain
    cuda = dev.cmake_args({"CMAKE_ARGS": "-DGGML_CUDA=on"})
    assert cuda.startswith("-DGGML_CUDA=on") and "-mno-amx-int8" in cuda
    own = '-DCMAKE_C_FLAGS="-O2"'
    assert dev.cmake_args({"CMAKE_ARGS": own}) == own  # the user's flags win
    assert "amx" not in dev.cmake_args({"CHATKIT_KEEP_AMX": "1"})
    assert len({dev.wheel_dir(plain), dev.wheel_dir(cuda), dev.wheel_dir(own)}) == 3
    monkeypatch.setattr(dev.platform, "machine", lambda: "aarch64")
    assert dev.cmake_args({}) == ""


def test_a_change_of_build_options_changes_the_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The set-up's stamp covers the build options, so new CMAKE_ARGS reinstall from a
    wheel built with them (pip's cache would hand back the old build)."""
    dev = load_dev()
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    plain = dev._fingerprint()
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_VULKAN=on")
    assert dev._fingerprint() != plain
    monkeypatch.delenv("CMAKE_ARGS")
    assert dev._fingerprint() == plain
