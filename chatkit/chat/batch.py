"""Lockstep batched sends: many conversations, one forward pass per step.

Every live conversation owns a KV sequence of the shared model; each decode
step is ONE ``llama_decode`` carrying one token per live sequence, and each
stream samples with its own Sampler and processor. Items beyond the model's
``n_seq_max`` wait and start as sequences free up (continuous batching).
Prompts sharing a prefix (quorum lanes) evaluate it once: it is copied to the
other sequences with ``llama_memory_seq_cp``. Prefill decodes carry at most
``SAFE_PREFILL_CHUNK`` tokens, the regime where logits are bitwise equal to
one-at-a-time evaluation, so a batched reply equals the reply sent alone.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Unpack, cast, overload

from ..decode.sampling import LogitProcessor
from ..engine.concurrency import engine_limiter
from ..engine.protocols import SAFE_PREFILL_CHUNK, Engine, SeqChunk, StepEngine
from ..errors import ChatkitError, InvalidParameter, SharedProcessorError
from ..grammar.constraints import Constraint, SchemaArg
from ..messages import Reply
from .conversation import Conversation
from .options import TurnOptions, check_options
from .plan import MIN_SHARED_PREFIX, common_prefix
from .runner import Results, run_all
from .turn import Turn

__all__ = ["BatchItem", "asend_batch", "send_batch"]

BatchItem = tuple[Conversation, str] | tuple[Conversation, str, Mapping[str, object]]
"""``(conversation, message)`` or ``(conversation, message, per-item options)``; the
per-item options may include ``schema``."""


@overload
def send_batch(items: Sequence[BatchItem], *, return_exceptions: Literal[False] = False,
               schema: SchemaArg = None, **options: Unpack[TurnOptions]) -> list[Reply[Any]]:
    ...


@overload
def send_batch(items: Sequence[BatchItem], *, return_exceptions: Literal[True],
               schema: SchemaArg = None,
               **options: Unpack[TurnOptions]) -> list[Reply[Any] | ChatkitError]: ...


def send_batch(items: Sequence[BatchItem], *, return_exceptions: bool = False,
               schema: SchemaArg = None,
               **options: Unpack[TurnOptions]) -> list[Reply[Any]] | list[
                   Reply[Any] | ChatkitError]:
    """Send one message in each of several conversations, in lockstep.

    Keyword ``schema`` and ``options`` (``TurnOptions``) apply to every item unless the
    item overrides them. A schema or Constraint given here is compiled once and cloned
    per stream. Two items sharing a processor object (the same Constraint instance, or
    one conversation twice) are ``SharedProcessorError`` before any decode.

    Returns the replies in item order. A failing item (``Truncated``, ...) does not stop
    the others: with ``return_exceptions`` its slot holds the error, otherwise the first
    error is raised once every item has finished.
    """
    if not items:
        return []
    turns = _prepare(items, schema, options)
    results: Results = [None] * len(turns)
    run_all(turns, results, lambda ts, rs: _Lockstep(ts, rs).run())
    done = [r for r in results if r is not None]
    if not return_exceptions:
        for r in done:
            if isinstance(r, ChatkitError):
                raise r
    return done


@overload
async def asend_batch(items: Sequence[BatchItem], *,
                      return_exceptions: Literal[False] = False, schema: SchemaArg = None,
                      **options: Unpack[TurnOptions]) -> list[Reply[Any]]: ...


@overload
async def asend_batch(items: Sequence[BatchItem], *, return_exceptions: Literal[True],
                      schema: SchemaArg = None,
                      **options: Unpack[TurnOptions]) -> list[Reply[Any] | ChatkitError]: ...


async def asend_batch(items: Sequence[BatchItem], *, return_exceptions: bool = False,
                      schema: SchemaArg = None, **options: Unpack[TurnOptions]
                      ) -> list[Reply[Any]] | list[Reply[Any] | ChatkitError]:
    """``send_batch`` for async code: the whole batch runs in a worker thread."""
    import anyio.to_thread

    if not items:
        return []

    def run() -> list[Reply[Any] | ChatkitError]:
        return send_batch(items, return_exceptions=True, schema=schema, **options)

    results = await anyio.to_thread.run_sync(run, limiter=engine_limiter(items[0][0].model))
    if not return_exceptions:
        for r in results:
            if isinstance(r, ChatkitError):
                raise r
    return results


def _prepare(items: Sequence[BatchItem], schema: SchemaArg,
             options: TurnOptions) -> list[Turn]:
    check_options(dict(options))
    model: Engine = items[0][0].model
    shared: dict[str, Any] = {**options, "schema": schema}
    seen_convs: set[int] = set()
    seen_procs: dict[int, int] = {}
    per_item: list[tuple[Conversation, str, dict[str, Any]]] = []
    for index, item in enumerate(items):
        conv, text = item[0], item[1]
        own = dict(item[2]) if len(item) == 3 else {}
        if not isinstance(conv, Conversation):
            raise InvalidParameter("items", f"item {index} is not (Conversation, str[, dict])")
        if conv.model is not model:
            raise InvalidParameter("items", "every conversation of a batch must share one Model")
        if id(conv) in seen_convs:
            raise SharedProcessorError(f"item {index}: one conversation twice in a batch "
                                       "(its sampler and processor would be shared)")
        seen_convs.add(id(conv))
        merged = {**shared, **own}
        if merged.get("speculative"):
            raise InvalidParameter("speculative", "not available in lockstep batches")
        for key in ("schema", "constraint"):
            value = merged.get(key)
            if not isinstance(value, LogitProcessor):
                continue
            if key not in own:  # given once for the batch: one clone per stream
                if not isinstance(value, Constraint):
                    if len(items) > 1:
                        raise SharedProcessorError(
                            f"{key}= {type(value).__name__} has no clone(); pass one per item")
                else:
                    merged[key] = value.clone()
            proc = merged[key]
            if id(proc) in seen_procs:
                raise SharedProcessorError(
                    f"items {seen_procs[id(proc)]} and {index} share one {key} object; "
                    "give each stream its own (Constraint.clone())")
            seen_procs[id(proc)] = index
        per_item.append((conv, text, merged))
    # Every refusal happens here, before any decode.
    return [conv.plan(text, opts.pop("schema", None), **opts) for conv, text, opts in per_item]


class _Lockstep:
    """The scheduler: admit, prefill (shared prefixes once), then one decode per step."""

    def __init__(self, turns: list[Turn],
                 results: list[Reply[Any] | ChatkitError | None]) -> None:
        self.turns = turns
        self.results = results
        self.model = cast(StepEngine, turns[0].engine)  # run_all: a local engine
        self.waiting = deque(range(len(turns)))
        self.live: list[int] = []

    def run(self) -> None:
        try:
            while self.waiting or self.live:
                admitted = []
                while self.waiting and self.model.free_seqs() > 0:
                    i = self.waiting.popleft()
                    try:
                        if not self.turns[i].try_open():  # taken by another thread meanwhile
                            self.waiting.appendleft(i)
                            break
                        admitted.append(i)
                    except ChatkitError as exc:
                        self.results[i] = exc
                if not admitted and not self.live and self.waiting:
                    time.sleep(0.005)  # every sequence is leased by other threads' turns
                    continue
                if admitted:
                    self._prefill(admitted)
                    self.live += [i for i in admitted if self.results[i] is None]
                self._finish_done()
                self._step()
                self._finish_done()
        finally:
            for t in self.turns:
                t.release()

    def _fail(self, i: int, exc: ChatkitError) -> None:
        self.results[i] = exc
        self.turns[i].release()
        if i in self.live:
            self.live.remove(i)

    def _finish_done(self) -> None:
        for i in list(self.live):
            turn = self.turns[i]
            if turn.done:
                self.live.remove(i)
                try:
                    turn.flush()
                    self.results[i] = turn.complete()
                except ChatkitError as exc:
                    self.results[i] = exc
                finally:
                    turn.release()

    def _step(self) -> None:
        chunks: list[tuple[int, SeqChunk]] = []
        for i in self.live:
            chunk = self.turns[i].chunk()
            if chunk is not None:
                chunks.append((i, chunk))
        if not chunks:
            return
        with self.model.lock:
            rows = self.model.decode([c for _, c in chunks])
            for (i, _), row in zip(chunks, rows, strict=True):
                try:
                    self.turns[i].advance(row[0])
                except ChatkitError as exc:
                    self._fail(i, exc)

    def _prefill(self, admitted: list[int]) -> None:
        """Evaluate the admitted prompts; a prefix shared with the first is evaluated once."""
        model = self.model
        turns = {i: self.turns[i] for i in admitted}
        for t in turns.values():
            t.begin()
        lead = turns[admitted[0]]
        start = {i: turns[i].reuse for i in admitted}
        followers: list[int] = []
        shared = 0
        for i in admitted[1:]:
            t = turns[i]
            lcp = min(common_prefix(lead.prompt, t.prompt),
                      len(lead.prompt) - 1, len(t.prompt) - 1)
            if (getattr(model, "copies_prefixes", False) and lcp >= MIN_SHARED_PREFIX
                    and lcp > t.reuse
                    and lcp > lead.reuse):
                followers.append(i)
                shared = lcp if not shared else min(shared, lcp)
        if followers:
            self._run_parts([(admitted[0], lead.reuse, shared, False)])
            for i in followers:
                # its own cells hold [0, reuse): the lead's [reuse, shared) join them
                model.seq_cp(lead.seq_id, turns[i].seq_id, turns[i].reuse, shared)
                turns[i].adopt_prefix(shared)
                start[i] = shared
            start[admitted[0]] = shared
        self._run_parts([(i, start[i], len(turns[i].prompt), True) for i in admitted])

    def _run_parts(self, parts: list[tuple[int, int, int, bool]]) -> None:
        """Evaluate prompt ranges, packed into decodes of <= SAFE_PREFILL_CHUNK tokens; a
        range marked final hands its last row to its turn's first sample."""
        queue = deque(parts)
        while queue:
            chunks: list[SeqChunk] = []
            finals: list[int | None] = []
            budget = SAFE_PREFILL_CHUNK
            while queue and budget > 0:
                i, lo, hi, final = queue.popleft()
                turn = self.turns[i]
                take = min(budget, hi - lo)
                last = lo + take == hi
                wanted = final and last
                chunks.append(SeqChunk(turn.seq_id, lo, turn.prompt[lo : lo + take],
                                       "last" if wanted else "none"))
                finals.append(i if wanted else None)
                budget -= take
                if not last:
                    queue.appendleft((i, lo + take, hi, final))
            with self.model.lock:
                rows = self.model.decode(chunks)
                for target, row in zip(finals, rows, strict=True):
                    if target is None:
                        continue
                    try:
                        self.turns[target].first(row[0])
                    except ChatkitError as exc:
                        self._fail(target, exc)
