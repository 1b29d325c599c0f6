"""The engine loop: continuous batching over time, one scheduler per engine.

Every ``send``/``stream``/``asend``/``astream`` (and so every server request) hands
its planned :class:`~chatkit.chat.turn.Turn` to the engine's loop. The loop admits
waiting turns at step boundaries as KV sequences come free, and each step is ONE
``StepEngine.decode`` carrying the next token of every decoding turn plus, in the
rows left over, chunks of the prompts being prefilled — so a long prompt never
stalls running streams, and turns arriving at any time share forward passes.

Numerics: with a KV stream per sequence (the default, ``kv_unified=False``) a step
carries at most ``SAFE_PREFILL_CHUNK`` rows (more only when more turns are decoding at
once), the regime where llama.cpp's CPU logits are bitwise equal to one-token-at-a-time
evaluation, so each reply equals the same reply sent alone, greedy and seeded. With
``kv_unified=True`` attention spans other sequences' cells and near-ties can flip
(docs/DESIGN.md "Numerics"), so nothing is kept by small steps while no turn decodes: a
prompt is then prefilled in steps of up to ``n_batch`` rows (an agent's long first prompt
at the speed llama.cpp prefills), as it is with a stream per sequence when the loop's
``reproducible`` is turned off. Beside decoding turns steps keep to ``STEP_ROWS`` (their
next token waits for the whole step). On one pool a new turn
copies a prompt prefix a running turn's sequence holds (or will, once its prefill gets
there) instead of evaluating it (``seq_cp``; ``LoopStats.shared_tokens``), so concurrent
turns with one system prompt prefill it once. ``chatkit serve`` runs one pool for short
contexts and a stream per sequence, ``reproducible`` off, for long ones
(:mod:`chatkit.serve.sizing`; ``--reproducible`` keeps the small steps).

Waiting turns sit in a bounded FIFO queue (``max_queue``): a full queue is
``EngineBusy`` at submission, and a turn that finds no free sequence within the
engine's ``seq_wait`` is ``EngineBusy`` too; running turns are never failed to make
room. A consumer that stops listening (a cancelled task, a closed stream, a
disconnected client) cancels its ticket; the loop frees the sequence at the next
step and acknowledges, so the conversation's KV bookkeeping stays exact.

The loop runs on the process's compute thread (:mod:`chatkit.engine.compute`, where every
forward pass runs), registered while it has work and dropped when it has none (so it
holds the engine only while there is work); several engines' loops take turns there,
one step each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import asyncio

from ..engine.compute import activate
from ..engine.protocols import SAFE_PREFILL_CHUNK, KVSequences, SeqChunk, StepEngine
from ..errors import ChatkitError, EngineBusy
from ..messages import Reply
from .plan import MIN_SHARED_PREFIX, common_prefix
from .turn import Turn

__all__ = ["EngineLoop", "Ticket", "engine_loop"]

_log = logging.getLogger("chatkit")

DEFAULT_MAX_QUEUE = 256
STEP_ROWS = SAFE_PREFILL_CHUNK
"""Rows per forward pass the loop aims for: decode rows first (a speculative turn's drafts in
what one row per decoding turn leaves, half of it while a prompt waits), prefill in the
rest (on a unified KV pool with no turn decoding: ``n_batch`` rows)."""

Event = tuple[Literal["delta", "reply", "error", "closed"], Any]


RowKind = Literal["advance", "verify", "first", "none"]
"""What a step's chunk is to its turn: a decode step, a verify step (rows for a draft), the
prompt's last chunk (sample the first token), or a prompt chunk without logits."""


