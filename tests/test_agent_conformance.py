"""What coding agents send and expect, served as the real APIs serve it (the conformance list
of docs/serving.md, "Coding agents"): ``max_tokens`` beyond the room left is shrunk, not
refused; image and document blocks on a text model become placeholders; system, ``ctx``
and ``msg`` messages anywhere in ``messages``; ``tool_use_id``s checked as Anthropic
checks them; server tools accepted until named; stop sequences beside tools; a reply cut
inside markup never returns the markup as text; unknown paths answered in the API's
error shape; the stream's first ping; logged names bounded. The real ``anthropic`` and
``openai`` SDKs against a server on loopback (SmolLM2, 1,024 tokens per sequence)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chatkit import Model
from chatkit.serve import anthropic_api
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.helpers import openai_client
from tests.test_server import _Running

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

MODEL = "claude-sonnet-4-6"
T0 = {"temperature": 0}
READ = {"name": "Read", "description": "Read a file",
        "input_schema": {"type": "object", "properties": {
            "file_path": {"type": "string", "maxLength": 40}}, "required": ["file_path"]}}
ASK = [{"role": "user", "content": "Read notes.txt"}]
LONG = {"type": "object", "properties": {"a": {"type": "string", "minLength": 900}},
        "required": ["a"]}
"""An answer that cannot end within the room a long prompt leaves."""


@pytest.fixture(scope="module")
def server(smol: Model) -> Iterator[_Running]:
    with _Running(ChatkitServer(smol, name="smollm2", limits=ServerLimits())) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: _Running) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=server.base, api_key="k", max_retries=0) as c:
        yield c


def _count(client: Any, messages: list[dict[str, Any]], **kw: Any) -> int:
    return int(client.messages.count_tokens(model=MODEL, messages=messages, **kw).input_tokens)


# ------------------------------------------------------------- max_tokens and the context
def test_max_tokens_beyond_the_context_is_served(client: Any, smol: Model) -> None:
    """Claude Code asks for 32k-64k tokens: served, and the reply keeps within the context."""
    with client.messages.stream(model=MODEL, max_tokens=64000, extra_body=T0,
                                messages=[{"role": "user", "content": "Say hi."}]) as s:
        m = s.get_final_message()  # (the SDK streams what may take this long)
    assert m.content and m.stop_reason in ("end_turn", "model_context_window_exceeded")
    assert m.usage.input_tokens + m.usage.output_tokens <= smol.n_ctx_seq


def test_a_reply_that_fills_the_context_says_so(client: Any, smol: Model) -> None:
    """The prompt leaves fewer tokens than asked for and the answer needs more: the reply
    fills the room and stops with ``model_context_window_exceeded``."""
    words = [{"role": "user", "content": "word " * 800}]
    prompt = _count(client, words)
    m = client.messages.create(model=MODEL, max_tokens=500, extra_body=T0, messages=words,
                               output_config={"format": {"type": "json_schema",
                                                         "schema": LONG}})
    assert m.stop_reason == "model_context_window_exceeded"
    assert m.usage.output_tokens == smol.n_ctx_seq - prompt


def test_openai_max_tokens_beyond_the_room_is_length(server: _Running, smol: Model) -> None:
    with openai_client(server.base, "k") as oa:
        r = oa.chat.completions.create(
            model="smollm2", max_tokens=500, temperature=0,
            messages=[{"role": "user", "content": "word " * 800}],
            response_format={"type": "json_schema", "json_schema": {"name": "a",
                                                                    "schema": LONG}})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == smol.n_ctx_seq


# ---------------------------------------------------------------- blocks and roles
def test_images_and_documents_become_placeholders(client: Any) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                               "data": "x"}}
    stand_in = anthropic_api.PLACEHOLDER.format(kind="Image")
    with_image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                               image]}]
    as_text = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                            {"type": "text", "text": stand_in}]}]
    assert _count(client, with_image) == _count(client, as_text)
    m = client.messages.create(model=MODEL, max_tokens=4, extra_body=T0, messages=with_image)
    assert m.content
    # a Read of a PDF: the document inside the tool result, then the session goes on
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read",
           "input": {"file_path": "a.pdf"}}
    session = [*ASK, {"role": "assistant", "content": [use]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                             "content": [document]}]}]
    m = client.messages.create(model=MODEL, max_tokens=4, extra_body=T0, tools=[READ],
                               messages=session)
    assert m.content
    with pytest.raises(anthropic.BadRequestError) as info:  # the whole question: an image
        client.messages.create(model=MODEL, max_tokens=4, messages=[
            {"role": "user", "content": [image]}])
    assert "image" in info.value.body["error"]["message"]


def test_system_ctx_and_msg_messages_anywhere(client: Any) -> None:
    """System text after an assistant turn joins the next user turn; before any turn, the
    system prompt; ``ctx`` folds like system text, ``msg`` is user text."""
    later = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
             {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}]
    joined = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
              {"role": "user", "content": "Why?\n\nBe brief."}]
    assert _count(client, later) == _count(client, joined)
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}]
    assert _count(client, first) == _count(client, [{"role": "user", "content": "Hi."}],
                                           system="Be brief.")
    roles = [{"role": "user", "content": "Hi."}, {"role": "ctx", "content": "cwd: /tmp"},
             {"role": "msg", "content": "From the lead: go on."}]
    m = client.messages.create(model=MODEL, max_tokens=4, extra_body=T0, messages=roles)
    assert m.content


def test_tool_use_ids_are_checked_as_anthropic_checks_them(client: Any) -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a"}}
    stray = [*ASK, {"role": "assistant", "content": [use]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                           "content": "x"}]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=4, tools=[READ], messages=stray)
    assert "unexpected `tool_use_id`" in info.value.body["error"]["message"]
    unanswered = [*ASK, {"role": "assistant", "content": [use]},
                  {"role": "user", "content": "never mind"}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=4, tools=[READ], messages=unanswered)
    assert "without `tool_result`" in info.value.body["error"]["message"]


def test_server_tools_are_refused_only_when_named(client: Any) -> None:
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    m = client.messages.create(model=MODEL, max_tokens=60, extra_body=T0, messages=ASK,
                               tools=[READ, search])
    assert all(b.name == "Read" for b in m.content if b.type == "tool_use")
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=60, messages=ASK, tools=[READ, search],
                               tool_choice={"type": "tool", "name": "web_search"})
    assert "web_search" in info.value.body["error"]["message"]


def test_stop_sequences_beside_tools_end_the_text(client: Any) -> None:
    m = client.messages.create(model=MODEL, max_tokens=60, extra_body=T0, tools=[READ],
                               stop_sequences=["e"], messages=ASK)
    uses = [b for b in m.content if b.type == "tool_use"]
    if m.stop_reason == "stop_sequence":
        assert not uses and "e" not in "".join(b.text for b in m.content if b.type == "text")
    else:  # a call from the first token: stop strings never cut it
        assert m.stop_reason == "tool_use" and uses


# ---------------------------------------------------------------- replies and plumbing
def test_a_reply_cut_inside_markup_never_returns_it_as_text(client: Any,
                                                            server: _Running) -> None:
    for cap in (3, 6, 9):
        m = client.messages.create(model=MODEL, max_tokens=cap, extra_body=T0, tools=[READ],
                                   tool_choice={"type": "any"}, messages=ASK)
        assert m.stop_reason == "max_tokens"
        assert not any(b.type == "text" and "<tool_call" in b.text for b in m.content), m
        r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
            "model": "smollm2", "max_tokens": cap, "temperature": 0, "tool_choice": "required",
            "messages": ASK, "tools": [{"type": "function", "function": {
                "name": "Read", "parameters": READ["input_schema"]}}]})
        message = r.json()["choices"][0]["message"]
        assert "<tool_call" not in (message["content"] or ""), message


def test_unknown_paths_answer_in_the_apis_shape(server: _Running) -> None:
    r = httpx.post(server.base + "/v1/messages/batches", json={},
                   headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 404
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(server.base + "/v1/embeddings", json={})
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = httpx.get(server.base + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_the_stream_pings_after_message_start(server: _Running) -> None:
    body = {"model": MODEL, "max_tokens": 3, "stream": True, "messages": ASK,
            "temperature": 0}
    with httpx.stream("POST", server.base + "/v1/messages", json=body, timeout=60) as r:
        events = [line[7:] for line in r.iter_lines() if line.startswith("event: ")]
    assert events[:2] == ["message_start", "ping"] and events[-1] == "message_stop"


def test_logged_names_from_client_input_are_bounded(client: Any) -> None:
    before = len(anthropic_api._logged)
    for i in range(anthropic_api.MAX_LOGGED + 10):
        anthropic_api.to_chat_body({"model": f"m{i}", "max_tokens": 1, f"field_{i}": 1,
                                    "messages": [{"role": "user", "content": "x"}]})
    assert before <= len(anthropic_api._logged) <= anthropic_api.MAX_LOGGED
    assert json.dumps(anthropic_api.to_chat_body({
        "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "new_field": 2}))


# ---------------------------------------------------------------- Codex CLI's Responses body
def test_codex_cli_request_shapes_translate() -> None:
    """What Codex CLI sends on every request: ``client_metadata``, ``include`` of encrypted
    reasoning, hosted and namespaced tools beside its function tools, and an output that
    no call asked for (its goal notes)."""
    from chatkit.serve.responses_api import to_chat_body

    shell = {"type": "function", "name": "exec_command", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
    chat = to_chat_body({
        "model": "gemma", "stream": True, "store": False, "parallel_tool_calls": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "s",
        "client_metadata": {"turn_id": "t"}, "reasoning": {"summary": "auto"},
        "tools": [shell, {"type": "web_search"}, {"type": "namespace", "name": "agents",
                                                  "tools": []}],
        "tool_choice": "auto",
        "input": [{"type": "message", "role": "user", "content": [
                      {"type": "input_text", "text": "run ls"}]},
                  {"type": "function_call", "name": "exec_command", "call_id": "c1",
                   "arguments": '{"cmd": "ls"}'},
                  {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                  {"type": "function_call_output", "name": "goal_objective",
                   "namespace": "agent", "output": "list files"}]})
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command"]
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool", "user"]
    assert chat["messages"][-1]["content"] == "goal_objective: list files"
    with pytest.raises(Exception, match="include"):
        to_chat_body({"input": "x", "include": ["message.output_text.logprobs"]})
