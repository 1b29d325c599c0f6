"""``Constraint``: an llguidance grammar as a ``LogitProcessor``.

JSON Schema (a dict, JSON text or a Pydantic model), regex or Lark; compiled
and refused (by name) before the first token, then bound to a ``Model``:
the llguidance tokenizer is built from the model's vocabulary once per model
and stop token (its cost grows with the vocabulary) and cached on the model.
llguidance itself is imported where it is used, not with this module: ``Model.load``
imports it while llama.cpp loads the weights (``import chatkit`` comes before the load;
the figures are in docs/benchmarks.md, "Cold start").

Masks cover the model's whole vocabulary: ids llama.cpp marks unused or
undefined (padding) are permanently forbidden, control tokens are never
allowed inside grammar text (llguidance's 0xFF special marker), and once the
grammar completes only the configured stop token remains.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from ..engine.coldstart import bare_import
from ..engine.protocols import Vocabulary
from ..errors import ConstraintError, GrammarInvalid, InvalidParameter, SchemaInvalid
from ..messages import JSONObject
from . import slices
from .guard import Guard, chosen
from .limits import native_limits
from .masks import Prepared, apply_prepared, bit_set, mask_words, prepare_bitmask, valid_prefix
from .schema import (
    NUMBER_DIGITS,
    Digits,
    LoadedSchema,
    SchemaInput,
    SchemaReader,
    Whitespace,
    compile_json_schema,
    grammar_problem,
    json_grammar,
    load_schema,
    matcher_problem,
    schema_refusal,
)
from .slices import wants_slices as wants_slices
from .value_checks import Checks, UnknownFormats, compile_relaxed

__all__ = ["Constraint"]

ConstraintKind = Literal["json_schema", "regex", "lark"]

MAX_REPEAT = 10_000
"""Largest counted repetition (``a{n}``, ``a{n,m}``) a regex may use."""
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


class GrammarSteps:
    """A bound grammar's steps: masks (prefetched after each commit when a core is free),
    ``allows``, ``commit``, ``rollback``, ``reset`` and the state queries, with the value
    checks' guard when the schema has checks. :class:`Constraint` builds and binds it."""

    model: Vocabulary | None
    stop_token: int
    prefetch: bool | None
    check_first: bool
    _initial: Any
    _matcher: Any
    _mask: NDArray[np.int32]
    _static: NDArray[np.int32]
    _next: _NextMask
    _forced: int | None
    _spare_core: bool
    _guard: Guard | None
    _slice_demand: list[int] | None
    _tokens: list[int]
    grammar: str
    _hidden_stops: bool
    rolls_back: bool
    kind: ConstraintKind
    source: str | JSONObject | bool

    def _live(self) -> Any:
        """The matcher, after any in-flight mask computation has finished with it."""
        if self._matcher is None:
            raise InvalidParameter("constraint", "not bound to a model: call bind(model) first")
        self._next.settle()
        return self._matcher

    def _fill(self) -> NDArray[np.int32] | None:
        """The current state's mask words, padding cleared (None: matcher in error)."""
        return mask_words(self._matcher, self._mask, self._static)

    def _compute(self) -> Prepared | None:
        """Mask for the current state, ready to apply (None when the matcher is in error)."""
        words = self._fill()
        if words is None:
            return None
        assert self.model is not None
        if self._slice_demand is not None:
            self._slice_demand[0] += 1
        return prepare_bitmask(words, self.model.n_vocab)

    def _failure(self, message: str) -> Exception:
        """A matcher error mid-reply: past llguidance's limits (lexer, parser items), the
        grammar's fault, named as at its first token (``GrammarInvalid`` / the schema's
        refusal); anything else ``ConstraintError``."""
        if any(needle in message.split("\n", 1)[0] for needle in _LIMIT_ERRORS):
            return _matcher_refusal(self.kind, self.source,
                                    f"past llguidance's limits during the reply: {message}")
        return ConstraintError(message)

    def _schedule(self) -> None:
        """A new grammar state (bind, commit, reset): forget per-state results."""
        self._forced = None
        prefetch = self._spare_core if self.prefetch is None else self.prefetch
        self._next.forget(self._compute if prefetch else None)

    # --------------------------------------------------------- LogitProcessor
    def process(self, logits: NDArray[np.float32], history: Sequence[int]) -> None:
        """Set every token the grammar forbids to -inf, in place: the mask prefetched since
        the last commit when there is one, else computed now."""
        m = self._live()
        prepared = self._next.take(self._compute)
        if prepared is None or m.is_error():
            raise self._failure(m.get_error() or "grammar matcher error")
        apply_prepared(logits, prepared)
        if self._guard is not None:  # may roll back: raises Rollback
            self._guard.filter(logits, self.rollback if self.rolls_back else None)

    def allows(self, token: int) -> bool:
        """Whether the mask :meth:`process` would apply now lets ``token`` through (pure).

        One llguidance ``validate_tokens`` call instead of a full mask: greedy selection
        asks this about the unmasked argmax first (``check_first``).
        """
        m = self._live()
        if not bit_set(self._static, token):
            return False  # padding ids, or not a token id
        guard = self._guard
        if guard is not None and not guard.allows(token):
            return False
        if token == self.stop_token:  # validate_tokens never takes the EOS; the mask does
            return bool(m.is_accepting())
        if self._forced is None:
            ff = m.compute_ff_tokens() if m.compute_ff_bytes() else None
            self._forced = -1 if ff is None else (ff[0] if ff else -2)
            if self._forced >= 0 and m.validate_tokens([self._forced]) != 1:
                # the forced text's tokenization is not what the bytes need (SentencePiece
                # reads U+2581 in DeepSeek's markers as a space): the mask decides
                self._forced = -2
        if self._forced != -1:
            # Forced bytes: the mask admits their canonical tokenization, a subset of what
            # validate_tokens accepts. Say yes to its first token only; else the mask decides.
            return token == self._forced
        return bool(m.validate_tokens([token]) == 1)

    def commit(self, token: int) -> None:
        """Advance the grammar by the selected token. Raises ``ConstraintError`` if refused."""
        m = self._live()
        guard = self._guard
        choice = guard is None or chosen(m, guard.vocab.token_bytes(token))
        if not m.consume_token(token):
            raise self._failure(m.get_error() or f"token {token} refused by the grammar")
        if guard is not None:
            guard.commit(token, choice=choice)
        demand = self._slice_demand
        if demand is not None:
            self._tokens.append(token)
            assert self.model is not None
            if demand[0] >= slices.SLICES_AFTER:  # the sliced tokenizer pays now: switch
                self._slice_demand = None
                made = slices.sliced_matcher(self.model, self.grammar, self.stop_token,
                                             self._tokens)
                if made is not None:
                    self._initial, self._matcher = made
        self._schedule()

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` commits (llguidance's matcher rollback; where it has none, as
        under a lexeme with ``max_tokens``, a checked constraint replays the tokens kept)."""
        guard = self._guard
        if not self._live().rollback(n):
            if guard is None or n > len(guard.tokens):
                raise ConstraintError(f"cannot roll back {n} tokens")
            self._matcher = self._initial.deep_copy()
            for token in guard.tokens[: len(guard.tokens) - n]:
                self._matcher.consume_token(token)
        if guard is not None:
            guard.rollback(n)
        del self._tokens[len(self._tokens) - n:]
        self._schedule()

    def reset(self) -> None:
        """Back to the initial state (start of an assistant turn)."""
        self._live()
        self._matcher = self._initial.deep_copy()
        self._tokens.clear()
        if self._guard is not None:
            self._guard.reset()
        self._schedule()

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar forces next (llguidance fast-forward tokens), maybe empty."""
        m = self._live()
        ff = list(m.compute_ff_tokens())
        if m.is_error():
            raise self._failure(m.get_error())
        return ff

    def valid_prefix_len(self, draft: Sequence[int]) -> int:
        """How many leading tokens of ``draft`` the grammar accepts, in order (pure; see
        :func:`~chatkit.grammar.masks.valid_prefix` for the cost past a hidden stop)."""
        return valid_prefix(self._live(), list(draft), hidden_stops=self._hidden_stops)

    def accepts(self, tokens: Sequence[int]) -> bool:
        """Reset, then whether ``tokens`` are a complete reply this constraint accepts: the
        grammar takes each and ends, and every value check passes where the tokens cross a
        value's end (the stop token's included). Leaves the state after them."""
        self.reset()
        if self.valid_prefix_len(tokens) != len(tokens):
            return False
        for t in tokens:
            if not self.passes_checks(t):
                return False
            self.commit(t)
        return self.is_accepting() and self.passes_checks(self.stop_token)

    def passes_checks(self, token: int) -> bool:
        """Whether the value checks let ``token`` through now (True without checks); with
        the grammar's own verdict, what a checked constraint accepts (pure)."""
        return self._guard is None or self._guard.allows(token)

    @property
    def rollbacks(self) -> int:
        """Rollbacks the value checks made in this reply (0 without checks)."""
        return self._guard.rollbacks if self._guard is not None else 0

    # ------------------------------------------------------------------ state
    def is_accepting(self) -> bool:
        """The text so far is a complete match (the stop token is allowed now)."""
        return bool(self._live().is_accepting())

    def is_stopped(self) -> bool:
        """The grammar can take nothing more but the stop token (or has taken it)."""
        return bool(self._live().is_stopped())

    def captures(self) -> list[tuple[str, bytes]]:
        """Named captures of the grammar so far (Lark ``rule[capture]``), in order."""
        return list(self._live().get_captures())


class Constraint(GrammarSteps):
    """A grammar constraint; implements ``LogitProcessor`` once bound to a model.

    Build with :meth:`json_schema`, :meth:`regex` or :meth:`lark` (refusals
    are raised there, before any model work); bind with :meth:`bind` (or pass
    ``model=``). One instance governs one stream; :meth:`clone` makes a fresh
    copy for another stream without recompiling. Not thread-safe.
    """

    def __init__(self, kind: ConstraintKind, grammar: str, *, source: str | JSONObject | bool,
                 reader: SchemaReader | None = None, stop_token: int | None = None,
                 checks: Checks | None = None) -> None:
        self.kind: ConstraintKind = kind
        self.grammar = grammar
        self._hidden_stops = "stop=" in grammar  # see valid_prefix_len (once, not per draft)
        self.source = source
        self.reader = reader
        self.checks = checks
        """The value checks of what the grammar was relaxed on (None: the grammar enforces
        the whole schema). See :mod:`chatkit.grammar.value_checks`."""
        self._guard: Guard | None = None
        self.rolls_back = True
        """A value check that leaves nothing rolls back (False: it only masks)."""
        self.stop_token_override = stop_token
        self.model: Vocabulary | None = None
        self.stop_token: int = -1
        self._initial: Any = None
        self._matcher: Any = None
        self._slice_demand: list[int] | None = None
        """Slices wanted, not built yet: the vocabulary's mask count (chatkit.grammar.slices)."""
        self._tokens: list[int] = []  # committed, while slices are pending (a replay)
        self._mask: NDArray[np.int32] = np.zeros((1, 0), dtype=np.int32)
        self._static: NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self.prefetch: bool | None = None
        """Compute the next mask in a worker thread right after each commit, so it
        overlaps the model's forward pass (llama.cpp and llguidance release the GIL).
        None (auto): only when the machine has a core llama.cpp's threads leave free."""
        self.check_first = True
        """Greedy selection asks :meth:`allows` about the unmasked argmax before
        masking the row (exact; see ``Sampler._greedy_checked``). False: mask every step."""
        self._next = _NextMask()
        # Per grammar state, for allows(): -1 nothing forced, -2 forced bytes without a
        # whole token, else the first canonical forced token. None: not computed yet.
        self._forced: int | None = None
        self._spare_core = False  # auto prefetch: a core the engine's threads leave free

    # ------------------------------------------------------------ constructors
    @classmethod
    def json_schema(
        cls,
        schema: SchemaInput | LoadedSchema,
        *,
        model: Vocabulary | None = None,
        whitespace: Whitespace = "compact",
        stop_token: int | None = None,
        digits: Digits = NUMBER_DIGITS,
        unknown_formats: UnknownFormats = "annotate",
        max_rollbacks: int = 32,
    ) -> Constraint:
        """JSON conforming to ``schema`` (dict, JSON text, bool or Pydantic model class).

        Keywords the grammar cannot express (``not``, ``if``/``then``/``else``,
        ``uniqueItems``, ``contains``, ``dependentRequired``, ``propertyNames``, overlapping
        ``oneOf``, ...) are enforced by value checks (``checks``): a token that would
        complete a failing value is masked, and when nothing valid is left the reply rolls
        back to a value start, at most ``max_rollbacks`` times per reply
        (``ChecksExhausted`` past it). A ``format`` neither llguidance nor ``jsonschema``
        knows is an annotation (logged), or refused with ``unknown_formats="refuse"``.

        ``digits`` bounds the numbers the model may write (integer, fractional digits; see
        ``chatkit.grammar.schema.NUMBER_DIGITS``; None: unbounded). Raises ``SchemaInvalid`` or
        ``SchemaUnsupported(keyword, path)``.
        """
        loaded = load_schema(schema)
        made, checks = compile_relaxed(
            loaded.doc, lambda doc: _schema_constraint(cls, loaded, doc, model, whitespace,
                                                       digits, stop_token),
            unknown_formats=unknown_formats)
        if checks is not None:
            checks.budget = max_rollbacks
            made.attach_checks(checks)
        return made

    @classmethod
    def regex(cls, pattern: str, *, model: Vocabulary | None = None,
              stop_token: int | None = None) -> Constraint:
        """Text matching ``pattern`` in full (Rust regex syntax). Raises ``GrammarInvalid``."""
        made = cls("regex", _regex_grammar(pattern), source=pattern, stop_token=stop_token)
        return made.bind(model) if model is not None else made

    @classmethod
    def lark(cls, grammar: str, *, model: Vocabulary | None = None,
             stop_token: int | None = None) -> Constraint:
        """Text derived from a Lark grammar (llguidance dialect). Raises ``GrammarInvalid``."""
        made = cls("lark", _lark_grammar(grammar), source=grammar, stop_token=stop_token)
        return made.bind(model) if model is not None else made

    # ----------------------------------------------------------------- binding
    def bind(self, model: Vocabulary, stop_token: int | None = None) -> Constraint:
        """Attach to ``model`` (self when unbound or already bound to it, else a copy).

        ``stop_token`` (default: the constructor's, else the model's end-of-turn
        id) is the only token allowed once the grammar completes.
        """
        return self._bind(model, stop_token, first_mask_now=False)

    def _bind(self, model: Vocabulary, stop_token: int | None, *,
              first_mask_now: bool) -> Constraint:
        """:meth:`bind`; ``first_mask_now``: compute the first mask at once, not in the
        background, and refuse by name a grammar whose language is empty (a ``$ref`` cycle
        without a base case errors there); the mask is kept for the first step."""
        stop = stop_token if stop_token is not None else self.stop_token_override
        stop = stop if stop is not None else model.eot_id
        if self.model is model and stop == self.stop_token:
            return self
        if self.model is not None:
            other = Constraint(self.kind, self.grammar, source=self.source, reader=self.reader,
                               checks=self.checks)
            return other.bind(model, stop)
        matcher, self._slice_demand = _new_matcher(model, self.grammar, stop)
        if matcher.is_error():
            raise _matcher_refusal(self.kind, self.source, matcher.get_error())
        self.model = model
        self.stop_token = stop
        self._initial = matcher
        self._matcher = matcher.deep_copy()
        self._static = model.grammar_token_words()
        self._mask = np.full((1, self._static.size), -1, dtype=np.int32)  # words alike
        self._spare_core = _spare_core(model)
        self.attach_checks()
        if first_mask_now:
            self._first_mask()
        else:
            self._schedule()
        return self

    def attach_checks(self, checks: Checks | None = None) -> None:
        """Enforce ``checks`` (default: this constraint's own) with a fresh guard, if bound:
        the value checks of what the grammar was relaxed on (:meth:`json_schema`)."""
        self.checks = checks if checks is not None else self.checks
        if self.checks is not None and self.model is not None:
            self._guard = Guard(self.checks, self.model, self.stop_token, self.captures)

    def _first_mask(self) -> None:
        """Compute the initial state's mask now and keep it for the first step (no prefetch)."""
        self._forced = None
        words = self._fill()
        if words is None:
            problem = matcher_problem(str(self._matcher.get_error()))
            raise _matcher_refusal(self.kind, self.source, problem)
        assert self.model is not None
        self._next.keep(prepare_bitmask(words, self.model.n_vocab))

    def check_start(self) -> None:
        """Compute the first mask now (kept for the first step); raise the named refusal
        (``GrammarInvalid``, or the schema's) of a grammar that errors there: too large to run
        (llguidance's limits) or an empty language. Bound, initial-state constraints only."""
        self._live()  # a mask computed in the background has finished with the matcher
        self._first_mask()

    def clone(self) -> Constraint:
        """A fresh copy (initial state) bound to the same model; no recompilation."""
        other = Constraint(self.kind, self.grammar, source=self.source, reader=self.reader,
                           stop_token=self.stop_token_override, checks=self.checks)
        if self.model is not None:
            demand = self._slice_demand
            if demand is not None and demand[0] >= slices.SLICES_AFTER:  # a template: once
                made = slices.sliced_matcher(self.model, self.grammar, self.stop_token, [])
                if made is not None:
                    self._initial, self._slice_demand = made[0], None
            other.model = self.model
            other.stop_token = self.stop_token
            other._initial = self._initial
            other._matcher = self._initial.deep_copy()
            other._slice_demand = self._slice_demand
            other._mask = np.empty_like(self._mask)
            other._static = self._static
            other._spare_core = self._spare_core
            other.prefetch = self.prefetch
            other.check_first = self.check_first
            other.attach_checks()
            other._schedule()
        return other

    def __repr__(self) -> str:
        bound = self.model.name if self.model is not None else "unbound"
        return f"Constraint({self.kind}, {bound})"


def _spare_core(model: Vocabulary) -> bool:
    """Whether the machine has a core the engine's compute threads leave free (cached on the
    model when it can cache: a protocol isinstance check is slow next to a mask)."""
    cache = getattr(model, "cache", None)
    if not callable(cache):
        return _has_spare_core(model)
    return bool(cache(_SPARE_CORE_KEY, lambda: _has_spare_core(model)))


SchemaArg = SchemaInput | Constraint | None
"""What a turn may be constrained by: a schema, a ``Constraint``, or nothing."""

_SPARE_CORE_KEY = ("constraint", "spare_core")


def _has_spare_core(model: Vocabulary) -> bool:
    threads = int(getattr(model, "n_threads", 0))  # a remote engine's threads are not ours
    return (os.cpu_count() or 1) > threads


def _schema_grammar(doc: dict[str, Any] | bool, whitespace: Whitespace, digits: Digits, *,
                    bound: bool) -> tuple[str, bool]:
    """A checked schema's grammar, and whether the model's matcher must check its first
    mask at once. ``bound``: a matcher over the model is built at once; it validates the
    grammar (and its first mask shows an empty language), so the separate passes over a
    byte-level tokenizer are skipped."""
    if not bound:
        return compile_json_schema(doc, whitespace, digits), False
    compiled = json_grammar(doc, whitespace, digits)
    return compiled.grammar, compiled.may_be_empty


def _schema_constraint(cls: type[Constraint], loaded: LoadedSchema,
                       doc: dict[str, Any] | bool,
                       model: Vocabulary | None, whitespace: Whitespace, digits: Digits,
                       stop_token: int | None) -> Constraint:
    """A constraint of ``loaded`` compiled from ``doc`` (the schema, or a relaxed copy),
    bound to ``model`` when given. Raises the schema's refusals."""
    grammar, check_now = _schema_grammar(doc, whitespace, digits, bound=model is not None)
    other = cls("json_schema", grammar, source=loaded.doc, reader=loaded.reader(),
                stop_token=stop_token)
    return other if model is None else other._bind(model, None, first_mask_now=check_now)


def _lark_grammar(grammar: str) -> str:
    """A Lark grammar compiled by llguidance, or ``GrammarInvalid``."""
    llguidance = bare_import.llguidance()
    return _checked(llguidance.LLMatcher.grammar_from_lark(grammar), "lark")


_LIMIT_ERRORS = ("Too many items", "too many expressions", "too many states", "TooComplex",
                 "fuel")
"""llguidance's words for a grammar that outgrew its limits (parser items, lexer states)."""


def _matcher_refusal(kind: ConstraintKind, source: Any, message: str) -> Exception:
    """The named refusal of a grammar whose matcher errs with ``message``."""
    if kind == "json_schema" and isinstance(source, dict | bool):
        return schema_refusal(source, message)
    return _refusal(kind, message)


def _regex_grammar(pattern: str) -> str:
    """``pattern`` compiled to an llguidance grammar, or ``GrammarInvalid`` (a dangling
    escape, a repetition past ``MAX_REPEAT``, what llguidance refuses)."""
    trailing = len(pattern) - len(pattern.rstrip("\\"))
    if trailing % 2:  # llguidance would silently drop a dangling escape
        raise GrammarInvalid("regex", "pattern ends with a dangling backslash")
    for m in _REPEAT.finditer(pattern):
        if max(int(n) for n in m.groups() if n) > MAX_REPEAT:
            raise GrammarInvalid("regex", f"repetition {m.group(0)} exceeds {MAX_REPEAT} "
                                 "(the lexer's automaton would not fit its limits)")
    llguidance = bare_import.llguidance()
    return _checked(llguidance.LLMatcher.grammar_from_regex(pattern), "regex")


def _new_matcher(model: Vocabulary, grammar: str, stop: int) -> tuple[Any, list[int] | None]:
    """An llguidance matcher of ``grammar`` over ``model``'s tokenizer ending in ``stop``
    (``InvalidParameter`` when that is no token id; check its ``is_error()``), and, while
    it waits for the sliced tokenizer, its mask counter (:mod:`chatkit.grammar.slices`)."""
    if not 0 <= stop < model.n_vocab:
        raise InvalidParameter("stop_token", f"{stop} is not a token id of {model.name}")
    llguidance = bare_import.llguidance()
    tok, demand = slices.tokenizer(model, grammar, stop)
    return llguidance.LLMatcher(tok, grammar, log_level=0, limits=native_limits()), demand


class _NextMask:
    """The mask of a constraint's next step, computed ahead: in a worker thread after each
    commit (prefetch), or at once by a check; taken once by the step."""

    def __init__(self) -> None:
        self.pending: Future[Prepared | None] | None = None
        self.prepared: Prepared | None = None
        self.ready = False

    def forget(self, compute: Callable[[], Prepared | None] | None) -> None:
        """A new grammar state: drop the mask kept; start ``compute`` in the pool if given."""
        self.ready = False
        if compute is not None:
            self.pending = _mask_pool().submit(compute)

    def settle(self) -> None:
        """Wait for a computation in flight (it uses the matcher) and keep its mask."""
        pending = self.pending
        if pending is not None:
            self.pending = None
            self.keep(pending.result())

    def keep(self, prepared: Prepared | None) -> None:
        self.prepared = prepared
        self.ready = True

    def take(self, compute: Callable[[], Prepared | None]) -> Prepared | None:
        """The kept mask, else ``compute()``'s; nothing is kept afterwards."""
        prepared = self.prepared if self.ready else compute()
        self.ready = False
        return prepared


def _checked(grammar: str, kind: ConstraintKind) -> str:
    llguidance = bare_import.llguidance()
    try:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, limits=native_limits())
    except BaseException as exc:  # a Rust panic (pyo3's PanicException is a BaseException)
        if type(exc).__name__ != "PanicException":
            raise
        raise _refusal(kind, f"llguidance could not build it ({exc}); a grammar this large "
                       "(e.g. hundreds of distinct parameter schemas) is beyond it") from None
    problem = "; ".join(messages) if failed else grammar_problem(grammar)
    if problem:
        raise _refusal(kind, problem)
    return grammar


def _refusal(kind: ConstraintKind, message: str) -> Exception:
    if kind == "json_schema":
        return SchemaInvalid(message)
    return GrammarInvalid(kind, message)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _mask_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="chatkit-mask")
        return _pool
