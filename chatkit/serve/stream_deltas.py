"""A reply with tools or a think block, streamed as it is written (``chatkit serve``).

The reply's raw text carries markup (tool calls in their dialect, a think block, text
before the calls). :class:`ReplyDeltas` reads it as it grows and gives OpenAI chat deltas:
``reasoning_content``, then ``content``, then ``tool_calls``: each call's id and name as
soon as they are written (the id fixed there), then its ``arguments`` in fragments (Hermes
and every JSON dialect as written; XML-like and Python ones a parameter at a time, as
JSON). The grammar guarantees that every prefix extends to a valid reply, so nothing is
held back but markup that may still be forming. :meth:`ReplyDeltas.finish` reconciles with
the parsed reply (what the stream has not said yet), so the deltas always add up to the
final message.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Any

from ..messages import Reply
from ..tools.definition import Tool
from ..tools.dialects import HERMES, Dialect
from ..tools.grammar import call_head
from ..tools.parser import (
    ScannedCall,
    gemma_args_so_far,
    py_args_so_far,
    scan_calls,
    scan_head,
    tree_args_so_far,
    xml_args_so_far,
)

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")

THINK_CLOSE = "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # Hermes, streamed in fragments
_HEAD = re.compile(r'\{\s*"name":\s*"((?:[^"\\]|\\.)*)",\s*"arguments":\s*(?=\S)')
"""A Hermes call up to its arguments' first character (the layout before them is not
theirs)."""


def _held(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the start of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _JsonEnd:
    """Finds where a compact JSON value ends, fed in pieces (the state is kept, so a long
    value costs one pass over its characters, not one per piece)."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped, self.seen = 0, False, False, False

    def feed(self, text: str) -> int | None:
        """The index in ``text`` just past the value's end; None: not ended yet."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif ch == '"':
                self.in_string, self.seen = True, True
            elif ch in "{[":
                self.depth, self.seen = self.depth + 1, True
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif self.depth == 0 and self.seen and ch in ",}\n":
                return i
            else:
                self.seen = True
        return None


class _DialectCalls:
    """A non-Hermes dialect's calls as they are written: a call's id and name once its name
    is written, then its arguments (JSON ones in fragments as written, XML-like and Python
    ones a parameter at a time), then the next call. ``calls`` is the reader's
    list of announced calls (shared)."""

    def __init__(self, reader: ReplyDeltas) -> None:
        self.r = reader
        self.cursor = 0  # where the next call begins (after the last one)

    def step(self) -> dict[str, Any] | None:
        """One delta ({}: progress without one), None: wait for more text."""
        r = self.r
        r.pos = len(r.text)
        current = r.calls[-1] if r.calls else None
        if current is None or current["closed"]:
            return self._next_head()
        if not current["ended"]:
            return self._next_arguments(current)
        done = self._done()
        if len(done) < len(r.calls) or not _complete(r.text[r.start:],
                                                     done[len(r.calls) - 1].end):
            return None
        current["closed"] = True
        self.cursor = r.start + done[len(r.calls) - 1].end
        return {}

    def _done(self) -> list[ScannedCall]:
        return scan_calls(self.r.text[self.r.start:], self.r.dialect, self.r.tool_list)

    def _next_head(self) -> dict[str, Any] | None:
        """The next call's id and name, once its name (and id) are written."""
        r = self.r
        index = len(r.calls)
        head = scan_head(r.text, self.cursor if index else r.start, r.dialect, r.tool_list,
                         index)
        if head is None:
            return None
        name, written, at = head
        ident = r.dialect.call_id(name, index, written) or f"call_{secrets.token_hex(12)}"
        r.calls.append({"id": ident, "name": name, "arguments": "", "ended": False,
                        "closed": False, "at": at, "scan": _JsonEnd()})
        return {"tool_calls": [{"index": index, "id": ident, "type": "function",
                                "function": {"name": name, "arguments": ""}}]}

    def _next_arguments(self, call: dict[str, Any]) -> dict[str, Any] | None:
        """More of the current call's arguments (None: nothing new yet)."""
        r = self.r
        kind = r.dialect.args.kind
        if kind == "json":
            rest = r.text[call["at"] + len(call["arguments"]):]
            end = call["scan"].feed(rest)
            fragment = rest if end is None else rest[:end]
            call["ended"] = end is not None
        else:
            done = self._done()
            index = len(r.calls) - 1
            if len(done) > index and _complete(r.text[r.start:], done[index].end):
                value = done[index].arguments
                text = json.dumps(value if isinstance(value, dict) else {},
                                  ensure_ascii=False)
                call["ended"] = True
            else:  # a parameter at a time
                tool = next(t for t in r.tool_list if t.name == call["name"])
                so_far = xml_args_so_far(r.text, call["at"], r.dialect, tool) \
                    if kind == "xml" else tree_args_so_far(r.text, call["at"], r.dialect, tool) \
                    if kind == "tree" else gemma_args_so_far(r.text, call["at"], r.dialect) \
                    if kind == "gemma" else py_args_so_far(r.text, call["at"], r.dialect)
                text = json.dumps(so_far, ensure_ascii=False)[:-1] if so_far else ""
            fragment = text[len(call["arguments"]):] if text.startswith(call["arguments"]) \
                else ""
        if not fragment:
            return {} if call["ended"] else None
        call["arguments"] += fragment
        return {"tool_calls": [{"index": len(r.calls) - 1,
                                "function": {"arguments": fragment}}]}


