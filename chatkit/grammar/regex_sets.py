"""Lookarounds that anchor a whole value, said as a plain regex the grammar compiles.

The Rust regex engine llguidance compiles patterns with has no lookarounds. A lookahead at
a pattern's start (``^(?!ab)[a-z]{3}$``, ``^(?=.*\\d).{8,}$``) or a lookbehind right before
its end (``^[a-z]+(?<!-)$``) says something about the whole value, though: the value's
language is the intersection of the main pattern's with each lookaround's (or its
complement's). :func:`without_lookarounds` builds each as a small DFA over the pattern's
character classes, intersects them and writes the product back as a regex without
lookarounds (state elimination), so the first character the model writes already obeys.
Lookarounds elsewhere, backreferences, flags and patterns whose automaton outgrows
:data:`MAX_STATES` are left to the value check (None).

Character classes read as ECMA-262 (JSON Schema's regex dialect) reads them: ``.`` is any
character but a line terminator, ``\\d`` is ``[0-9]``, ``\\w`` is ``[A-Za-z0-9_]``, ``\\s``
is ECMA-262's white space and line terminators; ``$`` is the end of the value.
"""

from __future__ import annotations

import bisect
import functools
import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

__all__: list[str] = []

MAX_STATES = 256
"""Largest automaton (NFA states, or DFA states of the product) translated; past it the
pattern stays a value check."""
MAX_LENGTH = 20_000
"""Longest regex written back; past it the pattern stays a value check."""
MAX_REPEAT = 64
"""Largest bounded repeat count unrolled (``{0,64}``)."""

TOP = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]
"""A character set: sorted, disjoint, inclusive code point ranges."""

