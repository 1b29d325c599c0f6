"""The README tour as a user writes it: checked by ``mypy --strict`` (tests/test_api.py).

Never run; only type-checked. ``assert_type`` fails the check when chatkit's annotations
stop giving users the precise types (e.g. ``Reply.parsed`` typed ``Any``).
"""

from __future__ import annotations

from typing import Any, Literal, assert_type

from pydantic import BaseModel, Field

from chatkit import (
    ChatkitError,
    Constraint,
    Conversation,
    Model,
    ModelRetry,
    QuorumResult,
    RemoteEngine,
    Reply,
    SamplingParams,
    Tool,
    ToolCall,
    Usage,
    aquorum,
    quorum,
    send_batch,
    tool,
)


class Verdict(BaseModel):
    decision: Literal["approve", "reject", "abstain"]
    confidence: float = Field(ge=0, le=1)
    reasons: list[str] = Field(max_length=3)


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    if not city:
        raise ModelRetry("name a city")
    return f"22 C in {city}"


def sync_tour() -> None:
    model = Model.load()
    conv = Conversation(model, system="You review claims.",
                        sampling=SamplingParams(temperature=0.0, seed=1))
    hello = conv.send("Hello!")
    assert_type(hello, Reply[Any])
    usage: Usage = hello.usage
    print(usage.prompt_tokens, hello.finish_reason)

    reply = conv.send("Judge: the sky is green.", schema=Verdict, max_tokens=120)
    assert_type(reply, Reply[Verdict])
    v = reply.parsed
    assert_type(v, Verdict)
    print(v.decision, v.confidence + 1.0)

    as_dict = conv.send("Again, as JSON.", schema={"type": "object"})
    assert_type(as_dict, Reply[Any])

    digits = conv.send("A number.", constraint=Constraint.regex(r"\d+"))
    print(digits.text)

    s = conv.stream("Tell me more.", schema=Verdict)
    for delta in s:
        print(delta, end="")
    if s.reply is not None:
        assert_type(s.reply.parsed, Verdict)

    weather = conv.send("Weather in Paris?", tools=[get_weather], tool_choice="auto")
    calls: list[ToolCall] = weather.tool_calls
    for call in calls:
        conv.add_tool_result(call, "22 C")
    after = conv.resume(schema=Verdict)
    assert_type(after.parsed, Verdict)

    answer = conv.run("Plan my trip", tools=[get_weather], schema=Verdict, max_steps=4)
    assert_type(answer.parsed, Verdict)
    tools: list[Tool] = [Tool.from_schema("lookup", {"type": "object", "properties": {}})]
    print(len(tools))

    conv_b = Conversation(model, messages=conv.to_openai())
    replies = send_batch([(conv, "Judge: A."), (conv_b, "Judge: B.")], schema=Verdict,
                         max_tokens=120, return_exceptions=True)
    for r in replies:
        if isinstance(r, ChatkitError):
            print(type(r).__name__)
        else:
            print(r.text)
    result = quorum(model, "Review: ...", schema=Verdict, lanes=5, system="You review code.")
    assert_type(result, QuorumResult)
    print(result.decision, result.votes, result.tie, result.dissent, result.failures)


async def async_tour(model: Model) -> None:
    conv = Conversation(model)
    reply = await conv.asend("Judge: snow is white.", schema=Verdict)
    assert_type(reply.parsed, Verdict)
    stream = conv.astream("Thanks!")
    async for delta in stream:
        print(delta, end="")
    if stream.reply is not None:
        print(stream.reply.usage.total_seconds)
    answer = await conv.arun("Weather?", tools=[get_weather], schema=Verdict)
    assert_type(answer.parsed, Verdict)
    result = await aquorum(model, "Review: ...", schema=Verdict, lanes=3)
    assert_type(result, QuorumResult)


def remote_tour() -> None:
    engine = RemoteEngine("http://127.0.0.1:8000", kind="vllm", model="smollm2",
                          vocab=Model.load_vocab())
    conv = Conversation(engine, system="You review claims.")
    reply = conv.send("Judge: the sky is green.", schema=Verdict)
    assert_type(reply.parsed, Verdict)
    result = quorum(engine, "Review: ...", schema=Verdict, lanes=3)
    assert_type(result, QuorumResult)
