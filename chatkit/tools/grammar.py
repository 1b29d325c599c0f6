"""The Hermes ``<tool_call>`` grammar derived from the tools, and its parser.

Each call body is ``{"name": <one tool's name>, "arguments": <that tool's
argument schema>}``: one JSON-schema ``anyOf`` branch per tool, so a name can
never be paired with another tool's arguments. ``tool_choice``:

- ``"auto"``: free text containing no ``<tool_call>``, or tool calls (from the
  start of the reply); once a call starts it is fully constrained.
- ``"required"``: one or more calls (exactly one when not parallel).
- ``"none"``: free text in which ``<tool_call>`` cannot appear.
- a tool name: calls of exactly that tool.

With ``output=`` (a schema) the free-text alternative becomes that schema's JSON.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..decode.options import TOOL_CHOICES, check_parallel, check_tool_choice
from ..engine.protocols import Vocabulary
from ..errors import ToolArgumentsInvalid
from ..grammar.schema import bound_numbers, closed_objects, json_options
from ..messages import ToolCall
from .definition import Tool

__all__: list[str] = []

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
_COMPACT = json_options()
_PLAIN = r"PLAIN: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/"
CALL_BLOCK = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
_ids = itertools.count(1)


def _body_schema(tools: Sequence[Tool]) -> dict[str, Any]:
    branches = [
        {"type": "object",
         "properties": {"name": {"const": t.name},
                        "arguments": bound_numbers(t.definition.parameters_schema)},
         "required": ["name", "arguments"], "additionalProperties": False}
        for t in tools
    ]
    return {"anyOf": branches, "x-guidance": _COMPACT}


DEFAULT_MAX_CALLS = 4


def tool_grammar(tools: Sequence[Tool], tool_choice: str = "auto", *,
                 parallel: bool | int = True, output: dict[str, Any] | None = None) -> str:
    """The Lark grammar (llguidance dialect) for one assistant turn with ``tools``.

    ``parallel``: False for exactly one call per turn, True for up to
    ``DEFAULT_MAX_CALLS`` (a small model would otherwise repeat calls until
    max_tokens), or an int for up to that many.
    """
    parallel = check_parallel(parallel)
    max_calls = DEFAULT_MAX_CALLS if parallel is True else 1 if parallel is False else parallel
    tool_choice = check_tool_choice(tool_choice, [t.name for t in tools])
    callable_tools = [t for t in tools if tool_choice in TOOL_CHOICES or t.name == tool_choice]
    free = "answer" if output is not None else "PLAIN"
    more = ""
    for _ in range(max_calls - 1):  # nested optionals: at most max_calls calls
        more = f' ("\\n" call{more})?'
    calls = f"calls: call{more}"
    rules = {
        "auto": f"start: {free} | calls",
        "none": f"start: {free}",
    }.get(tool_choice, "start: calls")
    lines = [rules]
    if tool_choice != "none":
        lines += [
            calls,
            f'call: "{CALL_OPEN}\\n" body "\\n{CALL_CLOSE}"',
            f"body: %json {json.dumps(_body_schema(callable_tools))}",
        ]
    if output is not None:
        answer = {**bound_numbers(closed_objects(output)), "x-guidance": _COMPACT}
        lines.append(f"answer: %json {json.dumps(answer)}")
    else:
        lines.append(_PLAIN)
    return "\n".join(lines) + "\n"


def opening_tokens(engine: Vocabulary) -> NDArray[np.intp]:
    """The tokens a reply can begin a ``<tool_call>`` with: those spelling a non-empty prefix
    of it, or it whole (and more). Computed once per engine."""
    opening = CALL_OPEN.encode()

    def build() -> NDArray[np.intp]:
        ids = [t for t in range(engine.n_vocab)
               if not engine.is_control(t) and (b := engine.token_bytes(t))
               and (opening.startswith(b) or b.startswith(opening))]
        return np.array(ids, dtype=np.intp)

    return engine.cache(("call_opening",), build)


def parse_calls(text: str, tools: Sequence[Tool]) -> tuple[str, list[ToolCall]]:
    """Split a reply into its text before the calls and the validated calls.

    Raises ``ToolArgumentsInvalid`` for a call whose body is not JSON, names no
    tool, or whose arguments fail the tool's validator.
    """
    by_name = {t.name: t for t in tools}
    calls: list[ToolCall] = []
    first = text.find(CALL_OPEN)
    lead = text if first < 0 else text[:first]
    for match in CALL_BLOCK.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError as exc:
            raise ToolArgumentsInvalid("?", match.group(1), [f"not JSON: {exc}"]) from exc
        name = body.get("name") if isinstance(body, dict) else None
        if name not in by_name:
            raise ToolArgumentsInvalid(str(name), body, ["no such tool"])
        args = body.get("arguments")
        parsed = by_name[name].validate(args)
        calls.append(ToolCall(id=f"call_{next(_ids)}", name=name,
                              arguments=dict(args) if isinstance(args, dict) else {},
                              parsed=parsed))
    return lead.strip(), calls
