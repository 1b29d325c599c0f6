"""Per-call options: what every send-like method takes, resolved once per call.

:func:`resolve` turns a call's :class:`TurnOptions` and the conversation's defaults into a
frozen :class:`CallOptions`; the library, the CLI and the server all go through it (the
server's request parser checks only the wire shape: types and the limits it advertises).
Each option's value is checked in the options module of its layer: decoding options in
:mod:`chatkit.decode.options`, tool options in :mod:`chatkit.tools.options`. Every refusal
is ``InvalidParameter`` naming the option.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ..decode.options import check_logprobs, check_max_tokens, check_probabilities, check_stop
from ..decode.sampling import LogitProcessor, Sampler, SamplingParams
from ..errors import InvalidParameter
from ..grammar.constraints import Constraint
from ..tools.definition import ToolLike
from ..tools.options import (
    check_parallel,
    check_threshold,
    check_tool_choice,
    check_tool_format,
)

__all__ = ["TurnOptions"]


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
    tools: Sequence[ToolLike] | None
    """Tools the model may call (``@tool`` functions, Pydantic models, ``Tool``, toolsets
    such as ``MCPToolset``: see ``ToolLike``)."""
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


def resolve(options: TurnOptions, defaults: Defaults, *, constrained: bool,
            tool_names: Sequence[str], local: bool, has_schema: bool) -> CallOptions:
    """Check every option of a call once and resolve it against ``defaults``.

    ``constrained``: a schema, constraint or tools govern the reply (stop strings are
    then refused, except beside tools alone on a local engine: they end the text written
    before any call); ``tool_names``: the checked tools' names; ``local``: the engine
    samples here (not a remote server). Raises ``InvalidParameter`` naming the option.
    """
    check_options(dict(options))
    constraint = options.get("constraint")
    if has_schema and constraint is not None:
        raise InvalidParameter("schema", "give schema= or constraint=, not both")
    if tool_names and constraint is not None:
        raise InvalidParameter("constraint", "tools= builds its own grammar")
    if options.get("tool_format") is not None:
        check_tool_format(options["tool_format"])
        if not tool_names:
            raise InvalidParameter("tool_format", "needs tools=")
    raw_max = options.get("max_tokens")
    max_tokens = check_max_tokens(defaults.max_tokens if raw_max is None else raw_max)
    if options.get("schema_in_prompt") and not has_schema:
        raise InvalidParameter("schema_in_prompt", "needs schema=")
    choice = check_tool_choice(options.get("tool_choice", "auto"), tool_names)
    parallel = check_parallel(options.get("parallel_tool_calls", True))
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
