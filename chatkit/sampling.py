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

# Candidate widths, in temperature-scaled logits below the top token (inf: all).
_WIDTHS = (10.0, 20.0, 40.0, math.inf)


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
        """Temperature, top-k, top-p, min-p and one draw, exact to the full distribution.

        Candidates are the tokens within ``r * temperature`` logits of the top
        (r = 10, then 20, 40, then everything). Every token left out weighs
        less than e^-r of the top one, which bounds the normaliser; the result
        is accepted only when the kept set and the drawn index are the same for
        every normaliser inside that bound, so it equals inverse-CDF sampling
        over the whole vocabulary (sorted by probability, ties by id). Cost:
        one max and one comparison over the row; exp and sort on candidates only.
        """
        p = self.params
        t = p.temperature
        n = row.shape[0]
        top = float(row.max())
        if not top > -np.inf:
            raise AllTokensMasked("no selectable token: every logit is -inf or NaN")
        floor = top + t * math.log(p.min_p) if p.min_p > 0.0 else -math.inf
        limit = p.top_k if 0 < p.top_k < n else n
        u = self.rng.random()
        for r in _WIDTHS:
            # min-p is applied after top-p, so it may only narrow the candidates
            # when top-p is off (top-p's normaliser covers every top-k token).
            thr = top - r * t if p.top_p < 1.0 else max(top - r * t, floor)
            cand = np.flatnonzero(row >= np.float32(thr)) if thr > -math.inf else (
                np.flatnonzero(row > -np.inf))
            if cand.shape[0] > limit:
                cand = cand[np.argpartition(-row[cand], limit - 1)[:limit]]
            cand = cand[np.lexsort((cand, -row[cand]))]  # most likely first, ties by id
            size = cand.shape[0]
            cum = np.cumsum(np.exp((row[cand].astype(np.float64) - top) / t))
            covered = thr == floor or size == limit  # nothing outside can be kept
            rest = 0.0 if covered else (limit - size) * math.exp(-r)
            if p.top_p < 1.0:
                keep = int(np.searchsorted(cum, p.top_p * cum[-1], side="left")) + 1
                if rest and int(np.searchsorted(cum, p.top_p * (cum[-1] + rest))) + 1 != keep:
                    continue  # the nucleus might reach below the candidates
                keep = min(keep, size)
                if p.min_p > 0.0:
                    keep = min(keep, int(np.count_nonzero(row[cand[:keep]] >= floor)))
                idx = int(np.searchsorted(cum[:keep], u * cum[keep - 1], side="right"))
                return int(cand[min(idx, keep - 1)])
            idx = int(np.searchsorted(cum, u * cum[-1], side="right"))
            if rest and (idx >= size or idx != int(np.searchsorted(cum, u * (cum[-1] + rest),
                                                                     side="right"))):
                continue  # the draw might land below the candidates
            return int(cand[min(idx, size - 1)])
        raise AssertionError("unreachable: the last width covers every token")


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
