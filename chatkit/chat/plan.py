"""Planning one assistant turn: everything decided before the first token.

:func:`plan_turn` needs only the engine's :class:`~chatkit.engine.protocols.Vocabulary`: it
resolves the options (:mod:`chatkit.decode.options`), chooses the template, builds (or takes
from the engine's cache) the grammar, renders the messages into segments and
tokenizes them, into a frozen :class:`TurnPlan`. :func:`plan_completion` does the same
for a raw completion (token ids, no template). Every refusal happens here, before any
decode.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..decode.options import check_max_tokens, check_stop
from ..decode.sampling import LogitProcessor, Logits, Sampler
from ..engine.kvseqs import common_prefix as common_prefix
from ..engine.protocols import Engine, GenerateRequest, Vocabulary
from ..errors import ContextOverflow, InvalidParameter
from ..grammar.constraints import Constraint, SchemaArg
from ..grammar.schema import (
    LoadedSchema,
    SchemaInput,
    bound_numbers,
    closed_objects,
    json_options,
    load_schema,
)
from ..grammar.value_checks import relaxed_schema
from ..messages import Message
from ..templates import ChatTemplate, Segment, fold_system, tokenize_segments
from ..tools.definition import Tool, check_tools
from ..tools.detect import (
    dialect_of_history,
    generic_messages,
    history_for,
    tool_reasoning,
    tool_setup,
)
from ..tools.dialects import Dialect
from ..tools.grammar import opening_tokens, tool_grammar
from ..tools.lark_text import markup_for
from ..tools.options import check_stop_in_json
from .options import CallOptions, Defaults, TurnOptions, resolve

__all__: list[str] = []

THINK_BUDGET = 256
"""Tokens a think block may take unless the caller says otherwise."""

_log = logging.getLogger("chatkit")

NO_THINK_PREFILL = "<think>\n\n</think>\n\n"

"""What ``schema=`` takes: a Pydantic class, a JSON-schema dict/text/bool, or a JSON
``Constraint``."""


@dataclass(frozen=True)
class TurnContext:
    """What the conversation contributes to planning a turn."""

    engine: Engine
    template: ChatTemplate
    history: list[Message]
    """The messages so far, system first."""
    sampler: Sampler
    """The conversation's sampler (its RNG persists across turns)."""
    no_think: bool = False
    think_budget: int = THINK_BUDGET
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    local: bool = True
    """The engine samples here (a remote engine samples on its server)."""
    fit_max_tokens: bool = False
    """``max_tokens`` shrinks to the room the prompt leaves (``Conversation``)."""


@dataclass(frozen=True)
class AutoCall:
    """``tool_choice="auto"`` as a decision at the reply's first token: a call when the
    model's probability of the call opening reaches ``threshold``, else text; the rest of
    the reply is then under the ``required`` or the ``none`` grammar."""

    threshold: float
    opening: NDArray[np.intp]
    call: Constraint
    text: Constraint

    def p_call(self, row: Logits) -> float:
        """The probability the model puts on the call opening in ``row`` (its logits)."""
        z = row.astype(np.float64)
        z -= z.max()
        np.exp(z, out=z)
        return float(z[self.opening].sum() / z.sum())

    def decide(self, row: Logits) -> Constraint:
        """The grammar for the rest of the reply (logged with the probability measured)."""
        p = self.p_call(row)
        chosen = self.call if p >= self.threshold else self.text
        _log.info("tool_choice='auto': P(call opening) %.4f %s threshold %g: %s", p,
                  ">=" if chosen is self.call else "<", self.threshold,
                  "a call" if chosen is self.call else "text")
        return chosen