class Ticket:
    """A turn handed to the loop; its text deltas, then its Reply or error, flow back.

    Consume it once, from one thread (:meth:`deltas`) or one task (:meth:`adeltas`);
    :meth:`cancel` abandons the turn (nothing is recorded in the conversation).
    """

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.submitted = time.monotonic()
        self.reply: Reply[Any] | None = None
        self.state: Literal["waiting", "share", "prefill", "decode", "closed"] = "waiting"
        self.pos = 0
        """Prompt tokens in the KV sequence (prefill progress)."""
        self.lead: Ticket | None = None
        self.share = 0
        """State ``share``: the prompt prefix this turn copies from ``lead``'s sequence once
        ``lead`` has evaluated it."""
        self.passed_over = 0
        """Steps in a row this prefilling turn got no rows (its priority grows with it)."""
        self._events: deque[Event] = deque()
        self._cond = threading.Condition()
        self._waker: Callable[[], None] | None = None
        self._drained = False
        """The consumer has taken the turn's last event."""
        self.cancelled = False
        self.head_since: float | None = None
        """When the turn reached the head of the queue (its ``seq_wait`` counts from here)."""
        self.on_close: list[Callable[[], None]] = []
        """Called once the loop has let go of the turn (e.g. to return a KV claim)."""

    # ------------------------------------------------------------ loop side
    def post(self, kind: Literal["delta", "reply", "error", "closed"], value: object) -> None:
        with self._cond:
            self._events.append((kind, value))
            self._cond.notify_all()
            waker = self._waker
        if waker is not None:
            waker()

    def mark_closed(self) -> None:
        """The loop has let go of the turn (its sequence is released): the last event; then
        the ``on_close`` callbacks run (on the loop's thread)."""
        with self._cond:
            self.state = "closed"
        self.post("closed", None)
        for callback in self.on_close:
            try:
                callback()
            except Exception:
                _log.exception("ticket on_close callback failed")

    # -------------------------------------------------------- consumer side
    def cancel(self) -> None:
        """Abandon the turn; the loop frees its KV sequence at the next step."""
        self.cancelled = True

    def wait_closed(self, timeout: float = 30.0) -> None:
        """Block until the loop has let go of the turn (after a cancel)."""
        with self._cond:
            self._cond.wait_for(lambda: self.state == "closed", timeout=timeout)

    def _take(self, item: Event) -> str | None:
        """An event's text for the consumer: a delta's text, "" for the reply (recorded
        here), None once the turn closed; the turn's error is raised."""
        kind, value = item
        if kind == "delta":
            return str(value)
        if kind == "reply":
            self.turn.record()  # on the consumer's side: a consumer that left records nothing
            self.reply = value
        elif kind == "error":
            raise value
        self._drained = kind == "closed"
        return None if self._drained else ""

    def deltas(self) -> Iterator[str]:
        """Text deltas as the loop produces them; ``reply`` is set at the end. Raises the
        turn's error. Leaving early cancels the turn and waits for the loop to let go."""
        try:
            while (delta := self._take(self._next_event())) is not None:
                if delta:
                    yield delta
        finally:
            if not self._drained:
                self.cancel()
                self.wait_closed()

    def _next_event(self) -> Event:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._events))
            return self._events.popleft()

    async def adeltas(self) -> AsyncGenerator[str, None]:
        """``deltas`` for async code: waits on an event the loop sets (asyncio: no worker
        thread, so nothing is left running when the event loop shuts down) and never
        blocks the event loop. Cancelling the task, or leaving early, cancels the turn."""
        import anyio  # here, not at module level: sync-only processes never import it

        flag = self._async_flag()
        try:
            while (delta := self._take(await self._anext_event(flag))) is not None:
                if delta:
                    yield delta
        finally:
            if not self._drained:
                self.cancel()
                with anyio.CancelScope(shield=True):
                    while True:
                        if flag is not None:
                            flag.clear()
                        if self.state == "closed":
                            break
                        await self._posted(flag)

    async def _anext_event(self, flag: asyncio.Event | None) -> Event:
        while True:
            if flag is not None:
                flag.clear()
            with self._cond:
                if self._events:
                    return self._events.popleft()
            await self._posted(flag)

    async def _posted(self, flag: asyncio.Event | None) -> None:
        """Until the loop posts an event (``flag``: set at every post; None under another
        anyio backend: a worker thread waits)."""
        if flag is not None:
            await flag.wait()
        else:
            import anyio.to_thread

            await anyio.to_thread.run_sync(self._wait_event)

    def _async_flag(self) -> asyncio.Event | None:
        """An asyncio event set at every post (None under another event loop)."""
        import asyncio

        try:
            aloop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        flag = asyncio.Event()

        def wake() -> None:
            try:
                aloop.call_soon_threadsafe(flag.set)
            except RuntimeError:  # the event loop is gone
                pass

        with self._cond:
            self._waker = wake
        return flag

    def _wait_event(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._events), timeout=0.5)


