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
silently: the conversation's template with its detected (or derived) dialect, or
``tool_format=``'s dialect with that template; a template with no tool syntax keeps its
template with the generic dialect, or the bundled ``hermes`` template where the vocabulary
has ChatML's control tokens (both logged); otherwise ``ToolFormatUnsupported`` naming what
the template rendered.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..engine.protocols import Vocabulary
from ..errors import TemplateError, ToolFormatUnsupported
from ..messages import Message, ToolCall
from ..templates import ChatTemplate, single_control
from .derive import derive, probe_render, respaced
from .dialects import DIALECTS, GENERIC, HERMES, Dialect, render_args, render_calls
from .options import check_tool_format

__all__: list[str] = []

_log = logging.getLogger("chatkit")

PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_fn", "description": "A probe.",
    "parameters": {"type": "object", "properties": {  # described: Command R+ reads that
        "probe_arg": {"type": "string", "description": "A text."},
        "n": {"type": "integer", "description": "A number."}}, "required": ["probe_arg"]}}}
PROBE_CALLS = (ToolCall(id="abcDEF123", name="probe_fn",
                        arguments={"probe_arg": "PROBEVAL", "n": 5}),
               ToolCall(id="xyzXYZ789", name="probe_fn",
                        arguments={"probe_arg": "SECOND", "n": 7}))
_SPACE = re.compile(r"\s+")
PROBE_NOW = datetime(2026, 1, 1)
"""The time every probe rendering sees (a template that writes the date, Firefunction v2's
``datetime``, renders a prompt and its history alike however long detection takes)."""


def _squash(text: str) -> str:
    return _SPACE.sub("", text)


def _rendered(template: ChatTemplate, calls: Sequence[ToolCall], *, as_text: bool) -> str:
    """A conversation with ``calls`` and their results as ``template`` writes it."""
    messages = [Message("user", "QUESTION"),
                Message("assistant", "", tool_calls=tuple(calls)),
                *(Message("tool", f"RESULT{i}", tool_call_id=c.id, name=c.name)
                  for i, c in enumerate(calls))]
    segments = template.render(messages, tools=[PROBE_TOOL], add_generation_prompt=False,
                               arguments_as_text=as_text, now=PROBE_NOW)
    return "".join(s.text for s in segments)


def assistant_rendering(template: ChatTemplate, message: Message, *,
                        as_text: bool = False,
                        tool: dict[str, Any] | None = None) -> str | None:
    """What ``template`` writes for ``message`` after a user's "QUESTION" (with ``tool``,
    by default the probe tool): the rendering of the conversation past its generation
    prompt (the text a model would write, end of turn included), or None where the
    template refuses it or the prompt is not a prefix. A generation prompt that closes an
    empty think block the history does not keep (Gemma 4's ``<|channel>thought\n<channel|>``
    with thinking off), or keeps only the end of (DeepSeek V3.2's ``</think>``), counts up
    to that block; one that opens a block the history never writes, up to the opening."""
    user = Message("user", "QUESTION")
    tools = [tool or PROBE_TOOL]
    try:
        prompt = "".join(s.text for s in template.render(
            [user], tools=tools, add_generation_prompt=True, arguments_as_text=as_text,
            now=PROBE_NOW))
        full = "".join(s.text for s in template.render(
            [user, message], tools=tools, add_generation_prompt=False,
            arguments_as_text=as_text, now=PROBE_NOW))
    except TemplateError:
        return None
    if full.startswith(prompt):
        return full[len(prompt):]
    try:  # a turn the template writes after the whole history (Command R+)
        bare = "".join(s.text for s in template.render(
            [user], tools=tools, add_generation_prompt=False, arguments_as_text=as_text,
            now=PROBE_NOW))
        trailed = _before_trailer(prompt, bare, full)
    except TemplateError:
        trailed = None
    if trailed is not None:
        return trailed
    for opener, closer in THINK_OPENERS.items():  # an empty block the history drops
        block = re.search(re.escape(opener) + r"\s*" + re.escape(closer.strip()) + r"\s*$",
                          prompt)
        if block and full.startswith(prompt[:block.start()]):
            rest, written = full[block.start():], prompt[block.start():].rstrip()
            for k, ch in enumerate(written):  # the block's end the history keeps (V3.2)
                if ch in "<[" and rest.startswith(written[k:]):
                    return rest[len(written) - k:]
            return rest
    return _after_dropped_opener(prompt, full)


