"""Decode loop drivers. Every path samples through ``Sampler.next``.

The plain loop is written once, as a step machine (:class:`Decoder`): each
``step()`` evaluates the previous token and samples the next one under the
model's lock, so a logits row never outlives the ``llama_decode`` that made
it and steps of different conversations can interleave on one model. The
sync driver (:func:`generate`) calls the steps directly; async drivers run
each step in a worker thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..engine.protocols import SAFE_PREFILL_CHUNK, SAFE_VERIFY_KV, SeqChunk, StepEngine
from ..errors import ChecksExhausted, InvalidParameter
from ..grammar.guard import Rollback
from ..messages import FinishReason, Usage
from .options import check_max_tokens
from .sampling import GrammarProcessor, Logits, Sampler

if TYPE_CHECKING:
    from .speculative import CostGate, DraftSource

__all__ = ["Generation", "generate"]

EndCause = Literal["stop_token", "length", "stop_string"]


def decide_finish(end: EndCause, *, grammar_done: bool, tool_calls: bool = False,
                  free_text: bool = False) -> FinishReason:
    """The one place a finish reason is decided.

    ``end`` is why the decoder stopped; ``grammar_done`` whether a grammar had completed
    when the stop token came; ``tool_calls`` whether the reply parsed into calls;
    ``free_text`` whether the grammar's text alternative (tools, ``auto``) was taken.
    """
    if tool_calls:
        return "tool_calls"
    if end == "length":
        return "length"
    if end == "stop_token" and grammar_done and not free_text:
        return "constraint_complete"
    return "stop"


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
    kv_tokens: list[int] = field(default_factory=list)
    """The tokens now held in the sequence's KV cache, in order."""
    draft_tokens: int = 0
    """Speculative draft tokens verified."""
    accepted_draft_tokens: int = 0
    """... and accepted."""


