"""The dialect comes from the template itself, and the history goes back in its form.

Detection renders probe conversations through the template (a known call, then two
calls) and looks for each dialect's own rendering of those calls in the output, whitespace
aside; the longest match wins (the template's name plays no part). A template that
renders two calls the dialect's way keeps its parallel calls; one that refuses them gets
one call per turn. A template that refuses arguments as a mapping but renders them as
JSON text (Functionary v3.2) gets them as text. A few templates never render stored calls
(Granite 3.3, LFM2, Phi-4-mini, DeepSeek R1's Hub template): those are recognised by their
tool markup in the source,
and their history carries the calls in the assistant's content, in the family's markup.

Choosing the turn's template and dialect (:func:`tool_setup`) never switches template
silently: the conversation's template with its detected dialect, or ``tool_format=``'s
dialect with that template; the bundled ``hermes`` template only when the template has no
tool format at all and the vocabulary has ChatML's control tokens (logged); otherwise
``ToolFormatUnsupported`` naming what the template rendered.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Sequence

from ..engine.protocols import Vocabulary
from ..errors import InvalidParameter, TemplateError, ToolFormatUnsupported
from ..messages import Message, ToolCall
from ..templates import ChatTemplate, single_control
from .dialects import DIALECTS, HERMES, Dialect, render_calls

__all__: list[str] = []

_log = logging.getLogger("chatkit")

PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_fn", "description": "A probe.",
    "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"},
                                                    "n": {"type": "integer"}},
                   "required": ["probe_arg"]}}}
PROBE_CALLS = (ToolCall(id="abcDEF123", name="probe_fn",
                        arguments={"probe_arg": "PROBEVAL", "n": 5}),
               ToolCall(id="xyzXYZ789", name="probe_fn",
                        arguments={"probe_arg": "SECOND", "n": 7}))
_SPACE = re.compile(r"\s+")


def _squash(text: str) -> str:
    return _SPACE.sub("", text)


def _rendered(template: ChatTemplate, calls: Sequence[ToolCall], *, as_text: bool) -> str:
    messages = [Message("user", "QUESTION"),
                Message("assistant", "", tool_calls=tuple(calls)),
                *(Message("tool", f"RESULT{i}", tool_call_id=c.id, name=c.name)
                  for i, c in enumerate(calls))]
    segments = template.render(messages, tools=[PROBE_TOOL], add_generation_prompt=False,
                               arguments_as_text=as_text)
    return _squash("".join(s.text for s in segments))


def _probe(template: ChatTemplate, calls: Sequence[ToolCall], *,
           as_text: bool) -> str | None:
    try:
        return _rendered(template, calls, as_text=as_text)
    except TemplateError:
        return None


def _match(rendered: str, calls: Sequence[ToolCall]) -> Dialect | None:
    best: tuple[int, Dialect] | None = None
    for d in DIALECTS.values():
        if not d.renders_calls:
            continue
        want = _squash(render_calls(d, calls))
        if want in rendered and (best is None or len(want) > best[0]):
            best = (len(want), d)
    return best[1] if best else None


@functools.lru_cache(maxsize=64)
def _detect(source: str) -> Dialect | str | None:
    template = ChatTemplate.from_string(source, name="probe")
    for as_text in (False, True):
        one = _probe(template, PROBE_CALLS[:1], as_text=as_text)
        if one is None:
            continue
        found = _match(one, PROBE_CALLS[:1])
        if found is None:
            continue
        two = _probe(template, PROBE_CALLS, as_text=as_text)
        if two is None or _match(two, PROBE_CALLS) is not found:
            found = dataclasses.replace(found, max_calls=1)
        if as_text:
            found = dataclasses.replace(found, args_as="string")
        return found
    for d in DIALECTS.values():
        if d.signature and all(s in source for s in d.signature):
            return dataclasses.replace(d, renders_calls=False)
    try:
        seen = _rendered(template, PROBE_CALLS[:1], as_text=False)
    except TemplateError as exc:
        return f"an error ({exc})"
    return seen.split("QUESTION", 1)[-1][:160] or None


def detect_dialect(template: ChatTemplate) -> Dialect | None:
    """The dialect ``template`` writes tool calls in, or None (cached per source)."""
    found = _detect(template.source)
    return found if isinstance(found, Dialect) else None


def tool_setup(engine: Vocabulary, template: ChatTemplate,
               tool_format: str | None = None) -> tuple[ChatTemplate, Dialect]:
    """The template and dialect of a turn with tools (see the module docstring).

    Raises ``InvalidParameter`` for an unknown ``tool_format`` and ``ToolFormatUnsupported``
    for a template whose calls match no dialect, or with no tool format on a vocabulary
    without ChatML's control tokens."""
    if tool_format is not None:
        if tool_format not in DIALECTS:
            raise InvalidParameter("tool_format", f"{tool_format!r} is not one of "
                                   f"{', '.join(DIALECTS)}")
        if not template.mentions_tools:
            raise ToolFormatUnsupported(template.name, f"tool_format={tool_format!r}, but the "
                                        "template renders no tools, so the model would never "
                                        "see them; pass a template that does")
        return template, DIALECTS[tool_format]
    found = _detect(template.source)
    if isinstance(found, Dialect):
        _log.debug("tools: template %r writes %r calls", template.name, found.name)
        return template, found
    if template.mentions_tools:
        raise ToolFormatUnsupported(
            template.name, "a conversation with a tool call renders as "
            f"{found or 'nothing'!r}, which matches no dialect chatkit writes; pass "
            "tool_format= (one of " + ", ".join(DIALECTS) + ")")
    if not (single_control(engine, "<|im_start|>") and single_control(engine, "<|im_end|>")):
        raise ToolFormatUnsupported(template.name, "the template has no tool-call format "
                                    "and the vocabulary no ChatML control tokens to carry "
                                    "the Hermes one; pass template= a tool template")
    _log.info("tools: bundled 'hermes' template (%r has no tool format)", template.name)
    return ChatTemplate.bundled("hermes"), HERMES


def history_for(messages: Sequence[Message], dialect: Dialect) -> list[Message]:
    """Messages as ``dialect``'s template needs them: ids in the family's scheme (a call and
    its result mapped alike), and calls written into the content where the template drops
    ``tool_calls``."""
    out = []
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            if not dialect.renders_calls:
                wire = render_calls(dialect, m.tool_calls)
                m = dataclasses.replace(m, content=m.content + wire, tool_calls=())
            elif dialect.ids == "alnum9":
                m = dataclasses.replace(m, tool_calls=tuple(
                    dataclasses.replace(c, id=dialect.history_id(c.id)) for c in m.tool_calls))
        elif m.role == "tool" and m.tool_call_id is not None and dialect.ids == "alnum9":
            m = dataclasses.replace(m, tool_call_id=dialect.history_id(m.tool_call_id))
        out.append(m)
    return out
