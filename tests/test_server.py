"""``chatkit serve`` with real HTTP clients on loopback: the openai SDK, pydantic-ai,
instructor and httpx against a real uvicorn server (in a thread of this process, sharing the
session's SmolLM2), plus one ``chatkit serve`` subprocess for the command itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import anyio
import httpx
import pytest
from pydantic import BaseModel, Field

from chatkit import Model
from chatkit.chat.scheduler import engine_loop
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.helpers import free_port, openai_client, wait_until_serving

openai = pytest.importorskip("openai")

NAME = "smollm2"
KEY = "test-key"


class _Running:
    def __init__(self, server: ChatkitServer) -> None:
        import uvicorn

        self.server = server
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(server.app, host="127.0.0.1", port=self.port,
                                log_level="warning", access_log=False)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)

    def __enter__(self) -> _Running:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.uvicorn.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(smol: Model) -> Iterator[_Running]:
    limits = ServerLimits(max_body_bytes=200_000, max_tokens=512, max_n=4)
    with _Running(ChatkitServer(smol, name=NAME, limits=limits)) as running:
        yield running


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 20}},
                   "required": ["tz"]}}}
# One call to WEATHER or TIME is at most ~200 bytes (20 characters of at most 6 bytes, each a
# \uXXXX escape, and the markup), so a token being at least one byte, one call always fits in
# the fixture's default max_tokens (512); several parallel calls might not: single calls.
# A reply that cannot end before its max_tokens: a JSON string of at least 4000 characters.
ENDLESS = {"type": "json_object", "schema": {"type": "string", "minLength": 4000}}


# ------------------------------------------------------------------ openai SDK
def test_models_and_health(server: _Running, client: Any) -> None:
    assert [m.id for m in client.models.list()] == [NAME]
    health = httpx.get(server.base + "/health").json()
    assert health["status"] == "ok" and health["model"] == NAME


def test_plain_chat(client: Any) -> None:
    r = client.chat.completions.create(model=NAME, temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}])
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_parse_returns_a_validated_instance(client: Any) -> None:
    r = client.beta.chat.completions.parse(
        model=NAME, temperature=0, max_tokens=120, response_format=Person,
        messages=[{"role": "user", "content": "Invent a person."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person)
    assert r.choices[0].finish_reason == "stop"


@pytest.mark.bitwise  # verify chunks against one token at a time, short contexts
def test_speculative_server_answers_as_the_plain_one(smol: Model, client: Any) -> None:
    """``--speculative``: the schema's forced spans are verified in the loop's steps (chunks
    with a row per token), and each reply is the plain server's, streamed or not."""
    requests = [dict(response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": Person.model_json_schema()}}, messages=[
            {"role": "user", "content": "Invent a person."}]),
        dict(tools=[WEATHER], tool_choice="required", messages=[
            {"role": "user", "content": "Weather in Oslo?"}])]
    plain = [client.chat.completions.create(model=NAME, temperature=0, max_tokens=120, **r)
             for r in requests]
    verify_rows: list[int] = []
    decode = smol.decode

    def recording(chunks: Any) -> Any:
        verify_rows.extend(len(c.tokens) for c in chunks if c.logits == "all")
        return decode(chunks)

    limits = ServerLimits(max_tokens=512, speculative=True)
    smol.decode = recording  # type: ignore[method-assign]
    try:
        with _Running(ChatkitServer(smol, name=NAME, limits=limits)) as running, \
                openai_client(running.base, "x") as c:
            spec = [c.chat.completions.create(model=NAME, temperature=0, max_tokens=120, **r)
                    for r in requests]
            streamed = "".join(
                ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                    model=NAME, temperature=0, max_tokens=120, stream=True, **requests[0]))
    finally:
        del smol.decode
    assert verify_rows  # verify chunks ran in the loop's steps (a row per token each)
    assert spec[0].choices[0].message.content == plain[0].choices[0].message.content
    assert streamed == plain[0].choices[0].message.content
    Person.model_validate_json(streamed)
    got, want = spec[1].choices[0].message.tool_calls, plain[1].choices[0].message.tool_calls
    assert got and [(t.function.name, t.function.arguments) for t in got] == [
        (t.function.name, t.function.arguments) for t in want]