class Decoder:
    """One reply's decode loop as steps: ``start()`` prefills and samples the first
    token, each ``step()`` evaluates the last token and samples the next.

    Both return the sampled token, or None once finished (stop token or
    ``max_tokens``); ``finish(reason)`` ends it early (e.g. a stop string).
    ``reuse`` leading prompt tokens are taken to be in the sequence's KV cache
    already; everything after them is removed and re-evaluated.
    """

    def __init__(self, model: StepEngine, prompt: Sequence[int], sampler: Sampler, *,
                 max_tokens: int = 256, stop_ids: Iterable[int] | None = None,
                 seq_id: int = 0, reuse: int = 0,
                 prefill_chunk: int = SAFE_PREFILL_CHUNK) -> None:
        check_max_tokens(max_tokens)
        if not prompt:
            raise InvalidParameter("prompt", "empty prompt")
        self.model = model
        self.prompt = list(prompt)
        self.sampler = sampler
        self.max_tokens = max_tokens
        self.stops = set(stop_ids) if stop_ids is not None else {model.eos_id, model.eot_id}
        self.seq_id = seq_id
        self.reuse = max(0, min(reuse, len(self.prompt) - 1))
        self.prefill_chunk = prefill_chunk
        self.tokens: list[int] = []
        self.logprobs: list[Any] = []
        """Per generated token, its ``TokenLogprob`` when the sampler records them."""
        self.history = list(self.prompt)
        self.end: EndCause | None = None
        self.grammar_done = False
        """A grammar processor had completed when the stop token came."""
        self.stop_token: int | None = None
        self._pending: int | None = None  # sampled, not yet evaluated
        self._evaluated = 0  # reply tokens in the KV cache
        self._held = self.reuse  # prompt tokens in the KV cache (all once prefilled)
        self.on_first: Callable[[Logits], None] | None = None
        """Sees the first row before its token is sampled (and may change the sampler's
        processor: ``tool_choice="auto"`` decided by threshold)."""
        self.drafted = 0  # speculative draft tokens verified
        self.accepted = 0  # ... and accepted
        self.rollbacks = 0
        """Times the processor took tokens back (a schema's value checks: ``Rollback``)."""
        self._t0 = 0.0
        self._first = 0.0
        self._end = 0.0

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def finish_reason(self) -> FinishReason:
        """Why the reply ended, as far as the decoder knows (``length`` while running)."""
        return decide_finish(self.end or "length", grammar_done=self.grammar_done)

    def adopt_prefix(self, n: int) -> None:
        """The first ``n`` prompt tokens were put in this sequence's KV cache by another
        route (a prefix copied from a sibling sequence): do not evaluate them."""
        self.reuse = max(0, min(n, len(self.prompt) - 1))

    def mark_start(self) -> None:
        """Start the clocks (drivers that evaluate nothing here: a replay)."""
        self._t0 = time.perf_counter()

    def begin(self) -> None:
        """Drop whatever the sequence holds past ``reuse`` (drivers prefill afterwards)."""
        self._t0 = time.perf_counter()
        with self.model.lock:
            self.model.seq_rm(self.seq_id, self.reuse, -1)
        self._held = self.reuse

    def prefilled(self, n: int) -> None:
        """Drivers that prefill in steps: the first ``n`` prompt tokens are in the KV cache
        (so an abandoned turn records only what the sequence holds)."""
        self._held = n

    def first(self, row: Logits) -> int | None:
        """Sample the first token from the prompt's last logits row."""
        self._held = len(self.prompt)
        if self.on_first is not None:
            self.on_first(row)
        tok = self._take(row)
        self._first = time.perf_counter() - self._t0
        return tok

    def chunk(self) -> SeqChunk | None:
        """The evaluation the next step needs: the last sampled token (None when done)."""
        if self.done or self._pending is None:
            return None
        pos = len(self.prompt) + len(self.tokens) - 1
        return SeqChunk(self.seq_id, pos, (self._pending,))

    def advance(self, row: Logits) -> int | None:
        """After ``chunk()`` was evaluated: sample the next token from its row."""
        self._pending = None
        self._evaluated += 1
        return self._take(row)

    def start(self) -> int | None:
        """Prefill the prompt suffix and sample the first token (holds the model lock)."""
        self.begin()
        with self.model.lock:
            row = self.model.prefill(self.seq_id, self.prompt[self.reuse :], self.reuse,
                                     chunk=self.prefill_chunk)
            return self.first(row)

    def step(self) -> int | None:
        """Evaluate the last sampled token and sample the next (holds the model lock)."""
        chunk = self.chunk()
        if chunk is None:
            return None
        with self.model.lock:
            return self.advance(self.model.decode([chunk])[0][0])

    def spec_step(self, draft: Sequence[int],
                  on_token: Callable[[int], object] | None = None) -> list[int]:
        """Verify ``draft`` after the pending token in ONE decode (holds the model lock).

        Rows of ``[pending, *draft]`` go through ``Sampler.next`` in order: accepted
        while the sample equals the draft token; the first mismatch's sample (or,
        all accepted, the bonus sample) ends the step. Every sampled token is
        committed, so no processor rollback is needed; rejected draft positions are removed
        from the KV sequence. Returns the tokens sampled (the stop token excluded). With an
        empty draft this is ``step()``. ``on_token``: see :meth:`verify`."""
        if not draft:
            tok = self.step()
            if tok is not None and on_token is not None:
                on_token(tok)
            return [] if tok is None else [tok]
        chunk = self.verify_chunk(draft)
        with self.model.lock:
            return ([] if chunk is None
                    else self.verify(self.model.decode([chunk])[0], draft, on_token))

    def verify_chunk(self, draft: Sequence[int]) -> SeqChunk | None:
        """Batch drivers: the evaluation a verify step of ``draft`` needs, ``[pending,
        *draft]`` with a logits row each (None when done). Evaluate it, then :meth:`verify`."""
        chunk = self.chunk()
        if chunk is None:
            return None
        return SeqChunk(self.seq_id, chunk.pos, (*chunk.tokens, *draft), "all")

    def verify(self, rows: Logits, draft: Sequence[int],
               on_token: Callable[[int], object] | None = None) -> list[int]:
        """After :meth:`verify_chunk` was evaluated (its rows, in order): sample along the
        draft as :meth:`spec_step` does, drop the rejected positions from the KV sequence
        (takes the model lock for that), and return the tokens sampled. ``on_token`` sees
        each token as it is taken; when it ends the reply (``finish``: a stop string) the
        walk stops there, as plain steps would."""
        pos = len(self.prompt) + len(self.tokens) - 1
        out: list[int] = []
        self._pending = None
        self._evaluated += 1
        accepted = 0
        for i in range(len(draft) + 1):
            tok = self._take(rows[i])
            if tok is None:
                break
            out.append(tok)
            if on_token is not None:
                on_token(tok)
            if i < len(draft) and tok == draft[i] and not self.done:
                accepted += 1
                self._pending = None  # the draft token is already in the KV cache
                self._evaluated += 1
                continue
            break
        self.drafted += len(draft)
        self.accepted += accepted
        keep = len(self.prompt) + self._evaluated
        if keep < pos + 1 + len(draft):
            with self.model.lock:
                self.model.seq_rm(self.seq_id, keep, -1)
        return out

    def _take(self, row: Logits) -> int | None:
        """Sample from ``row``; None when the reply ended, or when the processor rolled
        back (the next ``chunk()`` then evaluates the last token kept)."""
        try:
            tok = self.sampler.next(row, self.history)
        except Rollback as rb:
            self._roll_back(rb.drop)
            return None
        except ChecksExhausted as exc:
            exc.usage = usage_of(self)
            raise
        if tok in self.stops:
            self.stop_token = tok
            proc = self.sampler.processor
            self.grammar_done = isinstance(proc, GrammarProcessor) and proc.is_stopped()
            self.finish("stop_token")
            return None
        self.tokens.append(tok)
        self.history.append(tok)
        if self.sampler.logprobs is not None:
            self.logprobs.append(self.sampler.last_logprob)
        if len(self.tokens) >= self.max_tokens:
            self.finish("length")
        else:
            self._pending = tok
        return tok

    def _roll_back(self, drop: int) -> None:
        """Drop the last ``drop`` reply tokens and their KV cells, and the last token kept
        too (re-evaluated by the next ``chunk()`` for the row to sample from again)."""
        keep = len(self.tokens) - drop
        if drop <= 0 or keep < 0:
            raise InvalidParameter("rollback", f"cannot drop {drop} of {len(self.tokens)} "
                                   "reply tokens")
        self.rollbacks += 1
        del self.tokens[keep:]
        del self.history[len(self.prompt) + keep:]
        del self.logprobs[keep:]
        self._evaluated = keep - 1  # -1: the prompt's last token is evaluated again
        self._pending = self.tokens[-1] if keep else self.prompt[-1]
        if self.seq_id >= 0:
            with self.model.lock:
                self.model.seq_rm(self.seq_id, len(self.prompt) + keep - 1, -1)

    def finish(self, cause: EndCause) -> None:
        """End the reply now (idempotent: the first cause wins)."""
        if self.end is None:
            self.end = cause
            self._end = time.perf_counter()

    def kv_tokens(self) -> list[int]:
        """Tokens held in the KV sequence: the prompt and every evaluated reply token."""
        if self._held < len(self.prompt):
            return self.prompt[: self._held]
        if self._evaluated < 0:  # mid-rollback to the reply's first token
            return self.prompt[:-1]
        return self.prompt + self.tokens[: self._evaluated]

    def result(self) -> Generation:
        end = self._end or time.perf_counter()
        return Generation(
            tokens=list(self.tokens),
            text=self.model.detokenize(self.tokens),
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt),
            prompt_tokens_evaluated=len(self.prompt) - self.reuse,
            seconds=end - self._t0,
            first_token_seconds=self._first,
            stop_token=self.stop_token,
            kv_tokens=self.kv_tokens(),
            draft_tokens=self.drafted,
            accepted_draft_tokens=self.accepted,
        )


