"""Typed partial streaming: a schema reply's object as it is written.

The grammar guarantees that the committed text is always a prefix of a document the
schema accepts, so reading it needs no repair: :class:`PartialReader` keeps the values
that are complete (a closed string, object or array; a number followed by a delimiter;
``true``/``false``/``null``) and the containers that are open, with their complete
members. A value that is complete never changes afterwards, and a snapshot only ever
gains members, so nothing flickers. Events name each value by its JSON pointer when it
starts and when it completes (with its final value).

Tool calls stream the same way: each ``<tool_call>`` block's JSON under
``/tool_calls/N`` (its ``name`` complete first, then ``arguments`` growing). A thinking
reply's think text is not read; its answer is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from ..messages import JSON
from ..tools.dialects import HERMES, Dialect
from ..tools.parser import scan_calls

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # Hermes: read as it is written

__all__ = ["FieldEvent", "Partial"]

T = TypeVar("T")
_DELIMITERS = ",]} \t\r\n"


@dataclass(frozen=True)
class FieldEvent:
    """A value of the reply started or completed."""

    kind: Literal["start", "complete"]
    path: str
    """Its JSON pointer (``""`` the whole document; ``/tool_calls/0/arguments/x`` in a call)."""
    value: JSON = None
    """The final value (``complete`` events only)."""


@dataclass(frozen=True)
class Partial(Generic[T]):
    """One step of a streamed schema reply."""

    delta: str
    """The text this step added."""
    data: JSON
    """The document so far: complete values, open containers with their complete members
    (a value being written is absent until it completes). None before it opens."""
    events: tuple[FieldEvent, ...] = ()
    """What started and completed in this step, in document order."""
    object: T | None = None
    """For a Pydantic schema: an instance built without validation
    (``model_construct``) from the top-level fields complete so far, each validated
    alone; fields not complete yet are unset (their defaults)."""
    done: bool = False
    """The last step: the reply is complete."""


def _before_close(block: str) -> str:
    """A call block's JSON: the text before ``</tool_call>`` or before what may be its
    beginning."""
    body = block.split(CALL_CLOSE, 1)[0]
    for k in range(len(CALL_CLOSE) - 1, 0, -1):
        if body.endswith(CALL_CLOSE[:k]):
            body = body[:-k]
            break
    return body.strip()


def _may_repeat(body: str, closed: list[str], *, done: bool) -> bool:
    """Whether a call block may still turn out to repeat an earlier call of the reply,
    which the turn drops (``emit.DEDUP_TOOL_CALLS``): held back until it differs."""
    from . import emit

    if not emit.DEDUP_TOOL_CALLS:
        return False
    if done:
        return emit.same_call(body, closed)
    return any(c.startswith(body) for c in closed)


class _Value:
    """A parsed prefix of one JSON value."""

    __slots__ = ("complete", "end", "value")

    def __init__(self, value: Any, end: int, complete: bool) -> None:
        self.value, self.end, self.complete = value, end, complete


class _Prefix:
    """Reads a prefix of a JSON document: which values are complete, which started."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.started: list[str] = []
        self.completed: dict[str, Any] = {}

    def _ws(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in " \t\r\n":
            i += 1
        return i

    def value(self, i: int, path: str) -> _Value | None:
        i = self._ws(i)
        if i >= len(self.text):
            return None
        self.started.append(path)
        c = self.text[i]
        if c in "{[":
            return self._container(i, path)
        if c == '"':
            end = self._string_end(i)
            if end is None:
                return _Value(None, len(self.text), False)
            return self._done(path, json.loads(self.text[i:end]), end)
        end = i
        while end < len(self.text) and self.text[end] not in _DELIMITERS:
            end += 1
        word = self.text[i:end]
        if end < len(self.text) or word in ("true", "false", "null"):
            return self._done(path, json.loads(word), end)
        return _Value(None, end, False)

    def _done(self, path: str, value: Any, end: int) -> _Value:
        self.completed[path] = value
        return _Value(value, end, True)

    def _container(self, i: int, path: str) -> _Value:
        is_obj = self.text[i] == "{"
        out: Any = {} if is_obj else []
        i = self._ws(i + 1)
        while i < len(self.text):
            if self.text[i] in "}]":
                return self._done(path, out, i + 1)
            if self.text[i] == ",":
                i = self._ws(i + 1)
                continue
            if is_obj:
                key_end = self._string_end(i)
                if key_end is None:
                    break
                key = json.loads(self.text[i:key_end])
                i = self._ws(self._ws(key_end) + 1)  # past ':'
                child_path = f"{path}/{key.replace('~', '~0').replace('/', '~1')}"
            else:
                child_path = f"{path}/{len(out)}"
            child = self.value(i, child_path)
            if child is None:
                break
            if child.complete or isinstance(child.value, dict | list):
                if is_obj:
                    out[key] = child.value
                else:
                    out.append(child.value)
            if not child.complete:
                break
            i = self._ws(child.end)
        return _Value(out, len(self.text), False)

    def _string_end(self, i: int) -> int | None:
        j = i + 1
        while j < len(self.text):
            if self.text[j] == "\\":
                j += 2
                continue
            if self.text[j] == '"':
                return j + 1
            j += 1
        return None


@dataclass
class PartialReader(Generic[T]):
    """Feeds a schema (or tool-call) reply's text deltas; each :meth:`feed` is a
    :class:`Partial`. ``model``: the Pydantic class of ``schema=`` (for ``object``).

    Cost: each step re-reads the reply so far (quadratic in the reply's length)."""

    model: Any = None
    tools: bool = False
    thinking: bool = False
    dialect: Dialect | None = None
    """With tools: their dialect. Hermes calls are read as they are written; other
    dialects' calls appear as each completes."""
    tool_list: tuple[Any, ...] = ()
    text: str = ""
    _started: set[str] = field(default_factory=set)
    _completed: set[str] = field(default_factory=set)
    _adapters: dict[str, Any] = field(default_factory=dict)

    def feed(self, delta: str, *, done: bool = False, answer: str | None = None
             ) -> Partial[T]:
        """The step ``delta`` makes; ``done`` for the last (``answer``: the reply's final
        text, for a thinking reply whose think block closes without ``</think>``)."""
        self.text += delta
        data, prefix = self._read(done, answer)
        events = [FieldEvent("start", p) for p in prefix.started if p not in self._started]
        events += [FieldEvent("complete", p, v) for p, v in prefix.completed.items()
                   if p not in self._completed]
        self._started.update(e.path for e in events if e.kind == "start")
        self._completed.update(e.path for e in events if e.kind == "complete")
        return Partial(delta, data, tuple(events), self._object(data, prefix), done)

    def _read(self, done: bool, answer: str | None) -> tuple[Any, _Prefix]:
        end = " " if done else ""  # the end of the reply ends a number too
        if not self.tools:
            body: str | None = self.text
            if answer is not None:
                body = answer
            elif self.thinking:
                body = self.text.split("</think>", 1)[1] if "</think>" in self.text else None
            prefix = _Prefix((body or "") + end)
            parsed = prefix.value(0, "") if body is not None else None
            return (parsed.value if parsed is not None else None), prefix
        if self.dialect is not None and self.dialect.name != HERMES.name:
            return self._scanned()
        prefix = _Prefix("")
        calls: list[Any] = []
        closed: list[str] = []
        for block in self.text.split(CALL_OPEN)[1:]:
            body = _before_close(block)
            if _may_repeat(body, closed, done=CALL_CLOSE in block):
                continue  # a call repeating an earlier one verbatim ends the reply unseen
            if CALL_CLOSE in block:
                closed.append(body)
            one = _Prefix(body + end)
            parsed = one.value(0, f"/tool_calls/{len(calls)}")
            prefix.started += one.started
            prefix.completed.update(one.completed)
            if parsed is not None:
                calls.append(parsed.value)
        return {"tool_calls": calls}, prefix

    def _scanned(self) -> tuple[Any, _Prefix]:
        assert self.dialect is not None
        prefix = _Prefix("")
        calls = []
        for i, sc in enumerate(scan_calls(self.text, self.dialect, self.tool_list)):
            call = {"name": sc.name, "arguments": sc.arguments}
            prefix.started.append(f"/tool_calls/{i}")
            prefix.completed[f"/tool_calls/{i}"] = call
            calls.append(call)
        return {"tool_calls": calls}, prefix

    def _object(self, data: Any, prefix: _Prefix) -> T | None:
        model = self.model
        if model is None or not isinstance(data, dict) or not hasattr(model, "model_construct"):
            return None
        from pydantic import TypeAdapter

        fields = model.model_fields
        done = {}
        for name, value in data.items():
            info = fields.get(name)
            if info is not None and f"/{name}" in prefix.completed:
                if name not in self._adapters:
                    self._adapters[name] = TypeAdapter(info.annotation)
                done[name] = self._adapters[name].validate_python(value)
        return model.model_construct(**done)  # type: ignore[no-any-return]