@dataclass(frozen=True)
class TurnPlan:
    """Everything decided before the first token (immutable; a turn's current grammar is
    the turn's own)."""

    prompt: list[int]
    stop_ids: frozenset[int]
    max_tokens: int
    sampler: Sampler
    processor: LogitProcessor | None = None
    """What governs the reply's tokens: ``constraint``, or a caller's own processor."""
    constraint: Constraint | None = None
    thinking: bool = False
    stop_strings: tuple[str, ...] = ()
    tools: tuple[Tool, ...] = ()
    user: Message | None = None
    speculative: bool = False
    stop_token: int = -1
    """The token that ends the turn (the grammar's stop token)."""
    messages: tuple[Message, ...] = field(default_factory=tuple)
    """The messages the prompt renders (for engines that render their own template)."""
    auto_call: AutoCall | None = None
    """``tool_choice="auto"`` decided at the first token (``tool_call_threshold``)."""
    dialect: Dialect | None = None
    """With tools: the dialect the calls are written in."""
    tool_thinking: bool = False
    """With tools: the reply may open with the dialect's think block."""
    think_opened: bool = False
    """The prompt opened the think block (the reply begins inside it)."""
    logprobs: int | None = None
    """Record per-token log-probabilities with this many alternatives (None: off)."""
    probabilities: bool | tuple[str, ...] = False
    """Fields whose value probabilities the reply reports (True: every enumerable one)."""
    context_capped: bool = False
    """``max_tokens`` was shrunk to the room the prompt leaves (``fit_max_tokens``): a reply
    cut at it ran out of context, not of the tokens asked for."""
    schema: Any = None
    """The JSON schema the reply answers (a ``LoadedSchema``'s document), if any."""
    schema_model: Any = None
    """The Pydantic class of ``schema=``, if it was one."""


def _history_dialect(engine: Engine, template: ChatTemplate, dialect: Dialect | None,
                     messages: Sequence[Message]) -> Dialect | None:
    """The tool format earlier calls in the history render in: the turn's own, else the
    template's (a turn without tools still renders the calls made before it)."""
    if dialect is None and any(m.tool_calls or m.role == "tool" for m in messages):
        return dialect_of_history(engine, template)
    return dialect


def plan_turn(ctx: TurnContext, text: str | None, schema: SchemaArg,
              options: TurnOptions) -> TurnPlan:
    """Validate, choose the template, build the grammar, render and tokenize.

    Raises the refusals (``InvalidParameter``, ``SchemaInvalid``, ``SchemaUnsupported``,
    ``GrammarInvalid``, ``TemplateError``, ``ToolDefinitionError``, ``ContextOverflow``)
    before any decode.
    """
    engine = ctx.engine
    if text is not None and not isinstance(text, str):
        raise InvalidParameter("text", f"must be a str, not {type(text).__name__}")
    constraint = options.get("constraint")
    given_tools = options.get("tools")
    tools = check_tools(given_tools) if given_tools else []
    opts = resolve(options, Defaults(ctx.sampler, ctx.max_tokens, ctx.stop),
                   constrained=schema is not None or constraint is not None or bool(tools),
                   tool_names=[t.name for t in tools], local=ctx.local,
                   has_schema=schema is not None)
    loaded = load_schema(schema) if schema is not None and not isinstance(
        schema, Constraint) else None
    user = None
    if text is not None:
        user = Message("user", text + (_schema_note(schema, loaded) if opts.schema_in_prompt
                                       else ""))
    template, dialect = ctx.template, None
    if tools:
        template, dialect = tool_setup(engine, ctx.template, options.get("tool_format"))
    stop_token = turn_stop_token(engine, template)
    thinking = (schema is not None or constraint is not None) and not tools \
        and not ctx.no_think and template.supports_thinking
    messages = (*ctx.history, *([user] if user else []))
    prompt, prompt_text = _render(ctx, template, list(messages), tools, thinking=thinking,
                                  dialect=_history_dialect(engine, template, dialect, messages))
    opts, capped = _fit(opts, len(prompt), engine.n_ctx_seq, ctx.fit_max_tokens)
    dialect, think_budget, think_opened = _tool_thinking(ctx, dialect, prompt_text, opts)
    if dialect is not None and dialect.text_json:
        check_stop_in_json(opts.stop, dialect.name)
    grammar, auto = _grammar(ctx, template, tools, loaded, schema, opts, stop_token=stop_token,
                             thinking=thinking, dialect=dialect,
                             think=(think_budget, think_opened))
    if len(prompt) + opts.max_tokens > engine.n_ctx_seq:
        raise ContextOverflow(len(prompt), opts.max_tokens, engine.n_ctx_seq)
    return TurnPlan(prompt=prompt, stop_ids=frozenset({stop_token, engine.eos_id}),
                    max_tokens=opts.max_tokens, sampler=opts.sampler,
                    processor=grammar if grammar is not None else opts.constraint,
                    constraint=grammar, thinking=thinking, stop_strings=opts.stop,
                    tools=tuple(tools), user=user, speculative=opts.speculative,
                    stop_token=stop_token, messages=messages, auto_call=auto, dialect=dialect,
                    tool_thinking=think_budget is not None, think_opened=think_opened,
                    logprobs=opts.logprobs, probabilities=opts.probabilities,
                    context_capped=capped, schema=loaded.doc if loaded is not None else
                    schema.source if isinstance(schema, Constraint) else None,
                    schema_model=loaded.model_cls if loaded is not None else None)


