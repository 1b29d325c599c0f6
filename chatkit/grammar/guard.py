"""Value checks while decoding (:class:`Guard`): the other half of
:mod:`chatkit.grammar.value_checks`.

The grammar (relaxed) keeps the committed text a prefix of a JSON document, so a small
incremental scanner over the committed bytes knows where each value starts and ends, and
its JSON pointer. When a token would complete a value that has a check (a string's
closing quote, a number's delimiter, an array's ``]``, an object's ``}``, the stop token
after a root number), the value is checked first; a token that would complete a failing
value is masked like a token the grammar forbids. Where the mask then leaves nothing, the
guard picks a rollback: back to the latest value start inside the failing value, that
token banned at that position, and decoding resumes from there (the decode loop drops the
tokens and their KV cells). Rollbacks per reply are bounded (``Checks.budget``); past the
budget the reply fails with ``ChecksExhausted``, never with an unchecked success.

Cost: nothing when the schema has no checks (no guard). With checks, each committed token
is scanned (incrementally, no reparse); a mask is filtered only while a checked value is open or
could start, and only the tokens the grammar allows that contain ``"``, ``,``, ``]`` or
``}`` are simulated (plus the stop token).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..engine.protocols import Vocabulary
from ..errors import ChecksExhausted
from .schema_walk import escape
from .value_checks import Checks, matches_from_root

__all__: list[str] = []


class Rollback(Exception):
    """Raised by a processor's ``process`` (nothing selected, nothing committed): it has
    undone its last ``drop`` commits, and the decode loop drops those tokens too and
    samples again from the row after the tokens kept (this module: a value check left no
    valid token)."""

    def __init__(self, drop: int) -> None:
        super().__init__(f"roll back {drop} tokens")
        self.drop = drop


# Frame fields: [kind, path, start, state, key, count]
KIND, PATH, START, STATE, KEY, COUNT = range(6)
OBJ, ARR = 0, 1
FIRST, KEYS, COLON, VALUE, COMMA = range(5)
# Open scalar: [kind, start, escaped, key bytes, path]
STR, KEYSTR, WORD = 0, 1, 2

_QUOTE, _BS, _COLON, _COMMA = ord('"'), ord("\\"), ord(":"), ord(",")
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = ord("{"), ord("}"), ord("["), ord("]")
_WS = frozenset(b" \t\r\n")
_DELIMS = frozenset(b",]} \t\r\n")
_CLOSERS = b'",]}'
STUCK_STEPS = 16
"""Tokens an open string (a value or a key) may grow after an end of it was refused by its
checks (a ``format`` or a relaxed ``pattern`` the text so far cannot meet, the model
writing on instead) before the guard rolls it back to its start, instead of letting it
run to ``max_tokens``."""

Path = tuple[str | int, ...]
Done = tuple[Path, int, int, Path | None, int]
"""A completed value: path, start, end (byte offsets), its parent array's path and start
(None, -1: not in an array); or a completed key: its object's path, start, end, None,
``KEY_DONE``."""
KEY_DONE = -2


class Scan:
    """Where a prefix of a JSON document is: open containers and the open scalar."""

    __slots__ = ("done", "scalar", "stack")

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []
        self.scalar: list[Any] | None = None
        self.done = False

    def copy(self) -> Scan:
        other = Scan()
        other.stack = [f[:] for f in self.stack]
        sc = self.scalar
        if sc is not None:
            other.scalar = [sc[0], sc[1], sc[2], bytearray(sc[3]) if sc[3] is not None
                            else None, sc[4]]
        other.done = self.done
        return other

    def open_paths(self) -> list[Path]:
        paths = [f[PATH] for f in self.stack]
        if self.scalar is not None and self.scalar[0] != KEYSTR:
            paths.append(self.scalar[4])
        return paths

    def next_path(self) -> Path | None:
        """The path of the value that starts next at this level (None: none can)."""
        if not self.stack:
            return None if self.done else ()
        top = self.stack[-1]
        if top[KIND] == ARR:
            return (*top[PATH], top[COUNT])
        return (*top[PATH], top[KEY]) if top[STATE] == VALUE else top[PATH]

    def feed(self, data: bytes, base: int, starts: list[int] | None, done: list[Done]
             ) -> None:
        """Scan ``data`` (at byte offset ``base``): value starts into ``starts``,
        completed values into ``done``."""
        for j, c in enumerate(data):
            sc = self.scalar
            if sc is not None:
                if sc[0] != WORD:
                    if sc[2]:
                        sc[2] = False
                    elif c == _BS:
                        sc[2] = True
                    elif c == _QUOTE:
                        self.scalar = None
                        if sc[0] == KEYSTR:
                            top = self.stack[-1]
                            top[KEY] = json.loads(b'"' + bytes(sc[3]) + b'"')
                            top[STATE] = COLON
                            done.append((top[PATH], sc[1], base + j + 1, None, KEY_DONE))
                        else:
                            self._complete(sc[4], sc[1], base + j + 1, done)
                        continue
                    if sc[0] == KEYSTR:
                        sc[3].append(c)
                    continue
                if c not in _DELIMS:
                    continue
                self.scalar = None
                self._complete(sc[4], sc[1], base + j, done)
            if c in _WS:
                continue
            self._structural(c, base + j, starts, done)

    def _structural(self, c: int, i: int, starts: list[int] | None, done: list[Done]) -> None:
        if not self.stack:
            if not self.done:
                self._start(c, i, (), starts)
            return
        top = self.stack[-1]
        state = top[STATE]
        if top[KIND] == OBJ:
            if state in (FIRST, KEYS) and c == _QUOTE:
                self.scalar = [KEYSTR, i, False, bytearray(), None]
                if starts is not None:  # a key is a rollback target too (propertyNames)
                    starts.append(i)
            elif state in (FIRST, COMMA) and c == _RBRACE:
                self._close(i, done)
            elif state == COLON and c == _COLON:
                top[STATE] = VALUE
            elif state == VALUE:
                self._start(c, i, (*top[PATH], top[KEY]), starts)
            elif state == COMMA and c == _COMMA:
                top[STATE] = KEYS
            return
        if (state == FIRST and c == _RBRACKET) or (state == COMMA and c == _RBRACKET):
            self._close(i, done)
        elif state == COMMA:
            if c == _COMMA:
                top[STATE] = VALUE
        else:
            self._start(c, i, (*top[PATH], top[COUNT]), starts)

    def _start(self, c: int, i: int, path: Path, starts: list[int] | None) -> None:
        if starts is not None:
            starts.append(i)
        if c == _LBRACE:
            self.stack.append([OBJ, path, i, FIRST, None, 0])
        elif c == _LBRACKET:
            self.stack.append([ARR, path, i, FIRST, None, 0])
        elif c == _QUOTE:
            self.scalar = [STR, i, False, None, path]
        else:
            self.scalar = [WORD, i, False, None, path]

    def _close(self, i: int, done: list[Done]) -> None:
        frame = self.stack.pop()
        self._complete(frame[PATH], frame[START], i + 1, done)

    def _complete(self, path: Path, start: int, end: int, done: list[Done]) -> None:
        parent = self.stack[-1] if self.stack else None
        if parent is None:
            self.done = True
            done.append((path, start, end, None, -1))
            return
        parent[STATE] = COMMA
        parent[COUNT] += 1
        if parent[KIND] == ARR:
            done.append((path, start, end, parent[PATH], parent[START]))
        else:
            done.append((path, start, end, None, -1))

    def end(self, base: int, done: list[Done]) -> None:
        """The document ends here (the stop token): a root number or literal completes."""
        sc = self.scalar
        if sc is not None and sc[0] == WORD:
            self.scalar = None
            self._complete(sc[4], sc[1], base, done)


class Guard:
    """One stream's value checks: the scan of its committed tokens, the bans rollbacks
    left, and the rollback count (``Constraint`` drives it)."""

    def __init__(self, checks: Checks, vocab: Vocabulary, stop_token: int,
                 captures: Callable[[], list[tuple[str, bytes]]] | None = None) -> None:
        self.checks = checks
        self.vocab = vocab
        self.stop_token = stop_token
        self.captures = captures
        """The grammar's captures so far (``Checks.after_think``: where the think block
        ends)."""
        self.closers, self.is_closer = closer_tokens(vocab)
        quotes = [int(t) for t in self.closers if vocab.token_bytes(int(t)) == b'"']
        self.quote = quotes[0] if quotes else -1
        """The token of a lone ``"`` (-1: none), to ask whether an open string could end."""
        self.reset()

    def reset(self) -> None:
        self.text = bytearray()
        self.scan = Scan()
        self.tokens: list[int] = []
        self.choices: list[bool] = []  # per token: the grammar left a choice there
        self.offsets: list[int] = []  # each committed token's first byte
        self.starts: list[int] = []  # every value's first byte, in order
        self.saved: list[tuple[Scan, int, int]] = []  # before each token: scan,
        # len(starts), json_from
        self.json_from = -1 if self.checks.after_think else 0
        """Where the document starts in the text (-1: not yet, after a think block)."""
        self.bans: dict[int, set[int]] = {}
        self.rollbacks = 0
        self.floor = -1  # the failing value's start, for rollbacks after bans ran out
        self.refused_end = (-1, 0)  # an open string whose end was refused: its start,
        # and the tokens committed then
        self.armed = self._armed()

    # ------------------------------------------------------------ following
    def commit(self, token: int, *, choice: bool = True) -> None:
        """``token`` was committed; ``choice``: the grammar allowed others there (a
        rollback bans tokens only where there was a choice)."""
        if token == self.stop_token:
            return
        self.saved.append((self.scan.copy(), len(self.starts), self.json_from))
        self.offsets.append(len(self.text))
        self.tokens.append(token)
        self.choices.append(choice)
        data = self.vocab.token_bytes(token)
        base = len(self.text)
        self.text += data
        if self.json_from < 0:  # after a think block: skip to the document's start
            self.json_from = self._document_start()
            if self.json_from < 0:
                return
            data, base = bytes(self.text[self.json_from:]), self.json_from
        self.scan.feed(data, base, self.starts, [])
        self.armed = self._armed()

    def _document_start(self) -> int:
        """Where the document starts after the think block (its capture, then the close
        ending in a blank line), -1 while it has not."""
        think = dict(self.captures()).get("think") if self.captures is not None else None
        if think is None:
            return -1
        end = self.text.find(b"\n\n", len(think))
        return -1 if end < 0 else end + 2

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` commits."""
        if n <= 0:
            return
        keep = len(self.tokens) - n
        self.scan, n_starts, self.json_from = self.saved[keep]
        del self.saved[keep:]
        del self.starts[n_starts:]
        del self.text[self.offsets[keep]:]
        del self.offsets[keep:]
        del self.tokens[keep:]
        del self.choices[keep:]
        for pos in [p for p in self.bans if p > keep]:
            del self.bans[pos]
        if self.refused_end[1] > keep:
            self.refused_end = (-1, 0)
        self.armed = self._armed()

    def _armed(self) -> bool:
        """A check may fire at the next token: on an open value, or on one that may start
        (and end) within it."""
        scan = self.scan
        paths = scan.open_paths()
        nxt = scan.next_path()
        for check in self.checks.checks:
            if any(check.matches(p) for p in paths):
                return True
            if nxt is not None and matches_from_root(check.pattern, nxt):
                return True
        return False

    # ------------------------------------------------------------- checking
    def allows(self, token: int) -> bool:
        """Whether the checks let ``token`` through now (the grammar allows it)."""
        banned = self.bans.get(len(self.tokens))
        if banned and token in banned:
            return False
        if not self.armed or self.json_from < 0:
            return True
        if self._runaway():
            return False  # the mask's path rolls it back
        if token == self.stop_token:
            return self._passes(None) is None
        if not self.is_closer[token]:
            return True
        return self._passes(token) is None

    def _refused(self, start: int | None) -> None:
        """A token that would end the value starting at ``start`` was refused: when that
        is the open string, the runaway count starts (once per string)."""
        sc = self.scan.scalar
        if start is not None and sc is not None and sc[0] != WORD and sc[1] == start \
                and self.refused_end[0] != start:
            self.refused_end = (start, len(self.tokens))

    def _grown(self) -> bool:
        """The open string has grown ``STUCK_STEPS`` tokens since an end of it was
        refused."""
        sc = self.scan.scalar
        return (sc is not None and sc[0] != WORD and sc[1] == self.refused_end[0]
                and len(self.tokens) - self.refused_end[1] > STUCK_STEPS)

    def _runaway(self) -> bool:
        """:meth:`_grown`, and ending it here would still fail its checks (pure)."""
        return self._grown() and (self.quote < 0 or self._passes(self.quote) is not None)

    def filter(self, logits: NDArray[np.float32],
               roll_back: Callable[[int], None] | None) -> None:
        """Mask (in ``logits``, already grammar-masked) what the checks refuse. When nothing
        is left: ``roll_back(n)`` (the constraint's, which rolls this guard back too), that
        token banned where decoding resumes, and ``Rollback(n)`` raised for the decode loop;
        nothing when no rollback is needed or this guard can make none. ``roll_back=None``:
        mask only (a branch explored without decoding it: ``chatkit.grammar.choices``)."""
        drop = self._drop(logits, plan=roll_back is not None)
        if drop and roll_back is not None:
            banned = self.tokens[-drop]
            roll_back(drop)
            self.bans.setdefault(len(self.tokens), set()).add(banned)
            raise Rollback(drop)

    def _drop(self, logits: NDArray[np.float32], *, plan: bool = True) -> int:
        """:meth:`filter`'s masking; the tokens to drop (0: none)."""
        banned = self.bans.get(len(self.tokens))
        if banned:
            logits[list(banned)] = -np.inf
        failed: list[int] = []
        if self.armed and self.json_from >= 0:
            ids = self.closers[logits[self.closers] > -np.inf]
            for tok in ids.tolist():
                start = self._passes(int(tok))
                if start is not None:
                    logits[tok] = -np.inf
                    failed.append(start)
            stop = self.stop_token
            if 0 <= stop < logits.shape[0] and logits[stop] > -np.inf:
                start = self._passes(None)
                if start is not None:
                    logits[stop] = -np.inf
                    failed.append(start)
        sc = self.scan.scalar
        for start in failed:
            self._refused(start)
        runaway = self._runaway()
        if not runaway and sc is not None and self._grown():
            self.refused_end = (sc[1], len(self.tokens))  # it could end well now: count anew
        if runaway and sc is not None:
            failed.append(sc[1])  # a string that may never end well: from its start
        if not plan or (not runaway
                        and (not (banned or failed) or logits.max() > -np.inf)):
            return 0
        self.refused_end = (-1, 0)
        return self._roll_back_point(failed)

    def _passes(self, token: int | None) -> int | None:
        """None when every value ``token`` (None: the stop token) would complete passes its
        checks, else the start of the innermost failing value."""
        scan = self.scan.copy()
        done: list[Done] = []
        data = b"" if token is None else self.vocab.token_bytes(token)
        if token is None:
            scan.end(len(self.text), done)
        else:
            scan.feed(data, len(self.text), None, done)
        if not done:
            return None
        full: bytes | None = None
        failing = -1
        for path, start, end, parent, parent_start in done:
            if parent_start == KEY_DONE:
                names = [c.names for c in self.checks.at(path) if c.names is not None]
                if names:
                    full = bytes(self.text) + data if full is None else full
                    if not all(self.checks.name_passes(n, full[start:end]) for n in names):
                        failing = max(failing, start)
                continue
            checks = self.checks.at(path)
            uniques = [c for c in self.checks.at(parent) if c.unique] if parent is not None \
                else []
            if not checks and not uniques:
                continue
            if full is None:
                full = bytes(self.text) + data
            value = full[start:end]
            if any(not self.checks.passes(c, value) for c in checks):
                failing = max(failing, start)
            elif uniques and not self.checks.unique_so_far(full[parent_start:end]):
                failing = max(failing, parent_start)
        return None if failing < 0 else failing

    def _roll_back_point(self, failed: list[int]) -> int:
        """Tokens to drop so decoding resumes at the latest value start inside the failing
        value (that token banned there); ``ChecksExhausted`` when none is left or the budget
        is spent."""
        n = len(self.tokens)
        if failed:
            self.floor = max(failed)
        elif self.floor < 0:
            return 0  # nothing this guard masked: the grammar's own dead end
        if self.floor >= len(self.text):  # the failing value starts in the token (or did,
            open_starts = [f[START] for f in self.scan.stack]  # before a rollback)
            if self.scan.scalar is not None:
                open_starts.append(self.scan.scalar[1])
            self.floor = max(open_starts, default=0)
        target = -1
        for start in reversed(self.starts):
            if start < self.floor:
                break
            t = max(0, bisect.bisect_right(self.offsets, start) - 1)
            while t < n and not self.choices[t]:  # forced there: the same token comes back
                t += 1
            if t < n:
                target = t
                break
        if target < 0 or self.rollbacks >= self.checks.budget:
            raise _exhausted(self)
        self.rollbacks += 1
        return n - target

    def stable(self) -> int:
        """Committed tokens no rollback can take back: all of them once the document is
        complete, else none (a rollback may reach any value start)."""
        return len(self.tokens) if self.scan.done and self.scan.scalar is None else 0


def _exhausted(guard: Guard) -> ChecksExhausted:
    """The error of a guard whose rollbacks ran out (or found no value start to go back to)."""
    path = _pointer_at(guard.scan, guard.floor)
    checks = guard.checks
    where = [c for c in checks.checks if c.matches(path)] if path is not None else []
    keywords = where[0].keywords if where else checks.keywords
    return ChecksExhausted(guard.text.decode("utf-8", "replace"), keywords,
                           "" if path is None else "".join(f"/{escape(str(p))}"
                                                           for p in path),
                           guard.rollbacks)


def chosen(matcher: Any, data: bytes) -> bool:
    """Whether a token of bytes ``data`` was a choice for ``matcher`` (llguidance's): not
    wholly inside the bytes the grammar forces next (another token there would write the
    same bytes)."""
    forced = bytes(matcher.compute_ff_bytes())
    return not forced or not forced.startswith(data)


def _pointer_at(scan: Scan, start: int) -> Path | None:
    """The path of the open value starting at byte ``start``."""
    for f in scan.stack:
        if f[START] == start:
            return tuple(f[PATH])
    if scan.scalar is not None and scan.scalar[1] == start:
        return tuple(scan.scalar[4])
    return None


def closer_tokens(vocab: Vocabulary) -> tuple[NDArray[np.intp], NDArray[np.bool_]]:
    """The ids whose bytes contain ``"``, ``,``, ``]`` or ``}`` (the tokens that can
    complete a value), and the same as a per-id flag; cached on the model."""
    def build() -> tuple[NDArray[np.intp], NDArray[np.bool_]]:
        flags = np.zeros(vocab.n_vocab, dtype=np.bool_)
        for t in range(vocab.n_vocab):
            data = vocab.token_bytes(t)
            if any(b in data for b in _CLOSERS):
                flags[t] = True
        return np.flatnonzero(flags), flags

    cache = getattr(vocab, "cache", None)
    if callable(cache):
        return cache(("guard", "closers"), build)  # type: ignore[no-any-return]
    return build()
