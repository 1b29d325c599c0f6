"""Streamed tool calls in every dialect: each call's id and name as soon as they are
written, its arguments in pieces, and the pieces add up to the parsed reply's calls.

``ReplyDeltas`` (what ``chatkit serve`` streams for a reply with tools) is fed each
dialect's own text of a turn one character at a time, as a model writes it; the deltas are
reassembled as the openai SDK does (by ``index``: the id and name from the first delta, the
arguments concatenated). No model: the text is the dialect's rendering.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import pytest
from pydantic import Field

from chatkit.messages import Reply, ToolCall, Usage
from chatkit.serve.stream_deltas import ReplyDeltas
from chatkit.tools.definition import check_tools, tool
from chatkit.tools.dialects import DIALECTS, Dialect, render_calls
from chatkit.tools.parser import parse_calls
from tests.helpers import ATEM_REASONING, TEXT_LEADS


@tool
def get_weather(city: str, days: Annotated[int, Field(ge=1, le=9)] = 1) -> str:
    """Weather for a city."""
    return city


TOOLS = check_tools([get_weather])
CALLS = (ToolCall(id="abcDEF123", name="get_weather", arguments={"city": "Oslo", "days": 2}),
         ToolCall(id="xyzXYZ789", name="get_weather", arguments={"city": "Rome", "days": 3}))
STREAMED_ARGS = {"json", "xml", "python", "gemma"}
"""Argument encodings streamed in pieces (every one)."""


def _reassemble(parts: list[dict[str, Any]]) -> tuple[dict[int, dict[str, Any]], dict[int, int]]:
    calls: dict[int, dict[str, Any]] = {}
    pieces: dict[int, int] = {}
    for part in parts:
        for tc in part.get("tool_calls", []):
            k = tc["index"]
            if k not in calls:
                assert tc.get("id") and tc["function"]["name"], tc  # id + name first
                calls[k] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
                pieces[k] = 0
            else:
                assert "id" not in tc or tc["id"] == calls[k]["id"]  # the id never changes
            if tc["function"].get("arguments"):
                calls[k]["arguments"] += tc["function"]["arguments"]
                pieces[k] += 1
    return calls, pieces


def _stream(d: Dialect, text: str) -> tuple[list[dict[str, Any]], int]:
    deltas = ReplyDeltas(thinking=False, tools=True, dialect=d, tool_list=tuple(TOOLS))
    parts: list[dict[str, Any]] = []
    announced_at = -1
    for i, ch in enumerate(text):
        parts += deltas.feed(ch)
        if announced_at < 0 and any(p.get("tool_calls") for p in parts):
            announced_at = i
    content, calls = parse_calls(text, TOOLS, d)
    reply: Reply[Any] = Reply(text=content, finish_reason="tool_calls", parsed=None,
                              usage=Usage(0, 0, 0, 0.0, 0.0),
                              tool_calls=calls)
    return parts + deltas.finish(reply), announced_at


@pytest.mark.parametrize("name", sorted(n for n in DIALECTS if n != "lfm2-content"))
def test_calls_stream_as_they_are_written(name: str) -> None:
    d = DIALECTS[name]
    d = dataclasses.replace(d, json_separators=(", ", ": "))
    calls = CALLS if d.max_calls is None else CALLS[:1]
    text = render_calls(d, calls)
    parts, announced_at = _stream(d, text)
    got, pieces = _reassemble(parts)
    assert [c["name"] for c in got.values()] == [c.name for c in calls]
    assert [json.loads(c["arguments"]) for c in got.values()] == [c.arguments for c in calls]
    # the first call is announced before its text ends (not only once the reply is done)
    assert 0 <= announced_at < len(render_calls(d, calls[:1])) - 1, name
    if d.args.kind in STREAMED_ARGS:
        assert pieces[0] >= 2, (name, parts)  # two arguments: at least two pieces


def test_text_before_calls_streams_as_content_then_calls() -> None:
    d = dataclasses.replace(DIALECTS["hermes"], text_before=True,
                            json_separators=(", ", ": "))
    text = "Let me check.\n" + render_calls(d, CALLS[:1])
    parts, _ = _stream(d, text)
    content = "".join(p.get("content", "") for p in parts)
    assert content.strip() == "Let me check."
    got, _ = _reassemble(parts)
    assert json.loads(got[0]["arguments"]) == CALLS[0].arguments


def test_a_think_block_before_calls_streams_as_reasoning() -> None:
    d = dataclasses.replace(DIALECTS["hermes"], reasoning=("<think>\n", "\n</think>\n\n"))
    deltas = ReplyDeltas(thinking=False, tools=True, dialect=d, tool_list=tuple(TOOLS),
                         think_open="<think>\n", think_close="\n</think>\n\n")
    text = "<think>\nOslo, two days.\n</think>\n\n" + render_calls(d, CALLS[:1])
    parts = [p for ch in text for p in deltas.feed(ch)]
    assert "".join(p.get("reasoning_content", "") for p in parts).strip() == "Oslo, two days."
    assert not "".join(p.get("content", "") for p in parts).strip()
    assert _reassemble(parts)[0][0]["name"] == "get_weather"


def test_a_hermes_call_after_layout_streams_its_arguments() -> None:
    """The grammar lets a forced call open after a line break: it still streams in pieces."""
    d = DIALECTS["hermes"]
    parts, announced_at = _stream(d, "\n" + render_calls(d, CALLS[:1]))
    got, pieces = _reassemble(parts)
    assert 0 <= announced_at < len(render_calls(d, CALLS[:1])) - 1 and pieces[0] >= 2
    assert json.loads(got[0]["arguments"]) == CALLS[0].arguments


def test_a_think_close_written_twice_is_not_content() -> None:
    """Where a think budget runs out the close is optional, and a model may write it again
    after the block's own: neither the stream nor the parser takes it as content."""
    from chatkit.tools.parser import split_reasoning

    close = "<|end|><|start|>assistant"
    d = dataclasses.replace(DIALECTS["harmony"], reasoning=("<|channel|>analysis<|message|>",
                                                            close))
    call = render_calls(d, CALLS[:1])
    text = "<|channel|>analysis<|message|>Rome." + close + close + call
    deltas = ReplyDeltas(thinking=False, tools=True, dialect=d, tool_list=tuple(TOOLS),
                         think_open=d.reasoning[0], think_close=close)
    parts = [p for ch in text for p in deltas.feed(ch)]
    assert not "".join(p.get("content", "") for p in parts).strip()
    assert _reassemble(parts)[0][0]["name"] == "get_weather"
    assert split_reasoning(text, d, opened=False) == ("Rome.", call)


