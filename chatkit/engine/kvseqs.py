"""An engine's KV sequences: ``SeqLeases`` (which owner, a conversation, holds which
sequence, which are leased for a turn right now, and what each idle one holds, so a turn can
start from another owner's prefix: routing by content), ``WindowCheckpoints`` (where a
sliding window drops cells) and ``KVCells``, the member of a ``Model`` that holds both and
edits the cells."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import DecodeError, EngineBusy, InvalidParameter
from .lowlevel import llama_cpp

_log = logging.getLogger("chatkit")

__all__: list[str] = []


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SeqLeases:
    """Leases of ``n`` KV sequences, guarded by ``lock`` (the engine's own, so a lease and
    the KV edits around it do not interleave). ``seq_rm(seq, p0=0, p1=-1)`` empties (or, from
    ``p0``, trims) a sequence that changes owner; ``seq_cp(src, dst, p0, p1)``, where the
    engine can copy a prefix between sequences and read it back exactly, copies one."""

    def __init__(self, n: int, lock: threading.RLock, seq_rm: Callable[..., None],
                 seq_cp: Callable[[int, int, int, int], None] | None = None, *,
                 max_busy: int | None = None,
                 seq_len: Callable[[int], int] | None = None,
                 resumable: Callable[[int, int], int] | None = None) -> None:
        self.n = n
        self.max_busy = n if max_busy is None else max_busy
        """Leases at once (``n_seq_max``); the other ``n - max_busy`` sequences only keep
        prefixes for later turns (``cache_seqs``), within :attr:`room`."""
        self.routes = True
        """Whether a prompt may start from another sequence's prefix (not where a sliding
        window or recurrent state keeps no whole prefix)."""
        self.room: tuple[Callable[[], int], Callable[[], int]] | None = None
        """With cache sequences: (cells in the pool, cells one lease may fill). Idle
        sequences are emptied, least recently used first, while the leases' share and what
        idle sequences hold (``seq_len``) would not fit the pool."""
        self._seq_len = seq_len
        self._resumable = resumable
        """``resumable(seq, n)``: how many of a sequence's first ``n`` positions decoding can
        resume after exactly (0 where a sliding window dropped what they need)."""
        """Positions a sequence holds in the KV cache (its highest + 1), read to check a
        giver's record and to count what idle sequences hold."""
        self.lock = lock
        self._free = threading.Condition(lock)
        self._seq_rm = seq_rm
        self.seq_cp = seq_cp
        """None where prefixes cannot be copied (set by the engine once it knows)."""
        self._owner: list[int | None] = [None] * n
        self._busy = [False] * n
        self._used = [0] * n
        self._holds: list[tuple[int, ...] | None] = [()] * n
        self._reserved = [0] * n
        """Cells each lease may fill (0: the engine's share per sequence)."""
        """What each idle sequence holds, as its last lease recorded it (None: not known)."""
        self._clock = 0

    def acquire(self, owner: int, preferred: int | None, wait: float) -> tuple[int, bool]:
        """Lease a sequence to ``owner`` for one turn: ``(seq_id, kept)``, ``kept`` when
        ``preferred`` still holds this owner's tokens. Otherwise an unowned sequence, else
        the least recently used idle one, is cleared and handed over. When every sequence
        is busy, waits up to ``wait`` seconds (0: not at all) for a release, then raises
        ``EngineBusy``. (Among unowned sequences an empty one first.)"""
        seq, held = self.lease(owner, preferred, None, wait=wait)
        return seq, held is None

    def lease(self, owner: int, preferred: int | None, prompt: Sequence[int] | None, *,
              wait: float, min_shared: int = 1, cells: int = 0) -> tuple[int, list[int] | None]:
        """As :meth:`acquire`, for a turn that will evaluate ``prompt``: ``(seq_id, held)``,
        ``held`` None when ``preferred`` still holds the owner's own tokens, else the prompt
        prefix the leased sequence now holds (possibly empty).

        On a miss the prompt is routed by content: the idle sequence whose recorded tokens
        share the longest prefix with it (``min_shared`` tokens at least) gives that prefix.
        A giver holding the whole prompt, and owned by nobody, is itself leased, trimmed past
        the prompt (a repeated request then empties no other sequence). Otherwise, where
        prefixes can be copied, the prefix is copied into the sequence the plain rule picks
        (the giver keeps its tokens); otherwise the giver itself is trimmed to the prefix and
        handed over, when that evicts nothing a plain lease would have kept (the giver has no
        owner left, or no sequence is unowned). ``cells``: the most this lease will fill
        (0: a sequence's whole share), what :meth:`_make_room` keeps free for it."""
        with self._free:
            if not self._free.wait_for(lambda: self._busy.count(True) < self.max_busy,
                                       timeout=wait):
                raise EngineBusy(f"all {self.max_busy} KV sequences stayed busy for {wait:g} s "
                                 f"(n_seq_max={self.max_busy})")
            self._clock += 1
            if (preferred is not None and 0 <= preferred < self.n
                    and self._owner[preferred] == owner and not self._busy[preferred]):
                self._take(preferred, cells)
                self._make_room()
                return preferred, None
            idle = [s for s in range(self.n) if not self._busy[s]]
            seq = min(idle, key=lambda s: (self._owner[s] is not None, self._holds[s] != (),
                                           self._used[s]))
            giver, n = self._giver(idle, prompt, min_shared)
            if (giver is not None and prompt is not None and n == len(prompt) - 1
                    and self._owner[giver] is None):
                seq = giver  # the whole prompt is cached: no copy, no sequence emptied for it
            if giver is not None and giver != seq and self.seq_cp is not None:
                self._seq_rm(seq)
                self.seq_cp(giver, seq, 0, n)
            elif giver is not None and (giver == seq or self._owner[giver] is None
                                        or self._owner[seq] is not None):
                seq = giver
                self._seq_rm(seq, n, -1)
            else:
                self._seq_rm(seq)
                n = 0
            self._owner[seq] = owner
            self._take(seq, cells)
            self._make_room()
            return seq, list(prompt[:n]) if prompt is not None else []

    def _make_room(self) -> None:
        """Empty idle sequences, least recently used first, until every lease's share and
        what the idle ones hold fit the pool (an overestimate: a copied prefix's cells are
        counted once per sequence), so a lease never finds the KV cache full."""
        if self.room is None or self._seq_len is None:
            return
        (cells, share), held = self.room, self._seq_len
        whole = share()  # a lease counts at its reservation, or what it still holds if more
        need = sum(max(min(self._reserved[s], whole) or whole, held(s))
                   for s in range(self.n) if self._busy[s])
        idle = sorted((s for s in range(self.n) if not self._busy[s]), key=self._used.__getitem__)
        sizes = {s: held(s) for s in idle}
        total = need + sum(sizes.values())
        for s in idle:
            if total <= cells():
                return
            if sizes[s]:
                self._seq_rm(s)
                self._owner[s], self._holds[s] = None, ()
                total -= sizes[s]

    def _giver(self, idle: list[int], prompt: Sequence[int] | None,
               min_shared: int) -> tuple[int | None, int]:
        """The idle sequence sharing the longest prefix with ``prompt`` and that length,
        (None, 0) below ``min_shared``; never the whole prompt (its last token is evaluated
        for the first row)."""
        if prompt is None or not self.routes:
            return None, 0
        best, n = None, max(0, min_shared - 1)
        for s in idle:
            held = self._holds[s]
            if held and self._seq_len is not None and self._seq_len(s) != len(held):
                _log.warning("KV sequence %d holds %d positions, not the %d tokens recorded "
                             "at its release: not used as a prefix", s, self._seq_len(s),
                             len(held))
                self._holds[s] = held = None
            if held:
                k = min(common_prefix(held, prompt), len(prompt) - 1)
                if k > n and self._resumable is not None:
                    k = self._resumable(s, k)
                if k > n:
                    best, n = s, k
        return (best, n) if best is not None else (None, 0)

    def _take(self, seq: int, cells: int = 0) -> None:
        self._busy[seq] = True
        self._reserved[seq] = cells
        self._used[seq] = self._clock
        self._holds[seq] = None  # known again at release

    def free(self) -> int:
        """How many sequences are not leased right now."""
        with self.lock:
            return self.max_busy - self._busy.count(True)

    def release(self, seq_id: int, holds: Sequence[int] | None = None) -> None:
        """End a lease; the sequence keeps its tokens for the owner's next turn. ``holds``:
        exactly what it holds now (it may then give a prefix to another owner's turn)."""
        with self._free:
            self._busy[seq_id] = False
            self._holds[seq_id] = tuple(holds) if holds is not None else None
            self._free.notify_all()

    def touched(self, seqs: Iterable[int]) -> None:
        """KV edits outside a lease (the low-level API on an idle sequence): its record is
        no longer known, so it gives no prefix."""
        with self.lock:
            for s in seqs:
                if 0 <= s < self.n and not self._busy[s]:
                    self._holds[s] = None

    def release_owner(self, owner: int) -> None:
        """Forget an owner (it is gone): its idle sequences become free to reuse."""
        with self.lock:
            for s in range(self.n):
                if self._owner[s] == owner and not self._busy[s]:
                    self._owner[s] = None

    def forget_owners(self) -> None:
        """Every sequence was emptied: no owner's tokens are kept anywhere."""
        with self.lock:
            self._owner = [None] * self.n
            self._holds = [() if not busy else None for busy in self._busy]


