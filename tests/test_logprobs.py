"""Log-probabilities from ``chatkit serve``: the probabilities of the tokens actually chosen,
from the distribution they were chosen from (after the grammar's mask), on chat and
completions, streamed too. Real HTTP on loopback over the session's SmolLM2."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from chatkit import Model
from chatkit.serve.openai_api import ServerLimits
from chatkit.serve.server import ChatkitServer
from tests.test_server import _Running

NAME = "smollm2"


@pytest.fixture(scope="module")
def base(smol: Model) -> Iterator[str]:
    with _Running(ChatkitServer(smol, name=NAME, limits=ServerLimits(max_tokens=256))) as r:
        yield r.base


def post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(base + path, json={"model": NAME, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_greedy_tokens_are_their_distributions_most_probable(base: str) -> None:
    out = post(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0, "logprobs": True, "top_logprobs": 5})
    entries = out["choices"][0]["logprobs"]["content"]
    assert len(entries) == out["usage"]["completion_tokens"] > 0
    text = out["choices"][0]["message"]["content"]
    assert "".join(e["token"] for e in entries) == text
    for e in entries:
        top = e["top_logprobs"]
        assert len(top) == 5 and e["logprob"] <= 0
        assert top[0]["token"] == e["token"] and top[0]["logprob"] == e["logprob"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"]


def test_under_a_grammar_the_distribution_is_over_what_it_allows(base: str) -> None:
    """The mask is applied first: the alternatives are only tokens the grammar allows, and
    their probabilities sum to 1 (every allowed first token is among the top 20 here)."""
    out = post(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Is water wet?"}], "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
            "enum": ["yes", "no"]}}},
        "logprobs": True, "top_logprobs": 20})
    entries = out["choices"][0]["logprobs"]["content"]
    first = [t for t in entries[0]["top_logprobs"] if t["logprob"] > -math.inf]
    assert all('"yes"'.startswith(t["token"]) or '"no"'.startswith(t["token"])
               for t in first), first
    assert abs(sum(math.exp(t["logprob"]) for t in first) - 1.0) < 1e-4
    assert json.loads(out["choices"][0]["message"]["content"]) in ("yes", "no")


def test_sampled_tokens_carry_their_own_probability(base: str) -> None:
    out = post(base, "/v1/completions", {
        "prompt": "The colours of the rainbow are", "max_tokens": 12, "temperature": 1.0,
        "seed": 3, "logprobs": 5})
    lp = out["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                 strict=True):
        assert 0 < math.exp(value) <= 1
        if token in top:  # the same number wherever the token is listed
            assert top[token] == value
        assert all(v <= max(top.values()) for v in top.values())


def test_streamed_logprobs_cover_every_token(base: str) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "Count to five."}],
            "max_tokens": 12, "temperature": 0, "logprobs": True, "stream": True,
            "stream_options": {"include_usage": True}}
    tokens, text, usage = [], "", None
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk["choices"]:
                text += c["delta"].get("content") or ""
                tokens += (c.get("logprobs") or {}).get("content") or []
    assert usage is not None and len(tokens) == usage["completion_tokens"]
    assert "".join(t["token"] for t in tokens) == text


def test_refused_where_they_would_mean_markup(base: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {}}}}
    r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": [{"role": "user", "content": "x"}], "tools": [tool],
        "logprobs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
        "model": NAME, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"
