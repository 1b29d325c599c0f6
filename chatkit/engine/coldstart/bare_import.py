"""Compiled cores imported without their packages' ``__init__``: llama-cpp-python's ctypes
bindings (``engine/lowlevel.py``) and llguidance's Rust extension.

Both packages' ``__init__`` import far more than chatkit uses, on the path to a new process's
first token (``bench coldstart``; a verdict lane pays it once per decision):
llama-cpp-python's pulls in its high-level ``Llama``, llguidance's
``importlib.metadata`` for its ``__version__`` and its grammar converters (in the
GIL-bound chain that builds llguidance's tokenizer while the weights load).

A submodule is imported under a bare stand-in for its package, which is taken out of
``sys.modules`` again, so a later ``import <package>`` (the user's own) runs the real
``__init__`` and finds the same submodule (one extension, one set of classes). Where the
package is already imported, its own submodule is used. One trace is left: that later
package has no attribute naming the submodule (``llguidance._lib``, private: the names it
re-exports are all there), since Python sets it only when it loads the submodule itself."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from typing import Any

__all__: list[str] = []

_lock = threading.RLock()
"""One stand-in at a time: the llguidance worker imports while the main thread may."""


def submodule(package: str, name: str) -> Any:
    """``<package>.<name>`` without the package's ``__init__`` (unless that already ran).
    ``ImportError`` as ``import <package>`` would raise it."""
    full = f"{package}.{name}"
    with _lock:
        if full in sys.modules:
            return sys.modules[full]
        if package in sys.modules:
            return importlib.import_module(full)
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"No module named {package!r}", name=package)
        stand_in = types.ModuleType(package)
        stand_in.__path__ = list(spec.submodule_search_locations)
        stand_in.__spec__ = spec
        stand_in.__file__ = spec.origin
        stand_in.__package__ = package
        sys.modules[package] = stand_in
        try:
            return importlib.import_module(full)
        finally:
            if sys.modules.get(package) is stand_in:
                del sys.modules[package]


@functools.cache
def llguidance() -> Any:
    """llguidance's extension module ``llguidance._lib``: ``LLTokenizer``, ``LLMatcher``,
    ``LLParserLimits``... (the classes ``import llguidance`` re-exports, the same objects).
    ``ImportError`` when llguidance is not installed."""
    return submodule("llguidance", "_lib")