def speculate(dec: Decoder, source: DraftSource, k: int, gate: CostGate | None = None, *,
              max_kv: int | None = SAFE_VERIFY_KV,
              on_token: Callable[[int], object] | None = None) -> list[int]:
    """One speculative step of ``dec``: up to ``k`` tokens proposed by ``source`` (none while
    ``gate`` says no, or once the verify batch would reach ``max_kv`` cells, where its
    logits stop being bitwise equal to single steps), verified by ``Decoder.spec_step``;
    the source hears how many were rejected, the gate what was accepted (and how long
    it took). Returns the tokens sampled (``on_token``: see ``Decoder.verify``)."""
    draft = propose(dec, source, k, gate, max_kv=max_kv)
    before, started = dec.accepted, time.perf_counter()
    toks = dec.spec_step(draft, on_token)
    settle(dec, source, gate, draft, before, started, toks)
    return toks


def propose(dec: Decoder, source: DraftSource, k: int, gate: CostGate | None = None, *,
            max_kv: int | None = SAFE_VERIFY_KV) -> list[int]:
    """The draft for ``dec``'s next verify step (:func:`speculate`'s first half; batch
    drivers evaluate ``dec.verify_chunk(draft)`` among other rows, then :func:`settle`)."""
    k = min(k, dec.max_tokens - len(dec.tokens) - 1)
    if max_kv is not None:
        k = min(k, max_kv - len(dec.history) - 1)
    if k <= 0 or (gate is not None and not gate.allow()):
        return []
    return source.propose(dec.history, k)


