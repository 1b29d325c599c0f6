"""A dialect record derived from a template's own renderings, for families no record knows.

The template renders an assistant turn with one probe call and with two; the probe's name,
id and arguments are found in the text, and what lies around them is the record: the markup
before the name (the section's opening plus each call's own), between the slots, after the
arguments (each call's closing plus the section's), and between two calls (the separator).
Splitting "section" from "call" markup compares the one-call and two-call renderings: what
the second call repeats belongs to every call (llama.cpp's autoparser diffs renderings the
same way). Arguments are JSON or Python keywords where the probe's arguments appear so
(the name before or after them); else XML-like (``key_open KEY key_close VALUE
value_close``), found with two string parameters.
A derived record must render the probe calls back as the template did, whitespace aside, or
it is not used. Formats whose markup depends on a value's type (DeepSeek V3.2's
``string="true"``, Kimi K3's ``type="number"``) or on the name inside the section are left
to records.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..messages import Message, ToolCall
from .dialects import ARGS, ID, NAME, Args, Dialect, Piece, render_args, render_call, render_calls

__all__: list[str] = []

_SPACE = re.compile(r"\s+")
XML_TOOL = {"type": "function", "function": {
    "name": "probe_fn", "description": "A probe.",
    "parameters": {"type": "object", "properties": {
        "key_one": {"type": "string", "description": "A text."},
        "key_two": {"type": "string", "description": "A text."}},
                   "required": ["key_one", "key_two"]}}}
XML_CALLS = (ToolCall(id="abcDEF123", name="probe_fn",
                      arguments={"key_one": "VALUE_ONE", "key_two": "VALUE_TWO"}),
             ToolCall(id="xyzXYZ789", name="probe_fn",
                      arguments={"key_one": "VALUE_THREE", "key_two": "VALUE_FOUR"}))

Render = Callable[[Sequence[ToolCall], dict[str, Any]], str | None]
"""The text a template writes for an assistant turn holding these calls, with this tool
(None where it refuses)."""


def _squash(text: str) -> str:
    return _SPACE.sub("", text)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _common_suffix(a: str, b: str) -> str:
    return _common_prefix(a[::-1], b[::-1])[::-1]


def _split(one_head: str, one_tail: str, mid: str) -> tuple[str, str, str, str, str] | None:
    """(section open, call prefix, separator, call suffix, section close) from the markup
    before the first call's name (``one_head``), after the last call's arguments
    (``one_tail``) and between two calls (``mid``)."""
    prefix = _common_suffix(one_head, mid)
    suffix = _common_prefix(one_tail, mid[: len(mid) - len(prefix)])
    sep = mid[len(suffix): len(mid) - len(prefix)]
    if not prefix.strip() and not suffix.strip() and not sep.strip():
        return None
    return (one_head[: len(one_head) - len(prefix)], prefix, sep, suffix,
            one_tail[len(suffix):])


def _pieces(between: list[tuple[Piece, str]]) -> tuple[Piece, ...]:
    out: list[Piece] = []
    for slot, literal in between:
        out.append(slot)
        if literal:
            out.append(literal)
    return tuple(out)


def derive(render: Render, probe_tool: dict[str, Any],
           probe_calls: Sequence[ToolCall]) -> Dialect | None:
    """A record for the format ``render`` writes calls in, or None (see the module).
    ``probe_calls`` (a string and an integer argument, under ``probe_tool``) must render
    as the record writes them, whichever way it was found: a format whose markup depends
    on a value's type fails there."""
    one, two = render(probe_calls[:1], probe_tool), render(probe_calls, probe_tool)
    if not one or one.count(probe_calls[0].name) != 1:
        return None  # the name twice (a recipient and a call): not a shape found here
    found = _derive_inline(render, probe_tool, probe_calls) or _derive_xml(render)
    if found is None or not _renders(found, probe_calls, one, two):
        return None
    # ids of another shape (chatkit's call_N, mapped as the record maps them) render alike
    other = [dataclasses.replace(c, id=found.history_id(f"call_{i + 1}"))
             for i, c in enumerate(probe_calls)]
    again, again2 = render(other[:1], probe_tool), render(other, probe_tool)
    return found if again and _renders(found, other, again, again2) else None


_INLINE = ((Args(), (", ", ": ")), (Args(), (",", ":")),
           (Args("python", separator=", ", quote='"'), (", ", ": ")),
           (Args("python", separator=", ", quote="'"), (", ", ": ")))
"""Argument encodings written in one piece: JSON (spaced, compact), Python keywords."""


