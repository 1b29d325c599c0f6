"""llama-cpp-python's ctypes bindings without its high-level half.

``import llama_cpp`` runs the package's ``__init__``, which imports the high-level ``Llama``
too: its chat formats (jinja2, numpy), its prompt caches (diskcache, sqlite3),
multiprocessing, uuid... a measurable share of a new process's start that chatkit, which uses only
the C API, never needs (``bench coldstart``: a verdict lane pays it once per decision).

:data:`llama_cpp` here is the bindings module ``llama_cpp.llama_cpp`` itself (the same
names the package re-exports: ``llama_decode``, ``llama_batch_init``...), imported without
the package's ``__init__`` (``bare_import``): a later ``import llama_cpp`` (the user's own
``Llama``, a bench's peer) runs the real ``__init__`` and finds these same bindings (one
shared library, one set of ctypes signatures)."""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

from .coldstart import bare_import

__all__: list[str] = []

PACKAGE = "llama_cpp"


def submodule(name: str) -> Any:
    """``llama_cpp.<name>`` without the package's ``__init__`` (unless that already ran).
    ``ImportError`` as ``import llama_cpp`` would raise it."""
    return bare_import.submodule(PACKAGE, name)


@functools.cache
def version() -> str:
    """llama-cpp-python's version, as its package's ``__version__`` says (read from the
    ``__init__`` file's text when the package was not imported)."""
    package = sys.modules.get(PACKAGE)
    if package is not None and isinstance(getattr(package, "__version__", None), str):
        return str(package.__version__)
    init = Path(llama_cpp.__file__).with_name("__init__.py")
    found = re.search(r"""^__version__\s*=\s*["']([^"']+)["']""",
                      init.read_text(encoding="utf-8"), re.M)
    if found is None:
        raise ImportError(f"no __version__ in {init}")
    return found.group(1)


# llama.cpp's CPU threads meet at an OpenMP barrier after every operation, and libgomp's
# waiting threads spin 300,000 times first: with other processes on the CPU, a spinning
# thread holds the core the working one needs (docs/running.md, "Threads"). 1,000 spins
# keeps a quiet machine's speed and bounds the cost under contention. Read when libgomp
# loads, so set before the bindings load it; a value the user set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

llama_cpp = submodule("llama_cpp")
"""The bindings module ``llama_cpp.llama_cpp`` (chatkit's only use of llama-cpp-python)."""
