"""SeqLeases: which owner (a conversation) holds which of an engine's KV sequences, and
which are leased for a turn right now."""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import EngineBusy

__all__: list[str] = []


class SeqLeases:
    """Leases of ``n`` KV sequences, guarded by ``lock`` (the engine's own, so a lease and
    the KV edits around it do not interleave). ``clear_seq(seq)`` empties a sequence that
    changes owner."""

    def __init__(self, n: int, lock: threading.RLock, clear_seq: Callable[[int], None]) -> None:
        self.n = n
        self.lock = lock
        self._free = threading.Condition(lock)
        self._clear_seq = clear_seq
        self._owner: list[int | None] = [None] * n
        self._busy = [False] * n
        self._used = [0] * n
        self._clock = 0

    def acquire(self, owner: int, preferred: int | None, wait: float) -> tuple[int, bool]:
        """Lease a sequence to ``owner`` for one turn: ``(seq_id, kept)``, ``kept`` when
        ``preferred`` still holds this owner's tokens. Otherwise an unowned sequence, else
        the least recently used idle one, is cleared and handed over. When every sequence
        is busy, waits up to ``wait`` seconds (0: not at all) for a release, then raises
        ``EngineBusy``."""
        with self._free:
            if not self._free.wait_for(lambda: False in self._busy, timeout=wait):
                raise EngineBusy(f"all {self.n} KV sequences stayed busy for {wait:g} s "
                                 f"(n_seq_max={self.n})")
            self._clock += 1
            if (preferred is not None and 0 <= preferred < self.n
                    and self._owner[preferred] == owner and not self._busy[preferred]):
                self._take(preferred)
                return preferred, True
            idle = [s for s in range(self.n) if not self._busy[s]]
            seq = min(idle, key=lambda s: (self._owner[s] is not None, self._used[s]))
            self._clear_seq(seq)
            self._owner[seq] = owner
            self._take(seq)
            return seq, False

    def _take(self, seq: int) -> None:
        self._busy[seq] = True
        self._used[seq] = self._clock

    def free(self) -> int:
        """How many sequences are not leased right now."""
        with self.lock:
            return self._busy.count(False)

    def release(self, seq_id: int) -> None:
        """End a lease; the sequence keeps its tokens for the owner's next turn."""
        with self._free:
            self._busy[seq_id] = False
            self._free.notify_all()

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
