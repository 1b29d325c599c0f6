"""Stepping one planned turn (:mod:`chatkit.chat.plan` plans it).

A :class:`Turn` leases a KV sequence and decodes through the ``Sampler`` seam:
``start``/``step`` for a turn driven alone, ``begin``/``chunk``/``first``/``advance``
for drivers that batch many turns into one forward pass, ``open_replay``/``first``/
``advance`` for a remote engine's tokens; then ``complete`` (checked by the second
reader, recorded) or ``release`` alone (abandoned: nothing recorded). The turn is the
only owner of its current grammar (``tool_choice="auto"`` may choose it at the first
token); the finish reason is decided once (:func:`chatkit.decode.decoding.decide_finish`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from ..decode.decoding import Decoder, propose, settle, speculate, usage_of
from ..decode.sampling import DraftAwareProcessor, Logits
from ..decode.speculative import ConstrainedSource, CostGate, PromptLookupSource
from ..engine.protocols import SAFE_VERIFY_KV, Engine, GenerateRequest, SeqChunk, StepEngine
from ..errors import EngineBusy, InvalidParameter, RemoteUnsupported
from ..messages import Message, Reply, Usage
from ..tools.dialects import Dialect
from .emit import TextEmitter
from .outcome import reply_of
from .plan import MIN_SHARED_PREFIX, TurnPlan, common_prefix, request_for

__all__: list[str] = []

_log = logging.getLogger("chatkit")

SPEC_K = 4  # draft tokens per verify: 5-row batches stay in the bitwise-equal regime


@dataclass
class KVState:
    """A conversation's claim on the engine's KV cache, kept between turns."""

    owner: int
    """Stable id of the conversation."""
    seq: int | None = None
    """The sequence it last used (kept when nobody else took it)."""
    tokens: list[int] = field(default_factory=list)
    """What that sequence holds, in order."""


class TurnView:
    """A turn's plan and progress, read-only: what a reader of a turn takes (the stream
    readers: ``runner._reader``, ``serve.lanes._deltas``), so that it cannot step the turn;
    :class:`Turn` adds the steps."""

    def __init__(self, engine: Engine, plan: TurnPlan, kv: KVState,
                 on_complete: Callable[[list[Message]], None], *, local: bool = True) -> None:
        self.engine = engine
        self.plan = plan
        self.kv = kv
        self.on_complete = on_complete
        self.local = local
        """Stepped here (a remote engine's turn is replayed: ``open_replay``)."""
        self.logprob_top = plan.logprobs
        self.constraint = plan.constraint
        """The grammar governing the reply (``auto`` may replace it at the first token)."""
        self.processor = plan.processor
        self.gate = CostGate()
        self.draft = (None if not plan.speculative
                      else ConstrainedSource(self.processor, PromptLookupSource())
                      if isinstance(self.processor, DraftAwareProcessor)
                      else PromptLookupSource())
        self.emitter = TextEmitter(engine, plan.stop_strings, tools=plan.tools,
                                   dialect=plan.dialect)
        self._dec: Decoder | None = None
        self._verifying: tuple[list[int], int, float] | None = None
        """A batch driver's verify chunk in flight: (draft, accepted before, started)."""
        self._fed = False  # a checked reply's tokens went to the emitter (at the end)
        self.seq: int | None = None
        self._added: list[Message] = []  # checked, not yet recorded (see complete)
        self.reply: Reply[Any] | None = None
        """The checked Reply, once the last of :meth:`Turn.steps` ran."""

    @property
    def prompt(self) -> list[int]:
        """The prompt's token ids."""
        return self.plan.prompt

    @property
    def speculative(self) -> bool:
        return self.draft is not None

    @property
    def thinking(self) -> bool:
        """The reply opens a think block."""
        return self.plan.thinking

    @property
    def schema_model(self) -> Any:
        """The Pydantic class of ``schema=`` (None for other schemas)."""
        return self.plan.schema_model

    @property
    def has_tools(self) -> bool:
        return bool(self.plan.tools)

    @property
    def tools(self) -> tuple[Any, ...]:
        """The turn's tools."""
        return self.plan.tools

    @property
    def context_capped(self) -> bool:
        """``max_tokens`` was shrunk to the room the prompt left (``fit_max_tokens``)."""
        return self.plan.context_capped

    @property
    def dialect(self) -> Dialect | None:
        """With tools: the dialect their calls are written in."""
        return self.plan.dialect

    @property
    def stop_token(self) -> int:
        """The token that ends the turn (``stop_ids`` map to it)."""
        return self.plan.stop_token

    @property
    def stop_ids(self) -> frozenset[int]:
        return self.plan.stop_ids

    @property
    def text(self) -> str:
        """The reply's text so far."""
        return self.emitter.text

    @property
    def done(self) -> bool:
        return self._dec is not None and self._dec.done

    @property
    def decoder(self) -> Decoder:
        """The decode loop of an opened turn (its prompt, reuse, sequence, counts)."""
        if self._dec is None:
            raise InvalidParameter("turn", "not opened")
        return self._dec

    @property
    def seq_id(self) -> int:
        return self.decoder.seq_id

    @property
    def reuse(self) -> int:
        """Prompt tokens the KV sequence already holds (not evaluated again)."""
        return self.decoder.reuse

    @reuse.setter
    def reuse(self, n: int) -> None:
        self.decoder.reuse = max(0, min(n, len(self.plan.prompt) - 1))

    @property
    def tokens(self) -> list[int]:
        """The reply's token ids so far (none before the turn opens)."""
        return self._dec.tokens if self._dec is not None else []

    @property
    def logprobs(self) -> list[Any]:
        """Per reply token: the sampled token's log-probability entry (``record_logprobs``)."""
        return self._dec.logprobs if self._dec is not None else []

    def usage(self) -> Usage:
        return usage_of(self.decoder)

    def check_start(self) -> None:
        """Refuse now a grammar that compiles but fails at its first token."""
        if self.constraint is not None:
            self.constraint.check_start()

    def record_logprobs(self, top: int) -> None:
        """Record each sampled token's log-probability and the ``top`` alternatives."""
        self.logprob_top = top


class Turn(TurnView):
    """A planned turn, stepped: lease, prefill, sample, emit text deltas, finish.

    ``on_complete`` receives the messages the turn adds (the user message, if any, and
    the assistant's) once the reply passed every check; an abandoned or failed turn
    adds nothing. ``release`` (every exit path) records what the KV sequence holds and
    ends the lease. One thread at a time.
    """

    # ------------------------------------------------------------------ steps
    def _engine(self) -> StepEngine:
        if not self.local:
            raise InvalidParameter("engine", "a remote engine is driven by requests, not steps")
        return cast(StepEngine, self.engine)

    def open(self, wait: float | None = None) -> Decoder:
        """Lease the KV sequence (waiting up to ``wait`` seconds for a free one, None: the
        engine's default; ``EngineBusy`` when none came free) and reset the processor;
        nothing is evaluated yet."""
        engine = self._engine()
        # the most it fills: the prompt, the reply and a verify step's drafts past it
        cells = len(self.plan.prompt) + self.plan.max_tokens + SPEC_K + 1
        self.seq, held = engine.lease_seq(self.kv.owner, self.kv.seq, self.plan.prompt,
                                          min_shared=MIN_SHARED_PREFIX, cells=cells,
                                          wait=wait)
        self.kv.seq = self.seq
        if held is not None:  # not the owner's own tokens: none, or a prefix routed here
            self.kv.tokens = held
        reuse = common_prefix(self.kv.tokens, self.plan.prompt)
        resumable = getattr(engine, "resumable", None)
        if reuse and resumable is not None:  # a sliding window may have dropped cells
            reuse = resumable(self.seq, min(reuse, len(self.plan.prompt) - 1))
        self._dec = self._decoder(engine, self.seq, reuse)
        return self._dec

    def open_replay(self, *, check_grammar: bool = True) -> None:
        """Open for a coarse engine's tokens, replayed through ``first``/``advance`` as
        one-hot rows: the stop strings, tool-call and think parsing, finish rule and second
        reader are a local turn's. ``check_grammar=False`` (text re-tokenized locally, not
        the server's own ids) leaves the check to the second reader."""
        if not check_grammar:
            self.processor = None
        # A replay only samples (first/advance) and detokenizes: no stepping method runs.
        self._dec = self._decoder(cast(StepEngine, self.engine), -1, 0)
        self._dec.mark_start()

    def _decoder(self, engine: StepEngine, seq: int, reuse: int) -> Decoder:
        plan = self.plan
        plan.sampler.processor = self.processor
        plan.sampler.logprobs = self.logprob_top
        plan.sampler.reset()  # per-turn reset: one constraint governs each reply afresh
        dec = Decoder(engine, plan.prompt, plan.sampler, max_tokens=plan.max_tokens,
                      stop_ids=plan.stop_ids, seq_id=seq, reuse=reuse)
        if plan.auto_call is not None and self.processor is not None:
            dec.on_first = self._decide_call
        return dec

    def _decide_call(self, row: Logits) -> None:
        """``tool_choice="auto"`` with a threshold: the first row decides call or text, and
        that grammar governs the rest of the reply."""
        assert self.plan.auto_call is not None
        chosen = self.plan.auto_call.decide(row)
        chosen.reset()
        self.constraint = self.processor = self.plan.sampler.processor = chosen
        if isinstance(self.draft, ConstrainedSource):
            self.draft.processor = chosen

    def try_open(self) -> bool:
        """Open now if a KV sequence is free (async drivers wait between tries, outside the
        engine's limiter, so running turns keep stepping)."""
        if self._dec is not None:
            return True
        try:
            self.open(wait=0)
        except EngineBusy:
            return False
        return True

    def start(self) -> str:
        """Open (if not yet), prefill, and sample the first token; the first text delta."""
        decoder = self._dec if self._dec is not None else self.open()
        return self._emit(decoder.start())

    def steps(self) -> Iterator[Callable[[], str]]:
        """The turn's blocking steps in order, each returning a text delta, the last one
        finishing the turn (its withheld tail; the checked Reply in ``reply``): drivers run
        them directly (sync) or in a worker thread (async)."""
        yield self.start
        while not self.done:
            yield self.step
        yield self._finish_step

    def _finish_step(self) -> str:
        tail, self.reply = self.finish()
        return tail

    def step(self) -> str:
        """One decode step (a verify step when speculative); returns the text delta."""
        if self.draft is None:
            return self._emit(self.decoder.step())
        deltas: list[str] = []
        speculate(self.decoder, self.draft, SPEC_K, self.gate,
                  on_token=lambda tok: deltas.append(self._emit(tok)))
        return "".join(deltas)

    def begin(self) -> None:
        """Batch drivers: drop what the sequence holds past the reused prefix."""
        self.decoder.begin()

    def prefilled(self, n: int) -> None:
        """Batch drivers: the first ``n`` prompt tokens are in the KV cache."""
        self.decoder.prefilled(n)

    def adopt_prefix(self, n: int) -> None:
        """Batch drivers: ``n`` prompt tokens were copied in from a sibling sequence."""
        self.decoder.adopt_prefix(n)

    def chunk(self, max_draft: int = SPEC_K, *, exact: bool | None = None) -> SeqChunk | None:
        """Batch drivers: the next step's evaluation (None when done): a speculative turn's
        verify step when its source drafts (at most ``max_draft`` tokens; logits ``"all"``,
        for :meth:`verify`), else the plain step (one row: :meth:`advance`). ``exact``:
        drafts only below ``SAFE_VERIFY_KV`` cells, where verify logits equal plain steps'
        bit for bit (None: unless one KV pool, whose steps change the last bits anyway)."""
        d = self.decoder
        if self.draft is None or d.done or max_draft <= 0:
            return d.chunk()
        if exact is None:
            exact = not getattr(self.engine, "kv_unified", False)
        max_kv = SAFE_VERIFY_KV if exact else None
        draft = propose(d, self.draft, min(SPEC_K, max_draft), self.gate, max_kv=max_kv)
        if not draft:
            self._verifying = None
            return d.chunk()
        self._verifying = (draft, d.accepted, time.perf_counter())
        return d.verify_chunk(draft)

    def verify(self, rows: Logits) -> str:
        """Batch drivers: the verify chunk from :meth:`chunk` was evaluated (its rows in
        order); sample along the draft and return the text delta."""
        assert self._verifying is not None and self.draft is not None, "no verify chunk()"
        draft, before, started = self._verifying
        self._verifying = None
        deltas: list[str] = []
        toks = self.decoder.verify(rows, draft, lambda tok: deltas.append(self._emit(tok)))
        settle(self.decoder, self.draft, self.gate, draft, before, started, toks)
        return "".join(deltas)

    def first(self, row: Logits) -> str:
        """Batch drivers: the prompt was prefilled externally; sample the first token."""
        return self._emit(self.decoder.first(row))

    def advance(self, row: Logits) -> str:
        """Batch drivers: ``chunk()`` was evaluated externally; sample the next token."""
        return self._emit(self.decoder.advance(row))

    def end_at_limit(self) -> None:
        """A remote engine stopped at its own limit: the reply ends (no-op when done)."""
        self.decoder.finish("length")

    @property
    def checked(self) -> bool:
        """The reply's grammar has value checks (which may take tokens back): its text is
        held back until the reply is complete."""
        c = self.constraint
        return c is not None and c.checks is not None

    def _emit(self, tok: int | None) -> str:
        if tok is None or self.checked:
            return ""
        delta = self.emitter.feed(tok)
        if self.emitter.cut:
            self.decoder.finish("stop_string")
        return delta

    def generate_request(self) -> GenerateRequest:
        """The turn as a coarse engine's request (see :func:`chatkit.chat.plan.request_for`).
        ``RemoteUnsupported`` for a schema with value checks: a remote engine cannot take
        tokens back."""
        c = self.constraint
        if c is not None and c.checks is not None:
            raise RemoteUnsupported(str(getattr(self.engine, "kind", "remote")),
                                    f"a schema whose {', '.join(c.checks.keywords)} need "
                                    "value checks with rollback (it cannot take tokens back)")
        return request_for(self.plan, self.constraint)

    # ---------------------------------------------------------------- outcome
    def flush(self) -> str:
        """Text withheld at the end (a partial stop string, an unfinished character; a
        checked reply's whole text)."""
        text = ""
        if self.checked and self._dec is not None and not self._fed:
            self._fed = True
            text = "".join(self.emitter.feed(t) for t in self._dec.tokens)
        return text + self.emitter.flush()

    def finish(self, *, record: bool = True) -> tuple[str, Reply[Any]]:
        """The withheld tail and the checked, recorded Reply (see :meth:`complete`)."""
        tail = self.flush()
        return tail, self.complete(record=record)

    def complete(self, *, record: bool = True) -> Reply[Any]:
        """Check the reply (truncation, second reader, tool calls), record it, return it.

        Raises ``Truncated`` (with the partial text and usage), ``SchemaViolation`` or
        ``ToolArgumentsInvalid``; then nothing is recorded. ``record=False`` leaves
        recording to :meth:`record` (the engine loop finishes a turn on its thread; the
        consumer records it when it takes the Reply, so a consumer that left first records
        nothing).
        """
        d, plan, em = self.decoder, self.plan, self.emitter
        text = em.text if plan.stop_strings or em.cut else d.result().text
        reply, message = reply_of(plan, self.constraint, d, text,
                                  dropped_calls=em.dropped_calls)
        if plan.probabilities and not reply.tool_calls:
            reply = self._with_choices(reply, raw=text)
        if em.stop_hit is not None:
            reply = dataclasses.replace(reply, stop_sequence=em.stop_hit)
        self._added = [*([plan.user] if plan.user is not None else []), message]
        if record:
            self.record()
        return reply

    def _with_choices(self, reply: Reply[Any], *, raw: str) -> Reply[Any]:
        """The reply with the exact probabilities of its enumerable fields' values."""
        from ..grammar.choices import Branching, choice_probabilities

        plan = self.plan
        assert plan.constraint is not None and self.seq is not None
        start = len(raw) - len(reply.text)  # the answer after a think block
        params = plan.sampler.params
        branching = Branching(self._engine(), self.seq, plan.prompt,
                              self.decoder.tokens, plan.constraint,
                              temperature=params.temperature or 1.0)
        choices = choice_probabilities(branching, plan.schema, reply.text, start,
                                       fields=plan.probabilities)
        return dataclasses.replace(reply, choices=choices)

    def record(self) -> None:
        """Add the completed turn's messages to the conversation (once)."""
        added, self._added = self._added, []
        if added:
            self.on_complete(added)

    def release(self) -> None:
        """Record what the KV sequence now holds and end the lease (every exit path)."""
        if self.seq is None:
            return
        self.kv.tokens = self.decoder.kv_tokens()
        self._engine().release_seq(self.seq, self.kv.tokens)
        self.seq = None
