"""When a grammar gets llguidance's sliced tokenizer: only once it pays.

A grammar with a ``maxLength`` string (``wants_slices``) masks much faster inside such
strings with the sliced tokenizer (``chatkit.engine.vocab.LLG_SLICES``), but building it
costs far more than one mask at a large vocabulary, once per process: on a cold lane's
only reply that is most of the gap to a peer. So a process starts without it: such
grammars' masks are counted per vocabulary, and once ``SLICES_AFTER`` of them were made
without slices (about what the build costs in slower masks, at 262k tokens), the sliced copy
is built and every such constraint switches to it at its next commit (a new matcher replays
the tokens so far: the same language, the same masks). A constraint bound after that gets
it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..engine.coldstart import bare_import
from ..engine.protocols import Vocabulary
from .limits import native_limits

__all__: list[str] = []

_log = logging.getLogger("chatkit")

SLICES_AFTER = 64
"""Masks of slice-wanting grammars made without slices before the sliced tokenizer is
built (per vocabulary)."""


def wants_slices(grammar: str) -> bool:
    """Whether a compiled grammar (llguidance's JSON or Lark text) has a string bounded by
    ``maxLength``: the case the sliced tokenizer speeds up. A text test: a grammar that
    only mentions the word (a property of that name) is counted too, which changes no
    mask."""
    return "maxLength" in grammar


def _demand(model: Vocabulary) -> list[int]:
    """The vocabulary's count of masks made without slices by grammars that want them
    (a vocabulary without a cache: already past the threshold, as before)."""
    cache = getattr(model, "cache", None)
    if not callable(cache):
        return [SLICES_AFTER]
    return cache(("grammar", "slice_demand"), lambda: [0])  # type: ignore[no-any-return]


def tokenizer(model: Vocabulary, grammar: str, stop: int) -> tuple[Any, list[int] | None]:
    """llguidance's tokenizer for ``grammar`` over ``model``, and, while the grammar still
    waits for slices, the vocabulary's counter of its masks (add one per mask; switch once
    it reaches ``SLICES_AFTER``); None when it does not wait."""
    if not wants_slices(grammar):
        return model.llg_tokenizer(stop), None
    demand = _demand(model)
    if demand[0] >= SLICES_AFTER:
        return model.llg_tokenizer(stop, sliced=True), None
    return model.llg_tokenizer(stop), demand


def sliced_matcher(model: Vocabulary, grammar: str, stop: int,
                   tokens: Sequence[int]) -> tuple[Any, Any] | None:
    """A matcher of ``grammar`` over the sliced tokenizer (built now if need be) in its
    initial state and after ``tokens``; None when the replay fails (the caller keeps its
    matcher: nothing is lost but speed)."""
    llguidance = bare_import.llguidance()
    initial = llguidance.LLMatcher(model.llg_tokenizer(stop, sliced=True), grammar,
                                   log_level=0, limits=native_limits())
    matcher = initial.deep_copy()
    for token in tokens:
        if not matcher.consume_token(token):
            break
    if initial.is_error() or matcher.is_error():
        _log.info("chatkit: the sliced tokenizer's matcher did not replay; kept the plain one")
        return None
    return initial, matcher
