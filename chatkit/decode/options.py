"""Decoding options: a reply's token limit, stop strings, logprobs and choice
probabilities, each checked here once.

The call's resolution (:func:`chatkit.chat.options.resolve`) calls these checks; tool
options are checked in :mod:`chatkit.tools.options`. Every refusal is ``InvalidParameter``
naming the option.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidParameter

__all__: list[str] = []


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
