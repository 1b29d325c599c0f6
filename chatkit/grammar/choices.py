"""Exact choice probabilities: for a field whose allowed values the grammar enumerates,
``P(value | prompt, the reply before it)`` under the grammar, from the model's rows.

A value's probability is the product, along a token path that spells it, of the masked
and renormalised token probabilities at the temperature in force (1 when greedy: the
probability of a greedy "decision" is that of the model's distribution), summed over
every path that spells it ("approve" as one token or as "app" + "rove"). The paths are
enumerated depth first from the token where the value starts, on a scratch KV sequence
(the conversation's own sequence is never touched): one forward pass per expanded
branch token, plus the prefix (copied with a unified KV cache, else evaluated). Paths
whose probability falls below ``prune`` are not expanded; their mass is ``unaccounted``.
Penalties and top-k / top-p / min-p truncation are not applied (the distribution is the
one ``TokenLogprob`` reports).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..engine.protocols import SeqChunk, StepEngine
from ..errors import InvalidParameter
from ..messages import ChoiceProbabilities
from .constraints import Constraint

__all__: list[str] = []

MAX_INTEGER_RANGE = 64
"""An integer field is enumerable when its ``minimum``..``maximum`` range is this small."""
PRUNE = 1e-6
"""Paths less probable than this are not expanded (their mass is reported as
``unaccounted``)."""
_NUMBER_CHARS = b"0123456789.eE+-"


def enumerable_fields(doc: Any) -> dict[str, list[Any]]:
    """JSON pointer -> allowed values, for every field of ``doc`` (a JSON schema) whose
    values are an ``enum``, a ``const``, a boolean or a small integer range (nested objects
    followed; local ``$ref`` resolved; ``""`` when the whole document is one)."""
    out: dict[str, list[Any]] = {}
    _walk(doc, doc, "", out, depth=0)
    return out


def _resolve(root: Any, node: Any) -> Any:
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and seen < 32:
        ref = node["$ref"]
        if not ref.startswith("#/"):
            return node
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) \
                if isinstance(target, dict) else None
        node, seen = target, seen + 1
    return node


def _values(node: dict[str, Any]) -> list[Any] | None:
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    if "const" in node:
        return [node["const"]]
    kind = node.get("type")
    if kind == "boolean":
        return [True, False]
    lo, hi = node.get("minimum"), node.get("maximum")
    if kind == "integer" and isinstance(lo, int) and isinstance(hi, int) \
            and 0 <= hi - lo < MAX_INTEGER_RANGE:
        return list(range(lo, hi + 1))
    return None


def _walk(root: Any, node: Any, path: str, out: dict[str, list[Any]], *, depth: int) -> None:
    node = _resolve(root, node)
    if not isinstance(node, dict) or depth > 32:
        return
    values = _values(node)
    if values is not None:
        out[path] = values
        return
    for name, sub in (node.get("properties") or {}).items():
        _walk(root, sub, f"{path}/{name.replace('~', '~0').replace('/', '~1')}", out,
              depth=depth + 1)


def value_spans(text: bytes) -> dict[str, tuple[int, int]]:
    """JSON pointer -> (start, end) byte offsets of every value in a JSON document."""
    spans: dict[str, tuple[int, int]] = {}
    _Spans(text, spans).value(0, "")
    return spans


class _Spans:
    def __init__(self, text: bytes, out: dict[str, tuple[int, int]]) -> None:
        self.text, self.out = text, out

    def _ws(self, i: int) -> int:
        while i < len(self.text) and self.text[i] in b" \t\r\n":
            i += 1
        return i

    def value(self, i: int, path: str) -> int:
        i = self._ws(i)
        start, c = i, self.text[i:i + 1]
        if c == b"{":
            i = self._ws(i + 1)
            while self.text[i:i + 1] != b"}":
                key_end = self._string(i)
                key = json.loads(self.text[i:key_end])
                i = self._ws(self._ws(key_end) + 1)  # past ':'
                i = self._ws(self.value(i, f"{path}/{_escape(key)}"))
                if self.text[i:i + 1] == b",":
                    i = self._ws(i + 1)
            end = i + 1
        elif c == b"[":
            i, n = self._ws(i + 1), 0
            while self.text[i:i + 1] != b"]":
                i = self._ws(self.value(i, f"{path}/{n}"))
                n += 1
                if self.text[i:i + 1] == b",":
                    i = self._ws(i + 1)
            end = i + 1
        elif c == b'"':
            end = self._string(i)
        else:
            end = i
            while end < len(self.text) and self.text[end] not in b",]} \t\r\n":
                end += 1
        self.out[path] = (start, end)
        return end

    def _string(self, i: int) -> int:
        i += 1
        while self.text[i:i + 1] != b'"':
            i += 2 if self.text[i:i + 1] == b"\\" else 1
        return i + 1


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@dataclass
class Branching:
    """What branching needs: the engine, the turn's KV sequence (it holds the prompt and
    the reply), the tokens, the turn's grammar (cloned, never advanced) and the
    temperature."""

    engine: StepEngine
    seq: int
    prompt: Sequence[int]
    reply: Sequence[int]
    constraint: Constraint
    temperature: float = 1.0
    prune: float = PRUNE
    passes: int = field(default=0, init=False)

    def pieces(self) -> list[bytes]:
        """Each reply token's bytes."""
        return [self.engine.token_bytes(tok) for tok in self.reply]