def _before_trailer(prompt: str, bare: str, full: str) -> str | None:
    """The rendering of a template that writes a turn of its own after the whole history
    (Command R+'s tool-use instructions): ``bare`` (the history without a generation prompt)
    ends with it, ``prompt`` adds the generation prompt after it, and the reply comes
    between the history and it. None where the renderings are not so."""
    if not prompt.startswith(bare) or len(prompt) == len(bare):
        return None
    opening = prompt[len(bare):]
    n = 0
    while n < min(len(bare), len(full)) and bare[-1 - n] == full[-1 - n]:
        n += 1
    for cut in range(len(bare) - n, len(bare)):  # the trailer's start: where the reply fits
        history = bare[:cut]
        if bare[cut] in "<[\n" and bare[cut:].strip() and full.startswith(history + opening):
            return full[cut + len(opening): len(full) - (len(bare) - cut)]
    return None


def _after_dropped_opener(prompt: str, full: str) -> str | None:
    """The rendering past a generation prompt that ends with a think block's opening the
    history never writes (Apriel 1.6's ``Here are my reasoning steps:\n``): what follows
    the part they share (cut at a line or markup boundary), where the prompt's tail is a
    short opener the rendering does not hold. None otherwise."""
    k = 0
    while k < min(len(prompt), len(full)) and prompt[k] == full[k]:
        k += 1
    k = max(prompt.rfind("\n", 0, k), prompt.rfind(">", 0, k)) + 1
    opener = prompt[k:]
    if k == 0 or not opener.strip() or len(opener) > 80 or opener.strip() in full[k:]:
        return None
    return full[k:]


def _turn_text(template: ChatTemplate, message: Message,
               tool: dict[str, Any] | None) -> str | None:
    """:func:`assistant_rendering` without the markup that ends the turn (what the template
    writes after a plain answer)."""
    text = assistant_rendering(template, message, tool=tool)
    end = _turn_end(template, as_text=False)
    if text is not None and end and text.rstrip().endswith(end):
        return text.rstrip()[: -len(end)]
    return text


def _turn_end(template: ChatTemplate, *, as_text: bool) -> str:
    """The markup the template writes after a plain answer (stripped; "" when none)."""
    answer = assistant_rendering(template, Message("assistant", "PROBEEND"),
                                 as_text=as_text) or ""
    return answer[answer.find("PROBEEND") + len("PROBEEND"):].strip() \
        if "PROBEEND" in answer else ""


def _learn(template: ChatTemplate, d: Dialect, *, as_text: bool) -> Dialect:
    """What the template's renderings say beyond the markers: the JSON separators inside
    arguments, whether text may precede the calls, the think block's markup."""
    call = PROBE_CALLS[0]
    one = assistant_rendering(template, Message("assistant", "", tool_calls=(call,)),
                              as_text=as_text) or ""
    thought = assistant_rendering(template, Message("assistant", "", reasoning="PROBETHINK",
                                                    tool_calls=(call,)), as_text=as_text) or ""
    one = one or thought  # a template that writes calls only after a think block (Command A)
    seps = d.json_separators
    if d.args.kind == "json":
        for candidate in ((", ", ": "), (",", ":")):
            if render_args(d.args, call.arguments, candidate) in one:
                seps = candidate
                break
    else:
        seps = (", ", ": ")  # nested values come from tojson
    d = dataclasses.replace(d, json_separators=seps)
    head = d.trigger.split()[0] if d.trigger.split() else ""
    said = assistant_rendering(template, Message("assistant", "PROBETEXT", tool_calls=(call,)),
                               as_text=as_text) or ""
    at = said.find("PROBETEXT")
    before = at >= 0 and bool(head) and said.find(head, at) >= 0 and \
        not said[at + len("PROBETEXT"):said.find(head, at)].strip()
    reasoning = None
    i = thought.find("PROBETHINK")
    k = thought.find(d.trigger, i) if d.trigger.strip() else -1
    if i >= 0 and k > i:
        close = thought[i + len("PROBETHINK"):k]
        if close.strip() and (i == 0 or thought[:i].strip()):
            reasoning = (thought[:i], close)
    closed = reasoning is not None and bool(reasoning[0].strip()) and \
        one.lstrip().startswith(reasoning[1].strip())  # written with no reasoning (M3)
    shut = reasoning[1] if reasoning and not reasoning[0] else ""  # the prompt opened it
    if shut and said.startswith(shut) and one.startswith(shut):  # Kimi K3's empty block
        said, one, at = said[len(shut):], one[len(shut):], at - len(shut)
    lead = _text_lead(d, said, one, at) if not before and at >= 0 and one else None
    end = _turn_end(template, as_text=as_text)
    if lead is not None and end and end in lead[1]:
        lead = None  # the text is a turn of its own (Nemotron Nano v2): the model ends there
    if lead is not None and reasoning is not None and lead[0] == reasoning[0]:
        lead = None  # the text goes into the think block (harmony's analysis channel)
    return dataclasses.replace(d, text_before=before, text_lead=lead, reasoning=reasoning,
                               think_closed=closed)


