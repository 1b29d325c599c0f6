"""On a GPU build only (skipped elsewhere): the same contracts with every layer offloaded.

Run by ``scripts/gpu/run.sh`` on a machine with an NVIDIA GPU and llama-cpp-python built
with CUDA (``CMAKE_ARGS="-DGGML_CUDA=on"``). Each check holds on any GPU build: valid
replies, a batch, the engine loop; speeds are printed by ``bench/placement.py``, not
asserted.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from chatkit import Conversation, Model, build_info, engine_loop, send_batch
from tests.conftest import gemma_path

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not build_info().gpu_offload,
                                reason="this llama.cpp build has no GPU backend")


class Verdict(BaseModel):
    decision: Literal["approve", "reject", "abstain"]
    confidence: float = Field(ge=0, le=1)
    reason: str = Field(pattern=r"^[A-Za-z0-9 ,.'-]{0,40}$")


def test_demo_runs_fully_offloaded() -> None:
    done = subprocess.run([sys.executable, "examples/demo.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "offloaded to" in done.stdout and "finish: constraint_complete" in done.stdout


@pytest.mark.parametrize("path", [None, "gemma"])
def test_constrained_replies_are_valid_on_the_gpu(path: str | None) -> None:
    model = Model.load(gemma_path() if path else None, n_ctx=2048, n_seq_max=4)
    try:
        assert model.placement.on_gpu and model.placement.n_gpu_layers == -1
        for seed in range(3):
            reply = Conversation(model).send(f"Judge claim {seed}: the sky is green.",
                                             schema=Verdict, max_tokens=96)
            assert isinstance(reply.parsed, Verdict)
        convs = [Conversation(model) for _ in range(4)]
        replies = send_batch([(c, f"Judge claim {i}.") for i, c in enumerate(convs)],
                             schema=Verdict, max_tokens=96)
        assert all(isinstance(r.parsed, Verdict) for r in replies)
        loop = engine_loop(model)
        got: list[object] = [None] * 6

        def worker(i: int) -> None:
            got[i] = Conversation(model).send(f"Judge claim {i}.", schema=Verdict,
                                              max_tokens=96).parsed

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(isinstance(v, Verdict) for v in got)
        assert loop.stats.max_live > 1
    finally:
        model.close()
