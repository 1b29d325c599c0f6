"""Token masks as numbers: llguidance's bit words cut to a vocabulary, and applied to a
logits row (sparse ids or an additive bias row); a draft's valid prefix."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

__all__: list[str] = []


def mask_words(matcher: Any, mask: NDArray[np.int32],
                static: NDArray[np.int32]) -> NDArray[np.int32] | None:
    """``matcher``'s mask computed into ``mask`` (one row), ``static``'s cleared bits
    cleared (None: the matcher is in error)."""
    matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    if matcher.is_error():
        return None
    words: NDArray[np.int32] = mask[0]
    np.bitwise_and(words, static, out=words)
    return words


def bit_set(words: NDArray[np.int32], token: int) -> bool:
    """Whether ``token``'s bit is set in mask ``words`` (False past their end)."""
    if not 0 <= token < words.shape[0] * 32:
        return False
    return bool((int(words[token >> 5]) >> (token & 31)) & 1)


def bit_ids(words: NDArray[np.int32], which: NDArray[np.intp]) -> NDArray[np.intp]:
    """Token ids of the set bits in ``words[which]``."""
    bits = np.unpackbits(words[which].view(np.uint8), bitorder="little").reshape(-1, 32)
    rows, cols = np.nonzero(bits)
    return which[rows] * 32 + cols


# Byte -> its 8 bits as additive logit biases (0 allowed, -inf forbidden), little-endian.
BYTE_BIAS = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, 0.0, -np.inf).astype(
    np.float32
)


Prepared = tuple[Literal["sparse", "dense"], NDArray[Any]]


def prepare_bitmask(words: NDArray[np.int32], n: int) -> Prepared:
    """Turn mask words into what :func:`apply_prepared` needs (can run off the main thread).

    A sparse mask (few allowed words) becomes the list of allowed ids; any
    other becomes an additive bias row (0 allowed, -inf forbidden) expanded
    byte by byte through a 256x8 table: branch-free, several times faster than a boolean
    ``putmask`` at a large vocabulary (docs/benchmarks.md has the figures).
    """
    allowed_words = np.flatnonzero(words)
    if allowed_words.shape[0] <= words.shape[0] // 16:
        ids = bit_ids(words, allowed_words)
        return "sparse", ids[ids < n]
    bias = np.take(BYTE_BIAS, words.view(np.uint8), axis=0).reshape(-1)
    return "dense", bias[:n]


def apply_prepared(logits: NDArray[np.float32], prepared: Prepared) -> None:
    """Set the forbidden logits to -inf, in place."""
    kind, data = prepared
    if kind == "sparse":
        keep = logits[data]
        logits.fill(-np.inf)
        logits[data] = keep
    else:
        np.add(logits, data, out=logits)


def apply_bitmask(logits: NDArray[np.float32], words: NDArray[np.int32]) -> None:
    """Set logits whose bit is 0 to -inf, in place; bits past ``len(logits)`` are ignored."""
    apply_prepared(logits, prepare_bitmask(words, logits.shape[0]))


def valid_prefix(matcher: Any, tokens: list[int], *, hidden_stops: bool) -> int:
    """How many leading ``tokens`` ``matcher`` accepts, in order (the matcher unchanged).

    llguidance's ``validate_tokens`` stops at the token that completes a hidden stop string
    (a think block's closing text, ``stop="</think>"``) although the matcher and its mask
    take the tokens after it. Where the grammar has such stops (``hidden_stops``), the rest
    is validated from there on a copy, a token at a time across each such point (cost: one
    matcher copy, only where a draft stops short)."""
    n = int(matcher.validate_tokens(tokens))
    if n == len(tokens) or not hidden_stops:
        return n
    copy = matcher.deep_copy()
    done = 0
    while done + n < len(tokens):
        for t in tokens[done:done + n]:
            copy.consume_token(t)
        done += n
        if copy.validate_tokens(tokens[done:done + 1]) != 1:
            return done
        copy.consume_token(tokens[done])
        done += 1
        n = int(copy.validate_tokens(tokens[done:]))
    return done + n
