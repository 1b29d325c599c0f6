"""Conversation state as data, continuing after tool results, twins that match."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import anyio
import pytest
from pydantic import Field

from chatkit import (
    Conversation,
    InvalidParameter,
    MaxStepsExceeded,
    Message,
    Model,
    Reply,
    ToolCall,
    ToolResult,
    aquorum,
    quorum,
    tool,
)
from tests.helpers import VERDICT_MAX_TOKENS, Verdict

# A bounded argument (ASCII letters, no escapes): one call to a one-argument tool below fits
# in ONE_CALL tokens, '<tool_call>\n{"name":"get_weather","arguments":{"city":"<20>"}}
# \n</tool_call>' being 91 bytes and a token at least one byte.
City = Annotated[str, Field(pattern=r"^[A-Za-z ]{1,20}$")]
ONE_CALL = 100
MOST = VERDICT_MAX_TOKENS  # every Verdict the grammar admits fits

HISTORY = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": [{"type": "text", "text": "Weather in "},
                                 {"type": "text", "text": "Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22 C"},
    {"role": "assistant", "content": "It is 22 C in Paris.", "reasoning_content": "easy"},
]


def test_messages_round_trip_through_openai_dicts_and_json(smol: Model) -> None:
    conv = Conversation(smol, messages=HISTORY)
    assert conv.system == "You answer briefly."
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[0].content == "Weather in Paris?"
    call = conv.messages[1].tool_calls[0]
    assert call == ToolCall("call_1", "get_weather", {"city": "Paris"})
    again = Conversation(smol, messages=json.loads(conv.to_json()))
    assert again.history() == conv.history()
    assert again.prompt_ids("And Rome?") == conv.prompt_ids("And Rome?")
    assert Message.from_openai(call.to_openai() | {"role": "assistant"}).role == "assistant"


def test_bad_messages_are_named_errors(smol: Model) -> None:
    for bad in ([{"role": "wizard", "content": "x"}],
                [{"role": "user", "content": [{"type": "image_url"}]}],
                [{"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}],
                [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]):
        with pytest.raises(InvalidParameter):
            Conversation(smol, messages=bad)
    with pytest.raises(InvalidParameter):
        Conversation(smol, system="x", messages=HISTORY[:1])


def test_own_tool_executor_then_resume(smol: Model) -> None:
    @tool
    def get_weather(city: City) -> str:
        """Get the weather of a city."""
        return "unused"

    conv = Conversation(smol)
    reply = conv.send("Weather in Paris?", tools=[get_weather], tool_choice="required",
                      parallel_tool_calls=False, max_tokens=ONE_CALL)
    assert reply.finish_reason == "tool_calls"
    conv.add_tool_result(reply.tool_calls[0], {"temperature_c": 22})
    with pytest.raises(InvalidParameter):
        conv.add_tool_result("no-such-call", "x")
    final = conv.resume(tools=[get_weather], tool_choice="none", max_tokens=24)
    assert final.tool_calls == [] and "<tool_call>" not in final.text
    roles = [m.role for m in conv.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[2].content == '{"temperature_c": 22}'


def test_sync_agent_loop_inside_a_running_event_loop(smol: Model) -> None:
    """Jupyter / a FastAPI handler: ``run`` is called from a thread whose loop is running.
    One step (a forced call, executed) then ``max_steps``: whether the model would call
    again is its own business, so the loop stops by its limit, a named error."""
    seen: list[str] = []

    @tool
    def lookup(city: City) -> str:
        """Look up the weather of a city."""
        seen.append(city)
        return f"Sunny in {city}."

    async def handler() -> list[object]:
        conv = Conversation(smol)
        with pytest.raises(MaxStepsExceeded) as info:
            conv.run("Weather in Oslo?", tools=[lookup], tool_choice="required",
                     parallel_tool_calls=False, max_steps=1, max_tokens=ONE_CALL)
        assert [m.role for m in conv.messages] == ["user", "assistant", "tool"]
        return info.value.transcript

    reply, result = asyncio.run(handler())
    assert isinstance(reply, Reply) and isinstance(result, ToolResult)
    assert len(seen) == 1 and reply.tool_calls[0].arguments == {"city": seen[0]}
    assert result.content == f"Sunny in {seen[0]}."


def test_astream_gives_its_reply_like_stream(smol: Model) -> None:
    sync = Conversation(smol).stream("Judge: water is wet.", schema=Verdict, max_tokens=MOST)
    text = "".join(sync)

    async def main() -> tuple[str, Verdict | None]:
        stream = Conversation(smol).astream("Judge: water is wet.", schema=Verdict,
                                            max_tokens=MOST)
        got = "".join([d async for d in stream])
        return got, stream.reply.parsed if stream.reply else None

    got, parsed = anyio.run(main)
    assert got == text and sync.reply is not None
    assert parsed == sync.reply.parsed


def test_aquorum_equals_quorum(smol: Model) -> None:
    prompt = "Review: a pull request that renames a variable."
    sync = quorum(smol, prompt, schema=Verdict, lanes=2, max_tokens=MOST)
    result = anyio.run(lambda: aquorum(smol, prompt, schema=Verdict, lanes=2, max_tokens=MOST))
    assert [getattr(r, "text", None) for r in result.replies] == \
        [getattr(r, "text", None) for r in sync.replies]
    with pytest.raises(InvalidParameter):
        quorum(smol, prompt, schema=Verdict, lane=2)  # type: ignore[call-arg]


def test_a_string_stop_is_one_stop_string(smol: Model) -> None:
    conv = Conversation(smol, stop="END")
    assert conv.stop == ("END",)  # not the letters E, N, D
    assert conv.plan("hi").plan.stop_strings == ("END",)
    assert conv.plan("hi", stop="STOP").plan.stop_strings == ("STOP",)


def test_unknown_options_are_refused_by_name(smol: Model) -> None:
    with pytest.raises(InvalidParameter) as info:
        Conversation(smol).send("hi", max_token=3)  # type: ignore[call-overload]
    assert info.value.name == "max_token"


def test_per_call_sampling_options(smol: Model) -> None:
    conv = Conversation(smol)
    plan = conv.plan("hi", temperature=0.7, seed=3).plan
    assert plan.sampler.params.temperature == 0.7 and plan.sampler.params.seed == 3
    assert plan.sampler is not conv.sampler and conv.sampler.params.temperature == 0.0
    a = conv.send("Name a colour.", temperature=0.9, seed=5, max_tokens=8).text
    b = Conversation(smol).send("Name a colour.", temperature=0.9, seed=5, max_tokens=8).text
    assert a == b
    with pytest.raises(InvalidParameter):
        conv.send("hi", temperature=0.5, sampling=conv.sampling)


def test_logs_say_what_was_chosen_and_what_it_cost(smol: Model,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.DEBUG, logger="chatkit")
    Conversation(smol).send("Judge: snow is white.", schema=Verdict, max_tokens=MOST)
    text = caplog.text
    assert "template: the model's own (GGUF)" in text
    assert "schema grammar" in text and "turn:" in text and "prompt tokens" in text
