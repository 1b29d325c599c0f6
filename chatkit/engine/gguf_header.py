"""A GGUF file's header key-values, read without llama.cpp (no weights, no vocabulary): what a
server needs to size its context before loading (``kv_bytes_per_token``,
``train_context``).

GGUF (llama.cpp's ``gguf.h``): magic ``GGUF``, a version (2 or 3), the tensor and key-value
counts, then each key-value as a length-prefixed UTF-8 key, a type id and the value (arrays:
an element type and a count). Little-endian throughout. Reading stops once every key asked
for is found, so the tokenizer's large arrays after them are usually never read.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import Any, BinaryIO

from ..errors import ModelLoadError

__all__: list[str] = []

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_COUNT = 1 << 32
"""Largest key-value or array count believed (a corrupt header is refused, not allocated)."""


def read_keys(path: str | os.PathLike[str], wanted: Iterable[str]) -> dict[str, Any]:
    """The values of ``wanted`` keys present in the GGUF header (arrays as lists). Raises
    ``ModelLoadError`` on a file that is not a readable GGUF header."""
    want = set(wanted)
    found: dict[str, Any] = {}
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ModelLoadError(str(path), "not a GGUF file (bad magic)")
            version, = _unpack(fh, "<I")
            if version not in (2, 3):
                raise ModelLoadError(str(path), f"GGUF version {version} is not supported")
            _n_tensors, n_kv = _unpack(fh, "<QQ")
            for _ in range(_count(n_kv)):
                key = _string(fh)
                kind, = _unpack(fh, "<I")
                keep = key in want
                value = _value(fh, kind, keep)
                if keep:
                    found[key] = value
                    if len(found) == len(want):
                        break
    except (OSError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ModelLoadError(str(path), f"unreadable GGUF header: {exc}") from exc
    return found


def _unpack(fh: BinaryIO, fmt: str) -> tuple[Any, ...]:
    size = struct.calcsize(fmt)
    data = fh.read(size)
    if len(data) != size:
        raise ValueError("the header ends early")
    return struct.unpack(fmt, data)


def _count(n: int) -> int:
    if n > MAX_COUNT:
        raise ValueError(f"count {n} is not believable")
    return n


def _string(fh: BinaryIO) -> str:
    n, = _unpack(fh, "<Q")
    data = fh.read(_count(n))
    if len(data) != n:
        raise ValueError("the header ends early")
    return data.decode("utf-8")


def _value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _unpack(fh, _SCALARS[kind])[0]
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        inner, n = _unpack(fh, "<IQ")
        if inner in _SCALARS and not keep:  # skipped in one seek
            fh.seek(struct.calcsize(_SCALARS[inner]) * _count(n), os.SEEK_CUR)
            return None
        return [_value(fh, inner, keep) for _ in range(_count(n))]
    raise ValueError(f"unknown value type {kind}")


def _arch_keys(arch: str) -> list[str]:
    return [f"{arch}.{k}" for k in ("context_length", "block_count", "embedding_length",
                                     "attention.head_count", "attention.head_count_kv",
                                     "attention.key_length", "attention.value_length")]


def _most(value: Any) -> int:
    """A per-layer array's largest element, or the scalar itself (0 when absent)."""
    if isinstance(value, list):
        return max((int(v) for v in value), default=0)
    return int(value or 0)


def _arch(path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    arch = read_keys(path, ["general.architecture"]).get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(str(path), "the GGUF header names no general.architecture")
    return arch, read_keys(path, _arch_keys(arch))


def train_context(path: str | os.PathLike[str]) -> int | None:
    """The context length the model was trained for (``<arch>.context_length``), if given."""
    arch, kv = _arch(path)
    value = kv.get(f"{arch}.context_length")
    return int(value) if isinstance(value, int) and value > 0 else None


def attention_heads(path: str | os.PathLike[str]) -> int | None:
    """The most query heads a layer has (``<arch>.attention.head_count``), if given."""
    arch, kv = _arch(path)
    return _most(kv.get(f"{arch}.attention.head_count")) or None


def kv_bytes_per_token(path: str | os.PathLike[str]) -> int | None:
    """An upper bound on the f16 KV cache's bytes per token position (every layer's keys
    and values, as if every layer attended to the whole context); None when the header
    does not say enough (recurrent or unusual architectures)."""
    arch, kv = _arch(path)
    layers = _most(kv.get(f"{arch}.block_count"))
    heads = _most(kv.get(f"{arch}.attention.head_count"))
    heads_kv = _most(kv.get(f"{arch}.attention.head_count_kv")) or heads
    embd = _most(kv.get(f"{arch}.embedding_length"))
    k_len = _most(kv.get(f"{arch}.attention.key_length")) or (embd // heads if heads else 0)
    v_len = _most(kv.get(f"{arch}.attention.value_length")) or k_len
    if not (layers and heads_kv and k_len and v_len):
        return None
    return layers * heads_kv * (k_len + v_len) * 2
