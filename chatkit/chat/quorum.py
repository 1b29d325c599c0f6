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
from typing import Any, Literal, TypedDict, Unpack

from ..decode.sampling import SamplingParams
from ..engine.protocols import Engine
from ..errors import ChatkitError, InvalidParameter
from ..grammar.schema import SchemaInput
from ..messages import JSON, Reply
from .batch import asend_batch, send_batch
from .conversation import Conversation

__all__ = ["QuorumOptions", "QuorumResult", "aquorum", "quorum"]


@dataclass
class QuorumResult:
    """The outcome of a quorum: the majority on ``field`` and everything behind it."""

    decision: JSON
    """The majority value of ``field``; None when tied or when no lane produced a verdict."""
    votes: dict[JSON, int]
    """How many valid lanes voted for each value."""
    verdicts: list[JSON]
    """Each lane's parsed verdict, None for a failed lane (lane order)."""
    failures: dict[int, ChatkitError] = field(default_factory=dict)
    """Failed lanes by index, with their named errors (Truncated, SchemaViolation, ...)."""
    tie: bool = False
    """True when two or more values share the top vote."""
    dissent: list[int] = field(default_factory=list)
    """Indexes of valid lanes that voted against the majority."""
    replies: list[Reply[JSON] | ChatkitError] = field(default_factory=list)
    """The raw per-lane results."""
    probabilities: dict[JSON, float] | None = None
    """``method="probability"``: each value's exact probability (``votes`` is then empty)."""
    margin: float | None = None
    """``method="probability"``: the decision's probability minus the runner-up's."""


class QuorumOptions(TypedDict, total=False):
    """How the lanes of ``quorum``/``aquorum`` differ and what they vote on."""

    lanes: int
    """How many lanes (default 3)."""
    field: str
    """The field of the verdict to vote on (default ``decision``)."""
    system: str | None
    """The system prompt of every lane."""
    systems: Sequence[str | None] | None
    """Per-lane system prompts (overrides ``system``)."""
    temperatures: Sequence[float] | None
    """Per-lane temperatures (default 0.7 each)."""
    seeds: Sequence[int] | None
    """Per-lane seeds (default lane index + 1)."""
    max_tokens: int
    """Reply token limit per lane (default 256)."""
    method: Literal["vote", "probability"]
    """``vote`` (default): the lanes sample and vote. ``probability``: one greedy lane, and
    the exact distribution of ``field``'s values under the grammar (at ``temperatures[0]``,
    default 1; :mod:`chatkit.grammar.choices`); the decision is the most probable value. The field
    must be one whose values the schema enumerates; its distribution is conditioned on the
    reply before it (put the decision first)."""


def quorum(model: Engine, prompt: str, *, schema: SchemaInput,
           **options: Unpack[QuorumOptions]) -> QuorumResult:
    """Run the lanes of ``prompt`` under ``schema`` in one batch and vote on ``field``.

    Raises the schema refusals before any decode; a lane's own failure is reported,
    not raised. Lanes with one system prompt evaluate the prompt prefix once.
    """
    if options.get("method", "vote") == "probability":
        conv, path = _probability_lane(model, options)
        return _by_probability(send_batch([(conv, prompt)], schema=schema, probabilities=[path],
                                          return_exceptions=True)[0], path)
    convs = _lanes(model, options)
    replies = send_batch([(c, prompt) for c in convs], schema=schema, return_exceptions=True)
    return tally(replies, options.get("field", "decision"))


def _probability_lane(model: Engine, options: QuorumOptions) -> tuple[Conversation, str]:
    _check_names(options)
    if options.get("lanes", 1) != 1 or options.get("seeds") or options.get("systems"):
        raise InvalidParameter("lanes", "method='probability' runs one lane (the exact "
                               "distribution needs no samples)")
    temperatures = options.get("temperatures") or [0.0]
    if len(temperatures) != 1 or temperatures[0] < 0:
        raise InvalidParameter("temperatures", "method='probability' takes one temperature "
                               "(the distribution's; default 1 with a greedy reply)")
    conv = Conversation(model, system=options.get("system"),
                        sampling=SamplingParams(temperature=temperatures[0], seed=1),
                        max_tokens=options.get("max_tokens", 256))
    return conv, "/" + options.get("field", "decision")


def _check_names(options: QuorumOptions) -> None:
    unknown = set(options) - set(QuorumOptions.__annotations__)
    if unknown:
        raise InvalidParameter(sorted(unknown)[0], "unknown quorum option")
    if options.get("method", "vote") not in ("vote", "probability"):
        raise InvalidParameter("method", f"'vote' or 'probability', not {options['method']!r}")


def _by_probability(reply: Reply[Any] | ChatkitError, path: str) -> QuorumResult:
    """The lane's exact distribution of the field as a QuorumResult (its error as a failed
    lane's)."""
    if isinstance(reply, ChatkitError):
        return tally([reply], path[1:])
    dist = (reply.choices or {})[path]
    return QuorumResult(decision=dist.decision, votes={}, verdicts=[reply.parsed],
                        replies=[reply], probabilities=dict(dist.probabilities),
                        margin=dist.margin, tie=dist.margin == 0.0)


async def aquorum(model: Engine, prompt: str, *, schema: SchemaInput,
                  **options: Unpack[QuorumOptions]) -> QuorumResult:
    """``quorum`` for async code (the batch runs in a worker thread)."""
    if options.get("method", "vote") == "probability":
        conv, path = _probability_lane(model, options)
        return _by_probability((await asend_batch([(conv, prompt)], schema=schema,
                                                  probabilities=[path],
                                                  return_exceptions=True))[0], path)
    convs = _lanes(model, options)
    replies = await asend_batch([(c, prompt) for c in convs], schema=schema,
                                return_exceptions=True)
    return tally(replies, options.get("field", "decision"))


def _lanes(model: Engine, options: QuorumOptions) -> list[Conversation]:
    _check_names(options)
    lanes = options.get("lanes", 3)
    if lanes < 1:
        raise InvalidParameter("lanes", f"must be >= 1, got {lanes}")
    systems, temperatures, seeds = (options.get("systems"), options.get("temperatures"),
                                    options.get("seeds"))
    for name, seq in (("systems", systems), ("temperatures", temperatures), ("seeds", seeds)):
        if seq is not None and len(seq) != lanes:
            raise InvalidParameter(name, f"needs {lanes} values, got {len(seq)}")
    return [
        Conversation(
            model,
            system=systems[i] if systems is not None else options.get("system"),
            sampling=SamplingParams(
                temperature=temperatures[i] if temperatures is not None else 0.7,
                top_p=0.95,
                seed=seeds[i] if seeds is not None else i + 1,
            ),
            max_tokens=options.get("max_tokens", 256),
        )
        for i in range(lanes)
    ]


def tally(replies: Sequence[Reply[Any] | ChatkitError], field: str) -> QuorumResult:
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