_SPACE: Ranges = ((9, 13), (32, 32), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                  (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
                  (0xFEFF, 0xFEFF))
_DIGIT: Ranges = ((48, 57),)
_WORD: Ranges = ((48, 57), (65, 90), (95, 95), (97, 122))
_LINE_ENDS: Ranges = ((10, 10), (13, 13), (0x2028, 0x2029))


class Unsupported(Exception):
    """The pattern uses something this module does not translate (it stays a check)."""


def _union(*sets: Ranges) -> Ranges:
    spans = sorted(r for s in sets for r in s)
    out: list[tuple[int, int]] = []
    for lo, hi in spans:
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(s: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in s:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= TOP:
        out.append((at, TOP))
    return tuple(out)


_CATEGORIES = {sre.CATEGORY_DIGIT: _DIGIT, sre.CATEGORY_WORD: _WORD,
               sre.CATEGORY_SPACE: _SPACE, sre.CATEGORY_NOT_DIGIT: _complement(_DIGIT),
               sre.CATEGORY_NOT_WORD: _complement(_WORD),
               sre.CATEGORY_NOT_SPACE: _complement(_SPACE)}


def _class(items: list[tuple[Any, Any]]) -> Ranges:
    """The set an ``IN`` node's items name."""
    negate = bool(items) and items[0][0] is sre.NEGATE
    parts: list[Ranges] = []
    for op, av in items[1:] if negate else items:
        if op is sre.LITERAL:
            parts.append(((av, av),))
        elif op is sre.RANGE:
            parts.append(((av[0], av[1]),))
        elif op is sre.CATEGORY and av in _CATEGORIES:
            parts.append(_CATEGORIES[av])
        else:
            raise Unsupported(str(op))
    s = _union(*parts)
    return _complement(s) if negate else s


# ------------------------------------------------------------------ NFA (Thompson)
class _NFA:
    def __init__(self) -> None:
        self.edges: list[list[tuple[Ranges, int]]] = []
        self.eps: list[list[int]] = []

    def state(self) -> int:
        if len(self.edges) >= MAX_STATES * 4:
            raise Unsupported("too many states")
        self.edges.append([])
        self.eps.append([])
        return len(self.edges) - 1

    def chars(self, s: Ranges) -> tuple[int, int]:
        a, b = self.state(), self.state()
        self.edges[a].append((s, b))
        return a, b

    def seq(self, items: Any) -> tuple[int, int]:
        start = end = self.state()
        for op, av in items:
            a, b = self.node(op, av)
            self.eps[end].append(a)
            end = b
        return start, end

    def node(self, op: Any, av: Any) -> tuple[int, int]:
        if op is sre.LITERAL:
            return self.chars(((av, av),))
        if op is sre.NOT_LITERAL:
            return self.chars(_complement(((av, av),)))
        if op is sre.ANY:
            return self.chars(_complement(_LINE_ENDS))
        if op is sre.IN:
            return self.chars(_class(av))
        if op is sre.SUBPATTERN:
            if av[1] or av[2]:  # flags set or cleared inside the group
                raise Unsupported("group flags")
            return self.seq(av[3])
        if op is sre.BRANCH:
            a, b = self.state(), self.state()
            for branch in av[1]:
                s, e = self.seq(branch)
                self.eps[a].append(s)
                self.eps[e].append(b)
            return a, b
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):  # lazy or greedy: the same language
            return self.repeat(*av)
        raise Unsupported(str(op))  # anchors, lookarounds, backreferences inside

    def repeat(self, low: int, high: int, items: Any) -> tuple[int, int]:
        unbounded = high is sre.MAXREPEAT
        if low > MAX_REPEAT or (not unbounded and high > MAX_REPEAT):
            raise Unsupported("repeat count")
        start = end = self.state()
        for _ in range(low):
            s, e = self.seq(items)
            self.eps[end].append(s)
            end = e
        if unbounded:
            s, e = self.seq(items)
            self.eps[end].append(s)
            self.eps[e].append(s)
            tail = self.state()
            self.eps[end].append(tail)
            self.eps[e].append(tail)
            return start, tail
        tail = self.state()
        for _ in range(high - low):
            s, e = self.seq(items)
            self.eps[end].append(s)
            self.eps[end].append(tail)
            end = e
        self.eps[end].append(tail)
        return start, tail


def _anything(nfa: _NFA) -> tuple[int, int]:
    a = nfa.state()
    nfa.edges[a].append((((0, TOP),), a))
    return a, a


def _language(items: Any, head: bool, tail: bool) -> _NFA:
    """An NFA for ``items`` as a whole-value language: ``head``/``tail``: any text may come
    before / after (state 0 starts, state 1 accepts)."""
    nfa = _NFA()
    start, accept = nfa.state(), nfa.state()
    parts = [_anything(nfa)] if head else []
    parts.append(nfa.seq(items))
    if tail:
        parts.append(_anything(nfa))
    at = start
    for s, e in parts:
        nfa.eps[at].append(s)
        at = e
    nfa.eps[at].append(accept)
    return nfa


# ------------------------------------------------------------------ DFA
class _DFA:
    """A complete DFA over the alphabet's classes (state 0 starts)."""

    def __init__(self, nfa: _NFA, cuts: list[int], negate: bool) -> None:
        self.moves: list[list[int]] = []
        self.accept: list[bool] = []
        ids: dict[frozenset[int], int] = {}
        classes = len(cuts)

        def closure(states: set[int]) -> frozenset[int]:
            todo, seen = list(states), set(states)
            while todo:
                for nxt in nfa.eps[todo.pop()]:
                    if nxt not in seen:
                        seen.add(nxt)
                        todo.append(nxt)
            return frozenset(seen)

        def add(states: frozenset[int]) -> int:
            if states not in ids:
                if len(ids) >= MAX_STATES:
                    raise Unsupported("too many DFA states")
                ids[states] = len(ids)
                self.moves.append([])
                self.accept.append((1 in states) != negate)
                order.append(states)
            return ids[states]

        order: list[frozenset[int]] = []
        add(closure({0}))
        i = 0
        while i < len(order):
            states = order[i]
            targets: list[set[int]] = [set() for _ in range(classes)]
            for st in states:
                for ranges, nxt in nfa.edges[st]:
                    for k in _classes_of(ranges, cuts):
                        targets[k].add(nxt)
            self.moves[i] = [add(closure(t)) for t in targets]
            i += 1


def _classes_of(ranges: Ranges, cuts: list[int]) -> range | list[int]:
    """The alphabet classes (``cuts``: each class's first code point) ``ranges`` covers."""
    out: list[int] = []
    for lo, hi in ranges:
        out.extend(range(bisect.bisect_right(cuts, lo) - 1, bisect.bisect_right(cuts, hi)))
    return out


def _cuts(nfas: list[_NFA]) -> list[int]:
    points = {0}
    for nfa in nfas:
        for edges in nfa.edges:
            for ranges, _ in edges:
                for lo, hi in ranges:
                    points.add(lo)
                    if hi < TOP:
                        points.add(hi + 1)
    return sorted(points)


def _product(dfas: list[_DFA], classes: int) -> tuple[list[dict[int, list[int]]], list[bool]]:
    """The intersection's reachable states: per state, target -> classes; accepting flags.
    States that cannot reach an accepting one are dropped."""
    ids: dict[tuple[int, ...], int] = {}
    order: list[tuple[int, ...]] = []

    def add(key: tuple[int, ...]) -> int:
        if key not in ids:
            if len(ids) >= MAX_STATES:
                raise Unsupported("too many product states")
            ids[key] = len(ids)
            order.append(key)
        return ids[key]

    add(tuple(0 for _ in dfas))
    moves: list[list[int]] = []
    i = 0
    while i < len(order):
        key = order[i]
        moves.append([add(tuple(d.moves[s][k] for d, s in zip(dfas, key, strict=True)))
                      for k in range(classes)])
        i += 1
    accept = [all(d.accept[s] for d, s in zip(dfas, key, strict=True)) for key in order]
    live = {i for i, a in enumerate(accept) if a}
    grew = True
    while grew:
        grew = False
        for i, row in enumerate(moves):
            if i not in live and any(t in live for t in row):
                live.add(i)
                grew = True
    edges: list[dict[int, list[int]]] = []
    for i, row in enumerate(moves):
        out: dict[int, list[int]] = {}
        if i in live:
            for k, t in enumerate(row):
                if t in live:
                    out.setdefault(t, []).append(k)
        edges.append(out)
    if 0 not in live:
        raise Unsupported("empty language")
    return edges, accept


# ------------------------------------------------------------------ back to a regex
def _char(c: int) -> str:
    ch = chr(c)
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{c:x}}}"


