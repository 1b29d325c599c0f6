"""chatkit's files under ``$CHATKIT_CACHE_DIR`` (else ``~/.cache/chatkit``): what a new
process would otherwise rebuild on the way to its first token (a model's vocabulary table,
compiled chat templates). Each file's name hashes everything its contents depend on; a file
that is missing, unreadable or not what a write makes is a miss, never an error."""

from __future__ import annotations

import logging
import os
from pathlib import Path

__all__: list[str] = []

_log = logging.getLogger("chatkit")


def cache_dir() -> Path:
    """Where chatkit keeps its caches: ``$CHATKIT_CACHE_DIR``, else ``~/.cache/chatkit``."""
    return Path(os.environ.get("CHATKIT_CACHE_DIR") or Path.home() / ".cache" / "chatkit")


def read(path: Path) -> bytes | None:
    """The file's bytes, or None when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError:
        return None


def write(path: Path, data: bytes, what: str) -> None:
    """Write atomically (a temporary file, then a rename); a failure is logged (``what``:
    the cache's name) and the next process simply rebuilds."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        _log.info("%s cache not written (%s): the next process builds it again", what, exc)