@pytest.mark.parametrize("fmt", [
    {"type": "json_object", "schema": Person.model_json_schema()},
    {"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                            "schema": Person.model_json_schema()}},
])
def test_response_format_shapes_are_enforced(client: Any, fmt: dict[str, Any]) -> None:
    r = client.chat.completions.create(model=NAME, temperature=0.9, seed=3, max_tokens=120,
                                       response_format=fmt, messages=[
                                           {"role": "user", "content": "Write a poem."}])
    Person.model_validate_json(r.choices[0].message.content)


def test_json_object_without_schema_is_an_object(client: Any) -> None:
    r = client.chat.completions.create(model=NAME, temperature=0, max_tokens=60,
                                       response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "Say hi."}])
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_bad_schema_is_a_400_naming_the_keyword(client: Any) -> None:
    schema = {"type": "object", "properties": {"tags": {"$ref": "https://example.com/t.json"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "t", "schema": schema}})
    err = info.value.body
    assert err["param"] == "response_format" and err["code"] == "schema_unsupported"
    assert "$ref" in err["message"] and "/properties/tags" in err["message"]


def test_a_keyword_the_grammar_cannot_express_is_enforced(client: Any) -> None:
    """uniqueItems and not: enforced by value checks (a valid reply, or a named failure)."""
    import jsonschema

    schema = {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True,
                 "minItems": 2, "maxItems": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 9, "not": {"const": 0}}},
        "required": ["tags", "n"]}
    out = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "Tags and a number."}],
        max_tokens=60, response_format={"type": "json_schema", "json_schema": {
            "name": "t", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)


def test_invalid_schema_is_a_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "t", "schema": {"type": "nonsense"}}})
    assert info.value.body["code"] == "schema_invalid"


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                  "function": {"name": "get_time"}}])
def test_tool_choice_forces_a_call(client: Any, choice: Any) -> None:
    r = client.chat.completions.create(
        model=NAME, temperature=0, tools=[WEATHER, TIME], tool_choice=choice,
        parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Paris?"}])
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    if isinstance(choice, dict):
        assert call.function.name == "get_time"
    args = json.loads(call.function.arguments)
    assert set(args) <= {"city", "tz"} and args


def test_tool_choice_none_answers_in_text(client: Any) -> None:
    r = client.chat.completions.create(model=NAME, temperature=0, max_tokens=20,
                                       tools=[WEATHER], tool_choice="none",
                                       messages=[{"role": "user", "content": "Weather?"}])
    assert not r.choices[0].message.tool_calls
    assert "<tool_call>" not in (r.choices[0].message.content or "")


def test_tool_result_round_trip(client: Any) -> None:
    first = client.chat.completions.create(
        model=NAME, temperature=0, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Oslo?"}])
    call = first.choices[0].message.tool_calls[0]
    r = client.chat.completions.create(model=NAME, temperature=0, max_tokens=30, tools=[WEATHER],
                                       tool_choice="none", messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}])
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_tools_and_response_format_together(client: Any) -> None:
    r = client.chat.completions.create(
        model=NAME, temperature=0, max_tokens=512, tools=[WEATHER], tool_choice="auto",
        parallel_tool_calls=False, response_format={"type": "json_schema", "json_schema": {
            "name": "p", "schema": Person.model_json_schema()}},
        messages=[{"role": "user", "content": "Invent a person."}])
    c = r.choices[0]
    if c.finish_reason == "tool_calls":
        assert c.message.tool_calls[0].function.name == "get_weather"
    else:
        Person.model_validate_json(c.message.content)


def _stream(client: Any, **kwargs: Any) -> tuple[str, str | None, Any, int]:
    """A streamed chat completion: its text, finish reason, usage, number of content deltas."""
    stream = client.chat.completions.create(model=NAME, stream=True,
                                            stream_options={"include_usage": True}, **kwargs)
    text, finish, usage, deltas = "", None, None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            deltas += bool(c.delta.content)
            finish = c.finish_reason or finish
    return text, finish, usage, deltas


def test_streaming_deltas_and_usage(client: Any) -> None:
    """A reply that cannot end early streams in many deltas, then its finish and usage."""
    text, finish, usage, deltas = _stream(
        client, temperature=0, max_tokens=16, response_format=ENDLESS,
        messages=[{"role": "user", "content": "Count to five."}])
    assert finish == "length" and text.startswith('"') and deltas > 5
    assert usage is not None and usage.completion_tokens == 16


