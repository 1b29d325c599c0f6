"""Running a planned turn to its reply: the one place that dispatches on the engine's kind.

A local engine (:class:`~chatkit.engine.protocols.StepEngine`) runs a turn's steps in its engine
loop (:mod:`chatkit.chat.scheduler`), or on the caller's side when speculative (verify
batches are one sequence's own); a remote engine (:class:`~chatkit.engine.protocols.GenerateEngine`)
gets one request and its token ids are replayed through the turn (same stop strings,
tool-call and think parsing, finish rule and second reader as a local turn).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np

from ..engine.concurrency import run_blocking
from ..engine.protocols import Engine, GenerateEngine, GenerateResult, StepEngine
from ..errors import AllTokensMasked, ChatkitError, ConstraintError, SchemaViolation
from ..messages import Reply
from .partial import Partial, PartialReader
from .scheduler import engine_loop
from .turn import Turn, TurnView

__all__ = ["AsyncReplyStream", "ReplyStream"]

T = TypeVar("T")
Results = list[Reply[Any] | ChatkitError | None]


def is_local(engine: Engine) -> bool:
    """The engine steps turns here (KV sequences, forward passes), not a remote server."""
    return not isinstance(engine, GenerateEngine)


def local_engine(engine: Engine) -> StepEngine | None:
    """``engine`` as a :class:`StepEngine`, None for a remote engine."""
    return None if isinstance(engine, GenerateEngine) else engine


def drive(turn: Turn) -> Reply[Any]:
    """Run a planned turn to its reply (a remote engine: one request, then the replay)."""
    engine = turn.engine
    if isinstance(engine, GenerateEngine):
        result = engine.generate(turn.generate_request())
        out: list[Reply[Any]] = []
        for _ in _replayed(turn, [list(result.tokens), result], out):
            pass
        return out[0]
    stream: ReplyStream[Any] = ReplyStream(turn)
    for _ in stream:
        pass
    assert stream.reply is not None
    return stream.reply


def run_all(turns: list[Turn], results: Results,
            lockstep: Callable[[list[Turn], Results], None]) -> None:
    """Run a batch: a remote engine's turns as concurrent requests (its continuous batching
    shares the forward passes, its prefix cache the prompt), a local engine's under the
    ``lockstep`` driver. ``results`` gets each turn's Reply or error."""
    if turns and turns[0].local:
        lockstep(turns, results)
        return
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> None:
        try:
            results[i] = drive(turns[i])
        except ChatkitError as exc:
            results[i] = exc

    with ThreadPoolExecutor(max_workers=min(64, len(turns)),
                            thread_name_prefix="chatkit-remote") as pool:
        list(pool.map(one, range(len(turns))))


class ReplyStream(Generic[T]):
    """Iterate for text deltas; ``reply`` is set when the iteration ends normally.

    Leaving the loop early abandons the turn (nothing is appended).
    """

    def __init__(self, turn: Turn) -> None:
        self._turn = turn
        self.reply: Reply[T] | None = None

    def partials(self) -> Iterator[Partial[T]]:
        """The stream as :class:`~chatkit.chat.partial.Partial` steps: each delta with the
        document so far and the fields that started or completed; the last step is
        ``done`` (then ``reply`` is set)."""
        reader = _reader(self._turn)
        for delta in self:
            yield reader.feed(delta)
        yield _last(reader, self.reply)

    def __iter__(self) -> Iterator[str]:
        turn, engine = self._turn, self._turn.engine
        if isinstance(engine, GenerateEngine):
            out: list[Reply[T]] = []
            yield from _replayed(turn, engine.stream(turn.generate_request()), out)
            self.reply = out[0]
            return
        if not turn.speculative:
            ticket = engine_loop(engine).submit(turn)
            yield from ticket.deltas()
            self.reply = ticket.reply
            return
        try:
            for step in turn.steps():
                if delta := step():
                    yield delta
            self.reply = turn.reply
        finally:
            turn.release()


def _reader(turn: TurnView) -> PartialReader[Any]:
    return PartialReader(model=turn.schema_model, tools=turn.has_tools,
                         thinking=turn.thinking, dialect=turn.dialect,
                         tool_list=turn.tools)


def _last(reader: PartialReader[Any], reply: Reply[Any] | None) -> Partial[Any]:
    answer = reply.text if reply is not None and reader.thinking else None
    return reader.feed("", done=True, answer=answer)


