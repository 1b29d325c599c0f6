"""The engine loop: concurrent sends share forward passes, replies equal the same reply
sent alone, waiting instead of failing, cancellation, a bounded queue."""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Any

import anyio
import pytest

from chatkit import Conversation, EngineBusy, Model, SamplingParams, engine_loop
from chatkit.chat.scheduler import STEP_ROWS, EngineLoop

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    {"enum": ["red", "green", "blue"]},
]
PROMPTS = ["Invent a person.", "Is the sky blue?", "List fruits.", "Pick a colour.",
           "Describe a cat.", "Name a city."]
# Every document SCHEMAS admit fits (a token is at least one byte): the longest is three
# 8-character strings of at most 6-byte \uXXXX escapes, 154 bytes. Free text stops at 40.
SCHEMA_MAX_TOKENS = 160
# A reply that cannot end before its max_tokens: a JSON string of at least 4000 characters.
ENDLESS = {"type": "string", "minLength": 4000}


def _max_tokens(schema: object) -> int:
    return 40 if schema is None else SCHEMA_MAX_TOKENS


def _send(model: Model, i: int, sampling: SamplingParams | None = None) -> str:
    conv = Conversation(model, sampling=sampling or SamplingParams(temperature=0.0))
    schema = SCHEMAS[i % len(SCHEMAS)] if i % 3 else None
    return conv.send(PROMPTS[i % len(PROMPTS)], schema=schema,
                     max_tokens=_max_tokens(schema)).text


def _fresh_stats(model: Model) -> EngineLoop:
    loop = engine_loop(model)
    loop.stats.__init__()  # type: ignore[misc]
    return loop


@pytest.mark.bitwise  # rows of a shared decode against each conversation alone
def test_threads_share_forward_passes_and_equal_alone(smol: Model) -> None:
    n = 2 * smol.n_seq_max  # more conversations than KV sequences: the rest wait
    alone = [_send(smol, i) for i in range(n)]
    loop = _fresh_stats(smol)
    got: list[str | None] = [None] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            got[i] = _send(smol, i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert got == alone
    assert loop.stats.shared_steps > 0 and loop.stats.max_live > 1
    assert loop.stats.max_live <= smol.n_seq_max
    assert smol.free_seqs() == smol.n_seq_max


@pytest.mark.bitwise
def test_tasks_share_forward_passes_and_equal_alone_seeded(smol: Model) -> None:
    sampling = [SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i) for i in range(6)]
    alone = [_send(smol, i, sampling[i]) for i in range(6)]
    loop = _fresh_stats(smol)

    async def main() -> list[str]:
        out: list[str] = [""] * 6

        async def one(i: int) -> None:
            conv = Conversation(smol, sampling=sampling[i])
            schema = SCHEMAS[i % len(SCHEMAS)] if i % 3 else None
            out[i] = (await conv.asend(PROMPTS[i % len(PROMPTS)], schema=schema,
                                       max_tokens=_max_tokens(schema))).text

        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(one, i)
        return out

    assert anyio.run(main) == alone
    assert loop.stats.shared_steps > 0


def test_long_prompt_prefills_between_decode_steps(smol: Model) -> None:
    """A long prompt arriving while a reply decodes is prefilled in chunks riding along
    with the runner's decode rows. The runner cannot end early (ENDLESS) and is read until
    the long prompt's turn has finished, so that turn's whole prefill happened beside it,
    whatever the machine's speed."""
    loop = _fresh_stats(smol)
    runner = Conversation(smol, sampling=SamplingParams(temperature=0.0))
    deltas = iter(runner.stream("Write a long story about a lighthouse.", schema=ENDLESS,
                                max_tokens=800))
    assert isinstance(deltas, Generator)
    next(deltas)  # the runner is decoding
    long_text = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 40
    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(
        Conversation(smol, sampling=SamplingParams(temperature=0.0)).send(
            long_text, max_tokens=4).text))
    t.start()
    for _ in deltas:  # Truncated here: 800 steps went by and the long prompt never finished
        if result:
            break
    deltas.close()  # leaving the runner's stream abandons its turn
    t.join()
    assert result and loop.stats.mixed_steps > 0
    # never more rows than the bitwise-equal regime allows (docs/DESIGN.md, "Numerics")
    assert 32 >= loop.stats.max_rows > 8
    assert engine_loop(smol).running == 0 and smol.free_seqs() == smol.n_seq_max


