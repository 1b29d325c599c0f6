"""The OpenAI request translation on its own (no HTTP): what each field becomes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chatkit.errors import EngineBusy, InvalidParameter, RequestError, SchemaUnsupported
from chatkit.serve.openai_api import (
    ServerLimits,
    finish_reason,
    parse_chat,
    parse_completion,
    translate_error,
)
from chatkit.tools.options import check_tool_choice

LIMITS = ServerLimits()
USER = [{"role": "user", "content": "hi"}]


def chat(**body: Any) -> Any:
    return parse_chat({"model": "m", "messages": USER, **body}, LIMITS)


def test_messages_and_the_last_user_turn() -> None:
    req = parse_chat({"messages": [
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]}, LIMITS)
    assert req.text is None  # continue after the tool result
    assert [m.role for m in req.history] == ["system", "user", "assistant", "tool"]
    assert req.history[1].content == "ab" and req.history[2].reasoning == "hmm"
    assert chat().text == "hi"


@pytest.mark.parametrize("body", [
    {"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}])
def test_no_think_switches(body: dict[str, Any]) -> None:
    assert chat(**body).no_think
    assert not chat().no_think


def test_response_formats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert chat(response_format={"type": "text"}).schema is None
    assert chat(response_format={"type": "json_object"}).schema == {"type": "object"}
    # the schema as sent: generation closes open objects (schema.close_objects), the
    # reader checks what the client sent
    assert chat(response_format={"type": "json_object", "schema": schema}).schema == schema
    open_ = {**schema, "additionalProperties": True}
    kept = chat(response_format={"type": "json_schema", "json_schema": {"schema": open_}})
    assert kept.schema["additionalProperties"] is True
    with pytest.raises(RequestError) as info:
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert info.value.param == "response_format.json_schema"


def test_tools_and_choices() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}
    req = chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}},
               parallel_tool_calls=False)
    assert req.tool_choice == "f" and not req.parallel_tool_calls
    assert req.tools[0].name == "f"
    for bad, param in ((["nope"], "tools[0]"), ([tool, tool], "tools")):
        with pytest.raises(RequestError) as info:
            chat(tools=bad)
        assert info.value.param == param
    # "required" with no tools is refused where every tool_choice is checked (planning,
    # options.check_tool_choice), as a 400 naming the field
    assert chat(tool_choice="required").tool_choice == "required"
    with pytest.raises(InvalidParameter) as refused:
        check_tool_choice("required", [])
    err = translate_error(refused.value)
    assert (err.status, err.param) == (400, "tool_choice")


def test_sampling_fields() -> None:
    req = chat(temperature=0.5, top_p=0.9, seed=3, n=2, stop="END", max_completion_tokens=7,
               stream=True, stream_options={"include_usage": True})
    s = req.sampling
    assert (s.temperature, s.top_p, s.seed, s.n, s.stop, s.max_tokens) == (
        0.5, 0.9, 3, 2, ("END",), 7)
    assert s.stream and s.include_usage and s.seed_for(1) == 4
    for key, value in (("temperature", -1), ("top_p", 0), ("n", 0), ("seed", "x"),
                       ("max_tokens", 0), ("stream", "yes"), ("frequency_penalty", 2.5),
                       ("presence_penalty", -3), ("repetition_penalty", 0),
                       ("frequency_penalty", "x")):
        with pytest.raises(RequestError) as info:
            chat(**{key: value})
        assert info.value.param == key


def test_penalties_reach_the_sampler() -> None:
    s = chat(presence_penalty=0.5, frequency_penalty=-1, repetition_penalty=1.3).sampling
    params = s.params(0)
    assert (params.presence_penalty, params.frequency_penalty, params.repeat_penalty) == (
        0.5, -1.0, 1.3)
    assert params.has_penalties and not chat().sampling.params(0).has_penalties


@pytest.mark.parametrize(("body", "code"), [
    (json.loads("[" * 129 + "]" * 129), "body_too_deep"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "invalid_unicode"),
    ({"messages": [{"role": "user", "content": "x", "\udfff": 1}]}, "invalid_unicode"),
])
def test_bodies_a_model_cannot_take_are_named(body: Any, code: str) -> None:
    from chatkit.serve.openai_api import check_body

    with pytest.raises(RequestError) as info:
        check_body(body)
    assert info.value.status == 400 and info.value.code == code
    check_body({"messages": [{"role": "user", "content": "fine \u00e9"}]})


def test_completion_constraints() -> None:
    req = parse_completion({"prompt": [1, 2, 3], "structured_outputs": {"choice": ["a", "b"]}},
                           LIMITS)
    assert req.prompt == [1, 2, 3] and req.grammar == ("lark", 'start: "a" | "b"')
    req = parse_completion({"prompt": "x", "structured_outputs": {"json": '{"type": "integer"}'}},
                           LIMITS)
    assert req.schema == {"type": "integer"}
    with pytest.raises(RequestError):
        parse_completion({"prompt": "x", "structured_outputs": {"regex": "a", "grammar": "b"}},
                         LIMITS)
    with pytest.raises(RequestError):
        parse_completion({"prompt": [1, "a"]}, LIMITS)


def test_errors_and_finish_reasons() -> None:
    err = translate_error(SchemaUnsupported("uniqueItems", "/properties/tags"))
    assert (err.status, err.param, err.code) == (400, "response_format", "schema_unsupported")
    assert "uniqueItems" in err.message and "/properties/tags" in err.message
    busy = translate_error(EngineBusy("full", queued=3, max_queue=3))
    assert busy.status == 429 and busy.headers == {"Retry-After": "1"}
    assert translate_error(RuntimeError("x")).status == 500
    assert [finish_reason(r) for r in ("stop", "length", "constraint_complete", "tool_calls")] \
        == ["stop", "length", "stop", "tool_calls"]
