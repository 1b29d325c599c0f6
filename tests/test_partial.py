"""Typed partial streaming (``stream(...).partials()``): every snapshot is part of the final
document, a completed value never changes, events pair up; tool calls likewise."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from chatkit import Conversation, Model, SamplingParams, tool
from chatkit.chat.partial import Partial, PartialReader

SCHEMAS = sorted((Path(__file__).parent / "fixtures" / "schemas").glob("*.json"))


def is_part_of(part: Any, full: Any) -> bool:
    """``part`` is ``full`` with members (of objects and at the end of arrays) left out."""
    if isinstance(part, dict):
        return isinstance(full, dict) and all(k in full and is_part_of(v, full[k])
                                              for k, v in part.items())
    if isinstance(part, list):
        return isinstance(full, list) and len(part) <= len(full) and all(
            is_part_of(a, b) for a, b in zip(part, full, strict=False))
    return bool(part == full and type(part) is type(full))


def check_steps(steps: list[Partial[Any]], final: Any, *, whole: bool = True) -> None:
    """The contract of a stream of partials against the final document."""
    assert steps and steps[-1].done and not any(s.done for s in steps[:-1])
    assert steps[-1].data == final
    completed: dict[str, Any] = {}
    started: set[str] = set()
    for step in steps:
        assert step.data is None or is_part_of(step.data, final), (step.data, final)
        for e in step.events:
            if e.kind == "start":
                assert e.path not in started
                started.add(e.path)
            else:
                assert e.path in started and e.path not in completed
                completed[e.path] = e.value
        for path, value in completed.items():  # a completed value stays, unchanged
            assert _at(step.data, path) == value, path
    assert started == set(completed)
    if whole:
        assert completed[""] == final


def _at(doc: Any, path: str) -> Any:
    for part in path.split("/")[1:]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part.replace("~1", "/")
                                                                .replace("~0", "~")]
    return doc


def test_reader_on_any_chunking() -> None:
    text = json.dumps({"a": [1, 22.5, {"b": "x\\\"y", "c": None}], "d": True, "e": "",
                       "f/g": {"h": -3e2}}, separators=(",", ":"))
    final = json.loads(text)
    rng = random.Random(7)
    for _ in range(50):
        reader: PartialReader[Any] = PartialReader()
        steps, i = [], 0
        while i < len(text):
            n = rng.randint(1, 4)
            steps.append(reader.feed(text[i:i + n]))
            i += n
        steps.append(reader.feed("", done=True))
        check_steps(steps, final)


def test_reader_check_can_fail() -> None:
    """A reader that reported a number before its end would break the contract."""
    steps = [PartialReader[Any]().feed('{"n":1')]  # "1" may still become "12"
    assert steps[0].data == {} and not any(e.kind == "complete" for e in steps[0].events)
    with pytest.raises(AssertionError):
        check_steps([Partial("", {"n": 1}, (), None, False), Partial("", {"n": 12}, (), None,
                                                                          True)], {"n": 12})


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_snapshots_are_part_of_the_final_object(smol: Model, path: Path) -> None:
    schema = json.loads(path.read_text())
    for seed in (1, 2):
        conv = Conversation(smol, sampling=SamplingParams(temperature=0.8, seed=seed))
        stream = conv.stream("Give one example value, as JSON.", schema=schema,
                             max_tokens=120)
        try:
            steps = list(stream.partials())
        except Exception as exc:  # a cut reply is Truncated, named: nothing to check
            assert type(exc).__name__ == "Truncated", exc
            continue
        assert stream.reply is not None
        check_steps(steps, stream.reply.parsed)


class Ticket(BaseModel):
    kind: Literal["bug", "feature"]
    title: str = Field(max_length=40)
    labels: list[Literal["ui", "api", "docs"]] = Field(max_length=2)


def test_the_partial_object_is_typed_and_grows(smol: Model) -> None:
    stream = Conversation(smol).stream("File a ticket: the login button does nothing.",
                                       schema=Ticket, max_tokens=80)
    steps = list(stream.partials())
    assert stream.reply is not None
    final = stream.reply.parsed
    seen: set[str] = set()
    for step in steps:
        obj = step.object
        assert isinstance(obj, Ticket)
        now = set(obj.model_fields_set)
        assert seen <= now  # a field once set stays set
        for name in now:
            assert getattr(obj, name) == getattr(final, name)
        seen = now
    assert seen == {"kind", "title", "labels"}
    assert [e.path for e in steps[0].events + steps[1].events if e.kind == "start"][:1] == [""]


@tool
def lookup(city: str, days: int) -> str:
    """Look up the weather.

    Args:
        city: the city.
        days: how many days ahead (1-7).
    """
    return f"{city}: sunny"


def test_tool_call_partials(smol: Model) -> None:
    stream = Conversation(smol).stream("Weather in Paris in 3 days?", tools=[lookup],
                                       tool_choice="required", max_tokens=80)
    steps = list(stream.partials())
    assert stream.reply is not None and stream.reply.tool_calls
    call = stream.reply.tool_calls[0]
    final = {"tool_calls": [{"name": c.name, "arguments": c.arguments}
                            for c in stream.reply.tool_calls]}
    check_steps(steps, final, whole=False)
    completed = [e for s in steps for e in s.events if e.kind == "complete"]
    order = [e.path for e in completed]
    assert order.index("/tool_calls/0/name") < order.index("/tool_calls/0/arguments")
    assert dict(completed[order.index("/tool_calls/0/arguments")].value) == call.arguments


def test_async_partials_equal_sync(smol: Model) -> None:
    sync = [(s.delta, s.data) for s in Conversation(smol).stream(
        "File a ticket: the docs are wrong.", schema=Ticket, max_tokens=80).partials()]

    async def main() -> list[tuple[str, Any]]:
        stream = Conversation(smol).astream("File a ticket: the docs are wrong.",
                                            schema=Ticket, max_tokens=80)
        return [(s.delta, s.data) async for s in stream.partials()]

    assert anyio.run(main) == sync


def test_partials_over_a_remote_engine() -> None:
    """A remote engine's tokens are replayed through the turn: the same partials."""
    from chatkit import RemoteEngine
    from tests.helpers import Script, completion

    vocab = Model.load_vocab()
    script = Script()
    engine = RemoteEngine(script.base, kind="vllm", model="m", vocab=vocab, retries=0,
                          timeout=30)
    try:
        text = '{"kind":"bug","title":"Login fails","labels":["ui"]}'
        script.replies = [(200, completion([*vocab.tokenize(text, special=False),
                                            vocab.eot_id]), 0.0)]
        stream = Conversation(engine).stream("File it.", schema=Ticket, max_tokens=80)
        steps = list(stream.partials())
        check_steps(steps, json.loads(text))
        assert isinstance(steps[-1].object, Ticket) and steps[-1].object.labels == ["ui"]
    finally:
        engine.close()
        script.close()


def test_a_thinking_reply_streams_its_answer(smol: Model) -> None:
    """Under a thinking template the think text comes first (no data yet), then the
    answer's partials; the last step is the parsed answer."""
    stream = Conversation(smol, template="qwen3", think_budget=16).stream(
        "File a ticket: the docs are wrong.", schema=Ticket, max_tokens=120)
    steps = list(stream.partials())
    assert stream.reply is not None and stream.reply.reasoning is not None
    check_steps(steps, stream.reply.parsed.model_dump())
    assert steps[0].data is None  # the think block opens the reply