def _derive_inline(render: Render, tool: dict[str, Any],
                   calls: Sequence[ToolCall]) -> Dialect | None:
    """A record whose arguments are one piece of text (JSON or Python keywords), the name
    and id before or after them."""
    one, two = render(calls[:1], tool), render(calls, tool)
    if not one:
        return None
    for args, seps in _INLINE:
        args1 = render_args(args, calls[0].arguments, seps)
        at_args = one.find(args1)
        if at_args < 0:
            continue
        at_name = one.rfind(calls[0].name, 0, at_args)
        if at_name < 0:
            at_name = one.find(calls[0].name, at_args + len(args1))
        if at_name < 0:
            continue
        at_id = one.find(calls[0].id)
        slots = sorted([(at_name, NAME, len(calls[0].name)), (at_args, ARGS, len(args1))]
                       + ([(at_id, ID, len(calls[0].id))] if at_id >= 0 else []),
                       key=lambda s: s[0])
        first, end = slots[0][0], slots[-1][0] + slots[-1][2]
        between: list[tuple[Piece, str]] = [
            (slot, one[pos + size: slots[k + 1][0]]) for k, (pos, slot, size)
            in enumerate(slots[:-1])]
        between.append((slots[-1][1], ""))
        head, tail = one[:first], one[end:]
        split = None
        second = two.find(render_args(args, calls[1].arguments, seps)) if two else -1
        if two and second >= 0:
            first2 = second - (at_args - first)  # the same markup between the slots
            start2 = len(head) + (end - first)
            if first2 > start2:
                split = _split(head, tail, two[start2:first2])
        max_calls = None
        if split is None:
            split, max_calls = (head, "", "", "", tail), 1
        s_open, c_pre, sep, c_post, s_close = split
        call = (*((c_pre,) if c_pre else ()), *_pieces(between),
                *((c_post,) if c_post else ()))
        found = Dialect("derived", call, section=(s_open, s_close) if s_open or s_close
                        else None, separator=sep, args=args,
                        ids="alnum9" if at_id >= 0 else "none", max_calls=max_calls,
                        json_separators=seps, families=("derived from the template",))
        if _renders(found, calls, one, two):
            return found
    return None


def _derive_xml(render: Render) -> Dialect | None:
    calls = XML_CALLS
    one, two = render(calls[:1], XML_TOOL), render(calls, XML_TOOL)
    if not one:
        return None
    marks = [one.find(s) for s in ("probe_fn", "key_one", "VALUE_ONE", "key_two",
                                   "VALUE_TWO")]
    if min(marks) < 0 or marks != sorted(marks):
        return None
    name_at, k1, v1, k2, v2 = marks
    after_name = one[name_at + len("probe_fn"): k1]
    key_close = one[k1 + len("key_one"): v1]
    if key_close != one[k2 + len("key_two"): v2]:
        return None
    between = one[v1 + len("VALUE_ONE"): k2]  # value_close + key_open
    tail_all = one[v2 + len("VALUE_TWO"):]
    value_close = _common_prefix(between, tail_all)
    key_open = between[len(value_close):]
    if not key_open.strip() or not after_name.endswith(key_open):
        return None
    name_tail = after_name[: len(after_name) - len(key_open)]
    head, tail = one[:name_at], tail_all[len(value_close):]
    split = None
    if two:
        second = two.find("probe_fn", name_at + 1)
        start2 = len(one) - len(tail)
        if second > start2 and two.find("VALUE_THREE") > second:
            split = _split(head, tail, two[start2:second])
    max_calls = None
    if split is None:
        split, max_calls = (head, "", "", "", tail), 1
    s_open, c_pre, sep, c_post, s_close = split
    call: tuple[Piece, ...] = (*((c_pre,) if c_pre else ()), NAME,
                               *((name_tail,) if name_tail else ()), ARGS,
                               *((c_post,) if c_post else ()))
    found = Dialect("derived", call, section=(s_open, s_close) if s_open or s_close else None,
                    separator=sep, args=Args("xml", key_open, key_close, value_close),
                    max_calls=max_calls, json_separators=(", ", ": "),
                    families=("derived from the template",))
    return found if _renders(found, calls, one, two) else None


def _renders(d: Dialect, calls: Sequence[ToolCall], one: str, two: str | None) -> bool:
    """The record writes the probe calls as the template did (whitespace aside)."""
    if _squash(render_calls(d, calls[:1])) not in _squash(one):
        return False
    return d.max_calls == 1 or two is None or _squash(render_calls(d, calls)) in _squash(two)


def probe_render(render_turn: Callable[[Message, dict[str, Any]], str | None]) -> Render:
    """A :data:`Render` from a function rendering one assistant message with one tool."""
    return lambda calls, tool: render_turn(Message("assistant", "", tool_calls=tuple(calls)),
                                           tool)