def _fit(opts: CallOptions, prompt_tokens: int, n_ctx: int, fit: bool
         ) -> tuple[CallOptions, bool]:
    """``opts`` with ``max_tokens`` shrunk to the room the prompt leaves, when ``fit`` and
    it does not fit (and the prompt leaves any room: else the caller's ContextOverflow)."""
    room = n_ctx - prompt_tokens
    if not fit or opts.max_tokens <= room or room < 1:
        return opts, False
    return dataclasses.replace(opts, max_tokens=room), True


def _tool_thinking(ctx: TurnContext, dialect: Dialect | None, prompt_text: str,
                   opts: CallOptions) -> tuple[Dialect | None, int | None, bool]:
    """A tool turn's think block: the dialect for this prompt, the block's token budget
    (None: no block) and whether the prompt opened it. Off with ``no_think`` and with a
    first-token ``tool_call_threshold`` (the decision needs the call at the first token)."""
    decided_first = opts.threshold_given and opts.tool_choice == "auto"
    if dialect is None or ctx.no_think or decided_first:
        return dialect, None, False
    dialect, opened = tool_reasoning(dialect, prompt_text)
    if dialect.reasoning is None:
        return dialect, None, False
    return dialect, max(1, min(ctx.think_budget, opts.max_tokens // 2)), opened


def _grammar(ctx: TurnContext, template: ChatTemplate, tools: list[Tool],
             loaded: LoadedSchema | None, schema: SchemaArg, opts: CallOptions, *,
             stop_token: int, thinking: bool, dialect: Dialect | None,
             think: tuple[int | None, bool] = (None, False)
             ) -> tuple[Constraint | None, AutoCall | None]:
    """The turn's grammar (from the engine's cache) and, for tools, the first-token
    decision of ``tool_choice="auto"``."""
    engine = ctx.engine
    if tools and dialect is not None:
        return (_tools_constraint(engine, tools, loaded, schema, opts.tool_choice,
                                  opts.parallel_tool_calls, stop_token, dialect, think),
                _auto_call(ctx, template, tools, loaded, schema, opts, stop_token,
                           dialect=dialect, think=think))
    if isinstance(schema, Constraint):
        if schema.kind != "json_schema":
            raise InvalidParameter("schema", "a Constraint given as schema= must be JSON")
        if thinking:
            raise InvalidParameter("schema", "thinking needs a schema, not a Constraint")
        return schema.bind(engine, stop_token), None
    if loaded is not None:
        budget = max(1, min(ctx.think_budget, opts.max_tokens // 2)) if thinking else None
        return _schema_constraint(engine, loaded, stop_token, think_budget=budget), None
    if isinstance(opts.constraint, Constraint):
        return opts.constraint.bind(engine, stop_token), None
    return None, None


def plan_completion(engine: Vocabulary, prompt: Sequence[int], *, sampler: Sampler,
                    max_tokens: int, schema: SchemaInput | None = None,
                    constraint: Constraint | None = None,
                    stop: str | Sequence[str] | None = None,
                    fit_max_tokens: bool = False) -> TurnPlan:
    """A raw completion: ``prompt`` token ids continued, no chat template (the server's
    ``/v1/completions``). It ends at EOS or the end-of-turn token; ``schema`` (JSON) or an
    unbound ``constraint`` (regex / Lark) governs it like a chat turn. Refusals before any
    decode, as :func:`plan_turn`; ``fit_max_tokens`` as ``Conversation``'s."""
    check_max_tokens(max_tokens)
    if not prompt:
        raise InvalidParameter("prompt", "empty prompt")
    if any(not 0 <= t < engine.n_vocab for t in prompt):
        raise InvalidParameter("prompt", f"token ids must be in [0, {engine.n_vocab})")
    if schema is not None and constraint is not None:
        raise InvalidParameter("schema", "give a schema or a grammar, not both")
    stop_strings = check_stop(stop, constrained=schema is not None or constraint is not None)
    room = engine.n_ctx_seq - len(prompt)
    capped = fit_max_tokens and 1 <= room < max_tokens
    if capped:
        max_tokens = room
    if len(prompt) + max_tokens > engine.n_ctx_seq:
        raise ContextOverflow(len(prompt), max_tokens, engine.n_ctx_seq)
    stop_token = engine.eos_id
    grammar: Constraint | None = None
    if schema is not None:
        grammar = _schema_constraint(engine, load_schema(schema), stop_token,
                                     think_budget=None)
    elif constraint is not None:
        grammar = _compiled(engine, (constraint.kind, constraint.source, stop_token),
                            lambda: constraint.bind(engine, stop_token),
                            f"{constraint.kind} grammar").clone()
    return TurnPlan(prompt=list(prompt), stop_ids=frozenset({engine.eos_id, engine.eot_id}),
                    max_tokens=max_tokens, sampler=sampler, processor=grammar,
                    constraint=grammar, stop_strings=stop_strings, stop_token=stop_token,
                    context_capped=capped)


def turn_stop_token(engine: Vocabulary, template: ChatTemplate) -> int:
    """The token that ends an assistant turn under ``template``."""
    if template.end_of_turn:
        ids = engine.tokenize(template.end_of_turn, special=True)
        if len(ids) == 1 and engine.is_control(ids[0]):
            return ids[0]
    return engine.eot_id


def _render(ctx: TurnContext, template: ChatTemplate, messages: list[Message],
            tools: list[Tool], *, thinking: bool,
            dialect: Dialect | None) -> tuple[list[int], str]:
    """The prompt's token ids and its text."""
    engine = ctx.engine
    definitions = [t.definition.for_template() for t in tools] or None
    if dialect is not None and dialect.name == "generic":
        messages = generic_messages(messages, definitions or [])
        definitions = None
    elif dialect is not None:
        messages = history_for(messages, dialect)
    if messages and messages[0].role == "system" and not template.supports_system:
        _log.info("template %r has no system role: the system prompt opens the first user "
                  "message", template.name)
        messages = fold_system(messages)
    segments = template.render(
        messages,
        add_generation_prompt=True,
        tools=definitions,
        enable_thinking=(False if ctx.no_think else None) if template.supports_thinking
        else None,
        bos_token=engine.detokenize([engine.bos_id]) if engine.bos_id >= 0 else "",
        eos_token=engine.detokenize([engine.eos_id]) if engine.eos_id >= 0 else "",
        special=engine.special_texts(),
        arguments_as_text=dialect is not None and dialect.args_as == "string",
    )
    if ctx.no_think and not template.supports_thinking:
        segments.append(Segment("markup", NO_THINK_PREFILL))
    if thinking:
        segments.append(Segment("markup", "<think>"))
    prompt = tokenize_segments(engine, segments)
    if engine.add_bos and (not prompt or prompt[0] != engine.bos_id):
        prompt.insert(0, engine.bos_id)
    return prompt, "".join(seg.text for seg in segments)


def _tools_constraint(engine: Vocabulary, tools: list[Tool], loaded: LoadedSchema | None,
                      schema: SchemaArg, choice: str, parallel: bool | int,
                      stop_token: int, dialect: Dialect,
                      think: tuple[int | None, bool] = (None, False)) -> Constraint:
    if isinstance(schema, Constraint):
        raise InvalidParameter("schema", "with tools=, give the output as a schema")
    if loaded is not None and not isinstance(loaded.doc, dict):
        raise InvalidParameter("schema", "the output schema must be an object schema")
    out_doc = loaded.doc if loaded is not None and isinstance(loaded.doc, dict) else None
    lark = tool_grammar(tools, choice, parallel=parallel, output=out_doc, dialect=dialect,
                        markup=markup_for(engine), think_budget=think[0],
                        think_opened=think[1])

    def build() -> Constraint:
        made = Constraint.lark(lark, model=engine, stop_token=stop_token)
        made.reader = loaded.reader() if loaded is not None else None
        return made

    cls = loaded.model_cls if loaded is not None else None
    return _compiled(engine, ("tools", lark, cls, stop_token), build, "tool grammar").clone()


def _auto_call(ctx: TurnContext, template: ChatTemplate, tools: list[Tool],
               loaded: LoadedSchema | None, schema: SchemaArg, opts: CallOptions,
               stop_token: int, *, dialect: Dialect,
               think: tuple[int | None, bool]) -> AutoCall | None:
    """For ``auto`` with a ``tool_call_threshold`` given (an opt-in: by default the model's
    own sampling chooses between text and calls as it writes), the first-token decision's
    two grammars (from the engine's cache). ``AUTO_CALL_THRESHOLD`` is the value calibrated
    on BFCL requests for small models without a tool format."""
    threshold = opts.tool_call_threshold if opts.threshold_given else None
    if threshold is None or opts.tool_choice != "auto":
        return None
    _log.debug("tool_choice='auto' under the %s template: decided at the first token, a call "
               "from P(call opening) >= %g", template.name, threshold)
    engine, parallel = ctx.engine, opts.parallel_tool_calls
    opening = opening_tokens(engine, dialect)
    if not len(opening):
        return None  # calls open with the tool's name: no opening to weigh
    return AutoCall(
        float(threshold), opening,
        call=_tools_constraint(engine, tools, loaded, schema, "required", parallel, stop_token,
                               dialect, think),
        text=_tools_constraint(engine, tools, loaded, schema, "none", parallel, stop_token,
                               dialect, think))


def _schema_constraint(engine: Vocabulary, loaded: LoadedSchema, stop_token: int, *,
                       think_budget: int | None) -> Constraint:
    """The schema's grammar (or, with a think budget, think text then the schema), compiled
    once per engine, schema, budget and stop token, cloned per turn."""
    if think_budget is None:
        return _compiled(engine, ("schema", loaded.key, loaded.model_cls, stop_token),
                         lambda: Constraint.json_schema(loaded, model=engine,
                                                        stop_token=stop_token),
                         "schema grammar").clone()

    def build() -> Constraint:
        source, checks = relaxed_schema(loaded.doc)  # what a value check enforces
        doc = bound_numbers(closed_objects(source) if isinstance(source, dict) else source)
        embedded: dict[str, Any] = dict(doc) if isinstance(doc, dict) else {"anyOf": [doc]}
        embedded["x-guidance"] = {**json_options(), **embedded.get("x-guidance", {})}
        lark = (
            'start: think close answer\n'
            'close: "\\n\\n" | "</think>\\n\\n"\n'
            f'think[capture, suffix="</think>", max_tokens={think_budget}]: /(?s:.*)/\n'
            f"answer[capture]: %json {json.dumps(embedded)}\n"
        )
        made = Constraint.lark(lark, model=engine, stop_token=stop_token)
        made.reader = loaded.reader()
        if checks is not None:
            checks.after_think = True
            made.attach_checks(checks)
        return made

    return _compiled(engine, ("think+schema", loaded.key, loaded.model_cls, think_budget,
                              stop_token), build, "think+schema grammar").clone()


class CompileStats:
    """Grammars compiled in this process, all engines together (``/metrics`` reads them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._count += 1
            self._seconds += seconds

    def read(self) -> tuple[int, float]:
        """(grammars compiled, seconds spent compiling them)."""
        with self._lock:
            return self._count, self._seconds


COMPILES = CompileStats()


MAX_GRAMMARS = 128
"""Most compiled grammars kept per engine (schemas, tool sets, Lark and regex
constraints: a server's clients send new ones): the least recently used is dropped past
it, and compiled again if it comes back."""


class GrammarCache:
    """One engine's compiled grammars, least recently used dropped past ``bound``
    (:data:`MAX_GRAMMARS`); thread-safe (a compile runs outside the lock: two threads asking
    for the same new key may both compile it, and the second result is kept)."""

    def __init__(self, bound: int | None = None) -> None:
        self.bound = MAX_GRAMMARS if bound is None else bound
        self._lock = threading.Lock()
        self._items: OrderedDict[Any, Constraint] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any, build: Callable[[], Constraint]) -> tuple[Constraint, bool]:
        """The grammar under ``key``, built (and kept) when absent; and whether it was kept
        already."""
        with self._lock:
            made = self._items.get(key)
            if made is not None:
                self._items.move_to_end(key)
                return made, True
        made = build()
        with self._lock:
            self._items[key] = made
            self._items.move_to_end(key)
            while len(self._items) > self.bound:
                self._items.popitem(last=False)
        return made, False


def grammar_cache(engine: Vocabulary) -> GrammarCache:
    """``engine``'s compiled grammars (one :class:`GrammarCache` per engine)."""
    return engine.cache(("chatkit.grammars",), GrammarCache)


def _compiled(engine: Vocabulary, key: Any, build: Callable[[], Constraint],
              what: str) -> Constraint:
    """A grammar compiled once per engine and key while it stays among the
    :data:`MAX_GRAMMARS` most recently used (logged: compile time, or a cache hit)."""

    def timed() -> Constraint:
        started = time.perf_counter()
        made = build()
        took = time.perf_counter() - started
        COMPILES.add(took)
        _log.debug("%s compiled in %.1f ms", what, took * 1000)
        return made

    made, hit = grammar_cache(engine).get(key, timed)
    if hit:
        _log.debug("%s: cache hit", what)
    return made


def _schema_note(schema: SchemaArg, loaded: LoadedSchema | None) -> str:
    doc = schema.source if isinstance(schema, Constraint) else (
        loaded.doc if loaded is not None else None)
    return "\n\nAnswer with JSON matching this schema:\n" + json.dumps(doc)


def request_for(plan: TurnPlan, constraint: Constraint | None) -> GenerateRequest:
    """A planned turn as a coarse engine's request: prompt ids, the grammar
    (``constraint``) as llguidance Lark, the sampling, and (for engines that render their
    own template) the messages and the JSON schema."""
    c = constraint
    params = plan.sampler.params
    return GenerateRequest(
        prompt=plan.prompt, grammar=lark_text(c.grammar) if c is not None else None,
        max_tokens=plan.max_tokens, stop_ids=plan.stop_ids,
        temperature=params.temperature, top_p=params.top_p, seed=params.seed,
        messages=list(plan.messages),
        schema=c.source if c is not None and c.kind == "json_schema"
        and not isinstance(c.source, str) else None,
        grammar_kind=("tools" if plan.tools else "think+schema" if plan.thinking
                      else c.kind if c is not None else None))


def lark_text(grammar: str) -> str:
    """A compiled llguidance grammar (``Constraint.grammar``) as llguidance Lark text, the
    dialect remote engines with an llguidance backend take: Lark as is, a regex's Lark,
    a JSON schema as ``start: %json {...}`` (its compile options kept in ``x-guidance``)."""
    if not grammar.lstrip().startswith("{"):
        return grammar
    doc = json.loads(grammar)
    parts = doc.get("grammars") or []
    if len(parts) != 1:
        raise InvalidParameter("constraint", "a grammar of several parts has no Lark form")
    part = parts[0]
    if part.get("lark_grammar"):
        return str(part["lark_grammar"])
    if part.get("json_schema") is not None:
        return "start: %json " + json.dumps(part["json_schema"])
    raise InvalidParameter("constraint", "this grammar has no Lark form")


MIN_SHARED_PREFIX = 8
"""Fewest prompt tokens worth copying from another sequence instead of evaluating (a
shorter shared prefix is evaluated per sequence: copying costs more)."""