# ------------------------------------------------------------ sliding-window checkpoints
# Sliding-window checkpoints: where a model's window layers drop a sequence's older cells.
#
# A sliding-window model loaded without ``swa_full`` (Gemma 2/3/4, gpt-oss, Cohere 2, ...)
# keeps only the last ``n_swa`` cells (plus a batch's slack) of each sequence in its window
# layers; its full-attention layers keep every cell. Decoding can resume after the first
# ``n`` positions a sequence holds only while the window layers still hold the ``n_swa``
# cells before ``n``, which a long reply has usually pushed out by the next request of the
# same conversation (an agent's next turn repeats the whole prompt before it).
#
# So at the end of each prompt's prefill the window layers' cells of that sequence are saved
# (llama.cpp's sequence state with ``LLAMA_STATE_SEQ_FLAGS_SWA_ONLY``, what llama-server
# calls a context checkpoint), and a sequence cut back to that position, or a prefix of that
# length copied out of it, gets them back: the full-attention cells never left. This is what
# lets ``chatkit serve`` keep prefixes without ``swa_full`` (window layers as large as the
# context, slower on every long prompt).
#
# Bound: one checkpoint per KV sequence id, the last prompt's; a checkpoint is the window's
# cells of all window layers for one sequence (a few MB for a 270M model, hundreds for a 27B
# one) and is dropped when its sequence is cut below it or emptied.

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