@pytest.mark.bitwise  # the KV the sequence kept against a fresh prefill of the same history
def test_leaving_a_stream_frees_the_sequence_and_keeps_kv_exact(smol: Model) -> None:
    conv = Conversation(smol, sampling=SamplingParams(temperature=0.0))
    first = conv.send("Hello!", max_tokens=8).text
    for i, _ in enumerate(conv.stream("Tell me a long story.", schema=ENDLESS,
                                      max_tokens=200)):
        if i == 3:
            break
    assert len(conv.messages) == 2  # the abandoned turn added nothing
    assert engine_loop(smol).running == 0 and smol.free_seqs() == smol.n_seq_max
    again = conv.send("Thanks.", max_tokens=12).text
    fresh = Conversation(smol, sampling=SamplingParams(temperature=0.0),
                         messages=[{"role": "user", "content": "Hello!"},
                                   {"role": "assistant", "content": first}])
    assert again == fresh.send("Thanks.", max_tokens=12).text


def test_cancelled_task_frees_its_sequence(smol: Model) -> None:
    """Cancelled once the turn holds a sequence; it cannot have finished by then (ENDLESS:
    900 tokens first, and even then it would be Truncated, never recorded)."""
    loop = engine_loop(smol)

    async def main() -> None:
        conv = Conversation(smol)

        async def send() -> None:
            await conv.asend("Write a very long story.", schema=ENDLESS, max_tokens=900)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            with anyio.fail_after(60):
                while loop.running == 0:
                    await anyio.sleep(0.005)
            tg.cancel_scope.cancel()
        assert conv.messages == []

    anyio.run(main)
    assert loop.running == 0 and smol.free_seqs() == smol.n_seq_max


def test_full_queue_is_engine_busy(smol: Model) -> None:
    loop = engine_loop(smol)
    loop.max_queue = 0
    try:
        with pytest.raises(EngineBusy) as info:
            Conversation(smol).send("hi", max_tokens=2)
        assert info.value.max_queue == 0
    finally:
        loop.max_queue = 256
    assert Conversation(smol).send("hi", max_tokens=2).text is not None