def settle(dec: Decoder, source: DraftSource, gate: CostGate | None, draft: Sequence[int],
           accepted_before: int, started: float, toks: Sequence[int]) -> None:
    """After a verify step of ``draft``: the gate hears what was accepted and how long it
    took (from ``started``), the source how many were rejected."""
    accepted = dec.accepted - accepted_before
    if gate is not None:
        gate.record(len(draft), accepted, seconds=time.perf_counter() - started,
                    tokens=len(toks))
    if accepted < len(draft):
        source.truncated(len(draft) - accepted)


def usage_of(dec: Decoder) -> Usage:
    """Token counts and timings of a decode so far."""
    gen = dec.result()
    return Usage(
        prompt_tokens=gen.prompt_tokens,
        completion_tokens=len(gen.tokens),
        cached_prompt_tokens=gen.prompt_tokens - gen.prompt_tokens_evaluated,
        prompt_seconds=gen.first_token_seconds,
        total_seconds=gen.seconds,
        draft_tokens=dec.drafted,
        accepted_draft_tokens=dec.accepted,
        rollbacks=dec.rollbacks,
    )


def generate(
    model: StepEngine,
    prompt: Sequence[int],
    sampler: Sampler,
    *,
    max_tokens: int = 256,
    stop_ids: Iterable[int] | None = None,
    seq_id: int = 0,
    reuse: int = 0,
    prefill_chunk: int = SAFE_PREFILL_CHUNK,
    draft: DraftSource | None = None,
    draft_k: int = 4,
    gate: CostGate | None = None,
    max_kv: int | None = SAFE_VERIFY_KV,
) -> Generation:
    """Decode one reply for ``prompt`` in KV sequence ``seq_id`` (the sync driver).

    With ``draft`` (a ``chatkit.decode.speculative.DraftSource``), each step verifies up to
    ``draft_k`` proposed tokens in one batched decode; the output is the same.
    ``gate`` (a ``chatkit.decode.speculative.CostGate``, as ``send(speculative=True)`` uses)
    skips drafting while acceptance makes it a loss; no draft is verified once the
    sequence would pass ``max_kv`` cells (outside the regime where verify batches are
    bitwise equal to single steps; None: no bound).

    ``stop_ids`` default to the model's EOS and end-of-turn ids. Raises
    ``AllTokensMasked``/``ConstraintError`` from the sampler and
    ``DecodeError`` from llama.cpp.
    """
    dec = Decoder(model, prompt, sampler, max_tokens=max_tokens, stop_ids=stop_ids,
                  seq_id=seq_id, reuse=reuse, prefill_chunk=prefill_chunk)
    dec.start()
    while not dec.done:
        if draft is None:
            dec.step()
            continue
        speculate(dec, draft, draft_k, gate, max_kv=max_kv)
    return dec.result()

