"""Exact choice probabilities under the grammar (``probabilities=``), ``quorum(method=
"probability")`` and library logprobs (``logprobs=``), on the real models."""

from __future__ import annotations

import json
import math
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from chatkit import Conversation, InvalidParameter, Model, SamplingParams, quorum, send_batch
from chatkit.grammar.choices import enumerable_fields, value_spans


class Triage(BaseModel):
    verdict: Literal["approve", "reject", "escalate"]
    urgent: bool
    severity: int = Field(ge=1, le=4)


PROMPT = "A customer's parcel never arrived and they ask for a refund. Triage it."
# chi-square critical values at alpha = 0.001, by degrees of freedom
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27}


def test_probabilities_sum_to_one_over_each_fields_allowed_values(any_model: Model) -> None:
    reply = Conversation(any_model).send(PROMPT, schema=Triage, probabilities=True,
                                         max_tokens=40)
    assert reply.choices is not None and set(reply.choices) == {"/verdict", "/urgent",
                                                                "/severity"}
    allowed = {"/verdict": {"approve", "reject", "escalate"}, "/urgent": {True, False},
               "/severity": {1, 2, 3, 4}}
    for path, dist in reply.choices.items():
        assert set(dist.probabilities) == allowed[path]
        assert all(p >= 0 for p in dist.probabilities.values())
        assert abs(sum(dist.probabilities.values()) + dist.unaccounted - 1.0) < 1e-6, path
        assert dist.unaccounted < 1e-3
        assert dist.chosen == getattr(reply.parsed, path[1:])
        assert 1 <= dist.forward_passes <= 64  # one pass per expanded branch token


class Decision(BaseModel):
    verdict: Literal["approve", "reject", "escalate"]


def test_probabilities_match_the_frequencies_of_seeded_samples(smol: Model) -> None:
    """200 replies sampled at temperature 1 (no truncation) vote like the exact
    distribution says: a chi-square test at alpha = 0.001."""
    prompt = "Should a shop refund a customer whose order arrived one day late? Decide."
    exact = Conversation(smol).send(prompt, schema=Decision, probabilities=True,
                                    max_tokens=20).choices
    assert exact is not None
    probs = exact["/verdict"].probabilities
    n = 200
    convs = [Conversation(smol, sampling=SamplingParams(temperature=1.0, seed=s))
             for s in range(n)]
    replies = send_batch([(c, prompt) for c in convs], schema=Decision, max_tokens=20)
    counts = {v: 0 for v in probs}
    for r in replies:
        counts[r.parsed.verdict] += 1
    # categories expected fewer than 5 times are pooled (the test's validity condition)
    big = [v for v in probs if n * probs[v] >= 5]
    small = [v for v in probs if v not in big]
    cells = [(counts[v], n * probs[v]) for v in big]
    if small:
        cells.append((sum(counts[v] for v in small), n * sum(probs[v] for v in small)))
    stat = sum((o - e) ** 2 / e for o, e in cells if e > 0)
    assert len(cells) >= 2, (probs, counts)
    assert stat < CHI2_CRITICAL[len(cells) - 1], (probs, counts, stat)


def test_branching_leaves_the_conversation_as_it_was(smol: Model) -> None:
    """The branches run on a scratch KV sequence: the next turn is the same, token for
    token, whether the first computed probabilities or not."""
    def two_turns(probabilities: bool) -> tuple[str, str, object]:
        conv = Conversation(smol)
        first = conv.send(PROMPT, schema=Triage, max_tokens=40, probabilities=probabilities)
        second = conv.send("Now explain the verdict in one sentence.", max_tokens=30)
        return first.text, second.text, first.choices

    with_p, without_p = two_turns(True), two_turns(False)
    assert with_p[:2] == without_p[:2]
    assert with_p[2] is not None and without_p[2] is None


def test_quorum_by_probability_agrees_with_a_large_sampled_quorum(smol: Model) -> None:
    class Answer(BaseModel):
        decision: Literal["yes", "no"]

    prompt = "Is the sky blue on a clear day? Answer yes or no."
    exact = quorum(smol, prompt, schema=Answer, method="probability")
    assert exact.probabilities is not None and exact.margin is not None
    assert abs(sum(exact.probabilities.values()) - 1.0) < 1e-3
    assert exact.margin > 0.3, exact.probabilities  # the held fixture's margin is clear
    sampled = quorum(smol, prompt, schema=Answer, lanes=15)
    assert sampled.decision == exact.decision, (exact.probabilities, sampled.votes)


def test_refusals_are_named(smol: Model) -> None:
    conv = Conversation(smol)
    with pytest.raises(InvalidParameter, match="needs schema="):
        conv.send("Hi", probabilities=True)
    with pytest.raises(InvalidParameter, match="not a field whose values"):
        conv.send(PROMPT, schema=Triage, probabilities=["/nope"], max_tokens=40)
    with pytest.raises(InvalidParameter, match="JSON pointers"):
        conv.send(PROMPT, schema=Triage, probabilities="verdict", max_tokens=40)
    with pytest.raises(InvalidParameter, match="one lane"):
        quorum(smol, PROMPT, schema=Triage, field="verdict", method="probability", lanes=3)
    assert conv.messages == []


def test_enumerable_fields_and_value_spans() -> None:
    doc = {"$defs": {"Color": {"enum": ["red", "green"]}}, "type": "object", "properties": {
        "color": {"$ref": "#/$defs/Color"}, "n": {"type": "integer", "minimum": 0,
                                                  "maximum": 2},
        "big": {"type": "integer", "minimum": 0, "maximum": 1000}, "ok": {"type": "boolean"},
        "inner": {"type": "object", "properties": {"k": {"const": 3}}}}}
    assert enumerable_fields(doc) == {"/color": ["red", "green"], "/n": [0, 1, 2],
                                      "/ok": [True, False], "/inner/k": [3]}
    text = '{"color":"red","inner":{"k":3},"list":[1,"a/b"],"ok":true}'
    spans = value_spans(text.encode())
    for path, want in (("/color", '"red"'), ("/inner/k", "3"), ("/ok", "true"),
                       ("/list/1", '"a/b"'), ("", text)):
        start, end = spans[path]
        assert text[start:end] == want, path
    assert json.loads(text[slice(*spans["/inner"])]) == {"k": 3}


def test_library_logprobs(smol: Model) -> None:
    conv = Conversation(smol)
    reply = conv.send(PROMPT, schema=Triage, logprobs=3, max_tokens=40)
    entries = reply.logprobs
    assert entries is not None and len(entries) == reply.usage.completion_tokens
    assert "".join(smol.detokenize([e.token]) for e in entries) == reply.text
    for e in entries:
        assert e.logprob <= 0 and len(e.top) == min(3, len(e.top)) and e.top
        assert e.top[0][0] == e.token  # greedy: the distribution's most probable token
        assert sum(math.exp(lp) for _, lp in e.top) <= 1 + 1e-6
    assert conv.send("And again, briefly.", max_tokens=5).logprobs is None
    with pytest.raises(InvalidParameter, match="logprobs"):
        conv.send("x", logprobs=-1)
