"""Decode loop drivers. Every path samples through ``Sampler.next``.

``generate`` is the plain loop: prefill (or reuse) a sequence's prompt, then
one ``llama_decode`` of one token per step until a stop token or
``max_tokens``. The lockstep batch and speculative drivers come later and
keep the same shape.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .model import SAFE_PREFILL_CHUNK, Model, SeqChunk
from .sampling import Sampler

__all__ = ["FinishReason", "Generation", "generate"]

FinishReason = Literal["stop", "length", "constraint_complete", "dead_end", "tool_calls"]


@dataclass
class Generation:
    """The raw result of one decode: tokens, text and why it ended."""

    tokens: list[int]
    """Generated ids, the stop token excluded."""
    text: str
    """Their text (invalid UTF-8 replaced)."""
    finish_reason: FinishReason
    """stop (stop token), length (max_tokens), constraint_complete (the grammar ended it)."""
    prompt_tokens: int
    """Prompt length in tokens."""
    prompt_tokens_evaluated: int
    """Prompt tokens actually decoded (the rest was reused from the KV cache)."""
    seconds: float = 0.0
    """Wall time of prefill and generation."""
    first_token_seconds: float = 0.0
    """Wall time until the first token was selected."""
    stop_token: int | None = field(default=None)
    """The stop token that ended it, if any."""


def generate(
    model: Model,
    prompt: Sequence[int],
    sampler: Sampler,
    *,
    max_tokens: int = 256,
    stop_ids: Iterable[int] | None = None,
    seq_id: int = 0,
    reuse: int = 0,
    prefill_chunk: int = SAFE_PREFILL_CHUNK,
) -> Generation:
    """Decode one reply for ``prompt`` in KV sequence ``seq_id``.

    ``reuse`` leading prompt tokens are assumed to be in the sequence's KV
    cache already (the caller owns that bookkeeping); everything after them
    is removed and re-evaluated. ``stop_ids`` default to the model's EOS and
    end-of-turn ids. Raises ``AllTokensMasked``/``ConstraintError`` from the
    sampler and ``DecodeError`` from llama.cpp.
    """
    stops = set(stop_ids) if stop_ids is not None else {model.eos_id, model.eot_id}
    reuse = max(0, min(reuse, len(prompt) - 1))
    t0 = time.perf_counter()
    model.seq_rm(seq_id, reuse, -1)
    suffix = prompt[reuse:]
    row = model.prefill(seq_id, suffix, reuse, chunk=prefill_chunk)
    history = list(prompt)
    out: list[int] = []
    finish: FinishReason = "length"
    stop_token: int | None = None
    first = 0.0
    pos = len(prompt)
    while len(out) < max_tokens:
        tok = sampler.next(row, history)
        if not out:
            first = time.perf_counter() - t0
        if tok in stops:
            stop_token = tok
            finish = "constraint_complete" if _constraint_done(sampler) else "stop"
            break
        out.append(tok)
        history.append(tok)
        if len(out) >= max_tokens:
            break
        row = model.decode([SeqChunk(seq_id, pos, (tok,))])[0][0]
        pos += 1
    return Generation(
        tokens=out,
        text=model.detokenize(out),
        finish_reason=finish,
        prompt_tokens=len(prompt),
        prompt_tokens_evaluated=len(suffix),
        seconds=time.perf_counter() - t0,
        first_token_seconds=first,
        stop_token=stop_token,
    )


def _constraint_done(sampler: Sampler) -> bool:
    """True when the sampler's processor is a grammar that had completed."""
    proc = sampler.processor
    is_stopped = getattr(proc, "is_stopped", None)
    return bool(is_stopped()) if callable(is_stopped) else False
