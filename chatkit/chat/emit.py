"""A turn's text as its tokens come: UTF-8 pieces, stop strings held back, a repeated
tool call dropped."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence

from ..engine.protocols import IncrementalDetokenizer, Vocabulary
from ..tools.definition import Tool
from ..tools.dialects import Dialect
from ..tools.grammar import call_head
from ..tools.parser import scan_calls, starts_calls

__all__: list[str] = []

_log = logging.getLogger("chatkit")

DEDUP_TOOL_CALLS = True
"""End a reply at a tool call identical to an earlier one of the same reply (see
:meth:`TextEmitter.feed`)."""


class TextEmitter:
    """Turns a reply's token ids into text deltas.

    Text that may be the start of a stop string is withheld until it is not; a stop
    string (or, with ``tools``, a call repeating an earlier one of the reply) cuts the
    text and sets ``cut``: the turn ends there. With a ``dialect``, stop strings apply to
    the text before the calls' markup only (a call is never cut). ``text`` is the reply
    so far.
    """

    def __init__(self, engine: Vocabulary, stop_strings: Sequence[str], *,
                 tools: Sequence[Tool] = (), dialect: Dialect | None = None) -> None:
        self._detok = IncrementalDetokenizer(engine)
        self.stops = tuple(stop_strings)
        self.tools = tuple(tools)
        self.dialect = dialect
        last = dialect.call[-1] if dialect is not None else ""
        self._call_end = last.strip() if isinstance(last, str) else ""
        self.text = ""
        self.cut = False
        """A stop string (or a repeated tool call) ended the text."""
        self.stop_hit: str | None = None
        """The stop string that ended the text."""
        self.dropped_calls = 0
        self._held = ""  # text withheld while it may be the start of a stop string
        self._head = call_head(dialect) if dialect is not None else ""
        self._in_calls = False

    def feed(self, tok: int) -> str:
        """The delta a sampled token adds (maybe empty: held back or an unfinished
        character); check ``cut`` afterwards."""
        delta = self._detok.feed(tok)
        self.text += delta
        if (self._call_end and DEDUP_TOOL_CALLS and delta  # a call's end just written
                and self._call_end in self.text[-(len(delta) + len(self._call_end)):]):
            self._drop_repeated_call()
        if not self.stops or self._in_calls:
            return delta
        if self.dialect is not None and self._calls_begin():  # stops end text, not calls
            self._in_calls = True
            pending, self._held = self._held + delta, ""
            return pending
        for s in self.stops:
            cut = self.text.find(s)
            if cut >= 0:
                emitted = len(self.text) - len(delta) - len(self._held)
                self.text = self.text[:cut]
                self.cut = True
                self.stop_hit = s
                self._held = ""
                return self.text[emitted:]
        pending = self._held + delta
        keep = _stop_prefix_len(pending, self.stops)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def _calls_begin(self) -> bool:
        """Whether the calls' markup has begun in the text so far."""
        assert self.dialect is not None
        if self._head:
            return self._head in self.text
        # calls open the reply: once its start could be their opening, no stop applies
        so_far = re.sub(r"\s+", "", self.text)
        trigger = re.sub(r"\s+", "", self.dialect.trigger)
        return starts_calls(self.text, self.dialect) or (
            bool(so_far) and trigger.startswith(so_far))

    def _drop_repeated_call(self) -> None:
        """A greedy model repeats a finished call until the parallel cap: when the call just
        closed is identical to an earlier one of this reply, the reply ends before it (the
        grammar accepts there: calls then the stop token) and ``dropped_calls`` counts it."""
        assert self.dialect is not None
        calls = scan_calls(self.text, self.dialect, self.tools)
        if len(calls) < 2:  # (a multi-byte marker may complete with the next one's start)
            return
        last = calls[-1]
        if not any((c.name, c.arguments) == (last.name, last.arguments) for c in calls[:-1]):
            return
        close = self.dialect.section[1] if self.dialect.section else ""
        self.text = self.text[: calls[-2].end] + close
        self.dropped_calls += 1
        self.cut = True
        _log.info("tool call repeated verbatim in one reply: dropped, reply ended")

    def flush(self) -> str:
        """Text withheld at the end (a partial stop string, an unfinished character)."""
        tail = self._held
        self._held = ""
        if not self.cut:
            rest = self._detok.flush()
            self.text += rest
            tail += rest
        return tail


def same_call(body: str, earlier: list[str]) -> bool:
    """Whether a call block's JSON ``body`` repeats one of ``earlier`` (as JSON values)."""
    def norm(text: str) -> str:
        try:
            return json.dumps(json.loads(text), sort_keys=True)
        except ValueError:
            return text

    target = norm(body)
    return any(norm(b) == target for b in earlier)


def _stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
