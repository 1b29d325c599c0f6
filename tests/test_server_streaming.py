"""Replies with tools or a think block, streamed as they are written (chat completions):
tool-call names then argument fragments, reasoning before content; the SDK's stream helper
and instructor's ``create_partial`` see them grow. Real clients on loopback."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from chatkit import Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from chatkit.serve.stream_deltas import ReplyDeltas
from tests.helpers import openai_client
from tests.test_server import _Running

openai = pytest.importorskip("openai")
NAME = "smollm2"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}}


@pytest.fixture(scope="module")
def client(smol: Model) -> Iterator[Any]:
    with _Running(ChatkitServer(smol, name=NAME, limits=ServerLimits(max_tokens=512))) as r, \
            openai_client(r.base) as c:
        yield c


def test_tool_call_arguments_arrive_in_fragments(client: Any) -> None:
    stream = client.chat.completions.create(
        model=NAME, temperature=0, tools=[WEATHER], tool_choice="required", stream=True,
        parallel_tool_calls=False, max_tokens=96,
        messages=[{"role": "user", "content": "Weather in Rome for three days?"}])
    fragments: list[str] = []
    name_first = None
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                if tc.function.name:
                    name_first = name_first if name_first is not None else len(fragments) == 0
                    assert tc.id and tc.function.name == "get_weather"
                if tc.function.arguments:
                    fragments.append(tc.function.arguments)
            assert "<tool_call>" not in (c.delta.content or "")
    assert name_first is True  # the name before any argument
    assert len(fragments) > 2  # as the model writes them, not whole at the end
    assert set(json.loads("".join(fragments))) == {"city", "days"}


def test_the_sdk_stream_helper_sees_arguments_grow(client: Any) -> None:
    seen: list[str] = []
    with client.chat.completions.stream(
            model=NAME, temperature=0, tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False, max_tokens=96,
            messages=[{"role": "user", "content": "Weather in Oslo this week?"}]) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                seen.append(event.arguments)
        final = stream.get_final_completion()
    assert len(seen) > 2 and all(b.startswith(a) for a, b in itertools.pairwise(seen))
    call = final.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == json.loads(seen[-1])


class Forecast(BaseModel):
    city: Annotated[str, Field(pattern=r"^[A-Za-z ]{1,20}$")]
    days: int = Field(ge=1, le=7)
    summary: Annotated[str, Field(pattern=r"^[A-Za-z ,.]{1,40}$")]


def test_instructor_create_partial_yields_growing_partials(client: Any) -> None:
    import instructor

    patched = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    partials = list(patched.chat.completions.create_partial(
        model=NAME, response_model=Forecast, temperature=0, max_tokens=128,
        messages=[{"role": "user", "content": "Forecast for Rome."}]))
    filled = [sum(v is not None for v in p.model_dump().values()) for p in partials]
    assert len(partials) >= 2 and filled == sorted(filled) and filled[-1] == 3
    Forecast.model_validate(partials[-1].model_dump())


def test_reply_deltas_add_up_on_any_split() -> None:
    """The parser alone: any split of a raw reply gives the same calls, and reasoning stays
    out of content (markup never leaks)."""
    raw = ('thinking about "</th" it</think>\n\n<tool_call>\n{"name":"a","arguments":'
           '{"s":"}\\"{","n":[1,{"k":2}]}}\n</tool_call>\n<tool_call>\n{"name":"b",'
           '"arguments":{}}\n</tool_call>')
    for size in (1, 2, 5, 13, len(raw)):
        d = ReplyDeltas(thinking=True, tools=True)
        parts = [p for i in range(0, len(raw), size) for p in d.feed(raw[i:i + size])]
        reasoning = "".join(p.get("reasoning_content", "") for p in parts)
        assert reasoning == 'thinking about "</th" it'
        assert not any("content" in p for p in parts)
        args: dict[int, str] = {}
        for p in parts:
            for tc in p.get("tool_calls", []):
                args[tc["index"]] = args.get(tc["index"], "") + tc["function"]["arguments"]
        assert [json.loads(a) for a in args.values()] == [{"s": '}"{', "n": [1, {"k": 2}]},
                                                          {}]


def test_langchain_streams_tool_call_chunks(client: Any) -> None:
    """LangChain's ChatOpenAI: tool-call chunks arrive as the arguments are written, and
    add up to one call with the tool's arguments."""
    langchain_openai = pytest.importorskip("langchain_openai")

    llm = langchain_openai.ChatOpenAI(model=NAME, base_url=str(client.base_url),
                                      api_key="unused", temperature=0, max_tokens=96,
                                      max_retries=0)
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather", parallel_tool_calls=False)
    chunks = list(bound.stream("Weather in Rome for three days?"))
    pieces = [c for chunk in chunks for c in chunk.tool_call_chunks if c.get("args")]
    assert len(pieces) > 2  # fragments, not one chunk at the end
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    (call,) = total.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "days"}


def test_a_checked_schema_streams_its_reply_once_complete(client: Any) -> None:
    """A schema with value checks (uniqueItems) may take tokens back, so its content comes
    in one piece at the end; the stream still ends as any other, and the text is valid."""
    import jsonschema

    schema = {"type": "object", "properties": {"tags": {
        "type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True,
        "minItems": 2, "maxItems": 3}}, "required": ["tags"]}
    stream = client.chat.completions.create(
        model=NAME, stream=True, max_tokens=60,
        messages=[{"role": "user", "content": "Tags?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "t",
                                                                 "schema": schema}})
    contents: list[str] = []
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                contents.append(c.delta.content)
            finish = c.finish_reason or finish
    assert finish == "stop" and len(contents) == 1
    jsonschema.validate(json.loads(contents[0]), schema)
