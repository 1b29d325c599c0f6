"""Test processors: a recorder around any processor, an allow-list mask, a no-op."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chatkit import Constraint, LogitProcessor


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

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # is_stopped, forced_tokens, ... of the wrapped one


class Chain:
    """Runs processors in order (e.g. an adversarial bias, then the constraint)."""

    def __init__(self, *procs: LogitProcessor) -> None:
        self.procs = procs

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        for p in self.procs:
            p.process(logits, history)

    def commit(self, token: int) -> None:
        for p in self.procs:
            p.commit(token)

    def reset(self) -> None:
        for p in self.procs:
            p.reset()


class Boost:
    """Adds ``amount`` to the logits of ``ids``: makes the model want those tokens."""

    def __init__(self, ids: Sequence[int], amount: float = 100.0) -> None:
        self.ids = np.asarray(list(ids), dtype=np.int64)
        self.amount = amount

    def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
        logits[self.ids] += self.amount

    def commit(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass


def chat_prompt(model, user: str, system: str | None = None) -> list[int]:  # type: ignore[no-untyped-def]
    """A prompt with segment-safe tokenization: ChatML markup for SmolLM2, plain text for Gemma."""
    if model.chat_template and "<|im_start|>" in model.chat_template:
        ids: list[int] = []
        if system:
            ids += model.tokenize("<|im_start|>system\n", special=True)
            ids += model.tokenize(system, special=False)
            ids += model.tokenize("<|im_end|>\n", special=True)
        ids += model.tokenize("<|im_start|>user\n", special=True)
        ids += model.tokenize(user, special=False)
        ids += model.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
        return ids
    return [model.bos_id, *model.tokenize(f"{system or ''}\nQ: {user}\nA:", special=False)]


def unmasked(c: Constraint) -> Constraint:
    """A no-op variant of ``c`` (mask and matcher disabled, reader kept): the positive
    control for the second reader and the lane checks."""

    class Unmasked(Constraint):
        def process(self, logits: np.ndarray, history: Sequence[int]) -> None:
            pass

        def commit(self, token: int) -> None:
            pass

        def allows(self, token: int) -> bool:
            return True

        def is_accepting(self) -> bool:
            return True

        def is_stopped(self) -> bool:
            return True

    return Unmasked(c.kind, c.grammar, source=c.source, reader=c.reader)
