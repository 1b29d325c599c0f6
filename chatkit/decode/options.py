"""Per-call options: what every send-like method takes, and the one place each is checked.

:func:`resolve` turns a call's :class:`TurnOptions` and the conversation's defaults
into a frozen :class:`CallOptions`; the library, the CLI and the server all go
through it (the server's request parser checks only the wire shape: types and the
limits it advertises). Every refusal is ``InvalidParameter`` naming the option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ..errors import InvalidParameter
from ..grammar.constraints import Constraint
from .sampling import LogitProcessor, Sampler, SamplingParams

__all__ = ["TurnOptions"]

AUTO_CALL_THRESHOLD = 0.004
"""The ``tool_call_threshold`` calibrated on BFCL requests for small models without a tool
format of their own (``bench bfcl``); an opt-in value, not a default."""

TOOL_CHOICES = ("auto", "required", "none")


class TurnOptions(TypedDict, total=False):
    """Per-call options of every send-like method (``send``, ``asend``, ``stream``,
    ``astream``, ``resume``, ``run``, ``send_batch`` ...), written once."""

    constraint: Constraint | LogitProcessor | None
    """``Constraint.regex(...)``, ``Constraint.lark(...)`` or any ``LogitProcessor``."""
    max_tokens: int | None
    """Reply token limit (default: the conversation's)."""
    sampling: SamplingParams | None
    """Sampling for this call only (default: the conversation's, with its RNG)."""
    temperature: float
    """This call's temperature (the conversation's other sampling settings kept)."""
    top_p: float
    """This call's top-p."""
    seed: int | None
    """This call's seed (a fresh RNG for this reply)."""
    stop: str | Sequence[str] | None
    """Stop strings for free text (a string is one stop string)."""
    schema_in_prompt: bool
    """Also append the schema to the user message as text."""
    tools: Sequence[Any] | None
    """Tools the model may call (``@tool`` functions, Pydantic models, ``Tool``)."""
    tool_choice: str
    """``auto`` | ``required`` | ``none`` | a tool's name."""
    parallel_tool_calls: bool | int
    """Allow more than one call in a reply (an int: at most that many)."""
    tool_format: str | None
    """The tool-call dialect to write (``hermes``, ``qwen3-xml``, ``mistral-v11``, ...: see
    the README's table); default: the one the template renders its calls in."""
    tool_call_threshold: float | None
    """``tool_choice="auto"``, local engines: the reply opens a call when the model puts at
    least this probability on the call opening at its first token, else it answers in text
    (decided, not sampled; no think block then). Default None: the model's own sampling
    chooses between text and calls as it writes (``AUTO_CALL_THRESHOLD`` is the value
    calibrated for small models without a tool format)."""
    speculative: bool
    """Grammar-drafted speculative decoding (same output, fewer forward passes)."""
    logprobs: int | None
    """Record each reply token's log-probability with this many most probable alternatives
    (0: the token's own only) in ``reply.logprobs``; None: off. See ``TokenLogprob``."""
    probabilities: bool | Sequence[str]
    """Schema replies on a local engine: the exact probability of each value a field allows
    (enum, Literal, boolean, a small integer range) in ``reply.choices``; True for every
    such field, or the fields' JSON pointers (``"/verdict"``).
    See :mod:`chatkit.grammar.choices`."""


OPTION_NAMES = frozenset(TurnOptions.__annotations__)


def check_options(options: dict[str, Any]) -> None:
    """Refuse an option no send-like method knows (the typed signature's runtime twin)."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise InvalidParameter(sorted(unknown)[0], "unknown send option")


def check_positive(name: str, value: int) -> int:
    """A count option (``think_budget``, ``max_steps`` ...): an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidParameter(name, f"must be >= 1, got {value!r}")
    return value


def check_max_tokens(value: int) -> int:
    """``max_tokens`` (a reply's token limit): an int >= 1."""
    return check_positive("max_tokens", value)


def stop_tuple(stop: str | Sequence[str]) -> tuple[str, ...]:
    """Stop strings as a tuple; a plain string is ONE stop string (not its letters)."""
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if not all(isinstance(s, str) for s in stop):
        raise InvalidParameter("stop", "stop strings must be strings")
    return tuple(s for s in stop if s)


def check_stop(stop: str | Sequence[str] | None, *, constrained: bool,
               default: tuple[str, ...] = ()) -> tuple[str, ...]:
    """A call's stop strings: they end free text only (a constraint ends itself; beside
    tools, the text written before any call). None takes ``default`` for free text."""
    if stop and constrained:
        raise InvalidParameter("stop", "stop strings end free text; a constraint ends itself")
    if stop is not None:
        return stop_tuple(stop)
    return () if constrained else default


def check_stop_in_json(stop: tuple[str, ...], dialect_name: str) -> None:
    """Stop strings beside a tool format that writes its text inside JSON (the generic
    ``text_json`` format): refused, as a stop string cannot end text inside a string."""
    if stop:
        raise InvalidParameter("stop", f"the {dialect_name!r} tool format writes its text "
                               "inside JSON, which a stop string cannot end")


def check_tool_choice(choice: Any, names: Sequence[str]) -> str:
    """``tool_choice``: ``auto``, ``required``, ``none`` or the name of one of ``names``."""
    if not names and choice == "required":
        raise InvalidParameter("tool_choice", "'required' needs tools")
    if choice in TOOL_CHOICES:
        return str(choice)
    if isinstance(choice, str) and choice in names:
        return choice
    raise InvalidParameter("tool_choice", f"{choice!r} is not auto, required, none or the "
                           f"name of a tool ({', '.join(names) or 'none given'})")


def check_parallel(parallel: bool | int) -> bool | int:
    """``parallel_tool_calls``: True, False, or the most calls a reply may make (>= 1)."""
    if isinstance(parallel, bool):
        return parallel
    if not isinstance(parallel, int) or parallel < 1:
        raise InvalidParameter("parallel_tool_calls", f"must allow >= 1 call, got {parallel!r}")
    return parallel


def check_threshold(threshold: Any, *, choice: str, has_tools: bool, local: bool
                    ) -> float | None:
    """``tool_call_threshold``: a probability in [0, 1], for ``tool_choice="auto"`` with
    tools on a local engine (a remote engine samples the first token itself)."""
    if threshold is None:
        return None
    if (isinstance(threshold, bool) or not isinstance(threshold, int | float)
            or not 0.0 <= threshold <= 1.0):
        raise InvalidParameter("tool_call_threshold",
                               f"must be a probability in [0, 1] or None, got {threshold!r}")
    if not has_tools:
        raise InvalidParameter("tool_call_threshold", "decides tool_choice='auto', which "
                               "needs tools=")
    if choice != "auto":
        raise InvalidParameter("tool_call_threshold",
                               f"decides tool_choice='auto' only, not {choice!r}")
    if not local:
        raise InvalidParameter("tool_call_threshold", "a remote engine samples the first "
                               "token itself; it applies to local engines only")
    return float(threshold)


@dataclass(frozen=True)
class Defaults:
    """What a call falls back on: the conversation's settings."""

    sampler: Sampler
    max_tokens: int = 512
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class CallOptions:
    """One call's options, checked and resolved against the defaults."""

    max_tokens: int
    stop: tuple[str, ...]
    sampler: Sampler
    """The call's sampler: the conversation's (its RNG persists) or a fresh one."""
    constraint: Constraint | LogitProcessor | None = None
    schema_in_prompt: bool = False
    tool_choice: str = "auto"
    parallel_tool_calls: bool | int = True
    tool_call_threshold: float | None = None
    threshold_given: bool = False
    """``tool_call_threshold`` was given (None then means: no first-token decision)."""
    speculative: bool = False
    logprobs: int | None = None
    probabilities: bool | tuple[str, ...] = False


def check_logprobs(value: Any) -> int | None:
    """``logprobs``: None, or how many alternatives to record per token (>= 0)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParameter("logprobs", f"must be None or an int >= 0, got {value!r}")
    return value


def check_probabilities(value: Any, *, has_schema: bool, local: bool
                        ) -> bool | tuple[str, ...]:
    """``probabilities``: True, False, or JSON pointers of fields; a schema reply on a local
    engine (the branches are evaluated here)."""
    if value is False or value is None:
        return False
    fields: bool | tuple[str, ...] = True
    if value is not True:
        if isinstance(value, str) or not all(
                isinstance(p, str) and p.startswith("/") for p in value):
            raise InvalidParameter("probabilities", "True, or JSON pointers such as "
                                   "['/verdict']")
        fields = tuple(value)
    if not has_schema:
        raise InvalidParameter("probabilities", "needs schema=")
    if not local:
        raise InvalidParameter("probabilities", "a remote engine returns no rows to branch "
                               "on; local engines only")
    return fields


def resolve(options: TurnOptions, defaults: Defaults, *, constrained: bool,
            tool_names: Sequence[str], local: bool, has_schema: bool) -> CallOptions:
    """Check every option of a call once and resolve it against ``defaults``.

    ``constrained``: a schema, constraint or tools govern the reply (stop strings are
    then refused, except beside tools alone on a local engine: they end the text written
    before any call); ``tool_names``: the checked tools' names; ``local``: the engine
    samples here (not a remote server). Raises ``InvalidParameter`` naming the option.
    """
    check_options(dict(options))
    raw_max = options.get("max_tokens")
    max_tokens = check_max_tokens(defaults.max_tokens if raw_max is None else raw_max)
    if options.get("schema_in_prompt") and not has_schema:
        raise InvalidParameter("schema_in_prompt", "needs schema=")
    choice = check_tool_choice(options.get("tool_choice", "auto"), tool_names)
    parallel = check_parallel(options.get("parallel_tool_calls", True))
    constraint = options.get("constraint")
    if not local:
        if options.get("speculative"):
            raise InvalidParameter("speculative", "a remote engine does its own decoding "
                                   "(speculation is the server's business)")
        if constraint is not None and not isinstance(constraint, Constraint):
            raise InvalidParameter("constraint", "a remote engine can enforce chatkit "
                                   "Constraints only, not a custom LogitProcessor")
    threshold = check_threshold(options.get("tool_call_threshold"), choice=choice,
                                has_tools=bool(tool_names), local=local)
    return CallOptions(
        max_tokens=max_tokens,
        stop=check_stop(options.get("stop"), default=defaults.stop,
                        constrained=constrained and not (
                            local and tool_names and not has_schema
                            and options.get("constraint") is None)),
        sampler=_sampler(options, defaults.sampler), constraint=constraint,
        schema_in_prompt=bool(options.get("schema_in_prompt")), tool_choice=choice,
        parallel_tool_calls=parallel, tool_call_threshold=threshold,
        threshold_given="tool_call_threshold" in options,
        speculative=bool(options.get("speculative")),
        logprobs=check_logprobs(options.get("logprobs")),
        probabilities=check_probabilities(options.get("probabilities", False),
                                          has_schema=has_schema, local=local))


def _sampler(options: TurnOptions, default: Sampler) -> Sampler:
    sampling = options.get("sampling")
    overrides: dict[str, Any] = {k: v for k, v in options.items()
                                 if k in ("temperature", "top_p", "seed")}
    if sampling is not None and overrides:
        raise InvalidParameter(sorted(overrides)[0], "give sampling= or per-call "
                               "temperature/top_p/seed, not both")
    if overrides:
        sampling = dataclasses.replace(default.params, **overrides)
    return Sampler(sampling) if sampling is not None else default
