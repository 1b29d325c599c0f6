"""``chatkit serve`` under hostile and unusual request bodies: every client-caused failure is a
4xx naming the problem, never a 5xx, and the server stays healthy; sampling penalties reach
the sampler. A real uvicorn server on loopback (tests/test_server.py's harness)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatkit import Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.test_server import _Running

NAME = "smollm2"


@pytest.fixture(scope="module")
def base(smol: Model) -> Iterator[str]:
    limits = ServerLimits(max_body_bytes=200_000, max_tokens=512, max_n=4)
    with _Running(ChatkitServer(smol, name=NAME, limits=limits)) as running:
        yield running.base


def post(base: str, path: str, content: bytes | str) -> httpx.Response:
    data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    return httpx.post(base + path, content=data, timeout=120,
                      headers={"content-type": "application/json"})


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            **extra}


@pytest.mark.parametrize(("name", "raw", "code"), [
    ("100,000 levels deep", "[" * 100_000 + "]" * 100_000, "body_too_deep"),
    ("129 levels deep", json.dumps(chat_body(metadata=json.loads("[" * 129 + "]" * 129))),
     "body_too_deep"),
    ("a lone surrogate", json.dumps(chat_body()).replace('"Hi"', '"Hi \\ud800"'),
     "invalid_unicode"),
])
def test_bodies_are_refused_by_name(base: str, name: str, raw: str, code: str) -> None:
    r = post(base, "/v1/chat/completions", raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code
    assert httpx.get(base + "/health").status_code == 200


def test_a_grammar_that_fails_at_its_first_token_is_a_400(base: str) -> None:
    """It compiles, then llguidance gives up building the first mask: the request's fault,
    refused before the 200 (it was a 500 after it)."""
    body = {"model": NAME, "prompt": "x", "max_tokens": 4,
            "structured_outputs": {"regex": "(.{1,1000}){1,1000}"}}
    r = post(base, "/v1/completions", json.dumps(body))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "grammar_invalid"
    stream = post(base, "/v1/completions", json.dumps({**body, "stream": True}))
    assert stream.status_code == 400


def test_penalties_change_what_is_written(base: str) -> None:
    prompt = "cat cat cat cat cat cat cat cat cat cat cat cat"
    texts = []
    for penalty in (0.0, 2.0):
        body = {"model": NAME, "prompt": prompt, "max_tokens": 16, "temperature": 0,
                "frequency_penalty": penalty}
        r = post(base, "/v1/completions", json.dumps(body))
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    assert texts[0] != texts[1]  # the repeated token costs 2 logits per use: it gives way


# Generated bodies: any JSON (deep, wide, odd types) in the fields a client sends.
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
_FIELDS = ["messages", "model", "temperature", "top_p", "n", "stop", "seed", "tools",
           "tool_choice", "response_format", "max_tokens", "max_completion_tokens", "stream",
           "frequency_penalty", "presence_penalty", "logprobs", "parallel_tool_calls",
           "stream_options", "reasoning_effort", "chat_template_kwargs", "user"]
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant",
                                                           "tool", "x"]) | _json,
                                  "content": st.text(max_size=30) | _json})
_body = st.one_of(
    _json,
    st.dictionaries(st.sampled_from(_FIELDS), _json, max_size=6),
    st.fixed_dictionaries({"model": st.just(NAME), "messages": st.lists(_message, max_size=3)},
                          optional={k: _json for k in _FIELDS[2:]}),
)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=_body)
def test_no_generated_body_gets_a_5xx(base: str, body: Any) -> None:
    if isinstance(body, dict) and not {"max_tokens", "max_completion_tokens"} & set(body):
        body = {**body, "max_tokens": 2}  # a valid body answers quickly
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = post(base, path, json.dumps(body))
        assert r.status_code < 500, (path, body, r.text)


def test_contexts_are_reported_and_errors_name_their_numbers(smol: Model) -> None:
    limits = ServerLimits(max_tokens=512, context_source="--ctx-per-seq 1024 for each of 4")
    with _Running(ChatkitServer(smol, name=NAME, limits=limits)) as running:
        base = running.base
        health = httpx.get(base + "/health").json()
        assert health["context_per_sequence"] == smol.n_ctx_seq
        assert httpx.get(base + "/v1/models").json()["data"][0]["max_model_len"] == \
            smol.n_ctx_seq
        long = {"model": NAME, "messages": [{"role": "user", "content": "word " * 1500}]}
        r = post(base, "/v1/chat/completions", json.dumps(long))
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        message = r.json()["error"]["message"]
        assert "does not fit one sequence's context" in message
        assert "max_tokens" not in message  # the request set none
        assert "--ctx-per-seq 1024" in message
        short = {"model": NAME, "messages": [{"role": "user", "content": "word " * 700}],
                 "max_tokens": 500}  # more than the prompt leaves: served within the context
        r = post(base, "/v1/chat/completions", json.dumps(short))
        usage = r.json()["usage"]
        assert r.status_code == 200
        assert usage["prompt_tokens"] + usage["completion_tokens"] <= smol.n_ctx_seq


# Anthropic's Messages API: the same, in its own fields and block types.
_A_FIELDS = ["messages", "model", "system", "max_tokens", "stop_sequences", "temperature",
             "top_p", "top_k", "stream", "tools", "tool_choice", "thinking", "output_config",
             "output_format", "metadata", "context_management"]
_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image",
                              "redacted_thinking", "tool_reference", "document", "x"]) | _json},
    optional={"text": st.text(max_size=20) | _json, "id": _json, "name": _json,
              "input": _json, "tool_use_id": _json, "content": _json, "is_error": _json,
              "thinking": _json, "tool_name": _json})
_a_message = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system", "x"]) | _json,
    "content": st.text(max_size=30) | st.lists(_block, max_size=3) | _json})
_a_body = st.one_of(
    _json,
    st.dictionaries(st.sampled_from(_A_FIELDS), _json, max_size=6),
    st.fixed_dictionaries({"model": st.just("claude-x"), "messages": st.lists(_a_message,
                                                                              max_size=3)},
                          optional={k: _json for k in _A_FIELDS[2:]}),
    # a valid conversation with 1-3 odd fields, so that those fields are what is read
    st.dictionaries(st.sampled_from([k for k in _A_FIELDS[2:] if k != "max_tokens"]), _json,
                    min_size=1, max_size=3).map(lambda odd: {
                        "model": "claude-x", "max_tokens": 2,
                        "messages": [{"role": "user", "content": "Hi"}], **odd}),
)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=_a_body)
def test_no_generated_messages_body_gets_a_5xx(base: str, body: Any) -> None:
    if isinstance(body, dict) and "max_tokens" not in body:
        body = {**body, "max_tokens": 2}  # a valid body answers quickly
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = post(base, path, json.dumps(body))
        assert r.status_code < 500, (path, body, r.text)
        if r.status_code >= 400:
            assert r.json()["type"] == "error", r.text  # Anthropic's envelope


# Grammars past llguidance's limits (a lexer that blows up after the first token, a parser
# item explosion): the request's fault whenever it shows, never a 5xx.
REGEX_BOMB = "(a|aa)*" * 50 + "b{1000}{1000}"
GRAMMAR_BOMB = 'start: "a"{1000000}'
BOMBS = [
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"regex": REGEX_BOMB}}),
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"grammar": GRAMMAR_BOMB}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                              "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "x", "schema": {"type": "string",
                                                          "pattern": REGEX_BOMB}}}}),
]


@pytest.mark.parametrize(("path", "body"), BOMBS)
def test_grammar_bombs_are_the_requests_fault(base: str, path: str, body: dict[str, Any]) -> None:
    for seed in range(8):
        for stream in (False, True):
            full = {"model": NAME, "max_tokens": 8, "temperature": 1.0, "seed": seed,
                    "stream": stream, **body}
            r = post(base, path, json.dumps(full))
            assert r.status_code in (200, 400), (seed, stream, r.text[:300])
            if r.status_code == 400:
                assert r.json()["error"]["type"] == "invalid_request_error"
            elif stream:  # failed after the 200: an error event, then the end
                events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]"
                last = json.loads(events[-2])
                assert "error" not in last or last["error"]["type"] == "invalid_request_error"


def test_json_object_numbers_are_bounded(base: str) -> None:
    from tests.test_untyped import ASK, numbers

    body = {"model": NAME, "temperature": 0, "max_tokens": 160,
            "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": ASK}]}
    r = post(base, "/v1/chat/completions", json.dumps(body))
    text = r.json()["choices"][0]["message"]["content"]
    assert all(abs(n) < 10**15 for n in numbers(json.loads(text))), text
