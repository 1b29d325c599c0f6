"""Quorum verdict lanes: N lanes of one prompt in one lockstep batch, then a vote.

The lanes differ by seed, temperature or system prompt. Lanes with the same
system prompt share the prompt prefix, which is evaluated once and copied to
the other lanes' KV sequences. Every lane's verdict validates, or the lane
carries its named error; the vote reports ties, failures and dissent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .batch import send_batch
from .conversation import Conversation
from .errors import ChatkitError, InvalidParameter
from .messages import Reply
from .model import Model
from .sampling import SamplingParams
from .schema import SchemaInput

__all__ = ["QuorumResult", "quorum"]


@dataclass
class QuorumResult:
    """The outcome of a quorum: the majority on ``field`` and everything behind it."""

    decision: Any
    """The majority value of ``field``; None when tied or when no lane produced a verdict."""
    votes: dict[Any, int]
    """How many valid lanes voted for each value."""
    verdicts: list[Any]
    """Each lane's parsed verdict, None for a failed lane (lane order)."""
    failures: dict[int, ChatkitError] = field(default_factory=dict)
    """Failed lanes by index, with their named errors (Truncated, SchemaViolation, ...)."""
    tie: bool = False
    """True when two or more values share the top vote."""
    dissent: list[int] = field(default_factory=list)
    """Indexes of valid lanes that voted against the majority."""
    replies: list[Reply | ChatkitError] = field(default_factory=list)
    """The raw per-lane results."""


def quorum(
    model: Model,
    prompt: str,
    *,
    schema: SchemaInput,
    lanes: int = 3,
    field: str = "decision",
    system: str | None = None,
    systems: Sequence[str | None] | None = None,
    temperatures: Sequence[float] | None = None,
    seeds: Sequence[int] | None = None,
    max_tokens: int = 256,
) -> QuorumResult:
    """Run ``lanes`` lanes of ``prompt`` under ``schema`` in one batch and vote on ``field``.

    Lane i uses ``systems[i]`` (default ``system``), ``temperatures[i]``
    (default 0.7) and ``seeds[i]`` (default i + 1). Raises the schema
    refusals before any decode; a lane's own failure is reported, not raised.
    """
    if lanes < 1:
        raise InvalidParameter("lanes", f"must be >= 1, got {lanes}")
    for name, seq in (("systems", systems), ("temperatures", temperatures), ("seeds", seeds)):
        if seq is not None and len(seq) != lanes:
            raise InvalidParameter(name, f"needs {lanes} values, got {len(seq)}")
    convs = [
        Conversation(
            model,
            system=systems[i] if systems is not None else system,
            sampling=SamplingParams(
                temperature=temperatures[i] if temperatures is not None else 0.7,
                top_p=0.95,
                seed=seeds[i] if seeds is not None else i + 1,
            ),
            max_tokens=max_tokens,
        )
        for i in range(lanes)
    ]
    replies = send_batch([(c, prompt) for c in convs], schema=schema, return_exceptions=True)
    return tally(replies, field)


def tally(replies: Sequence[Reply | ChatkitError], field: str) -> QuorumResult:
    """Majority vote on ``field`` of each valid reply's parsed value."""
    verdicts: list[Any] = []
    failures: dict[int, ChatkitError] = {}
    values: dict[int, Any] = {}
    for i, r in enumerate(replies):
        if isinstance(r, ChatkitError):
            failures[i] = r
            verdicts.append(None)
            continue
        verdicts.append(r.parsed)
        values[i] = _field(r.parsed, field)
    votes = Counter(values.values())
    ranked = votes.most_common()
    tie = len(ranked) > 1 and ranked[0][1] == ranked[1][1]
    decision = None if not ranked or tie else ranked[0][0]
    dissent = [i for i, v in values.items() if decision is not None and v != decision]
    return QuorumResult(decision=decision, votes=dict(votes), verdicts=verdicts,
                        failures=failures, tie=tie, dissent=dissent, replies=list(replies))


def _field(parsed: Any, name: str) -> Any:
    if isinstance(parsed, dict):
        if name not in parsed:
            raise InvalidParameter("field", f"the verdict has no field {name!r}")
        return parsed[name]
    if not hasattr(parsed, name):
        raise InvalidParameter("field", f"the verdict has no field {name!r}")
    return getattr(parsed, name)