def _text_lead(d: Dialect, said: str, one: str, at: int) -> tuple[str, str] | None:
    """The markup around a sentence before a call (``said``: the rendering of "PROBETEXT"
    then the call, at ``at``; ``one``: the call alone), where it is not plain text before the
    calls' markup word: before the call as the template writes it alone (Functionary v3.2's
    ``all\nPROBETEXT>>>``), or inside the opening of the calls' section (Llama 4's
    ``<|python_start|>PROBETEXT<|python_end|>``). None otherwise."""
    end = at + len("PROBETEXT")
    if said.endswith(one) and end <= len(said) - len(one):
        lead = (said[:at], said[end:len(said) - len(one)])
    elif d.section and said[:at] + said[end:] == one and 0 < at < len(d.section[0]) and \
            one.startswith(d.section[0]):
        lead = (d.section[0][:at], d.section[0][at:])
    else:
        return None
    head = d.trigger.split()[0] if d.trigger.split() else ""
    return lead if lead[1].strip() and not (head and head in lead[1]) else None



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
    """The dialect ``source`` (a template) renders calls in (the 64 most recent templates
    kept)."""
    template = ChatTemplate.from_string(source, name="probe")
    for as_text in (False, True):
        one = _probe(template, PROBE_CALLS[:1], as_text=as_text)
        if one is None:
            continue
        found = _match(_squash(one), PROBE_CALLS[:1])
        if found is None:
            continue
        two = _probe(template, PROBE_CALLS, as_text=as_text)
        if two is None or _match(_squash(two), PROBE_CALLS) is not found:
            found = dataclasses.replace(found, max_calls=1)
        found = respaced(found, PROBE_CALLS, one, None if found.max_calls == 1 else two)
        if as_text:
            found = dataclasses.replace(found, args_as="string")
        return _learn(template, found, as_text=as_text)
    derived = derive(probe_render(lambda m, tool: _turn_text(template, m, tool)), PROBE_TOOL,
                     PROBE_CALLS)
    if derived is not None:
        _log.info("tools: template %r matches no dialect record; its calls are read from its "
                  "renderings: %s", template.name, render_calls(derived, PROBE_CALLS[:1]))
        return _learn(template, derived, as_text=False)
    for d in DIALECTS.values():
        if d.signature and all(s in source for s in d.signature):
            # chatkit writes the calls into the content, after any text
            return dataclasses.replace(d, renders_calls=False, text_before=bool(d.section))
    try:
        seen = _squash(_rendered(template, PROBE_CALLS[:1], as_text=False))
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
    for a template whose calls match no dialect and none can be derived."""
    if tool_format is not None:
        check_tool_format(tool_format)
        if not template.mentions_tools and tool_format != GENERIC.name:
            raise ToolFormatUnsupported(template.name, f"tool_format={tool_format!r}, but the "
                                        "template renders no tools, so the model would never "
                                        "see them; pass a template that does (or 'generic')")
        return template, _forced(template.source, tool_format)
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
        _say_generic(template.name)
        return template, GENERIC
    _log.info("tools: bundled 'hermes' template (%r has no tool format)", template.name)
    return ChatTemplate.bundled("hermes"), HERMES


@functools.lru_cache(maxsize=64)
def _forced(source: str, tool_format: str) -> Dialect:
    """``tool_format``'s record as the template lays the turn out (once per template and
    format, the 64 most recent pairs kept; a format other than the template's own is logged,
    once)."""
    chosen = DIALECTS[tool_format]
    template = ChatTemplate.from_string(source, name="forced")
    rendered = _detect(source)
    if isinstance(rendered, Dialect) and rendered.name != chosen.name:
        _log.warning("tools: tool_format=%r, but the template renders calls as %r: the model "
                     "writes %r calls while its history shows %r ones", tool_format,
                     rendered.name, tool_format, rendered.name)
    return chosen if chosen is GENERIC else _learn(template, chosen, as_text=False)


def dialect_of_history(engine: Vocabulary, template: ChatTemplate) -> Dialect | None:
    """The dialect earlier calls and results are rendered in on a turn without tools: the
    template's own, or the generic one where ``tool_setup`` would choose it."""
    found = detect_dialect(template)
    if found is None and not template.mentions_tools and not (
            single_control(engine, "<|im_start|>") and single_control(engine, "<|im_end|>")):
        return GENERIC
    return found