def _class_regex(ks: list[int], cuts: list[int]) -> str:
    spans = _union(*(((cuts[k], (cuts[k + 1] - 1) if k + 1 < len(cuts) else TOP),)
                     for k in ks))
    if len(spans) == 1 and spans[0][0] == spans[0][1]:
        return _char(spans[0][0])
    body = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in spans)
    return f"[{body}]"


def _alt(a: str | None, b: str | None) -> str | None:
    if a is None or a == b:
        return b
    if b is None:
        return a
    return f"(?:{a}|{b})"


def _star(a: str | None) -> str:
    return "" if not a else f"(?:{a})*"


def _to_regex(edges: list[dict[int, list[int]]], accept: list[bool], cuts: list[int]) -> str:
    """State elimination: a regex for the DFA's language."""
    n = len(edges)
    start, final = n, n + 1
    r: dict[int, dict[int, str]] = {i: {} for i in range(n + 2)}
    for i, out in enumerate(edges):
        for t, ks in out.items():
            r[i][t] = _class_regex(ks, cuts)
        if accept[i]:
            r[i][final] = ""
    r[start][0] = ""
    remaining = set(range(n))
    while remaining:
        k = min(remaining, key=lambda s: sum(1 for i in r if s in r[i]) * len(r[s]))
        remaining.discard(k)
        loop = _star(r[k].pop(k, None))
        into = [i for i in r if k in r[i] and i != k]
        for i in into:
            head = r[i].pop(k)
            for j, tail in r[k].items():
                r[i][j] = _alt(r[i].get(j), f"{head}{loop}{tail}")  # type: ignore[assignment]
        del r[k]
        for i in r:
            r[i].pop(k, None)
        if sum(len(v) for row in r.values() for v in row.values()) > MAX_LENGTH * 4:
            raise Unsupported("regex too long")
    if final not in r[start]:
        raise Unsupported("empty language")
    return r[start][final]


# ------------------------------------------------------------------ the pattern
@functools.lru_cache(maxsize=256)
def without_lookarounds(pattern: str) -> str | None:
    """``pattern`` without its lookarounds, as a regex for the same set of values
    (anchored: ``^...$``), or None: it has none, or they are not at the value's edges, or
    it is past this module's limits (see the module docstring). Cached: the 256 most
    recently asked patterns."""
    if "(?" not in pattern:
        return None
    try:
        parsed = sre_parse.parse(pattern)
        if parsed.state.flags & ~sre.SRE_FLAG_UNICODE:  # (?i), (?s), (?x)...: not read here
            return None
        return _translate(list(parsed))
    except (Unsupported, re.error, RecursionError, ValueError, OverflowError):
        return None  # re's own parse errors included: the check (and its error) decides


def _translate(items: list[Any]) -> str | None:
    head = not (items and items[0][0] is sre.AT and items[0][1] in _BEGIN)
    tail = not (items and items[-1][0] is sre.AT and items[-1][1] in _END)
    body = items[(0 if head else 1):(len(items) if tail else -1)]
    aheads: list[tuple[bool, Any]] = []
    while body and body[0][0] in _ASSERTS and body[0][1][0] == 1:
        aheads.append((body[0][0] is sre.ASSERT_NOT, body[0][1][1]))
        body = body[1:]
    behinds: list[tuple[bool, Any]] = []
    while body and body[-1][0] in _ASSERTS and body[-1][1][0] == -1:
        behinds.append((body[-1][0] is sre.ASSERT_NOT, body[-1][1][1]))
        body = body[:-1]
    if not (aheads or behinds) or (aheads and head) or (behinds and tail):
        return None
    parts: list[tuple[_NFA, bool]] = [(_language(body, head, tail), False)]
    for negate, sub in aheads:
        sub = list(sub)
        ends = bool(sub) and sub[-1][0] is sre.AT and sub[-1][1] in _END
        parts.append((_language(sub[:-1] if ends else sub, False, not ends), negate))
    for negate, sub in behinds:
        sub = list(sub)
        begins = bool(sub) and sub[0][0] is sre.AT and sub[0][1] in _BEGIN
        parts.append((_language(sub[1:] if begins else sub, not begins, False), negate))
    cuts = _cuts([nfa for nfa, _ in parts])
    dfas = [_DFA(nfa, cuts, negate) for nfa, negate in parts]
    edges, accept = _product(dfas, len(cuts))
    regex = _to_regex(edges, accept, cuts)
    return None if len(regex) > MAX_LENGTH else f"^(?:{regex})$"


_BEGIN = (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING)
_END = (sre.AT_END, sre.AT_END_STRING)
_ASSERTS = (sre.ASSERT, sre.ASSERT_NOT)
