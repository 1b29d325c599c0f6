"""Test processors: a recorder around any processor, an allow-list mask, a no-op."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatkit import LogitProcessor


class AllowList:
    """Masks every token outside ``allowed`` (a fixed set)."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = sorted(allowed)

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        keep = logits[self.allowed].copy()
        logits[:] = -np.inf
        logits[self.allowed] = keep

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class NoOp:
    """A processor that constrains nothing: the positive control for constraint tests."""

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        pass

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


class Recorder:
    """Wraps a processor and records every call made through the seam."""

    def __init__(self, inner: LogitProcessor) -> None:
        self.inner = inner
        self.commits: list[int] = []
        self.process_calls = 0
        self.resets = 0

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        self.process_calls += 1
        self.inner.process(logits, history)

    def commit(self, token: int) -> None:
        self.commits.append(token)
        self.inner.commit(token)

    def reset(self) -> None:
        self.resets += 1
        self.inner.reset()