# ------------------------------------------------------------------ a record's whitespace
Segment = tuple[str, str]
"""A stretch of a rendering: its part of the record ("s0" / "s1" the section's opening /
closing, "sep" the separator, "c<k>" the call's k-th piece, a literal; "" a slot's text)
and its text."""


def _segments(d: Dialect, calls: Sequence[ToolCall]) -> list[Segment]:
    out: list[Segment] = [("s0", d.section[0])] if d.section else []
    for i, call in enumerate(calls):
        if i:
            out.append(("sep", d.separator))
        for k, piece in enumerate(d.call):
            out.append((f"c{k}", piece) if isinstance(piece, str) else
                       ("", render_call(dataclasses.replace(d, call=(piece,)), call, i)))
    return [*out, ("s1", d.section[1])] if d.section else out


def _cores(segments: list[Segment], text: str) -> list[tuple[int, int] | None] | None:
    """Each segment's span in ``text`` from its first to its last non-space character (None
    for one that is all space), where the segments appear in ``text`` whitespace aside."""
    kept = [i for i, ch in enumerate(text) if not ch.isspace()]
    at = "".join(text[i] for i in kept).find("".join(_squash(s) for _, s in segments))
    if at < 0:
        return None
    spans: list[tuple[int, int] | None] = []
    for _, s in segments:
        n = len(_squash(s))
        spans.append((kept[at], kept[at + n - 1] + 1) if n else None)
        at += n
    return spans


def _spaced(segments: list[Segment], text: str) -> dict[str, str] | None:
    """Each literal part's text as ``text`` writes it: its core plus the space around it (a
    gap goes to an all-space literal in it, else to the literal it separates from a slot,
    else to the next literal unless the record's previous one ends with space; the space
    before the first part and after the last, which the text does not delimit, as the
    record writes it); None where the segments do not align or one part is written two
    ways."""
    spans = _cores(segments, text)
    if spans is None:
        return None
    got: dict[int, str] = {i: text[sp[0]:sp[1]] for i, sp in enumerate(spans) if sp}
    cores = [i for i, sp in enumerate(spans) if sp]
    for a, b in itertools.pairwise(cores):
        gap = text[spans[a][1]:spans[b][0]]  # type: ignore[index]
        empty = [i for i in range(a + 1, b) if segments[i][0]]
        if empty:
            got.update({i: "" for i in empty})
            got[empty[0]] = gap
        elif segments[a][0] and (not segments[b][0] or segments[a][1][-1:].isspace()):
            got[a] += gap  # where the record's own piece ends with space (", "), there
        elif segments[b][0]:
            got[b] = gap + got[b]
        elif gap:
            return None
    for i, (key, piece) in enumerate(segments):  # the edges: as the record writes them
        if key and (not cores or i < cores[0] or i > cores[-1]):
            got[i] = piece
    if cores and segments[cores[0]][0]:
        piece = segments[cores[0]][1]
        got[cores[0]] = piece[:len(piece) - len(piece.lstrip())] + got[cores[0]]
    if cores and segments[cores[-1]][0]:
        piece = segments[cores[-1]][1]
        got[cores[-1]] += piece[len(piece.rstrip()):]
    parts: dict[str, str] = {}
    for i, (key, _) in enumerate(segments):
        if key and parts.setdefault(key, got.get(i, "")) != got.get(i, ""):
            return None
    return parts


def respaced(d: Dialect, calls: Sequence[ToolCall], one: str, two: str | None) -> Dialect:
    """``d`` with the space the template writes in and around its markers, where the record
    matches the template's renderings (``one``: ``calls[:1]``'s, ``two``: ``calls``', or
    None) only with whitespace aside (Mistral 3's ``[TOOL_CALLS] [``, indentation a
    template leaks between DeepSeek's markers); ``d`` itself where it matches as written or
    the renderings do not say."""
    seps = (d.json_separators, (", ", ": "), (",", ":"))

    def writes(r: Dialect, some: Sequence[ToolCall], text: str) -> bool:
        return any(render_calls(dataclasses.replace(r, json_separators=s), some) in text
                   for s in seps)

    if writes(d, calls[:1], one):
        return d
    parts = _spaced(_segments(d, calls[:1]), one)
    if two is not None and d.max_calls != 1 and parts is not None:
        both = _spaced(_segments(d, calls), two)
        parts = both if both is not None and all(both[k] == v for k, v in parts.items()) \
            else None
    if parts is None:
        return d
    found = dataclasses.replace(
        d, call=tuple(parts[f"c{k}"] if isinstance(p, str) else p
                      for k, p in enumerate(d.call)),
        section=(parts["s0"], parts["s1"]) if d.section else d.section,
        separator=parts.get("sep", d.separator))
    both_written = two is None or d.max_calls == 1 or writes(found, calls, two)
    return found if writes(found, calls[:1], one) and both_written else d