class KVCells:
    """A llama.cpp context's KV cells by sequence, and who holds which sequence: cut back,
    copied, asked what they hold, leased for a turn, checkpointed where a sliding window
    drops cells (``Model.kv``; the model lends its methods as its own).

    ``model`` and ``ctx``: llama.cpp's model and context; ``lock``: the engine's; ``n_seq_ids``
    sequence ids of which ``n_seq_max`` are leased at once; ``room``: with cache sequences,
    (cells in the pool, cells one lease may fill), read at each lease. Not thread-safe but
    through ``lock`` (the leases take it; KV edits are made under it by the engine)."""

    def __init__(self, model: Any, ctx: Any, lock: threading.RLock, *, n_seq_ids: int,
                 n_seq_max: int, kv_unified: bool, swa_full: bool,
                 room: tuple[Callable[[], int], Callable[[], int]] | None = None) -> None:
        self._model = model
        self._mem = llama_cpp.llama_get_memory(ctx)
        self.kv_unified = kv_unified
        """One KV pool for every sequence (prefix copies); else a stream per sequence."""
        self.swa_full = swa_full
        """A sliding-window model's window layers keep every cell (llama.cpp's
        ``swa_full``), so sequences keep their prefixes (:attr:`keeps_prefixes`)."""
        self.seq_wait = 60.0
        """Seconds a turn waits for a free KV sequence before ``EngineBusy``."""
        self._windows = (WindowCheckpoints(ctx, self._window_intact)
                         if llama_cpp.llama_model_n_swa(model) > 0 and not swa_full
                         and self.cuts_back else None)
        """A sliding window's checkpoints at each prompt's end (:meth:`checkpoint`)."""
        self.leases = SeqLeases(n_seq_ids, lock, self.seq_rm,
                                self.seq_cp if self.copies_prefixes else None,
                                max_busy=n_seq_max, seq_len=lambda s: self.seq_pos_max(s) + 1,
                                resumable=self.resumable)
        """Which owner holds which sequence."""
        # a window's cells are checked by resumable(); not on one pool (copies_prefixes)
        self.leases.routes = self.keeps_prefixes or (self.cuts_back and not kv_unified)
        self.leases.room = room  # each lease keeps to its share; idle prefixes fill the rest

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove positions [p0, p1) of a sequence (p1=-1: to the end)."""
        self.leases.touched((seq_id,))
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise DecodeError(-1, f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) refused")
        if self._windows is not None:  # cut back to a prompt's end: its window restored
            self._windows.after_rm(seq_id, p0, p1)

    @property
    def copies_prefixes(self) -> bool:
        """Whether a prompt prefix can be copied between sequences and read back exactly:
        one KV pool and :attr:`keeps_prefixes`. (Not a sliding window without ``swa_full``
        on one pool: there the window layers' cells are too few for the copies' windows
        beside the running sequences'; llama.cpp then finds no KV slot.)"""
        return self.kv_unified and self.keeps_prefixes

    @property
    def cuts_back(self) -> bool:
        """Whether a sequence can be cut back to a prefix and decoding resumed there: no
        recurrent state. (Where a sliding window dropped the cells a position needs,
        :meth:`resumable` says how far.)"""
        model = self._model
        return not (llama_cpp.llama_model_is_recurrent(model)
                    or llama_cpp.llama_model_is_hybrid(model))

    @property
    def keeps_prefixes(self) -> bool:
        """Whether a sequence's prefix stays whole as it grows: full attention, or a sliding
        window loaded with ``swa_full`` (else the window drops a sequence's older cells), and
        no recurrent state (which cannot be cut back to a prefix)."""
        model = self._model
        return not ((llama_cpp.llama_model_n_swa(model) > 0 and not self.swa_full)
                    or llama_cpp.llama_model_is_recurrent(model)
                    or llama_cpp.llama_model_is_hybrid(model))

    def resumable(self, seq_id: int, n: int) -> int:
        """How many of the first ``n`` positions ``seq_id`` holds can be kept and decoding
        resumed after them exactly: ``n``; where a sliding window has dropped cells the
        next position attends to, the end of the sequence's window checkpoint if that is
        within ``n`` (cutting the sequence back there, or copying that prefix out of it,
        restores the window: ``WindowCheckpoints`` in :mod:`chatkit.engine.kvseqs`), else 0."""
        if self._window_intact(seq_id, n):
            return max(0, n)
        saved = self._windows.at(seq_id) if self._windows is not None else None
        return saved if saved is not None and 0 < saved <= n else 0

    def _window_intact(self, seq_id: int, n: int) -> bool:
        """Whether ``seq_id`` holds the window's ``n_swa`` positions before ``n``.
        llama.cpp keeps every position from a sequence's lowest to its highest (in the
        window layers; the lowest reported is theirs), so the lowest one held says it."""
        window = int(llama_cpp.llama_model_n_swa(self._model))
        if n <= 0 or window <= 0:
            return True
        lowest = int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq_id))
        return 0 <= lowest <= max(0, n - window)

    def checkpoint(self, seq_id: int, pos: int) -> None:
        """A prompt's prefill ended at ``pos`` in ``seq_id``: on a sliding-window model
        without ``swa_full``, save the window there (one per sequence; a later turn that
        repeats the prompt resumes there whatever the reply pushed out). A no-op
        elsewhere. Costs a copy of the window's cells."""
        if self._windows is not None:
            self._windows.save(seq_id, pos)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make positions [p0, p1) of ``src`` also belong to ``dst`` (no recompute).

        Only with a unified KV cache: llama.cpp aborts the process on a partial copy
        between per-sequence streams, so that is ``InvalidParameter`` here."""
        if not self.kv_unified:
            raise InvalidParameter("seq_cp", "needs a unified KV cache (kv_unified=True)")
        self.leases.touched((dst,))
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)
        if self._windows is not None:  # a prefix ending at src's checkpoint: its window
            self._windows.after_cp(src, dst, p1)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held for the sequence, -1 when empty."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq_id))

    def clear(self) -> None:
        """Drop every sequence from the KV cache (and forget their owners)."""
        llama_cpp.llama_memory_clear(self._mem, True)
        self.leases.forget_owners()
        if self._windows is not None:
            self._windows.forget()

    def acquire_seq(self, owner: int, preferred: int | None = None, *,
                    wait: float | None = None) -> tuple[int, bool]:
        """Lease a KV sequence to ``owner`` (e.g. a conversation's id) for one turn.

        Returns ``(seq_id, kept)``: ``kept`` is True when ``preferred`` still
        holds this owner's cached tokens. Otherwise an unowned sequence, else
        the least recently used idle one, is cleared and handed over. When every
        sequence is busy, waits up to ``wait`` seconds (default ``seq_wait``) for one
        to be released (other threads' turns keep running meanwhile), then raises
        ``EngineBusy``; ``wait=0`` does not wait.
        """
        return self.leases.acquire(owner, preferred, self.seq_wait if wait is None else wait)

    def lease_seq(self, owner: int, preferred: int | None, prompt: Sequence[int], *,
                  min_shared: int = 1, cells: int = 0, wait: float | None = None
                  ) -> tuple[int, list[int] | None]:
        """As :meth:`acquire_seq`, for a turn that evaluates ``prompt``: ``(seq_id, held)``,
        ``held`` None when ``preferred`` still holds the owner's own tokens, else the prompt
        prefix the sequence now holds. On a miss, the idle sequence whose tokens (as its last
        ``release_seq(seq, holds)`` recorded them) share the longest prefix with ``prompt``,
        ``min_shared`` tokens at least, gives it: copied (``copies_prefixes``), or else that
        sequence itself is trimmed and handed over when that evicts nothing a plain lease
        would keep. Routing a request to the cache that shares most of its prompt.
        ``cells``: the most the turn will fill (prompt, reply and drafts; 0: ``n_ctx_seq``),
        which the room kept for cache sequences' prefixes leaves free."""
        return self.leases.lease(owner, preferred, prompt, min_shared=min_shared, cells=cells,
                                  wait=self.seq_wait if wait is None else wait)

    def free_seqs(self) -> int:
        """How many KV sequences are not leased right now."""
        return self.leases.free()

    def release_seq(self, seq_id: int, holds: Sequence[int] | None = None) -> None:
        """End a lease; the sequence keeps its tokens for the owner's next turn. ``holds``:
        exactly the tokens it holds now, which lets another owner's turn start from them
        (``lease_seq``); None when not known."""
        self.leases.release(seq_id, holds)

    def release_seq_owner(self, owner: int) -> None:
        """Forget an owner (it is gone): its sequences become free to reuse."""
        self.leases.release_owner(owner)