class AsyncReplyStream(Generic[T]):
    """``async for`` text deltas; ``reply`` is set when the iteration ends normally.

    Planning (``plan``) runs in a worker thread; the steps run in the model's engine loop
    (a speculative turn: in worker threads). Leaving the loop early (or cancelling)
    abandons the turn (nothing is appended).
    """

    def __init__(self, engine: Engine, plan: Callable[[], Turn]) -> None:
        self._engine = engine
        self._plan = plan
        self._turn: Turn | None = None
        self.reply: Reply[T] | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._deltas()

    async def partials(self) -> AsyncIterator[Partial[T]]:
        """``ReplyStream.partials`` for async code."""
        reader: PartialReader[Any] | None = None
        async for delta in self:
            reader = reader or _reader(self._turn_planned())
            yield reader.feed(delta)
        yield _last(reader or _reader(self._turn_planned()), self.reply)

    def _turn_planned(self) -> Turn:
        assert self._turn is not None
        return self._turn

    async def _deltas(self) -> AsyncIterator[str]:
        engine = self._engine
        turn = self._turn = await run_blocking(engine, self._plan)
        if isinstance(engine, GenerateEngine):
            gen = self._remote(turn, engine)
        elif not turn.speculative:
            gen = self._looped(turn, engine)
        else:
            gen = self._stepped(turn, engine)
        async with contextlib.aclosing(gen):  # a consumer that left ends the turn now
            async for delta in gen:
                yield delta

    async def _remote(self, turn: Turn, engine: GenerateEngine) -> AsyncGenerator[str, None]:
        import anyio

        replay = Replay(turn, check_grammar=engine.returns_token_ids)
        pieces = engine.astream(turn.generate_request())
        try:
            async for piece in pieces:
                delta = replay.piece(piece)
                if delta:
                    yield delta
        finally:  # close the request now (a replay error, a consumer that left)
            aclose = getattr(pieces, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
        tail, self.reply = turn.finish()
        if tail:
            yield tail

    async def _looped(self, turn: Turn, engine: StepEngine) -> AsyncGenerator[str, None]:
        ticket = engine_loop(engine).submit(turn)
        async for delta in ticket.adeltas():
            yield delta
        self.reply = ticket.reply

    async def _stepped(self, turn: Turn, engine: StepEngine) -> AsyncGenerator[str, None]:
        import anyio

        try:
            waited = 0.0
            while not await run_blocking(engine, turn.try_open):
                if waited > engine.seq_wait:
                    turn.open(wait=0)  # raises the named error
                await anyio.sleep(0.01)
                waited += 0.01
            for step in turn.steps():
                if delta := await run_blocking(engine, step):
                    yield delta
            self.reply = turn.reply
        finally:
            turn.release()


class Replay:
    """A coarse engine's token ids replayed through a turn as one-hot rows (see
    :meth:`Turn.open_replay`). A token the grammar forbids (a server that ignored it) is
    ``SchemaViolation``."""

    def __init__(self, turn: Turn, *, check_grammar: bool) -> None:
        self.turn = turn
        turn.open_replay(check_grammar=check_grammar)
        self.fed = 0
        self._row = np.full(turn.engine.n_vocab, -np.inf, dtype=np.float32)

    def piece(self, piece: list[int] | GenerateResult) -> str:
        """A streamed piece: token ids (their text delta), or the engine's result."""
        return self.end(piece) if isinstance(piece, GenerateResult) else self.feed(piece)

    def feed(self, tokens: Iterable[int]) -> str:
        """Replay the engine's next token ids; the text delta."""
        turn, out = self.turn, ""
        n_vocab = turn.engine.n_vocab
        for tok in tokens:
            if turn.done:
                break
            if tok in turn.stop_ids:  # the engine's stop (EOS or end of turn): the turn's
                tok = turn.stop_token
            if not 0 <= tok < n_vocab:
                raise SchemaViolation(turn.text, [f"the engine returned token id {tok}, "
                                                  "outside the vocabulary"])
            row = self._row
            row.fill(-np.inf)  # the sampler may have written into it
            row[tok] = 0.0
            try:
                out += turn.first(row) if self.fed == 0 else turn.advance(row)
            except (AllTokensMasked, ConstraintError) as exc:
                raise SchemaViolation(turn.text, [
                    f"the engine's token {self.fed} ({tok}, "
                    f"{turn.engine.token_bytes(tok)!r}) is outside the grammar: it was not "
                    f"enforced ({exc})"]) from exc
            self.fed += 1
        return out

    def end(self, result: GenerateResult) -> str:
        """The engine finished: its stop token (or its limit) ends the replay."""
        turn, out = self.turn, ""
        if result.finish == "stop_token" and not turn.done:
            out = self.feed([turn.stop_token])
        turn.reuse = result.cached_prompt_tokens
        turn.end_at_limit()  # the engine stopped at its own limit (no-op when done)
        return out


def _replayed(turn: Turn, pieces: Iterable[list[int] | GenerateResult],
              out: list[Reply[Any]]) -> Iterator[str]:
    """A coarse engine's streamed token ids replayed through ``turn`` as they come: text
    deltas, then the checked Reply appended to ``out``."""
    engine = turn.engine
    assert isinstance(engine, GenerateEngine)
    replay = Replay(turn, check_grammar=engine.returns_token_ids)
    for piece in pieces:
        delta = replay.piece(piece)
        if delta:
            yield delta
    tail, reply = turn.finish()
    out.append(reply)
    if tail:
        yield tail
