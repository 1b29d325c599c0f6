"""``POST /v1/responses`` with the openai SDK on loopback: create, parse, stream, function
tools and their results as input items, refusals by name. A real uvicorn server over the
session's SmolLM2 (tests/test_server.py's harness)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from pydantic import BaseModel, Field

from chatkit import Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.helpers import answer_responses_call, stream_responses_call
from tests.test_server import _Running

openai = pytest.importorskip("openai")

NAME = "smollm2"
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"}},
               "required": ["city"]}}


class Person(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z ]{1,12}$")
    age: int = Field(ge=0, le=120)


@pytest.fixture(scope="module")
def server(smol: Model) -> Iterator[_Running]:
    limits = ServerLimits(max_tokens=512)
    with _Running(ChatkitServer(smol, name=NAME, limits=limits)) as running:
        yield running


def test_create_gives_a_response(client: Any) -> None:
    r = client.responses.create(model=NAME, input="Say hello.", max_output_tokens=8,
                                instructions="You are terse.", temperature=0)
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert isinstance(r.output_text, str)
    assert r.usage.input_tokens > 0 and r.usage.output_tokens <= 8
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_parse_returns_a_validated_instance(client: Any) -> None:
    r = client.responses.parse(model=NAME, input="Invent a person.", text_format=Person,
                               max_output_tokens=64, temperature=0)
    assert r.status == "completed" and isinstance(r.output_parsed, Person)


def test_stream_sends_text_as_it_is_written(client: Any) -> None:
    kinds: list[str] = []
    deltas: list[str] = []
    with client.responses.stream(model=NAME, input="Invent a person.", text_format=Person,
                                 max_output_tokens=64, temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and len(deltas) > 1
    assert "".join(deltas) == final.output_text
    assert isinstance(final.output_parsed, Person)


def test_function_tools_and_their_results(client: Any) -> None:
    first = client.responses.create(model=NAME, input="Weather in Oslo?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=64, temperature=0)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    # the call and its output as input items: the model answers in text (no tools offered)
    second = answer_responses_call(client, NAME, call)
    assert [item.type for item in second.output] == ["message"]


def test_streamed_function_call(client: Any) -> None:
    kinds, final = stream_responses_call(client, NAME, WEATHER, 64)
    assert "response.function_call_arguments.done" in kinds
    # arguments as they are written, after the item (its name) is announced
    assert kinds.count("response.function_call_arguments.delta") > 1
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta")
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(call.arguments)["city"]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "frobnicator"}]}, "tools"),
    ({"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
     "tool_choice"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x",
                                        "schema": {"$ref": "https://example.com/s.json"}}}},
     "text.format"),
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
])
def test_what_is_not_supported_is_a_400_by_name(server: _Running, body: dict[str, Any],
                                                param: str) -> None:
    r = httpx.post(server.base + "/v1/responses", json={"model": NAME, **body}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_openai_agents_default_model_with_a_tool_and_an_output_type(server: _Running) -> None:
    """openai-agents' default model speaks the Responses API: a function tool, then an
    ``output_type``. The first call is forced (``tool_choice``; the agent resets it after a
    tool use) and chatkit's ``tool_call_threshold`` extension (``extra_body``) makes the
    turns after it answer, so the run ends the same way on any build."""
    agents = pytest.importorskip("agents")

    class Forecast(BaseModel):
        city: str = Field(pattern=r"^[A-Za-z ]{1,20}$")
        rain: bool

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        calls.append(city)
        return "12 C, rain"

    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused",
                                      max_retries=0) as client:
            model = agents.OpenAIResponsesModel(model=NAME, openai_client=client)
            agent = agents.Agent(name="weather", instructions="Answer with the forecast.",
                                 model=model, tools=[get_weather], output_type=Forecast,
                                 model_settings=agents.ModelSettings(
                                     tool_choice="get_weather", temperature=0,
                                     max_tokens=96, parallel_tool_calls=False,
                                     extra_body={"tool_call_threshold": 1.0}))
            return await agents.Runner.run(agent, "Will it rain in Oslo?", max_turns=4)

    agents.set_tracing_disabled(True)
    result = anyio.run(run)
    assert calls and isinstance(result.final_output, Forecast)
