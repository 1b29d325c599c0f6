"""The one stream driver (``serve/sse.py``) under the three wire APIs: with a ping after
every few milliseconds of silence, a streamed tool call still reaches each real SDK whole
(openai's chat and Responses streams, anthropic's Messages stream), and each stream carries
its API's keep-alive. Real clients on loopback, SmolLM2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chatkit import Model
from chatkit.serve import sse
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.helpers import openai_client
from tests.test_server import _Running

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
NAME = "smollm2"
ASK = "Weather in Rome for three days?"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "minimum": 1,
                                                    "maximum": 7}},
          "required": ["city", "days"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather",
                                              "description": "Weather in a city",
                                              "parameters": PARAMS}}


@pytest.fixture(scope="module")
def server(smol: Model) -> Iterator[_Running]:
    with _Running(ChatkitServer(smol, name=NAME, limits=ServerLimits(max_tokens=256))) as r:
        yield r


@pytest.fixture(autouse=True)
def fast_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ping after 2 ms of silence: every stream interleaves them with its events."""
    monkeypatch.setattr(sse, "PING_SECONDS", 0.002)


def _raw(server: _Running, path: str, body: dict[str, Any]) -> list[str]:
    """The stream's SSE lines, as sent."""
    with httpx.stream("POST", server.base + path, json=body, timeout=120,
                      headers={"x-api-key": "unused", "anthropic-version": "2023-06-01"}) as r:
        assert r.status_code == 200
        return list(r.iter_lines())


def test_chat_stream_pings_and_the_sdk_reassembles_the_call(server: _Running) -> None:
    body = {"model": NAME, "temperature": 0, "tools": [CHAT_TOOL], "tool_choice": "required",
            "stream": True, "max_tokens": 64, "parallel_tool_calls": False,
            "messages": [{"role": "user", "content": ASK}]}
    lines = _raw(server, "/v1/chat/completions", body)
    assert ": ping" in lines and [x for x in lines if x][-1] == "data: [DONE]"
    with openai_client(server.base) as c:
        stream = c.chat.completions.create(**body)
        args, names = "", []
        for chunk in stream:
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or ():
                    names += [tc.function.name] if tc.function.name else []
                    args += tc.function.arguments or ""
    assert names == ["get_weather"] and set(json.loads(args)) == {"city", "days"}


def test_responses_stream_pings_and_the_sdk_reassembles_the_call(server: _Running) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "Weather in a city",
            "parameters": PARAMS}
    body = {"model": NAME, "temperature": 0, "tools": [tool], "tool_choice": "required",
            "stream": True, "max_output_tokens": 64, "parallel_tool_calls": False,
            "input": ASK}
    assert ": ping" in _raw(server, "/v1/responses", body)
    with openai_client(server.base) as c:
        events = list(c.responses.create(**body))
    done = events[-1]
    assert done.type == "response.completed"
    calls = [item for item in done.response.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_weather"]
    assert set(json.loads(calls[0].arguments)) == {"city", "days"}


def test_messages_stream_pings_and_the_sdk_reassembles_the_call(server: _Running) -> None:
    tool = {"name": "get_weather", "description": "Weather in a city", "input_schema": PARAMS}
    body = {"model": NAME, "max_tokens": 64, "tools": [tool], "stream": True,
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [{"role": "user", "content": ASK}], "temperature": 0}
    lines = _raw(server, "/v1/messages", body)
    assert lines.count("event: ping") >= 2  # the one after message_start, and keep-alives
    with anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0) as c, \
            c.messages.stream(**{k: v for k, v in body.items()
                                 if k not in ("stream", "temperature")},
                              extra_body={"temperature": 0}) as stream:
        message = stream.get_final_message()
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [u.name for u in uses] == ["get_weather"] and set(uses[0].input) == {"city", "days"}