class _HermesCalls:
    """Hermes calls as they are written: ``<tool_call>``, the name (the call announced with
    its id), the arguments in fragments as written, ``</tool_call>``; then the next call.
    ``calls`` is the reader's list of announced calls (shared)."""

    def __init__(self, reader: ReplyDeltas) -> None:
        self.r = reader

    def step(self, rest: str) -> dict[str, Any] | None:
        """One delta ({}: progress without one), None: wait for more text."""
        r = self.r
        current = r.calls[-1] if r.calls else None
        if current is not None and not current["ended"]:
            return self._arguments(current, rest)
        if current is not None and not current["closed"]:
            # the body object's end, then the markup (its line break optional)
            squashed = rest.replace("\n", "")
            closing = f"}}{CALL_CLOSE}"
            if len(squashed) < len(closing) and closing.startswith(squashed):
                return None
            end = rest.find(CALL_CLOSE)
            r.pos += end + len(CALL_CLOSE) if end >= 0 else len(rest)
            current["closed"] = True
            return {}
        body = rest.lstrip()  # layout before a call (the grammar allows a line break or two)
        skip = len(rest) - len(body)
        if len(body) < len(CALL_OPEN) + 1 and f"{CALL_OPEN}\n".startswith(body):
            return None
        if not body.startswith(CALL_OPEN):  # the grammar allows nothing else: finish() says it
            r.pos = len(r.text)
            return {}
        after = len(CALL_OPEN) + (1 if body[len(CALL_OPEN):].startswith("\n") else 0)
        head = _HEAD.match(body, after)
        if head is None:
            return None  # the name is still being written
        r.pos += skip + head.end()
        call = {"id": f"call_{secrets.token_hex(12)}", "name": json.loads(f'"{head.group(1)}"'),
                "arguments": "", "ended": False, "closed": False, "scan": _JsonEnd()}
        r.calls.append(call)
        return {"tool_calls": [{"index": len(r.calls) - 1, "id": call["id"],
                                "type": "function",
                                "function": {"name": call["name"], "arguments": ""}}]}

    def _arguments(self, call: dict[str, Any], rest: str) -> dict[str, Any] | None:
        r = self.r
        end = call["scan"].feed(rest)
        fragment = rest if end is None else rest[:end]
        call["ended"] = end is not None
        r.pos += len(fragment)
        if not fragment:
            return {} if call["ended"] else None
        call["arguments"] += fragment
        return {"tool_calls": [{"index": len(r.calls) - 1,
                                "function": {"arguments": fragment}}]}


def _complete(body: str, end: int) -> bool:
    """A scanned call is complete when more text follows it (a separator, the section's
    end): the last call of the reply is said by ``finish``."""
    return len(body.rstrip()) > end


