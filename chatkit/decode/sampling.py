"""Sampling: the one seam every decode path samples through.

``Sampler.next(logits_row, history)`` runs, in order: the processor's
``process`` (masks/biases, first), penalties, temperature, top-k, top-p, min-p,
the pick, and the processor's ``commit`` (exactly once per selection, greedy
included). Nothing on the per-token path loops over the vocabulary in Python.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..errors import AllTokensMasked, InvalidParameter
from ..messages import TokenLogprob

__all__ = [
    "CheckingProcessor",
    "DraftAwareProcessor",
    "GrammarProcessor",
    "LogitProcessor",
    "Sampler",
    "SamplingParams",
]

Logits = NDArray[np.float32]

MAX_TEMPERATURE = 1e4

# Sampling works on the tokens within _BAND temperature-scaled logits of the top,
# bucketed in _BUCKETS slices for the top-p crossing.
_BAND = 20.0
_BUCKETS = 64


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
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "seed" and value is None:
                continue
            kinds = int if f.name in ("seed", "top_k", "penalty_window") else int | float
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise InvalidParameter(f.name, f"must be a number, got {value!r}")
        checks = [
            # Past ~1e4, logits / temperature underflow float32's resolution: refuse by name.
            ("temperature", 0 <= self.temperature <= MAX_TEMPERATURE),
            ("top_k", self.top_k >= 0),
            ("top_p", 0 < self.top_p <= 1),
            ("min_p", 0 <= self.min_p < 1),
            ("repeat_penalty", self.repeat_penalty > 0 and math.isfinite(self.repeat_penalty)),
            ("presence_penalty", math.isfinite(self.presence_penalty)),
            ("frequency_penalty", math.isfinite(self.frequency_penalty)),
            ("penalty_window", self.penalty_window >= 0),
            ("seed", self.seed is None or 0 <= self.seed < 2**63),
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
class CheckingProcessor(LogitProcessor, Protocol):
    """A processor that can say whether it allows one token without masking the row.

    With ``check_first`` true, greedy selection asks ``allows`` about the unmasked
    argmax first and calls ``process`` only when it is refused (same token, see
    ``Sampler._greedy_checked``). ``allows`` must agree with the mask ``process``
    would apply, and must not change the processor's state.
    """

    check_first: bool

    def allows(self, token: int) -> bool: ...


@runtime_checkable
class GrammarProcessor(LogitProcessor, Protocol):
    """A processor that knows whether its grammar has completed (``chatkit.Constraint``)."""

    def is_accepting(self) -> bool:
        """The text so far is a complete match (the stop token is allowed now)."""
        ...

    def is_stopped(self) -> bool:
        """Nothing but the stop token can follow."""
        ...


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
        self._processor: LogitProcessor | None = None
        self._checking: CheckingProcessor | None = None
        self.processor = processor
        self._rng: np.random.Generator | None = None
        self.logprobs: int | None = None
        """Record each selected token's log-probability, with this many most probable
        alternatives (None: off). The distribution is the one the token was chosen from:
        the row after the processor's mask and the penalties, at the temperature in force
        (1 under greedy), before top-k / top-p / min-p truncation; under a grammar it sums
        to 1 over the tokens the grammar allows. Costs one log-softmax over the vocabulary
        per token, and greedy check-first is off (the whole row is masked)."""
        self.last_logprob: TokenLogprob | None = None
        """The last selection's (with ``logprobs`` on)."""

    @property
    def rng(self) -> np.random.Generator:
        """The sampling RNG (``params.seed``), made at the first sampled token: a greedy
        sampler never needs it, and ``numpy.random``'s import is on the path to a process's
        first token."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.params.seed)
        return self._rng

    @property
    def processor(self) -> LogitProcessor | None:
        """The processor that hooks every selection (None: unconstrained)."""
        return self._processor

    @processor.setter
    def processor(self, value: LogitProcessor | None) -> None:
        self._processor = value
        # Checked once here, not per token (protocol isinstance checks cost microseconds).
        self._checking = value if isinstance(value, CheckingProcessor) else None

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
        if self.logprobs is not None:
            self.last_logprob = _logprob(logits_row, token, self.params, self.logprobs)
        proc = self._processor  # the attribute, not the property: this runs per token
        if proc is not None:
            proc.commit(token)
        return token

    def _select(self, row: Logits, history: Sequence[int]) -> int:
        p = self.params
        proc = self._processor
        checking = self._checking
        if p.greedy and checking is not None and checking.check_first \
                and self.logprobs is None:
            return self._greedy_checked(row, history, checking)
        if proc is not None:
            proc.process(row, history)
        if p.has_penalties and history:
            _apply_penalties(row, history, p)
        if p.greedy:
            return _argmax(row)
        return self._sample(row)

    def _greedy_checked(self, row: Logits, history: Sequence[int],
                        proc: CheckingProcessor) -> int:
        """Greedy with a processor that can answer ``allows(token)``: the unmasked argmax
        is kept when the processor allows it, else the row is masked and argmax'd again.

        Exact: the mask only sets tokens to -inf and penalties map -inf to -inf, so an
        allowed maximum of the whole row (lowest id among ties) is also the maximum of
        the masked row. A grammar usually allows the model's favourite token, so the
        full mask (the costly part inside free strings) is computed only when it does not.
        """
        if self.params.has_penalties and history:
            _apply_penalties(row, history, self.params)
        token = int(np.argmax(row))
        if row[token] > -np.inf and proc.allows(token):
            return token
        proc.process(row, history)
        return _argmax(row)

    def _sample(self, row: Logits) -> int:
        """Temperature, top-k, top-p, min-p and one draw, exact to the full distribution.

        Top-p keeps the smallest set of most probable tokens (ties: lower id
        first) whose probability reaches top_p; min-p then drops tokens below
        min_p times the top token's probability; the draw is inverse-CDF
        sampling over the kept tokens in id order. Only the BAND (tokens within
        20 temperature-scaled logits of the top) is exponentiated: every other
        token weighs less than e^-20 of the top one, which bounds the
        normaliser, and a result is used only when it is the same for every
        normaliser inside that bound; otherwise an exact pass over the whole
        row decides. Cost: one max and one comparison over the row, then
        vectorised work on the band (no full-vocabulary exp or sort).
        """
        p = self.params
        n = row.shape[0]
        top = float(row.max())
        if not top > -np.inf:
            raise AllTokensMasked("no selectable token: every logit is -inf or NaN")
        u = self.rng.random()
        limit = p.top_k if 0 < p.top_k < n else n
        ids = np.flatnonzero(row >= np.float32(top - _BAND * p.temperature))
        complete = ids.shape[0] >= limit
        if ids.shape[0] > limit:
            ids = np.sort(ids[np.argpartition(-row[ids], limit - 1)[:limit]])
        rest = 0.0 if complete else (limit - ids.shape[0]) * math.exp(-_BAND)
        pick = self._pick(row, ids, top, rest, u)
        if pick is None:  # undecided inside the band: an exact pass over every token
            every = np.flatnonzero(row > -np.inf)
            if every.shape[0] > limit:
                every = np.sort(every[np.argpartition(-row[every], limit - 1)[:limit]])
            pick = self._pick(row, every, top, 0.0, u)
        assert pick is not None
        return pick

    def _pick(self, row: Logits, ids: NDArray[np.intp], top: float, rest: float,
              u: float) -> int | None:
        """Draw among ``ids`` (ascending); ``rest`` bounds the weight of selectable
        tokens outside them. None when that bound leaves the result undecided."""
        p = self.params
        vals = row[ids]
        scaled = (vals - np.float32(top)) / np.float32(p.temperature)
        w = np.exp(scaled, dtype=np.float32)
        if p.top_p < 1.0:
            kept = _nucleus(scaled, w, p.top_p, rest)
            if kept is None:
                return None
            ids, w, rest = ids[kept], w[kept], 0.0
        if p.min_p > 0.0:
            sel = w >= np.float32(p.min_p)
            ids, w = ids[sel], w[sel]
            if p.min_p >= math.exp(-_BAND):
                rest = 0.0  # every token that can be kept is among ids
        cum = np.cumsum(w, dtype=np.float64)
        idx = int(np.searchsorted(cum, u * cum[-1], side="right"))
        if rest and (idx >= ids.shape[0] or idx != int(
                np.searchsorted(cum, u * (cum[-1] + rest), side="right"))):
            return None
        return int(ids[min(idx, ids.shape[0] - 1)])


def _nucleus(scaled: NDArray[np.float32], w: NDArray[np.float32], top_p: float,
             rest: float) -> NDArray[np.intp] | None:
    """Positions (ascending) of the top-p set, or None when ``rest`` leaves it undecided.

    Buckets the candidates by scaled logit (one bincount), finds the bucket
    where the cumulative mass crosses top_p, and sorts only that bucket.
    """
    bucket = np.minimum((-scaled * (_BUCKETS / _BAND)).astype(np.intp), _BUCKETS - 1)
    mass = np.cumsum(np.bincount(bucket, weights=w, minlength=_BUCKETS))
    z = float(mass[-1])
    target, target_hi = top_p * z, top_p * (z + rest)
    b = min(int(np.searchsorted(mass, target, side="left")), _BUCKETS - 1)
    if target_hi > mass[b]:
        return None  # with the largest normaliser the crossing moves to a later bucket
    inside = np.flatnonzero(bucket == b)
    inside = inside[np.lexsort((inside, -scaled[inside]))]  # most probable first, ties by id
    before = float(mass[b - 1]) if b > 0 else 0.0
    cum = before + np.cumsum(w[inside], dtype=np.float64)
    k = int(np.searchsorted(cum, target, side="left")) + 1
    if rest and int(np.searchsorted(cum, target_hi, side="left")) + 1 != k:
        return None
    return np.sort(np.concatenate([np.flatnonzero(bucket < b), inside[:k]]))


def _argmax(row: Logits) -> int:
    token = int(np.argmax(row))
    if not row[token] > -np.inf:  # -inf everywhere, or NaN
        raise AllTokensMasked("no selectable token: every logit is -inf or NaN")
    return token


def _logprob(row: Logits, token: int, p: SamplingParams, k: int) -> TokenLogprob:
    scaled = row.astype(np.float64) / (p.temperature if p.temperature > 0 else 1.0)
    top = float(scaled.max())
    lse = top + math.log(float(np.exp(scaled - top).sum()))
    top_ids: list[int] = []
    if k > 0:
        k = min(k, int(np.isfinite(scaled).sum()))
        part = np.argpartition(-scaled, k - 1)[:k]
        top_ids = [int(i) for i in part[np.argsort(-scaled[part], kind="stable")]]
    return TokenLogprob(token, float(scaled[token]) - lse,
                        tuple((i, float(scaled[i]) - lse) for i in top_ids))


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
