"""Sliding-window checkpoints: where a model's window layers drop a sequence's older cells.

A sliding-window model loaded without ``swa_full`` (Gemma 2/3/4, gpt-oss, Cohere 2, ...)
keeps only the last ``n_swa`` cells (plus a batch's slack) of each sequence in its window
layers; its full-attention layers keep every cell. Decoding can resume after the first
``n`` positions a sequence holds only while the window layers still hold the ``n_swa``
cells before ``n``, which a long reply has usually pushed out by the next request of the
same conversation (an agent's next turn repeats the whole prompt before it).

So at the end of each prompt's prefill the window layers' cells of that sequence are saved
(llama.cpp's sequence state with ``LLAMA_STATE_SEQ_FLAGS_SWA_ONLY``, what llama-server
calls a context checkpoint), and a sequence cut back to that position, or a prefix of that
length copied out of it, gets them back: the full-attention cells never left. This is what
lets ``chatkit serve`` keep prefixes without ``swa_full`` (window layers as large as the
context, slower on every long prompt).

Bound: one checkpoint per KV sequence id, the last prompt's; a checkpoint is the window's
cells of all window layers for one sequence (a few MB for a 270M model, hundreds for a 27B
one) and is dropped when its sequence is cut below it or emptied.
"""

from __future__ import annotations

import ctypes
from typing import Any

from ..errors import DecodeError
from .lowlevel import llama_cpp

__all__: list[str] = []

_SWA_ONLY = llama_cpp.LLAMA_STATE_SEQ_FLAGS_SWA_ONLY


class WindowCheckpoints:
    """The window layers' cells of each sequence at its last prompt's end.

    ``ctx``: the llama.cpp context; ``window_intact(seq, n)``: whether ``seq`` still
    holds the window before position ``n``. Not thread-safe: callers hold the engine's
    lock (every method issues llama.cpp calls on ``ctx``)."""

    def __init__(self, ctx: Any, window_intact: Any) -> None:
        self._ctx = ctx
        self._intact = window_intact
        self._saved: dict[int, tuple[int, Any]] = {}

    def save(self, seq_id: int, pos: int) -> None:
        """Record ``seq_id``'s window cells, which end at position ``pos`` (replacing the
        sequence's previous checkpoint). ``DecodeError`` when llama.cpp writes no state."""
        size = int(llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq_id, _SWA_ONLY))
        buf = (ctypes.c_uint8 * size)()
        if size == 0 or llama_cpp.llama_state_seq_get_data_ext(
                self._ctx, buf, size, seq_id, _SWA_ONLY) != size:
            raise DecodeError(-1, f"llama.cpp wrote no window state for sequence {seq_id}")
        self._saved[seq_id] = (pos, buf)

    def at(self, seq_id: int) -> int | None:
        """Where ``seq_id``'s checkpoint ends (None: it has none)."""
        saved = self._saved.get(seq_id)
        return saved[0] if saved is not None else None

    def after_rm(self, seq_id: int, p0: int, p1: int) -> None:
        """``seq_id``'s positions [p0, p1) were removed (p1 < 0: to the end): a checkpoint
        past ``p0`` is dropped; cut back exactly to a checkpoint whose window was pushed
        out, the sequence gets the window back."""
        pos = self.at(seq_id)
        if pos is None:
            return
        if pos > p0:  # cells it followed are gone
            del self._saved[seq_id]
        elif pos == p0 and p1 < 0 and not self._intact(seq_id, pos):
            self._restore(seq_id, seq_id)

    def after_cp(self, src: int, dst: int, p1: int) -> None:
        """``src``'s positions up to ``p1`` were copied into ``dst``: where ``src``'s
        checkpoint ends at ``p1``, ``dst`` gets its window (if it lacks it) and a copy of
        the checkpoint."""
        saved = self._saved.get(src)
        if saved is None or saved[0] != p1:
            return
        if not self._intact(dst, p1):
            self._restore(src, dst)
        self._saved[dst] = saved

    def forget(self, seq_id: int | None = None) -> None:
        """Drop ``seq_id``'s checkpoint (None: every sequence's)."""
        if seq_id is None:
            self._saved.clear()
        else:
            self._saved.pop(seq_id, None)

    def _restore(self, src: int, dst: int) -> None:
        pos, buf = self._saved[src]
        if llama_cpp.llama_state_seq_set_data_ext(self._ctx, buf, len(buf), dst,
                                                  _SWA_ONLY) != len(buf):
            self._saved.pop(dst, None)
            raise DecodeError(-1, f"llama.cpp refused the window checkpoint at {pos} for "
                                  f"sequence {dst}")
