"""Tool options: ``tool_choice``, ``parallel_tool_calls``, ``tool_call_threshold`` and a
tool format's stop strings, each checked here once.

The library, the CLI and the server reach these checks through the call's resolution
(:func:`chatkit.chat.options.resolve`); :func:`chatkit.tools.grammar.tool_grammar`, a public
builder, calls the same functions. Every refusal is ``InvalidParameter`` naming the option.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidParameter
from .dialects import DIALECTS

__all__: list[str] = []

AUTO_CALL_THRESHOLD = 0.004
"""The ``tool_call_threshold`` calibrated on BFCL requests for small models without a tool
format of their own (``bench bfcl``); an opt-in value, not a default."""

TOOL_CHOICES = ("auto", "required", "none")
"""``tool_choice``'s keywords (any other value names a tool)."""


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


def check_tool_format(name: Any) -> str:
    """``tool_format``: the name of one of the dialects (``DIALECTS``)."""
    if not isinstance(name, str) or name not in DIALECTS:
        raise InvalidParameter("tool_format", f"{name!r} is not one of {', '.join(DIALECTS)}")
    return name


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


def check_stop_in_json(stop: tuple[str, ...], dialect_name: str) -> None:
    """Stop strings beside a tool format that writes its text inside JSON (the generic
    ``text_json`` format): refused, as a stop string cannot end text inside a string."""
    if stop:
        raise InvalidParameter("stop", f"the {dialect_name!r} tool format writes its text "
                               "inside JSON, which a stop string cannot end")
