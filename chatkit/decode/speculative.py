"""Speculative decoding where the grammar drafts.

A :class:`DraftSource` proposes the next few tokens; the verify step
(:meth:`chatkit.decode.decoding.Decoder.spec_step`) evaluates ``[last, draft...]`` in
one ``llama_decode`` and walks the rows through the same ``Sampler.next``
(which commits every sampled token): accepted while the sample equals the
draft, then the first mismatch's sample is the correction, or, all accepted,
the next row gives a bonus token. Rejected positions leave the KV cache. No
rollback is needed, and the output is the plain loop's output.

- :class:`PromptLookupSource`: n-gram lookup in the history (copies spans of
  the prompt: names, quoted values, repeated keys).
- :class:`ConstrainedSource`: when the grammar forces a continuation
  (llguidance fast-forward tokens) that span is the draft; otherwise the inner
  source drafts and the draft is cut at its first grammar-invalid token.
- :class:`CostGate`: turns speculation off for a stretch when acceptance makes
  it a loss (a batch of n tokens costs about 1 + 0.43 (n - 1) single steps
  here, DESIGN.md), and back on later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .sampling import DraftAwareProcessor

__all__ = ["ConstrainedSource", "CostGate", "DraftSource", "PromptLookupSource"]


@runtime_checkable
class DraftSource(Protocol):
    """Proposes up to ``k`` tokens to follow ``history``; told how many were rejected."""

    def propose(self, history: Sequence[int], k: int) -> list[int]: ...

    def truncated(self, n: int) -> None: ...


class PromptLookupSource:
    """Prompt lookup decoding: find the latest earlier occurrence of the last n tokens
    (n from ``ngram_max`` down to ``ngram_min``) and propose what followed it."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1) -> None:
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        h = list(history)
        for n in range(min(self.ngram_max, len(h) - 1), self.ngram_min - 1, -1):
            key = h[-n:]
            for start in range(len(h) - n - 1, -1, -1):
                if h[start : start + n] == key:
                    follow = h[start + n : start + n + k]
                    if follow:
                        return follow
        return []

    def truncated(self, n: int) -> None:
        pass


class ConstrainedSource:
    """Grammar-forced spans first; else the inner source's draft cut at its first
    token the grammar would refuse (so no verify slot is spent on a sure reject)."""

    def __init__(self, processor: DraftAwareProcessor, inner: DraftSource | None = None) -> None:
        self.processor = processor
        self.inner = inner if inner is not None else PromptLookupSource()
        self.pruned = 0
        """Draft tokens cut before verification because the grammar refuses them."""
        self.forced = 0
        """Draft tokens that came from grammar-forced spans."""

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        forced = self.processor.forced_tokens()[:k]
        if forced:
            self.forced += len(forced)
            return forced
        draft = self.inner.propose(history, k)
        keep = self.processor.valid_prefix_len(draft) if draft else 0
        self.pruned += len(draft) - keep
        return draft[:keep]

    def truncated(self, n: int) -> None:
        self.inner.truncated(n)


class CostGate:
    """Speculate only while it pays; switch off for ``pause`` steps when it does not.

    By default the decision is reproducible: it depends only on draft acceptance (a
    verify of d drafts yields 1 + acceptance*d tokens and costs 1 + per_token_cost*d
    single passes; 0.8 measured on a 2-core CPU), never on the clock, so the same
    prompt drafts the same way whatever the machine load. ``timed=True`` (opt-in) also
    learns from step timings: the recent tokens/s of verify steps against plain steps,
    as moving averages, once both are known.
    """

    def __init__(self, per_token_cost: float = 0.8, pause: int = 8, *,
                 timed: bool = False) -> None:
        self.per_token_cost = per_token_cost
        self.pause = pause
        self.timed = timed
        self.acceptance = 1.0  # optimistic start: try speculation first
        self.plain_rate: float | None = None  # tokens/s, moving average
        self.spec_rate: float | None = None
        self._off_for = 0

    def allow(self) -> bool:
        if self._off_for > 0:
            self._off_for -= 1
            return False
        return True

    def record(self, drafted: int, accepted: int, *, seconds: float | None = None,
               tokens: int | None = None) -> None:
        """One step: ``drafted`` tokens verified, ``accepted`` of them kept; optionally the
        step's wall time and the tokens it produced."""
        rate = tokens / seconds if self.timed and seconds and tokens else None
        if drafted <= 0:
            if rate is not None:
                self.plain_rate = _ema(self.plain_rate, rate)
            return
        self.acceptance = 0.7 * self.acceptance + 0.3 * (accepted / drafted)
        if rate is not None:
            self.spec_rate = _ema(self.spec_rate, rate)
        if self.timed and self.plain_rate is not None and self.spec_rate is not None:
            pays = self.spec_rate >= self.plain_rate
        else:  # tokens gained per verify vs its cost, both in single-step units
            pays = 1.0 + self.acceptance * drafted >= 1.0 + self.per_token_cost * drafted
        if not pays:
            self._off_for = self.pause


def _ema(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new