@pytest.mark.parametrize("body", ["text", "calls"])
def test_atem_streams_by_recipient(body: str) -> None:
    """Muse Glimmer's ATEM names each message's recipient: ' to=self' reasoning, ' to=user'
    text, ' to=NAME' a call. Text is never announced as a call (both open ' to=')."""
    from chatkit.tools.parser import split_reasoning

    think = ATEM_REASONING
    d = dataclasses.replace(DIALECTS["atem"], reasoning=think, json_separators=(", ", ": "))
    rest = " to=user<|message|>Hello." if body == "text" else render_calls(d, CALLS)
    text = think[0] + "Oslo." + think[1] + rest
    deltas = ReplyDeltas(thinking=False, tools=True, dialect=d, tool_list=tuple(TOOLS),
                         think_open=think[0], think_close=think[1])
    streamed = [p for ch in text for p in deltas.feed(ch)]
    assert split_reasoning(text, d, opened=False) == ("Oslo.", rest)
    said, calls = parse_calls(rest, TOOLS, d)
    parts = streamed + deltas.finish(Reply(text=said, finish_reason="stop", parsed=None,
                                           reasoning="Oslo.",
                                           usage=Usage(0, 0, 0, 0.0, 0.0), tool_calls=calls))
    assert "".join(p.get("reasoning_content", "") for p in parts) == "Oslo."
    content = "".join(p.get("content", "") for p in parts)
    got, _ = _reassemble(parts)
    if body == "text":
        assert content == "Hello." and not got
        assert "".join(p.get("content", "") for p in streamed) == "Hello."  # as written
        assert parse_calls(rest, TOOLS, d) == ("Hello.", [])
    else:
        assert not content.strip()
        assert [json.loads(c["arguments"]) for c in got.values()] == \
            [c.arguments for c in CALLS]


def test_a_text_wrapper_close_never_streams_as_content() -> None:
    """Command R7B's text is wrapped: its closing marker is not content."""
    d = DIALECTS["command-r7b"]
    parts, _ = _stream(d, "<|START_RESPONSE|>Hello there<|END_RESPONSE|>")
    assert "".join(p.get("content", "") for p in parts) == "Hello there"


LEADS = TEXT_LEADS


@pytest.mark.parametrize("name", sorted(LEADS))
def test_text_in_its_lead_markup_streams_as_content_then_calls(name: str) -> None:
    d = dataclasses.replace(DIALECTS[name], text_lead=LEADS[name],
                            json_separators=(", ", ": "))
    open_, close = LEADS[name]
    calls = render_calls(d, CALLS[:1])
    section = d.section[0] if d.section else ""
    text = open_ + "Let me check." + close + calls[len(section):]
    parts, _ = _stream(d, text)
    assert "".join(p.get("content", "") for p in parts) == "Let me check."
    got, pieces = _reassemble(parts)
    assert json.loads(got[0]["arguments"]) == CALLS[0].arguments and pieces[0] >= 2
    plain = open_ + "Just text." if open_ == d.text_open else "Just text."
    parts, _ = _stream(d, plain)  # no calls: all of it content, the markup none of it
    assert "".join(p.get("content", "") for p in parts) == "Just text."
    assert not _reassemble(parts)[0]
