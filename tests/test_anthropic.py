"""``chatkit serve``'s Anthropic Messages API with the real ``anthropic`` SDK on loopback
(a uvicorn server in a thread of this process, on the session's SmolLM2): create, stream,
tools under every ``tool_choice``, tool results, ``parse`` with an output format,
``count_tokens``, mid-conversation system messages, auth and errors in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel, Field

from chatkit import Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.test_server import _Running

anthropic = pytest.importorskip("anthropic")

KEY = "test-key"
MODEL = "claude-sonnet-4-6"  # any name is served by the loaded model, and echoed
WEATHER = {"name": "get_weather", "description": "Current weather for a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}
TIME = {"name": "get_time", "description": "Current time in a timezone",
        "input_schema": {"type": "object", "properties": {
            "tz": {"type": "string", "maxLength": 20}}, "required": ["tz"]}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
T0 = {"temperature": 0}  # greedy: this SDK has no temperature argument (extra_body)


@pytest.fixture(scope="module")
def server(smol: Model) -> Iterator[_Running]:
    limits = ServerLimits(max_tokens=256)
    with _Running(ChatkitServer(smol, name="smollm2", api_key=KEY, limits=limits)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: _Running) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0) as c:
        yield c


def test_create_echoes_the_model_and_reports_usage(client: Any) -> None:
    m = client.messages.create(model=MODEL, max_tokens=12, extra_body=T0,
                               system=[{"type": "text", "text": "Be brief."}],
                               messages=[{"role": "user", "content": "Say hello."}])
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 12


def test_stream_text_deltas_make_the_final_message(client: Any) -> None:
    with client.messages.stream(model=MODEL, max_tokens=16, extra_body=T0,
                                messages=[{"role": "user", "content": "Count to five."}]) as s:
        deltas = list(s.text_stream)
        final = s.get_final_message()
    assert len(deltas) > 1 and "".join(deltas) == final.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 16


def _uses(m: Any) -> list[Any]:
    return [b for b in m.content if b.type == "tool_use"]


def test_named_tool_choice_is_that_tool(client: Any) -> None:
    m = client.messages.create(model=MODEL, max_tokens=200, extra_body=T0, messages=ASK,
                               tools=[WEATHER, TIME], tool_choice={"type": "tool",
                                                                   "name": "get_time"})
    uses = _uses(m)
    assert m.stop_reason == "tool_use" and uses and all(u.name == "get_time" for u in uses)
    assert isinstance(uses[0].input["tz"], str) and uses[0].id


def test_any_without_parallel_is_exactly_one_call(client: Any) -> None:
    m = client.messages.create(
        model=MODEL, max_tokens=200, extra_body=T0, messages=ASK, tools=[WEATHER, TIME],
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert m.stop_reason == "tool_use" and len(_uses(m)) == 1


def test_none_and_auto(client: Any) -> None:
    m = client.messages.create(model=MODEL, max_tokens=20, extra_body=T0, messages=ASK,
                               tools=[WEATHER], tool_choice={"type": "none"})
    assert not _uses(m) and m.content[0].type == "text" and "<tool_call>" not in m.content[0].text
    m = client.messages.create(model=MODEL, max_tokens=200, extra_body=T0, messages=ASK,
                               tools=[WEATHER], tool_choice={"type": "auto"})
    assert (m.stop_reason == "tool_use") == bool(_uses(m))


def test_tool_result_round_trip(client: Any) -> None:
    first = client.messages.create(model=MODEL, max_tokens=200, extra_body=T0, messages=ASK,
                                   tools=[WEATHER], tool_choice={"type": "any"})
    use = _uses(first)[0]
    second = client.messages.create(model=MODEL, max_tokens=20, extra_body=T0,
                                    tools=[WEATHER], tool_choice={"type": "none"}, messages=[
        *ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": [{"type": "text", "text": "12 C, rain"}]}]}])
    assert second.content[0].type == "text" and second.content[0].text


def test_streamed_tool_use_grows_its_input(client: Any) -> None:
    with client.messages.stream(model=MODEL, max_tokens=200, extra_body=T0, messages=ASK,
                                tools=[WEATHER], tool_choice={"type": "tool",
                                                              "name": "get_weather"}) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in s]
        final = s.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    assert kinds[0][0] == "message_start" and kinds[-1][0] == "message_stop"
    uses = _uses(final)  # parallel calls allowed: each its own block, in index order
    assert uses and all(u.name == "get_weather" and isinstance(u.input["city"], str)
                        for u in uses)
    assert kinds.count(("content_block_start", None)) == len(final.content)
    assert final.stop_reason == "tool_use"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


def test_parse_with_an_output_format(client: Any) -> None:
    """The SDK moves ``ge``/``le`` into the description; the grammar still gets the
    schema it sends, and the whole text block parses as the model."""
    m = client.messages.parse(model=MODEL, max_tokens=60, extra_body=T0,
                              output_format=Person,
                              messages=[{"role": "user", "content": "Alice is 30."}])
    assert isinstance(m.content[0].parsed_output, Person)


def test_count_tokens_is_the_prompt_that_runs(client: Any) -> None:
    body: dict[str, Any] = dict(model=MODEL, messages=[{"role": "user", "content": "Hi."}],
                                system="Be brief.", tools=[WEATHER])
    counted = client.messages.count_tokens(**body)
    m = client.messages.create(max_tokens=1, extra_body=T0, tool_choice={"type": "none"},
                               **body)
    assert counted.input_tokens == m.usage.input_tokens + m.usage.cache_read_input_tokens


def test_a_mid_conversation_system_message_is_kept(client: Any) -> None:
    m = client.messages.create(model=MODEL, max_tokens=8, extra_body=T0, messages=[
        {"role": "user", "content": "Hi."},
        {"role": "system", "content": "Answer in French."},
    ])
    assert m.content[0].text


def test_stop_sequences(client: Any) -> None:
    m = client.messages.create(model=MODEL, max_tokens=64, extra_body=T0,
                               stop_sequences=["3"],
                               messages=[{"role": "user", "content": "Count: 1, 2, 3, 4."}])
    if m.stop_reason == "stop_sequence":
        assert m.stop_sequence == "3" and "3" not in m.content[0].text
    else:  # the model never wrote a 3
        assert m.stop_sequence is None


def test_auth_and_errors_in_anthropic_shape(server: _Running, client: Any) -> None:
    with anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0) as bad:
        with pytest.raises(anthropic.AuthenticationError) as info:
            bad.messages.create(model=MODEL, max_tokens=4, messages=ASK)
    assert info.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])
    assert info.value.body["type"] == "error" and "image" in info.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": "word " * 5000}])
    assert info.value.body["error"]["message"].startswith("prompt is too long: ")


def test_models_in_anthropic_shape(client: Any) -> None:
    page = client.models.list()
    assert page.data[0].type == "model" and page.data[0].id == "smollm2"


def test_pings_while_the_stream_has_nothing_and_leaving_closes_it() -> None:
    import asyncio

    from chatkit.serve.sse import with_pings

    closed = []

    async def slow() -> Any:
        try:
            await asyncio.sleep(0.35)
            yield 1
            yield 2
            await asyncio.sleep(10)
            yield 3
        finally:
            closed.append(True)

    async def run() -> list[Any]:
        out: list[Any] = []
        async for item in with_pings(slow(), 0.1):
            out.append(item)
            if item == 2:
                break  # a client that leaves
        return out

    out = asyncio.run(run())
    assert out[-2:] == [1, 2] and len(out) >= 4 and set(out[:-2]) == {None}
    assert closed == [True]
