"""``chatkit serve`` on the Gemma 3 GGUF, no template flag: its template has no tool syntax,
so tool calls go through the generic JSON envelope in Gemma's own template; the openai and
anthropic SDKs get calls, plain and streamed (arguments in pieces, ids fixed at the first
delta), and the tool result goes back. A real uvicorn server on loopback (in a thread).

What is proven is the protocol (a call in the wire shapes, the loop continuing after a
result), not the 270M model's judgement: ``tool_choice`` forces the call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from chatkit import Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.helpers import answer_chat_call, openai_client
from tests.test_server import _Running
from tests.test_server_dialects import WEATHER

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytestmark = pytest.mark.gemma

NAME = "gemma"

@pytest.fixture(scope="module")
def server(gemma: Model) -> Iterator[_Running]:
    with _Running(ChatkitServer(gemma, name=NAME,
                                limits=ServerLimits(max_tokens=200))) as running:
        yield running


def test_openai_sdk_gets_a_call_and_sends_the_result_back(server: _Running) -> None:
    with openai_client(server.base) as c:
        first = c.chat.completions.create(
            model=NAME, temperature=0, max_tokens=200, tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Oslo?"}])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather"
        assert set(json.loads(call.function.arguments)) == {"city", "days"}
        assert "tool_calls" not in (choice.message.content or "")
        second = answer_chat_call(c, NAME, choice, call, max_tokens=30, tools=[WEATHER])
        reply = second.choices[0].message
        assert not reply.tool_calls and reply.content and "{" not in reply.content[:1]


def test_openai_sdk_streams_the_call_in_pieces(server: _Running) -> None:
    with openai_client(server.base) as c:
        stream = c.chat.completions.create(
            model=NAME, temperature=0, max_tokens=200, tools=[WEATHER], stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Rome?"}])
        ids, pieces, arguments, finish = set(), 0, "", None
        for chunk in stream:
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or ():
                    if tc.id:
                        ids.add(tc.id)
                    if tc.function and tc.function.arguments:
                        arguments += tc.function.arguments
                        pieces += 1
    assert finish == "tool_calls" and len(ids) == 1
    assert pieces >= 2 and set(json.loads(arguments)) == {"city", "days"}


def test_anthropic_sdk_gets_a_tool_use_plain_and_streamed(server: _Running) -> None:
    tool = {"name": "get_weather", "description": "Current weather for a city",
            "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    with anthropic.Anthropic(base_url=server.base, api_key="unused", max_retries=0) as c:
        msg = c.messages.create(model=NAME, max_tokens=200, tools=[tool],
                                tool_choice={"type": "any"},
                                messages=[{"role": "user", "content": "Weather in Oslo?"}])
        assert msg.stop_reason == "tool_use"
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert uses and all(u.name == "get_weather" and set(u.input) == {"city", "days"}
                            for u in uses)
        with c.messages.stream(model=NAME, max_tokens=200, tools=[tool],
                               tool_choice={"type": "tool", "name": "get_weather"},
                               messages=[{"role": "user", "content": "Weather in Rome?"}]) as s:
            kinds = [event.type for event in s]
            final: Any = s.get_final_message()
    assert "input_json" in kinds or "content_block_delta" in kinds
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses and all(set(u.input) == {"city", "days"} for u in uses)


def test_a_turn_without_tools_after_a_generic_tool_exchange(gemma: Model) -> None:
    """Gemma's template knows no tool role: the history keeps the generic form (results as
    a user turn, the next question joined to it) on a later turn offered no tools."""
    from chatkit import Conversation, tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    conv = Conversation(gemma, max_tokens=60)
    reply = conv.send("Weather in Oslo?", tools=[get_weather], tool_choice="required")
    assert reply.tool_calls
    conv.add_tool_result(reply.tool_calls[0], "sunny, 21 C")
    assert conv.send("Thanks! Anything else?", max_tokens=8).text is not None


SYSTEM = "You answer questions about files. " + " ".join(
    f"Rule {i}: quote item {i} exactly." for i in range(300))
"""A system prompt of ~3,000 tokens: far past Gemma 3's 512-token sliding window."""


@pytest.mark.parametrize("swa_full", [False, True])
def test_a_window_that_dropped_cells_is_never_resumed_from(swa_full: bool) -> None:
    """llama.cpp keeps each sequence's positions from its lowest to its highest: a sliding
    window drops the oldest, after which decoding may resume only where the window's cells
    before that position are all held (``resumable``); with ``swa_full`` they all are."""
    from tests.conftest import gemma_path

    model = Model.load(gemma_path(), n_ctx=4096, n_seq_max=1, swa_full=swa_full)
    try:
        tokens = model.tokenize(SYSTEM, special=False)[:2000]
        model.prefill(0, tokens, chunk=512)
        assert model.resumable(0, len(tokens)) == len(tokens)  # the end: always
        assert model.resumable(0, 100) == (100 if swa_full else 0)
        assert model.keeps_prefixes == swa_full
    finally:
        model.close()


def test_a_sessions_second_turn_is_served_from_its_cached_prefix() -> None:
    """At 8,192 tokens a sequence ``chatkit serve`` loads Gemma 3 on one KV pool with
    ``swa_full`` (longer contexts: a stream per sequence and window checkpoints,
    test_swa_checkpoints): an agent's second request (its first request, the call and the
    tool result) starts from the first request's cells."""
    from tests.conftest import gemma_path

    model = Model.load(gemma_path(), n_ctx=16384, n_seq_max=2, kv_unified=True,
                       swa_full=True)
    model.n_ctx_seq = model.n_ctx // 2
    read = {"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string", "maxLength": 30}},
        "required": ["file_path"]}}
    try:
        with _Running(ChatkitServer(model, name=NAME)) as running, \
                anthropic.Anthropic(base_url=running.base, api_key="k", max_retries=0) as c:
            ask: list[dict[str, Any]] = [{"role": "user", "content": "Read notes.txt"}]
            first = c.messages.create(model="m", max_tokens=100, system=SYSTEM, tools=[read],
                                      tool_choice={"type": "any"}, messages=ask,
                                      extra_body={"temperature": 0})
            (use,) = [b for b in first.content if b.type == "tool_use"]
            second = c.messages.create(model="m", max_tokens=8, system=SYSTEM, tools=[read],
                                       extra_body={"temperature": 0}, messages=[
                *ask, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                              "content": "The secret word is PELICAN."}]}])
        prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
        assert second.usage.cache_read_input_tokens >= 0.9 * prompt, second.usage
    finally:
        model.close()