def choice_probabilities(b: Branching, schema: Any, answer: str, answer_start: int, *,
                         fields: bool | Sequence[str]) -> dict[str, ChoiceProbabilities]:
    """The distributions of the enumerable fields of ``answer`` (the reply's JSON, at
    byte offset ``answer_start`` of the reply's text). ``fields``: True for every
    enumerable field, or the JSON pointers wanted (one that is not enumerable is
    ``InvalidParameter``)."""
    candidates = enumerable_fields(schema)
    wanted = list(candidates) if fields is True else list(fields or ())
    for path in wanted:
        if path not in candidates:
            raise InvalidParameter("probabilities", f"{path!r} is not a field whose values "
                                   f"the schema enumerates ({', '.join(candidates) or 'none'})")
    spans = value_spans(answer.encode())
    pieces = b.pieces()
    text = b"".join(pieces)
    offsets = [0, *itertools.accumulate(len(p) for p in pieces)][:-1]
    out: dict[str, ChoiceProbabilities] = {}
    for path in wanted:
        if path not in spans:
            continue  # an optional field the reply left out
        start, end = spans[path]
        out[path] = _distribution(b, path, candidates[path], text, offsets,
                                  answer_start + start, json.loads(answer.encode()[start:end]))
    return out


def _distribution(b: Branching, path: str, values: list[Any], text: bytes,
                  offsets: list[int], value_start: int, chosen: Any) -> ChoiceProbabilities:
    k = max(i for i, at in enumerate(offsets) if at <= value_start)
    connector = text[offsets[k]:value_start]
    encodings = [(v, json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode())
                 for v in values]
    grammar = b.constraint.clone()
    grammar.prefetch = False
    grammar.rolls_back = False  # value checks mask; a branch is explored, not decoded
    for tok in b.reply[:k]:
        grammar.commit(tok)
    engine, passes_before = b.engine, b.passes
    probs: dict[Any, float] = {v: 0.0 for v in values}
    lost = [0.0]
    scratch, _ = engine.acquire_seq(-(id(b) & 0x7FFFFFFF) - 1, None)
    try:
        with engine.lock:
            row = _fork(b, scratch, len(b.prompt) + k)
            for value, p in _explore(b, grammar, scratch, len(b.prompt) + k, row, b"",
                                     connector, encodings, 1.0, lost):
                probs[value] += p
            engine.seq_rm(scratch, 0, -1)
    finally:
        engine.release_seq(scratch)
    return ChoiceProbabilities(path, probs, chosen, unaccounted=max(0.0, lost[0]),
                               forward_passes=b.passes - passes_before,
                               temperature=b.temperature)


def _fork(b: Branching, scratch: int, pos: int) -> NDArray[np.float32]:
    """The scratch sequence holding the ``pos`` tokens before the branch; the row there."""
    full = [*b.prompt, *b.reply]
    engine = b.engine
    engine.seq_rm(scratch, 0, -1)
    if engine.kv_unified and pos > 1:
        engine.seq_cp(b.seq, scratch, 0, pos - 1)
        rows = engine.decode([SeqChunk(scratch, pos - 1, [full[pos - 1]], "last")])
        return np.array(rows[0][0])
    return np.array(engine.prefill(scratch, full[:pos], 0))


def _explore(b: Branching, grammar: Constraint, seq: int, pos: int, row: Any, spelled: bytes,
             connector: bytes, encodings: list[tuple[Any, bytes]], p_path: float,
             lost: list[float]) -> Iterator[tuple[Any, float]]:
    """(value, probability) of every path from here (depth first, one forward pass per
    expanded token)."""
    z = row.astype(np.float32) / np.float32(b.temperature)
    grammar.process(z, ())
    z64 = z.astype(np.float64)
    top = float(z64.max())
    if not math.isfinite(top):
        return
    logp = z64 - (top + math.log(float(np.exp(z64 - top).sum())))
    for tok in np.flatnonzero(np.isfinite(logp)):
        p = p_path * math.exp(float(logp[tok]))
        text = spelled + b.engine.token_bytes(int(tok))
        value = _resolved(text, connector, encodings)
        if value is not _OPEN:
            yield value, p
            continue
        if p < b.prune:
            lost[0] += p
            continue
        grammar.commit(int(tok))
        nxt = b.engine.decode([SeqChunk(seq, pos, [int(tok)], "last")])[0][0].copy()
        b.passes += 1
        yield from _explore(b, grammar, seq, pos + 1, nxt, text, connector, encodings, p, lost)
        grammar.rollback(1)
        b.engine.seq_rm(seq, pos, -1)


_OPEN = object()


def _resolved(text: bytes, connector: bytes, encodings: list[tuple[Any, bytes]]) -> Any:
    """The value ``text`` (connector + value + what follows) spells, or ``_OPEN`` while
    it may still spell several."""
    if len(text) <= len(connector):
        return _OPEN
    spelled = text[len(connector):]
    for value, enc in encodings:
        if not spelled.startswith(enc):
            continue
        numeric = not enc.startswith((b'"', b"t", b"f", b"n"))
        if not numeric or (len(spelled) > len(enc) and spelled[len(enc)] not in _NUMBER_CHARS):
            return value
    return _OPEN