def test_batches_and_speculation_beside_the_loop_do_not_deadlock(smol: Model) -> None:
    """send_batch and speculative sends hold the model's lock while their decodes run on the
    compute thread; the loop only tries that lock, so all of them finish."""
    from chatkit import send_batch

    errors: list[BaseException] = []

    def batch() -> None:
        try:
            send_batch([(Conversation(smol), f"Say {i}.") for i in range(2)], max_tokens=24)
        except BaseException as exc:
            errors.append(exc)

    def plain(i: int) -> None:
        try:
            Conversation(smol).send(f"Count to {i}.", max_tokens=24)
        except BaseException as exc:
            errors.append(exc)

    def spec() -> None:
        try:
            Conversation(smol).send("Spell cat.", max_tokens=24, speculative=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=batch), threading.Thread(target=spec),
               *(threading.Thread(target=plain, args=(i,)) for i in range(2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlocked"
    assert errors == []


@pytest.mark.bitwise  # the KV a cancelled prefill left, reused, against a fresh prefill
def test_cancelled_mid_prefill_keeps_kv_exact(smol: Model) -> None:
    long_text = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 30
    conv = Conversation(smol, sampling=SamplingParams(temperature=0.0))

    async def main() -> None:
        with anyio.move_on_after(0.15):  # inside the ~1 s prefill
            await conv.asend(long_text, max_tokens=8)

    anyio.run(main)
    assert smol.free_seqs() == smol.n_seq_max
    history = conv.to_openai()  # empty unless a much faster machine finished the turn
    again = conv.send(long_text, max_tokens=8).text  # reuses what the sequence really holds
    fresh = Conversation(smol, sampling=SamplingParams(temperature=0.0),
                         messages=history).send(long_text, max_tokens=8)
    assert again == fresh.text


SYSTEM = ("You are a careful judge of customer messages. Read the message, decide whether it "
          "is a complaint, and answer in JSON with the field ok set to true for a complaint. "
          "Never add other fields. Be brief and exact; think of refunds, delays and damage.")


def test_concurrent_turns_with_one_system_prompt_prefill_it_once() -> None:
    """One KV pool (``kv_unified=True``): a prompt prefix a running turn's sequence holds,
    or will once its prefill gets there, is copied into the next turn's sequence instead of
    evaluated; the copies are reported as cached prompt tokens."""
    model = Model.load(n_ctx=4096, n_seq_max=4, kv_unified=True)
    try:
        loop = _fresh_stats(model)
        schema = SCHEMAS[1]
        replies: list[Any] = [None] * 4
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                conv = Conversation(model, system=SYSTEM)
                replies[i] = conv.send(f"Message {i}: my parcel came late.", schema=schema,
                                       max_tokens=16)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        prefix = model.tokenize(SYSTEM, special=False)
        cached = sorted(r.usage.cached_prompt_tokens for r in replies)
        # every turn after the first copies the system prompt (at least) from another
        assert cached[0] == 0 and all(c >= len(prefix) for c in cached[1:]), cached
        assert loop.stats.shared_tokens == sum(cached)
        assert all(isinstance(r.parsed["ok"], bool) for r in replies)
        assert model.free_seqs() == model.n_seq_max
    finally:
        model.close()


def test_a_unified_pool_prefills_in_large_steps_and_smaller_beside_decoding() -> None:
    """On one KV pool no bitwise regime is kept (docs/DESIGN.md "Numerics"), so a prompt
    alone is prefilled in steps of up to ``n_batch`` rows (a long agent prompt at the
    prompt-processing speed llama.cpp reaches), and beside a decoding turn in steps of
    ``STEP_ROWS`` (that turn's next token waits for the whole step)."""
    model = Model.load(n_ctx=4096, n_seq_max=2, kv_unified=True, n_batch=256)
    try:
        loop = _fresh_stats(model)
        greedy = SamplingParams(temperature=0.0)
        long_text = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 60
        Conversation(model, sampling=greedy).send(long_text, max_tokens=1)
        assert loop.stats.max_rows == 256  # the prompt is over 256 tokens
        runner = Conversation(model, sampling=greedy)
        deltas = iter(runner.stream("Write a long story.", schema=ENDLESS, max_tokens=800))
        assert isinstance(deltas, Generator)
        next(deltas)  # the runner is decoding
        loop.stats.__init__()  # type: ignore[misc]
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(
            Conversation(model, sampling=greedy).send(long_text.upper(), max_tokens=1).text))
        t.start()
        for _ in deltas:
            if result:
                break
        deltas.close()
        t.join()
        assert result and loop.stats.mixed_steps > 0
        assert loop.stats.max_rows == STEP_ROWS
    finally:
        model.close()


def test_streams_keep_small_steps_unless_the_loop_is_not_reproducible() -> None:
    """A KV stream per sequence keeps steps of ``STEP_ROWS`` rows by default (each reply
    equals the same reply sent alone); with ``reproducible`` off (``chatkit serve`` on long
    contexts) a prompt alone is prefilled in steps of up to ``n_batch`` rows."""
    model = Model.load(n_ctx=4096, n_seq_max=2, kv_unified=False, n_batch=256)
    try:
        loop = _fresh_stats(model)
        assert loop.reproducible
        greedy = SamplingParams(temperature=0.0)
        long_text = "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 60
        Conversation(model, sampling=greedy).send(long_text, max_tokens=1)
        assert loop.stats.max_rows == STEP_ROWS
        loop.reproducible = False
        Conversation(model, sampling=greedy).send(long_text.upper(), max_tokens=1)
        assert loop.stats.max_rows == 256  # the prompt is over 256 tokens
    finally:
        model.close()


def test_a_cached_prompt_starts_before_a_long_prefill_ends(smol: Model) -> None:
    """Prefill rows go to the prompt with least left first: a turn whose history is cached
    gets its first token in the first step, not after another turn's long prefill. Both
    are submitted while the loop is held (the engine's lock), so they start in one step
    whatever the machine's speed."""
    loop = _fresh_stats(smol)
    greedy = SamplingParams(temperature=0.0)
    cached = Conversation(smol, system="Answer in one word.", sampling=greedy)
    cached.send("Is water wet?", max_tokens=2)
    long = Conversation(smol, sampling=greedy)
    turns = [long.plan("Summarise: " + "the quick brown fox jumps over the lazy dog. " * 80,
                       max_tokens=1),
             cached.plan("Is fire hot?", max_tokens=1)]
    steps = [0]
    decode = smol.decode

    def counting(chunks: Any) -> Any:
        steps[0] += 1
        return decode(chunks)

    firsts: dict[int, int] = {}
    smol.decode = counting  # type: ignore[method-assign]
    try:
        with smol.lock:  # the loop cannot tick until both wait
            tickets = [loop.submit(turn) for turn in turns]

        def read(i: int) -> None:
            for _ in tickets[i].deltas():
                firsts.setdefault(i, steps[0])

        threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        del smol.decode
    assert len(turns[0].plan.prompt) > 20 * 32  # twenty steps of prefill at least
    assert firsts[1] <= 2 < 15 < firsts[0], firsts


def test_a_turn_that_fails_to_draft_fails_alone(smol: Model) -> None:
    """A turn's grammar failing while it drafts (its ``chunk``) ends that turn with the
    error; the turns stepping beside it go on."""
    loop = engine_loop(smol)
    greedy = SamplingParams(temperature=0.0)
    turns = [Conversation(smol, sampling=greedy).plan(f"Count to {n}.", max_tokens=6)
             for n in (5, 6)]

    def broken(**_: Any) -> None:
        raise RuntimeError("the grammar failed while drafting")

    turns[0].chunk = broken  # type: ignore[method-assign]
    with smol.lock:  # both start in one step
        tickets = [loop.submit(turn) for turn in turns]
    with pytest.raises(RuntimeError, match="while drafting"):
        "".join(tickets[0].deltas())
    "".join(tickets[1].deltas())
    assert tickets[1].reply is not None and tickets[1].reply.usage.completion_tokens > 1
