"""Sampling: the one seam every decode path samples through.

``Sampler.next(logits_row, history)`` runs, in order: the processor's
``process`` (masks/biases, first), penalties, temperature, top-k, top-p, min-p,
the pick, and the processor's ``commit`` (exactly once per selection, greedy
included). Nothing on the per-token path loops over the vocabulary in Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from .errors import AllTokensMasked, InvalidParameter

__all__ = [
    "DraftAwareProcessor",
    "LogitProcessor",
    "Sampler",
    "SamplingParams",
]

Logits = NDArray[np.float32]

# Candidates examined before falling back to a full sort for top-p; the
# nucleus is exact either way (the fallback covers the rare wide nucleus).
_TOP_CANDIDATES = 256


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are picked. ``temperature=0`` is greedy (argmax), the default.

    Raises ``InvalidParameter`` on out-of-range values.
    """

    temperature: float = 0.0
    """0 = greedy; > 0 scales logits before sampling."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Keep the smallest set whose probability reaches top_p (1 = off)."""
    min_p: float = 0.0
    """Drop tokens below min_p times the top token's probability (0 = off)."""
    repeat_penalty: float = 1.0
    """llama.cpp-style: positive logits of recent tokens divided by it, negative multiplied."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of each token present in the window."""
    frequency_penalty: float = 0.0
    """Subtracted per occurrence of the token in the window."""
    penalty_window: int = 64
    """How many of the last history tokens the penalties look at."""
    seed: int | None = None
    """Seeds the sampler's own RNG; None draws fresh entropy."""

    def __post_init__(self) -> None:
        checks = [
            ("temperature", self.temperature >= 0 and math.isfinite(self.temperature)),
            ("top_k", self.top_k >= 0),
            ("top_p", 0 < self.top_p <= 1),
            ("min_p", 0 <= self.min_p < 1),
            ("repeat_penalty", self.repeat_penalty > 0 and math.isfinite(self.repeat_penalty)),
            ("presence_penalty", math.isfinite(self.presence_penalty)),
            ("frequency_penalty", math.isfinite(self.frequency_penalty)),
            ("penalty_window", self.penalty_window >= 0),
        ]
        for name, ok in checks:
            if not ok:
                raise InvalidParameter(name, f"out of range: {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.penalty_window > 0 and (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@runtime_checkable
class LogitProcessor(Protocol):
    """Hooks the sampler. Implementations: ``chatkit.Constraint``, test recorders.

    ``process`` masks/biases one ``[n_vocab]`` float32 row in place (``-inf`` =
    forbidden) and runs before everything else; ``commit`` observes the token
    selected, exactly once per ``Sampler.next``; ``reset`` re-arms the state at
    the start of every assistant turn.
    """

    def process(self, logits: Logits, history: Sequence[int]) -> None: ...

    def commit(self, token: int) -> None: ...

    def reset(self) -> None: ...


@runtime_checkable
class DraftAwareProcessor(LogitProcessor, Protocol):
    """A processor that can also answer the speculative drafter's pure lookaheads."""

    def forced_tokens(self) -> list[int]:
        """Tokens the processor forces next, whatever the logits (may be empty)."""
        ...

    def valid_prefix_len(self, draft: Sequence[int]) -> int:
        """How many leading tokens of ``draft`` the processor would accept, in order."""
        ...


class Sampler:
    """Picks one token per call; owns its RNG so seeded runs reproduce.

    One Sampler per stream; not thread-safe. ``next`` may modify
    ``logits_row`` in place (it is a scratch row owned by the decode loop).
    """

    def __init__(
        self,
        params: SamplingParams | None = None,
        processor: LogitProcessor | None = None,
    ) -> None:
        self.params = params if params is not None else SamplingParams()
        self.processor = processor
        self.rng = np.random.default_rng(self.params.seed)

    def reset(self) -> None:
        """Start of an assistant turn: re-arm the processor (the RNG keeps its stream)."""
        if self.processor is not None:
            self.processor.reset()

    def next(self, logits_row: Logits, history: Sequence[int]) -> int:
        """Select the next token and commit it to the processor.

        Raises ``AllTokensMasked`` when no token is selectable (nothing is
        committed then). Cost: one argmax when greedy; when sampling, one exp
        over the vocabulary plus a partial sort of the top candidates.
        """
        token = self._select(logits_row, history)
        if self.processor is not None:
            self.processor.commit(token)
        return token

    def _select(self, row: Logits, history: Sequence[int]) -> int:
        p = self.params
        if self.processor is not None:
            self.processor.process(row, history)
        if p.has_penalties and history:
            _apply_penalties(row, history, p)
        if p.greedy:
            token = int(np.argmax(row))
            if not row[token] > -np.inf:  # -inf everywhere, or NaN
                raise AllTokensMasked("no selectable token: every logit is -inf or NaN")
            return token
        return self._sample(row)

    def _sample(self, row: Logits) -> int:
        """Temperature, top-k, top-p, min-p and a draw, exact to the full distribution.

        Works on the top ``_TOP_CANDIDATES`` tokens (argpartition) when that
        provably holds the whole kept set; otherwise falls back to an O(n)
        draw over the row (no truncation) or, rarely, a full sort.
        """
        p = self.params
        n = row.shape[0]
        top_k = p.top_k if 0 < p.top_k < n else n
        width = min(top_k, _TOP_CANDIDATES)
        cand = _top_indices(row, width)
        vals = row[cand].astype(np.float64)
        top = vals[0]
        if not top > -np.inf:
            raise AllTokensMasked("no selectable token: every logit is -inf or NaN")
        weights = np.exp((vals - top) / p.temperature)
        exact = width == top_k  # the candidates are the whole top-k support
        if exact:
            probs = weights / weights.sum()
        else:
            full = np.exp((row.astype(np.float64) - top) / p.temperature)
            if p.top_p >= 1.0 and p.min_p == 0.0:
                return self._draw(np.arange(n), full)
            probs = weights / full.sum()
        keep = width
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p, side="left")) + 1
            if keep > width:  # the nucleus is wider than the candidates
                if not exact:
                    return self._sample_sorted(row)
                keep = width  # rounding: the whole top-k support
        if p.min_p > 0.0:
            above = int(np.count_nonzero(probs[:keep] >= p.min_p * probs[0]))
            if not exact and p.top_p >= 1.0 and above == width:
                return self._sample_sorted(row)
            keep = min(keep, above)
        return self._draw(cand[:keep], probs[:keep])

    def _draw(self, ids: NDArray[np.int64], weights: NDArray[np.float64]) -> int:
        """One draw from unnormalised ``weights`` over ``ids`` (one RNG call)."""
        cum = np.cumsum(weights)
        idx = int(np.searchsorted(cum, self.rng.random() * cum[-1], side="right"))
        return int(ids[min(idx, ids.shape[0] - 1)])

    def _sample_sorted(self, row: Logits) -> int:
        """Exact fallback for a kept set wider than the candidates: sorts the row."""
        p = self.params
        n = row.shape[0]
        top_k = p.top_k if 0 < p.top_k < n else n
        cand = np.argsort(-row, kind="stable")[:top_k]
        vals = row[cand].astype(np.float64)
        probs = np.exp((vals - vals[0]) / p.temperature)
        probs /= probs.sum()
        keep = top_k
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p, side="left")) + 1)
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs[:keep] >= p.min_p * probs[0])))
        return self._draw(cand[:keep], probs[:keep])


def _top_indices(row: Logits, width: int) -> NDArray[np.int64]:
    """Indices of the ``width`` largest logits, largest first (ties: lower id first)."""
    n = row.shape[0]
    if width < n:
        part = np.argpartition(row, n - width)[n - width :]
    else:
        part = np.arange(n)
    order = np.lexsort((part, -row[part]))
    return part[order].astype(np.int64)


def _apply_penalties(row: Logits, history: Sequence[int], p: SamplingParams) -> None:
    """Repeat/presence/frequency penalties over the last ``penalty_window`` tokens.

    ``-inf`` stays ``-inf``: division and multiplication by a positive penalty and
    subtraction of a finite amount all preserve it.
    """
    window = np.asarray(history[-p.penalty_window :], dtype=np.int64)
    window = window[(window >= 0) & (window < row.shape[0])]
    if window.size == 0:
        return
    ids, counts = np.unique(window, return_counts=True)
    vals = row[ids]
    if p.repeat_penalty != 1.0:
        vals = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
    if p.frequency_penalty != 0.0:
        vals = vals - counts.astype(np.float32) * p.frequency_penalty
    if p.presence_penalty != 0.0:
        vals = vals - p.presence_penalty
    row[ids] = vals.astype(np.float32)