class ReplyDeltas:
    """Incremental OpenAI deltas for one held reply (``thinking``: it opens with a think
    block; ``tools``: it may be ``<tool_call>`` blocks)."""

    def __init__(self, *, thinking: bool, tools: bool, dialect: Dialect | None = None,
                 tool_list: tuple[Tool, ...] = (), think_open: str = "",
                 think_close: str = THINK_CLOSE) -> None:
        """``thinking``: the reply begins inside a think block; ``think_open``: it may open
        one with this markup (a tool turn's optional think block); ``think_close``: the
        block's closing markup."""
        self.tools = tools
        self.dialect = dialect or HERMES
        self.hermes = self.dialect.name == HERMES.name
        self.tool_list = tool_list
        self.head = call_head(self.dialect) if tools else ""
        """The calls' markup word: text before it is content, the calls begin at it."""
        self.start = 0  # where the calls begin (other dialects)
        self.think_open = think_open.strip()
        self.think_close = think_close.strip() or THINK_CLOSE
        self.phase = "think" if thinking else "open" if self.think_open else "body"
        self.text = ""
        self.pos = 0
        self.reasoning = ""
        self.content = ""
        self.calls: list[dict[str, Any]] = []
        """Per announced call: id, name, the arguments streamed, whether they ended."""
        self.mode: str | None = None
        """"content", "calls", or "said" (text in ``text_lead`` markup, calls may follow),
        once the body shows which."""
        self.lead_at = 0  # where the body's first markup begins
        self.dialect_calls = _DialectCalls(self)
        self.hermes_calls = _HermesCalls(self)

    def feed(self, delta: str) -> list[dict[str, Any]]:
        """The deltas ``delta`` (more raw text) makes certain."""
        self.text += delta
        out: list[dict[str, Any]] = []
        while True:
            step = self._step()
            if step is None:
                return out
            if step:
                out.append(step)

    def _step(self) -> dict[str, Any] | None:
        """One delta ({} when something was consumed without one), None: wait for more."""
        rest = self.text[self.pos:]
        if not rest:
            return None
        if self.phase != "body":
            return self._think_step(rest)
        if self.mode is None:
            return self._choose(rest)
        if self.mode == "content" and self.dialect.text_json:
            self.pos = len(self.text)  # a JSON string: said whole by finish()
            return None
        if self.mode == "said":
            return self._said_then_calls(rest)
        if self.mode == "content" and self.head and not self.dialect.text_close:
            return self._content_then_calls(rest)
        if self.mode == "content":
            close = self.dialect.text_close
            keep = _held(rest, close) if close else 0
            if close and close in rest:
                rest, keep = rest[: rest.index(close)], 0
                self.pos = len(self.text)
            else:
                self.pos += len(rest) - keep
                rest = rest[: len(rest) - keep]
            if not rest:
                return None
            self.content += rest
            return {"content": rest}
        if not self.hermes:
            return self.dialect_calls.step()
        return self.hermes_calls.step(rest)

    def _think_step(self, rest: str) -> dict[str, Any] | None:
        """A step before the body: an optional think block's opening, its text, the layout
        after it."""
        if self.phase == "open":  # an optional think block
            probe = rest.lstrip()
            if len(probe) < len(self.think_open) and self.think_open.startswith(probe):
                return None
            if probe.startswith(self.think_open):
                self.pos += len(rest) - len(probe) + len(self.think_open)
                self.phase = "think"
            else:
                self.phase = "body"
            return {}
        if self.phase == "think":
            end = rest.find(self.think_close)
            if end >= 0:
                self.pos += end + len(self.think_close)
                self.phase = "gap"
                return self._reasoning(rest[:end])
            safe = len(rest) - _held(rest, self.think_close)
            if safe <= 0:
                return None
            self.pos += safe
            return self._reasoning(rest[:safe])
        # the gap: the "\n\n" after the think block (its close again, too)
        if rest[0] == "\n":
            self.pos += 1
            return {}
        if rest.startswith(self.think_close):
            self.pos += len(self.think_close)
            return {}
        if self.think_close.startswith(rest):
            return None  # may be the close again, still forming
        self.phase = "body"
        return {}

    def _content_then_calls(self, rest: str) -> dict[str, Any] | None:
        """Content up to the calls' markup word (held back while it may be forming); the
        calls from there."""
        at = rest.find(self.head)
        if at >= 0:
            self.mode = "calls"
            self.pos += at
            self.start = self.pos
            text = rest[:at].rstrip() if not self.content else rest[:at]
            if not text.strip() and not self.content:
                return {}
            self.content += text
            return {"content": text} if text else {}
        keep = _held(rest, self.head)
        if len(rest) == keep:
            return None
        text = rest[: len(rest) - keep]
        self.pos += len(text)
        if not self.content:
            text = text.lstrip()
            if not text:
                return {}
        self.content += text
        return {"content": text}

    def _said_then_calls(self, rest: str) -> dict[str, Any] | None:
        """Text inside the dialect's ``text_lead`` markup, up to its closing markup (held
        back while it may be forming); then the calls: the lead is cut from the raw text
        and the calls' section opening it wrote put back, so the calls read as written
        alone."""
        assert self.dialect.text_lead is not None
        open_, close = self.dialect.text_lead
        at = rest.find(close)
        if at >= 0:
            said = rest[:at]
            section = self.dialect.section[0] if self.dialect.section else ""
            restored = section if section.startswith(open_ + close) else ""
            self.text = self.text[:self.lead_at] + restored + rest[at + len(close):]
            self.pos = self.start = self.lead_at
            self.mode = "calls"
        else:
            keep = _held(rest, close)
            said = rest[: len(rest) - keep]
            self.pos += len(said)
        if not self.content:
            said = said.lstrip()
        if not said:
            return {} if at >= 0 else None
        self.content += said
        return {"content": said}

    def _choose(self, rest: str) -> dict[str, Any] | None:
        """Content or calls, once the body's start says which (None: not yet)."""
        d = self.dialect
        opening = (CALL_OPEN if self.hermes else d.trigger).strip()
        text_open = d.text_open
        probe = rest.lstrip()
        if not probe:
            return None
        lead = d.text_lead[0] if d.text_lead and self.tools else ""
        markers = sorted(((opening, "calls"), (lead, "said"), (text_open.lstrip(), "content")),
                         key=lambda m: -len(m[0]))  # ATEM's text ' to=user' before ' to='
        for marker, mode in markers:
            if (not self.tools and mode == "calls") or not marker:
                continue
            if marker.startswith(probe[: len(marker)]):
                if len(probe) < len(marker):
                    return None  # could still be the marker
                self.mode = mode
                self.lead_at = self.pos + len(rest) - len(probe)
                if mode != "calls":
                    self.pos += len(rest) - len(probe) + len(marker)
                self.start = self.pos
                return {}
        if self.tools and not opening and not self.hermes:
            self.mode = "calls"  # calls open with the tool's name (text with text_open)
        else:
            self.mode = "content"
        self.start = self.pos
        return {}

    def _reasoning(self, text: str) -> dict[str, Any]:
        if not text:
            return {}
        self.reasoning += text
        return {"reasoning_content": text}

    def finish(self, reply: Reply[Any]) -> list[dict[str, Any]]:
        """What the stream has not said of the parsed ``reply`` yet."""
        out: list[dict[str, Any]] = []
        if reply.reasoning and reply.reasoning.startswith(self.reasoning) \
                and reply.reasoning != self.reasoning:
            out.append({"reasoning_content": reply.reasoning[len(self.reasoning):]})
        if reply.text and reply.text.startswith(self.content) and reply.text != self.content:
            out.append({"content": reply.text[len(self.content):]})
        for k, call in enumerate(reply.tool_calls):
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            if k >= len(self.calls):
                out.append({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                            "function": {"name": call.name,
                                                         "arguments": arguments}}]})
            elif not self.calls[k]["ended"]:
                streamed = self.calls[k]["arguments"]
                missing = arguments[len(streamed):] if arguments.startswith(streamed) else ""
                if missing:
                    out.append({"tool_calls": [{"index": k,
                                                "function": {"arguments": missing}}]})
        return out


def read_cut(deltas: ReplyDeltas, text: str) -> tuple[str, str, list[dict[str, Any]]]:
    """A reply cut at ``max_tokens`` read through its markup (the markup itself never
    becomes text): its reasoning, its content and the calls written to their end, each
    ``{"id", "name", "arguments"}`` (a call cut before its arguments were whole is left
    out, logged). ``deltas`` must not have been fed yet."""
    deltas.feed(text)
    whole = [c for c in deltas.calls if c["ended"]]
    if len(whole) < len(deltas.calls):
        _log.info("a reply cut at max_tokens inside a tool call: the unfinished call is "
                  "left out")
    return deltas.reasoning, deltas.content, [
        {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in whole]