@dataclass
class LoopStats:
    """What the loop did (for tests and benchmarks)."""

    steps: int = 0
    """Forward passes."""
    rows: int = 0
    """Tokens evaluated in them."""
    shared_steps: int = 0
    """Forward passes that carried more than one turn."""
    mixed_steps: int = 0
    """Forward passes that carried decode rows and prompt (prefill) rows together."""
    max_live: int = 0
    """Most turns running at once."""
    max_rows: int = 0
    """Most tokens in one forward pass."""
    shared_tokens: int = 0
    """Prompt tokens copied from another running turn's sequence instead of evaluated."""

    def count(self, chunks: list[SeqChunk], owners: list[tuple[Ticket, RowKind]]) -> None:
        """One forward pass of ``chunks`` (``owners``: whose, and what each row is)."""
        self.steps += 1
        rows_now = sum(len(c.tokens) for c in chunks)
        self.rows += rows_now
        self.max_rows = max(self.max_rows, rows_now)
        if len({id(t) for t, _ in owners}) > 1:
            self.shared_steps += 1
        kinds = {"advance" if kind == "verify" else kind for _, kind in owners}
        if "advance" in kinds and kinds - {"advance"}:
            self.mixed_steps += 1


class EngineLoop:
    """The scheduler of one engine (see the module docstring). Get it with
    :func:`engine_loop`; ``max_queue`` may be changed at any time."""

    def __init__(self, engine: StepEngine, *, max_queue: int = DEFAULT_MAX_QUEUE) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.stats = LoopStats()
        self._lock = threading.Lock()
        self._waiting: deque[Ticket] = deque()
        self._live: list[Ticket] = []
        self._active = False  # registered with the compute thread
        self._checkpoint = getattr(engine, "checkpoint", None)
        """A sliding window's checkpoint at each prompt's end (``Model.checkpoint``)."""
        self.reproducible = not engine.kv_unified
        """Steps keep to ``STEP_ROWS`` rows, where each reply equals the same reply sent
        alone (a KV stream per sequence; the default there). False: a prompt is prefilled
        in steps of up to ``n_batch`` rows while no turn decodes, and speculative turns
        draft at any length, not only below ``SAFE_VERIFY_KV`` cells (``chatkit serve``
        with a stream per sequence and no ``--reproducible``). Never True on one pool."""

    @property
    def queued(self) -> int:
        """Turns waiting for a KV sequence."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Turns holding a KV sequence (prefilling or decoding)."""
        return len(self._live)

    def submit(self, turn: Turn) -> Ticket:
        """Queue a planned turn; ``EngineBusy`` when ``max_queue`` turns already wait."""
        ticket = Ticket(turn)
        with self._lock:
            if len(self._waiting) >= self.max_queue:
                raise EngineBusy(f"{len(self._waiting)} turns already wait (max_queue="
                                 f"{self.max_queue})", queued=len(self._waiting),
                                 max_queue=self.max_queue)
            self._waiting.append(ticket)
            start = not self._active
            self._active = True
        if start:
            activate(self)
        return ticket

    # ------------------------------------------------- on the compute thread
    def retire(self) -> bool:
        """Unregister from the compute thread when nothing waits or runs."""
        with self._lock:
            if self._waiting or self._live:
                return False
            self._active = False
            return True

    def tick(self) -> bool:
        """One round: reap cancelled turns, admit, one forward pass, finish the done.
        False when no turn could run (every sequence leased elsewhere, or the engine's lock
        held by another driver).

        The engine's lock is only ever tried, never waited for: another driver (``send_batch``,
        speculation, ``generate``) holds it while it waits for this same compute thread to
        run its decode, so waiting here would deadlock both. Stalled, the compute thread
        runs that driver's call and comes back."""
        lock = self.engine.lock
        if not lock.acquire(blocking=False):
            return False
        try:
            return self._tick()
        finally:
            lock.release()

    def _tick(self) -> bool:
        try:
            self._reap_cancelled()
            self._admit()
            if not any(t.state in ("prefill", "decode") for t in self._live):
                return False
            self._step()
            self._finish_done()
            return True
        except BaseException as exc:  # a bug: fail every turn rather than hang a consumer
            _log.exception("engine loop failed")
            with self._lock:
                tickets = [*self._live, *self._waiting]
                self._live.clear()
                self._waiting.clear()
            for t in tickets:
                self._close(t, exc if isinstance(exc, Exception) else ChatkitError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return False

    def _close(self, t: Ticket, error: BaseException | None = None) -> None:
        try:
            t.turn.release()
        finally:
            if error is not None:
                t.post("error", error)
            t.mark_closed()

    def _reap_cancelled(self) -> None:
        with self._lock:
            gone = [t for t in (*self._waiting, *self._live) if t.cancelled]
            for t in gone:
                if t in self._live:
                    self._live.remove(t)
                else:
                    self._waiting.remove(t)
        for t in gone:
            self._close(t)

    def _admit(self) -> None:
        engine = self.engine
        now = time.monotonic()
        _resolve_shares(engine, self._live, self.stats)
        while True:
            with self._lock:
                if not self._waiting:
                    return
                t = self._waiting[0]
            try:
                opened = engine.free_seqs() > 0 and t.turn.try_open()
                if opened:
                    t.turn.begin()
            except ChatkitError as exc:
                self._drop_waiting(t, exc)
                continue
            if not opened:
                if t.head_since is None:
                    t.head_since = now
                if now - t.head_since > engine.seq_wait:
                    self._drop_waiting(t, EngineBusy(
                        f"no KV sequence came free in {engine.seq_wait:g} s "
                        f"(n_seq_max={engine.n_seq_max})", queued=len(self._waiting),
                        max_queue=self.max_queue))
                    continue
                return
            t.pos = t.turn.reuse
            t.state = "prefill"
            if getattr(engine, "copies_prefixes", False):
                _find_share(engine, self._live, self.stats, t)
            with self._lock:
                self._waiting.popleft()
                self._live.append(t)
                self.stats.max_live = max(self.stats.max_live, len(self._live))

    def _drop_waiting(self, t: Ticket, exc: BaseException) -> None:
        with self._lock:
            self._waiting.remove(t)
        self._close(t, exc)

    def _fail(self, t: Ticket, exc: BaseException) -> None:
        with self._lock:
            if t in self._live:
                self._live.remove(t)
        self._close(t, exc)

    def _step(self) -> None:
        engine = self.engine
        chunks: list[SeqChunk] = []
        owners: list[tuple[Ticket, RowKind]] = []
        room = min(STEP_ROWS, engine.n_batch)
        decoding = [t for t in self._live if t.state == "decode"]
        # draft rows (speculative turns) take what one row per decoding turn leaves, half of
        # it while a prompt waits for rows
        drafts = max(0, room - len(decoding))
        if any(t.state == "prefill" for t in self._live):
            drafts //= 2
        for t in decoding:
            try:
                c = t.turn.chunk(max_draft=drafts, exact=self.reproducible)
            except Exception as exc:  # its grammar failed while drafting: that turn alone
                self._fail(t, exc)
                continue
            if c is not None:
                chunks.append(c)
                owners.append((t, "verify" if c.logits == "all" else "advance"))
                drafts -= len(c.tokens) - 1
        if not chunks and (engine.kv_unified or not self.reproducible):  # no bitwise
            room = engine.n_batch  # regime to keep (module docstring)
        budget = max(1, room - sum(len(c.tokens) for c in chunks))
        _prefill_rows(self._live, budget, chunks, owners)
        if not chunks:
            return
        checkpoint = self._checkpoint
        with engine.lock:
            try:
                rows = engine.decode(chunks)
            except ChatkitError as exc:
                for t, _ in owners:
                    self._fail(t, exc)
                return
            self.stats.count(chunks, owners)
            for (t, kind), row, chunk in zip(owners, rows, chunks, strict=True):
                if kind == "none":
                    t.turn.prefilled(chunk.pos + len(chunk.tokens))
                    continue
                try:
                    if kind == "first":
                        t.state = "decode"
                        if checkpoint is not None:  # a sliding window's, at the prompt's end
                            checkpoint(t.turn.seq_id, chunk.pos + len(chunk.tokens))
                        delta = t.turn.first(row[0])
                    elif kind == "verify":
                        delta = t.turn.verify(row)
                    else:
                        delta = t.turn.advance(row[0])
                except Exception as exc:
                    self._fail(t, exc)
                    continue
                if delta:
                    t.post("delta", delta)

    def _finish_done(self) -> None:
        for t in list(self._live):
            if not t.turn.done:
                continue
            with self._lock:
                self._live.remove(t)
            try:
                tail, reply = t.turn.finish(record=False)
            except Exception as exc:
                self._close(t, exc)
                continue
            if tail:
                t.post("delta", tail)
            t.post("reply", reply)
            self._close(t)


def _prefill_rows(live: list[Ticket], budget: int, chunks: list[SeqChunk],
                  owners: list[tuple[Ticket, RowKind]]) -> None:
    """Fill ``budget`` rows with prompt chunks: the prompt with the least left to evaluate
    first (a cached one needs one row), so a turn whose prefix was found starts decoding at
    once instead of waiting behind other turns' long prefills. A step's worth of rows is
    credited for every step a turn got none, so a long prompt is never starved by a stream
    of short ones."""
    waiting = sorted((t for t in live if t.state == "prefill"),
                     key=lambda t: len(t.turn.prompt) - t.pos - STEP_ROWS * t.passed_over)
    for t in waiting:
        if budget <= 0:
            t.passed_over += 1
            continue
        t.passed_over = 0
        prompt = t.turn.prompt
        take = min(budget, len(prompt) - t.pos)
        final = t.pos + take == len(prompt)
        chunks.append(SeqChunk(t.turn.seq_id, t.pos, prompt[t.pos : t.pos + take],
                               "last" if final else "none"))
        owners.append((t, "first" if final else "none"))
        t.pos += take
        budget -= take


# ------------------------------------------------- prompt prefixes shared
def _find_share(engine: KVSequences, live: list[Ticket], stats: LoopStats, t: Ticket) -> None:
    """A prompt prefix (``MIN_SHARED_PREFIX`` tokens past its own reuse at least) that a
    running turn's sequence holds, or will once its prefill gets there, is copied into ``t``'s
    sequence (``seq_cp``, one KV pool) instead of evaluated: concurrent requests with one
    system prompt prefill it once."""
    prompt = t.turn.prompt
    best: Ticket | None = None
    n = t.turn.reuse + MIN_SHARED_PREFIX - 1
    for other in live:
        if other.state in ("prefill", "decode"):
            lcp = min(common_prefix(other.turn.prompt, prompt), len(prompt) - 1)
            if lcp > n:
                best, n = other, lcp
    if best is None:
        return
    if _held(best) >= n:
        _copy(engine, stats, t, best, n)
    else:
        t.state, t.lead, t.share = "share", best, n


def _resolve_shares(engine: KVSequences, live: list[Ticket], stats: LoopStats) -> None:
    """Turns waiting for a prefix: copied once their lead holds it; back to their own
    prefill when the lead is gone."""
    for t in live:
        if t.state != "share":
            continue
        lead = t.lead
        if lead is not None and lead in live and lead.state in ("prefill", "decode"):
            if _held(lead) < t.share:
                continue
            _copy(engine, stats, t, lead, t.share)
        t.state, t.lead = "prefill", None


def _copy(engine: KVSequences, stats: LoopStats, t: Ticket, source: Ticket, n: int) -> None:
    start = t.turn.reuse  # its own cells hold [0, start): the source's [start, n) join them
    resumable = getattr(engine, "resumable", None)
    if resumable is not None and resumable(source.turn.seq_id, n) < n:
        return  # a sliding window dropped cells position n attends to: prefilled here
    engine.seq_cp(source.turn.seq_id, t.turn.seq_id, start, n)
    t.turn.adopt_prefix(n)
    t.turn.prefilled(n)
    t.pos = n
    stats.shared_tokens += n - start


def _held(t: Ticket) -> int:
    """Prompt tokens ``t``'s sequence holds (after the steps so far)."""
    if t.state == "decode":
        return len(t.turn.prompt)
    return t.pos if t.state == "prefill" else t.turn.reuse


def engine_loop(engine: StepEngine) -> EngineLoop:
    """The engine's loop (one per engine, created on first use)."""
    return engine.cache(("chatkit.engine_loop",), lambda: EngineLoop(engine))
