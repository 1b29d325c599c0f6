"""``chatkit serve`` with another family's template: the openai SDK's tool calls, plain and
streamed, in each kind of dialect (JSON, XML, pythonic, harmony, Gemma 4's keyed values),
then the tool result rendered back through the same template. A real uvicorn server on
loopback (in a thread)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatkit import ChatTemplate, Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.helpers import answer_chat_call, answer_responses_call, stream_responses_call
from tests.test_server import _Running

openai = pytest.importorskip("openai")

CORPORA = Path(__file__).resolve().parent / "corpora"
NAME = "smollm2"
KINDS = {  # dialect kind: a family template that writes it
    "json": "mistral-small-3.2-instruct-2506",  # [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}
    "xml": "qwen3-coder",  # <function=NAME><parameter=KEY>raw</parameter>
    "pythonic": "lfm2.5",  # <|tool_call_start|>[NAME(key='v')]<|tool_call_end|>
    "harmony": "gpt-oss",  # to=functions.NAME<|channel|>commentary json<|message|>{...}
    "gemma": "gemma-4-it",  # <|tool_call>call:NAME{key:<|"|>raw<|"|>,n:5}<tool_call|>
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "days": {"type": "integer", "minimum": 1,
                                                             "maximum": 9}},
                   "required": ["city", "days"]}}}
MARKUP = ("[TOOL_CALLS]", "<function=", "<|tool_call_start|>", "to=functions.", "<tool_call>",
          "<|tool_call>")


@pytest.fixture(scope="module")
def model() -> Iterator[Model]:
    m = Model.load(n_ctx=4096, n_seq_max=2)
    yield m
    m.close()


@pytest.fixture(scope="module", params=sorted(KINDS))
def client(request: pytest.FixtureRequest, model: Model) -> Iterator[Any]:
    family = KINDS[request.param]
    path = next(CORPORA.glob(f"*/templates/{family}.jinja"))
    template = ChatTemplate.from_string(path.read_text(), name=family)
    server = ChatkitServer(model, name=NAME, template=template,
                           limits=ServerLimits(max_tokens=400))
    with _Running(server) as running, openai.OpenAI(
            base_url=running.base + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_tool_call_then_result_in_the_family_format(client: Any) -> None:
    first = client.chat.completions.create(
        model=NAME, temperature=0, max_tokens=400, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Oslo?"}])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and isinstance(args["days"], int)
    assert not any(m in (choice.message.content or "") for m in MARKUP)
    second = answer_chat_call(client, NAME, choice, call, max_tokens=20, tools=[WEATHER])
    message = second.choices[0].message
    assert not message.tool_calls
    assert message.content or getattr(message, "reasoning_content", None)  # (cut in thought)
    # (under tool_choice="none" the text is the model's, returned as written: a small model
    # may imitate the markup its history shows, which is text here, not a call)


def test_streamed_tool_call_in_the_family_format(client: Any) -> None:
    stream = client.chat.completions.create(
        model=NAME, temperature=0, max_tokens=400, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True,
        parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Rome?"}])
    calls: dict[int, dict[str, str]] = {}
    finish, content = None, ""
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": ""})
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
                slot["id"] += tc.id or ""
    assert finish == "tool_calls" and list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert set(json.loads(calls[0]["arguments"])) == {"city", "days"}
    assert not any(m in content for m in MARKUP)


RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}


def test_responses_api_calls_in_the_family_format(client: Any) -> None:
    """The Responses API on the same lanes: a call (plain and streamed) and its output."""
    first = client.responses.create(model=NAME, input="Weather in Oslo?",
                                    tools=[RESPONSES_WEATHER], tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=400,
                                    temperature=0)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city", "days"}
    second = answer_responses_call(client, NAME, call)
    assert [item.type for item in second.output] == ["message"]
    kinds, final = stream_responses_call(client, NAME, RESPONSES_WEATHER, 400)
    assert "response.function_call_arguments.done" in kinds
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert set(json.loads(call.arguments)) == {"city", "days"}