@functools.lru_cache(maxsize=64)
def _say_generic(name: str) -> None:
    """Logged once per template (of the 64 most recent): tools through the generic
    fallback."""
    _log.info("tools: template %r has no tool syntax: the tools are described in the system "
              "turn and calls are written as a JSON envelope (tool_format='generic')", name)


GENERIC_INSTRUCTIONS = (
    "You can call tools. They are described below as JSON Schema.\n{tools}\n\n"
    "Reply with one JSON object: either {{\"tool_calls\": [{{\"name\": \"TOOL_NAME\", "
    "\"arguments\": {{...}}}}]}} to call tools, or {{\"response\": \"...\"}} to answer "
    "directly.")
"""The system text the generic fallback adds (``{tools}``: one JSON line per tool)."""


def generic_messages(messages: Sequence[Message],
                     tools: Sequence[dict[str, object]]) -> list[Message]:
    """Messages for a template with no tool syntax: the tools described in the system turn
    (added to it, or a new one), each assistant call as the generic JSON in its content,
    and tool results as a user turn holding ``{"tool_response": ...}`` objects
    (consecutive results in one turn, as templates that alternate roles need)."""
    described = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    note = GENERIC_INSTRUCTIONS.format(tools=described)
    out: list[Message] = []
    if tools:
        if messages and messages[0].role == "system":
            out.append(dataclasses.replace(messages[0],
                                           content=messages[0].content + "\n\n" + note))
            messages = messages[1:]
        else:
            out.append(Message("system", note))
    results = False  # the last turn out holds tool results
    for m in history_for(messages, GENERIC):
        if m.role == "user" and results:  # roles alternate in such templates
            out[-1] = dataclasses.replace(out[-1], content=out[-1].content + "\n\n" +
                                          m.content)
            results = False
            continue
        if m.role != "tool":
            out.append(m)
            results = False
            continue
        body = json.dumps({"tool_response": {"name": m.name, "content": m.content}},
                          ensure_ascii=False)
        if results:
            out[-1] = dataclasses.replace(out[-1], content=out[-1].content + "\n" + body)
        else:
            out.append(Message("user", body))
            results = True
    return out


THINK_OPENERS = {"<think>": "</think>", "[THINK]": "[/THINK]", "<seed:think>": "</seed:think>",
                 "<|channel>thought": "<channel|>"}
"""Think blocks a generation prompt may open although the template renders no reasoning
(DeepSeek R1's ``<think>\n``): opening and closing markup."""


def tool_reasoning(dialect: Dialect, prompt: str) -> tuple[Dialect, bool]:
    """The dialect's think block for a turn whose prompt text is ``prompt``, and whether the
    prompt opened it: none where the prompt closed an empty block already (thinking off);
    the family's opener where the prompt ends with one the template renders no reasoning
    for."""
    tail = prompt.rstrip()
    if dialect.reasoning is not None:
        open_, close = (m.strip() for m in dialect.reasoning)
        before = tail[: len(tail) - len(close)].rstrip() if tail.endswith(close) else None
        if before is not None and any(before.endswith(o) for o in (open_ or "\0",
                                                                     *THINK_OPENERS)):
            return dataclasses.replace(dialect, reasoning=None), False
        return dialect, not open_ or tail.endswith(open_)
    for opener, closer in THINK_OPENERS.items():
        if tail.endswith(opener):
            return dataclasses.replace(dialect, reasoning=(opener, closer + "\n\n")), True
    return dialect, False


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