@pytest.mark.bitwise  # the second request reuses the first one's KV (the server's KVPool)
def test_streaming_equals_the_same_request_unstreamed(client: Any) -> None:
    kwargs: dict[str, Any] = dict(temperature=0, max_tokens=16, messages=[
        {"role": "user", "content": "Count to five."}])
    text, finish, usage, _ = _stream(client, **kwargs)
    same = client.chat.completions.create(model=NAME, **kwargs)
    assert text == same.choices[0].message.content
    assert finish == same.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == same.usage.completion_tokens


def test_streaming_tool_calls(client: Any) -> None:
    stream = client.chat.completions.create(
        model=NAME, temperature=0, tools=[WEATHER], tool_choice="required", stream=True,
        parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Rome?"}])
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for tc in c.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
            assert "<tool_call>" not in (c.delta.content or "")
    assert finish == "tool_calls"
    assert calls[0]["name"] == "get_weather" and "city" in json.loads(calls[0]["arguments"])


@pytest.mark.bitwise  # n lanes in lockstep against n=1 requests (reusing their KV)
def test_n_lanes_one_seed_each(client: Any) -> None:
    kwargs: dict[str, Any] = dict(model=NAME, temperature=1.0, seed=7, n=3, max_tokens=10,
                                  messages=[{"role": "user", "content": "Name a colour."}])
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    for i in range(3):  # lane i is seed 7 + i: the same reply as an n=1 request with it
        lane = client.chat.completions.create(**{**kwargs, "n": 1, "seed": 7 + i})
        assert lane.choices[0].message.content == a.choices[i].message.content, i


def test_max_tokens_is_a_200_with_length(client: Any) -> None:
    long = {"type": "object", "properties": {"text": {"type": "string", "minLength": 40}},
            "required": ["text"]}
    r = client.chat.completions.create(model=NAME, temperature=0, max_completion_tokens=3,
                                       response_format={"type": "json_object", "schema": long},
                                       messages=[{"role": "user", "content": "Describe Paris."}])
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_completions_endpoint(client: Any) -> None:
    r = client.completions.create(model=NAME, prompt="The capital of France is", max_tokens=6,
                                  temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 6
    forced = client.completions.create(model=NAME, prompt="Is water wet? Answer:", max_tokens=4,
                                       temperature=0, extra_body={
                                           "structured_outputs": {"choice": [" yes", " no"]}})
    assert forced.choices[0].text in (" yes", " no")


def test_completions_token_ids_and_regex(server: _Running, smol: Model) -> None:
    ids = smol.tokenize("Order number:", special=False)
    r = httpx.post(server.base + "/v1/completions", timeout=60, json={
        "prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
        "structured_outputs": {"regex": " [0-9]{3}"}}).json()
    choice = r["choices"][0]
    assert len(choice["text"]) == 4 and choice["text"][1:].isdigit()
    assert r["prompt_token_ids"] == ids and smol.detokenize(choice["token_ids"]) == choice["text"]


# -------------------------------------------------------------- HTTP errors
def test_errors_have_openai_shape(server: _Running) -> None:
    url = server.base + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "x"}]
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        ({"model": "nope", "messages": msgs}, 404, None),
        ({"model": NAME, "messages": []}, 400, "messages"),
        ({"model": NAME, "messages": msgs, "temperature": 5}, 400, "temperature"),
        ({"model": NAME, "messages": msgs, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": NAME, "messages": msgs, "tool_choice": {"type": "function",
                                                           "function": {"name": "x"}}},
         400, "tool_choice"),
        ({"model": NAME, "messages": msgs, "logit_bias": {"1": 5}}, 400, "logit_bias"),
        ({"model": NAME, "messages": msgs, "n": 9}, 400, "n"),
        ({"model": NAME, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         400, "messages"),
    ]
    for body, status, param in cases:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert err["param"] == param, body
    r = httpx.post(url, content=b"{not json", timeout=30)
    assert r.status_code == 400
    r = httpx.post(url, content=b"x" * 300_000, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_option_refusals_from_planning_are_400s_naming_the_field(server: _Running) -> None:
    """The request parser checks the wire shape; what an option means beside the others
    (stop strings beside a constraint, tool_choice against the tools, the threshold's range)
    is refused where the library refuses it, and answered as a 400 naming the field."""
    msgs = [{"role": "user", "content": "x"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"enum": ["y"]}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}]
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/chat/completions", {"messages": msgs, "stop": "END", "response_format": fmt},
         "stop"),
        ("/v1/chat/completions", {"messages": msgs, "tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {"messages": msgs, "tools": tools,
                                  "tool_call_threshold": 2}, "tool_call_threshold"),
        ("/v1/chat/completions", {"messages": msgs, "tool_call_threshold": 1.5},
         "tool_call_threshold"),
        ("/v1/completions", {"prompt": "x", "stop": "END",
                             "structured_outputs": {"regex": "[ab]"}}, "stop"),
    ]
    for path, body, param in cases:
        r = httpx.post(server.base + path, json={"model": NAME, **body}, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)
    # a threshold without tools has nothing to decide: an agent client sends its model's
    # extra fields on its title requests too (opencode), so it is ignored, not refused
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": msgs, "tool_call_threshold": 0.5, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_context_overflow_is_a_400(server: _Running) -> None:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "max_tokens": 500,
        "messages": [{"role": "user", "content": "word " * 1200}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_requests_find_their_prompt_cached_after_other_prompts() -> None:
    """A finished request's prompt stays in a sequence nobody owns (a cache sequence here):
    four other prompts later, on two leased sequences, the same prompt is all cached."""
    model = Model.load(n_ctx=4096, n_seq_max=2, kv_unified=True, cache_seqs=4)
    try:
        with _Running(ChatkitServer(model, name=NAME)) as running, openai.OpenAI(
                base_url=running.base + "/v1", api_key="unused", max_retries=0) as c:
            def ask(topic: str) -> Any:
                return c.chat.completions.create(model=NAME, max_tokens=4, temperature=0,
                    messages=[{"role": "user", "content": f"Tell me about {topic}. " * 6}])

            first = ask("owls")
            for topic in ("rivers", "bread", "glass", "trains"):
                ask(topic)
            again = ask("owls")
        assert again.usage.prompt_tokens == first.usage.prompt_tokens
        assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1
    finally:
        model.close()


def test_api_key(smol: Model) -> None:
    with _Running(ChatkitServer(smol, name=NAME, api_key=KEY)) as running:
        url = running.base + "/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(running.base + "/health").status_code == 200


def test_full_queue_is_429_with_retry_after(smol: Model) -> None:
    """More requests than sequences plus the queue: the rest are 429. Each admitted reply
    cannot end before 120 tokens (ENDLESS), so the requests, sent together, overlap."""
    srv = ChatkitServer(smol, name=NAME, max_queue=1)
    loop = engine_loop(smol)
    try:
        with _Running(srv) as running:
            body = {"model": NAME, "max_tokens": 120, "temperature": 0,
                    "response_format": ENDLESS,
                    "messages": [{"role": "user", "content": "Write a long story."}]}
            statuses: list[int] = []
            retry: list[str | None] = []

            def go() -> None:
                r = httpx.post(running.base + "/v1/chat/completions", json=body, timeout=120)
                statuses.append(r.status_code)
                retry.append(r.headers.get("retry-after"))

            threads = [threading.Thread(target=go) for _ in range(smol.n_seq_max + 4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert 429 in statuses and 200 in statuses
            assert all(r == "1" for s, r in zip(statuses, retry, strict=True) if s == 429)
    finally:
        loop.max_queue = 256


def test_disconnect_cancels_the_turn(server: _Running, smol: Model) -> None:
    loop = engine_loop(smol)
    loop.stats.__init__()  # type: ignore[misc]
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=60, json={
            "model": NAME, "max_tokens": 400, "temperature": 0, "stream": True,
            "response_format": ENDLESS,  # cannot end early
            "messages": [{"role": "user", "content": "Write a very long story."}]}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 5:
                break
    deadline = time.monotonic() + 10
    while loop.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.running == 0 and loop.stats.steps < 400  # cancelled, not finished
    assert smol.free_seqs() == smol.n_seq_max


def test_a_non_streaming_request_is_cancelled_when_the_client_leaves(
        server: _Running, smol: Model) -> None:
    """The client leaves after 0.5 s; the reply cannot end before 500 tokens (ENDLESS). The
    turn must end then, not run on to max_tokens: counted in decode steps, not seconds."""
    loop = engine_loop(smol)
    loop.stats.__init__()  # type: ignore[misc]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + "/v1/chat/completions", timeout=0.5, json={
            "model": NAME, "max_tokens": 500, "temperature": 0, "response_format": ENDLESS,
            "messages": [{"role": "user", "content": "Write a very long story."}]})
    deadline = time.monotonic() + 30
    while loop.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loop.running == 0
    assert loop.stats.steps < 500  # cancelled, not finished


def test_errors_during_generation_keep_their_name(server: _Running,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import chatkit.chat.turn
    from chatkit import SchemaViolation

    def broken(self: Any, *, record: bool = True) -> Any:
        raise SchemaViolation("x", ["the reader disagreed"])

    monkeypatch.setattr(chatkit.chat.turn.Turn, "complete", broken)
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 500 and r.json()["error"]["code"] == "SchemaViolation"


# ------------------------------------------------------------ other clients
def test_pydantic_ai_agent_with_a_tool_and_output_type(server: _Running) -> None:
    """Every request pydantic-ai makes is served (its tools and output tool, single calls of
    bounded arguments that always fit max_tokens); whether a small model stops calling the
    weather tool is its own business, so the run ends with a Forecast or at the request
    limit, pydantic-ai's named error, never with a failed request."""
    from pydantic_ai import Agent, capture_run_messages
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import UsageLimits

    class Forecast(BaseModel):
        city: str = Field(pattern=r"^[A-Za-z ]{1,20}$")
        summary: Literal["sunny", "rainy", "cloudy"]

    calls: list[str] = []
    http = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
    model = OpenAIChatModel(NAME, provider=OpenAIProvider(openai_client=http))
    agent = Agent(model, output_type=Forecast, model_settings={
        "temperature": 0, "max_tokens": 512, "parallel_tool_calls": False})

    @agent.tool_plain
    def get_weather(city: Annotated[str, Field(pattern=r"^[A-Za-z ]{1,20}$")]) -> str:
        """Current weather for a city."""
        calls.append(city)
        return "sunny"

    async def main() -> Forecast | None:
        async with http:
            try:
                result = await agent.run("What is the weather in Paris? Use the tool.",
                                         usage_limits=UsageLimits(request_limit=4))
            except UsageLimitExceeded:
                return None
        return result.output

    with capture_run_messages() as messages:
        output = anyio.run(main)
    responses = [m for m in messages if isinstance(m, ModelResponse)]
    parts = [p for r in responses for p in r.parts if isinstance(p, ToolCallPart)]
    assert responses and len(parts) == len(responses)  # every reply one valid tool call
    assert all(p.tool_name in ("get_weather", "final_result") for p in parts)
    if output is None:  # the request limit: every reply called the weather tool, which ran
        assert len(responses) == 4 and all(p.tool_name == "get_weather" for p in parts)
        assert len(calls) == len(parts)
    else:
        assert isinstance(output, Forecast) and parts[-1].tool_name == "final_result"


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_modes(client: Any, mode: str) -> None:
    import instructor

    patched = instructor.from_openai(client, mode=getattr(instructor.Mode, mode))
    person = patched.chat.completions.create(
        model=NAME, response_model=Person, temperature=0, max_tokens=256, max_retries=0,
        messages=[{"role": "user", "content": "Invent a person."}])
    assert isinstance(person, Person)


# ------------------------------------------------------------------ the command
def test_chatkit_serve_command(tmp_path: Any) -> None:
    port = free_port()
    env = {**os.environ, "CHATKIT_API_KEY": KEY}
    log = tmp_path / "serve.log"
    out = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "chatkit", "serve", "--port", str(port),
                             "--n-ctx", "2048", "--n-seq-max", "2", "--name", "m"],
                            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_serving(base + "/health", proc, why=log.read_text)
        # one KV pool (prefix copies), each request still held to its sequence's share
        health = httpx.get(base + "/health", timeout=10).json()
        assert health["context_per_sequence"] == 1024 and health["sequences"] == 2
        with openai_client(base, KEY) as c:
            r = c.chat.completions.create(model="m", max_tokens=40, temperature=0,
                                          response_format={"type": "json_object"},
                                          messages=[{"role": "user", "content": "JSON please"}])
            assert r.choices[0].finish_reason in ("stop", "length")
            with pytest.raises(openai.AuthenticationError):
                c.with_options(api_key="wrong").models.list()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        out.close()
