"""One assistant turn, in two parts: planning, then stepping.

Planning (:func:`plan_turn`) needs only the engine's :class:`~chatkit.engine.Vocabulary`:
it validates the options, chooses the template, builds (or takes from the
engine's cache) the grammar, renders the messages into segments and tokenizes
them. Stepping (:class:`Turn`) leases a KV sequence and decodes through the
``Sampler`` seam: ``start``/``step`` for a turn driven alone, ``chunk``/``first``/
``advance`` for drivers that batch many turns into one forward pass; then
``complete`` (checked by the second reader, recorded) or ``release`` alone
(abandoned: nothing recorded). The finish reason is decided once
(:func:`chatkit.decoding.decide_finish`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import numpy as np
from numpy.typing import NDArray

from .constraints import Constraint
from .decoding import Decoder, decide_finish
from .engine import (
    Engine,
    GenerateEngine,
    GenerateRequest,
    GenerateResult,
    IncrementalDetokenizer,
    SeqChunk,
    StepEngine,
    Vocabulary,
)
from .errors import (
    AllTokensMasked,
    ConstraintError,
    ContextOverflow,
    InvalidParameter,
    SchemaViolation,
    Truncated,
)
from .messages import Message, Reply, ToolCall, Usage
from .sampling import DraftAwareProcessor, LogitProcessor, Logits, Sampler, SamplingParams
from .schema import (
    LoadedSchema,
    SchemaInput,
    bound_numbers,
    closed_objects,
    json_options,
    load_schema,
)
from .speculative import ConstrainedSource, CostGate, DraftSource, PromptLookupSource
from .templates import BUNDLED, ChatTemplate, Segment, fold_system, tokenize_segments
from .tools.definition import Tool, check_tools
from .tools.grammar import (
    CALL_BLOCK,
    CALL_CLOSE,
    CALL_OPEN,
    opening_tokens,
    parse_calls,
    tool_grammar,
)

__all__ = ["TurnOptions"]

_log = logging.getLogger("chatkit")

NO_THINK_PREFILL = "<think>\n\n</think>\n\n"
SPEC_K = 4  # draft tokens per verify: 5-row batches stay in the bitwise-equal regime

AUTO_CALL_THRESHOLD = 0.004
"""``tool_call_threshold``'s default under a bundled tool template (see ``bench bfcl``)."""

SchemaArg = SchemaInput | Constraint | None
"""What ``schema=`` takes: a Pydantic class, a JSON-schema dict/text/bool, or a JSON
``Constraint``."""


class TurnOptions(TypedDict, total=False):
    """Per-call options of every send-like method (``send``, ``asend``, ``stream``,
    ``astream``, ``resume``, ``run``, ``send_batch`` ...), written once."""

    constraint: Constraint | LogitProcessor | None
    """``Constraint.regex(...)``, ``Constraint.lark(...)`` or any ``LogitProcessor``."""
    max_tokens: int | None
    """Reply token limit (default: the conversation's)."""
    sampling: SamplingParams | None
    """Sampling for this call only (default: the conversation's, with its RNG)."""
    temperature: float
    """This call's temperature (the conversation's other sampling settings kept)."""
    top_p: float
    """This call's top-p."""
    seed: int | None
    """This call's seed (a fresh RNG for this reply)."""
    stop: str | Sequence[str] | None
    """Stop strings for free text (a string is one stop string)."""
    schema_in_prompt: bool
    """Also append the schema to the user message as text."""
    tools: Sequence[Any] | None
    """Tools the model may call (``@tool`` functions, Pydantic models, ``Tool``)."""
    tool_choice: str
    """``auto`` | ``required`` | ``none`` | a tool's name."""
    parallel_tool_calls: bool | int
    """Allow more than one call in a reply (an int: at most that many)."""
    tool_call_threshold: float | None
    """``tool_choice="auto"``, local engines: the reply opens a call when the model puts at
    least this probability on the call opening at its first token, else it answers in text
    (decided, not sampled). Default ``AUTO_CALL_THRESHOLD`` under chatkit's bundled Hermes
    template (a model without a tool format of its own) for a reply to the user, None under
    the model's own template and after tool results: its sampling decides, as written."""
    speculative: bool
    """Grammar-drafted speculative decoding (same output, fewer forward passes)."""


OPTION_NAMES = frozenset(TurnOptions.__annotations__)


def check_options(options: dict[str, Any]) -> None:
    """Refuse an option no send-like method knows (the typed signature's runtime twin)."""
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise InvalidParameter(sorted(unknown)[0], "unknown send option")


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
    think_budget: int = 256
    max_tokens: int = 512
    stop: tuple[str, ...] = ()


@dataclass
class KVState:
    """A conversation's claim on the engine's KV cache, kept between turns."""

    owner: int
    """Stable id of the conversation."""
    seq: int | None = None
    """The sequence it last used (kept when nobody else took it)."""
    tokens: list[int] = field(default_factory=list)
    """What that sequence holds, in order."""


@dataclass
class TurnPlan:
    """Everything decided before the first token."""

    prompt: list[int]
    stop_ids: frozenset[int]
    max_tokens: int
    sampler: Sampler
    processor: LogitProcessor | None = None
    constraint: Constraint | None = None
    thinking: bool = False
    stop_strings: tuple[str, ...] = ()
    tools: list[Tool] = field(default_factory=list)
    user: Message | None = None
    speculative: DraftSource | None = None
    stop_token: int = -1
    """The token that ends the turn (the grammar's stop token)."""
    messages: list[Message] = field(default_factory=list)
    """The messages the prompt renders (for engines that render their own template)."""
    auto_call: AutoCall | None = None
    """``tool_choice="auto"`` decided at the first token (``tool_call_threshold``)."""


@dataclass
class AutoCall:
    """``tool_choice="auto"`` as a decision at the reply's first token: a call when the
    model's probability of the call opening reaches ``threshold``, else text; the rest of
    the reply is then under the ``required`` or the ``none`` grammar."""

    threshold: float
    opening: NDArray[np.intp]
    call: Constraint
    text: Constraint
    p_call: float | None = None
    """The probability measured (None until the first token)."""

    def decide(self, row: Logits) -> Constraint:
        z = row.astype(np.float64)
        z -= z.max()
        np.exp(z, out=z)
        self.p_call = float(z[self.opening].sum() / z.sum())
        chosen = self.call if self.p_call >= self.threshold else self.text
        _log.info("tool_choice='auto': P(call opening) %.4f %s threshold %g: %s", self.p_call,
                  ">=" if chosen is self.call else "<", self.threshold,
                  "a call" if chosen is self.call else "text")
        return chosen


def plan_turn(ctx: TurnContext, text: str | None, schema: SchemaArg,
              options: TurnOptions) -> TurnPlan:
    """Validate, choose the template, build the grammar, render and tokenize.

    Raises the refusals (``InvalidParameter``, ``SchemaInvalid``, ``SchemaUnsupported``,
    ``GrammarInvalid``, ``TemplateError``, ``ToolDefinitionError``) before any decode.
    """
    check_options(dict(options))
    engine = ctx.engine
    constraint = options.get("constraint")
    if text is not None and not isinstance(text, str):
        raise InvalidParameter("text", f"must be a str, not {type(text).__name__}")
    if schema is not None and constraint is not None:
        raise InvalidParameter("schema", "give schema= or constraint=, not both")
    given_tools = options.get("tools")
    tools = check_tools(given_tools) if given_tools else []
    if tools and constraint is not None:
        raise InvalidParameter("constraint", "tools= builds its own grammar")
    if options.get("tool_call_threshold") is not None and not tools:
        raise InvalidParameter("tool_call_threshold", "decides tool_choice='auto', which "
                               "needs tools=")
    max_tokens = options.get("max_tokens")
    max_tokens = ctx.max_tokens if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise InvalidParameter("max_tokens", f"must be >= 1, got {max_tokens}")
    loaded = load_schema(schema) if schema is not None and not isinstance(
        schema, Constraint) else None
    if options.get("schema_in_prompt") and schema is None:
        raise InvalidParameter("schema_in_prompt", "needs schema=")
    user = None
    if text is not None:
        note = _schema_note(schema, loaded) if options.get("schema_in_prompt") else ""
        user = Message("user", text + note)
    constrained = schema is not None or constraint is not None or bool(tools)
    stop = options.get("stop")
    if stop and constrained:
        raise InvalidParameter("stop", "stop strings end free text; a constraint ends itself")
    stop_strings = (stop_tuple(stop) if stop is not None
                    else () if constrained else ctx.stop)

    template = ctx.template
    if tools and not template.supports_tools:
        template = ChatTemplate.for_model(engine, tools=True)
        _log.info("tools=: template %r (the conversation's %r has no Hermes tool format)",
                  template.name, ctx.template.name)
    stop_token = turn_stop_token(engine, template)
    thinking = (constrained and not tools and not ctx.no_think
                and template.supports_thinking)
    plan = TurnPlan(prompt=[], stop_ids=frozenset({stop_token, engine.eos_id}),
                    max_tokens=max_tokens, sampler=ctx.sampler, thinking=thinking,
                    stop_strings=stop_strings, tools=tools, user=user, stop_token=stop_token)
    if tools:
        plan.constraint = _tools_constraint(engine, tools, loaded, schema, options,
                                            stop_token)
        after_tools = user is None and bool(ctx.history) and ctx.history[-1].role == "tool"
        plan.auto_call = _auto_call(engine, template, tools, loaded, schema, options,
                                    stop_token, after_tools=after_tools)
    elif isinstance(schema, Constraint):
        if schema.kind != "json_schema":
            raise InvalidParameter("schema", "a Constraint given as schema= must be JSON")
        if thinking:
            raise InvalidParameter("schema", "thinking needs a schema, not a Constraint")
        plan.constraint = schema.bind(engine, stop_token)
    elif loaded is not None:
        plan.constraint = _schema_constraint(engine, loaded, stop_token,
                                             think_budget=max(1, min(ctx.think_budget,
                                                                     max_tokens // 2))
                                             if thinking else None)
    elif isinstance(constraint, Constraint):
        plan.constraint = constraint.bind(engine, stop_token)
    plan.processor = plan.constraint if plan.constraint is not None else constraint
    plan.prompt = _render(ctx, template, plan, tools)
    if len(plan.prompt) + max_tokens > engine.n_ctx_seq:
        raise ContextOverflow(len(plan.prompt), max_tokens, engine.n_ctx_seq)
    sampling = options.get("sampling")
    overrides: dict[str, Any] = {k: v for k, v in options.items()
                                 if k in ("temperature", "top_p", "seed")}
    if sampling is not None and overrides:
        raise InvalidParameter(sorted(overrides)[0], "give sampling= or per-call "
                               "temperature/top_p/seed, not both")
    if overrides:
        sampling = dataclasses.replace(ctx.sampler.params, **overrides)
    if sampling is not None:
        plan.sampler = Sampler(sampling)
    if options.get("speculative"):
        proc = plan.processor
        plan.speculative = (ConstrainedSource(proc, PromptLookupSource())
                            if isinstance(proc, DraftAwareProcessor) else PromptLookupSource())
    return plan


def plan_completion(engine: Vocabulary, prompt: Sequence[int], *, sampler: Sampler,
                    max_tokens: int, schema: SchemaInput | None = None,
                    constraint: Constraint | None = None,
                    stop: str | Sequence[str] | None = None) -> TurnPlan:
    """A raw completion: ``prompt`` token ids continued, no chat template (the server's
    ``/v1/completions``). It ends at EOS or the end-of-turn token; ``schema`` (JSON) or an
    unbound ``constraint`` (regex / Lark) governs it like a chat turn. Refusals before any
    decode, as :func:`plan_turn`."""
    if max_tokens < 1:
        raise InvalidParameter("max_tokens", f"must be >= 1, got {max_tokens}")
    if not prompt:
        raise InvalidParameter("prompt", "empty prompt")
    if any(not 0 <= t < engine.n_vocab for t in prompt):
        raise InvalidParameter("prompt", f"token ids must be in [0, {engine.n_vocab})")
    if schema is not None and constraint is not None:
        raise InvalidParameter("schema", "give a schema or a grammar, not both")
    if stop and (schema is not None or constraint is not None):
        raise InvalidParameter("stop", "stop strings end free text; a constraint ends itself")
    if len(prompt) + max_tokens > engine.n_ctx_seq:
        raise ContextOverflow(len(prompt), max_tokens, engine.n_ctx_seq)
    stop_token = engine.eos_id
    plan = TurnPlan(prompt=list(prompt), stop_ids=frozenset({engine.eos_id, engine.eot_id}),
                    max_tokens=max_tokens, sampler=sampler,
                    stop_strings=stop_tuple(stop) if stop else (), stop_token=stop_token)
    if schema is not None:
        plan.constraint = _schema_constraint(engine, load_schema(schema), stop_token,
                                             think_budget=None)
    elif constraint is not None:
        plan.constraint = _compiled(engine, (constraint.kind, constraint.source, stop_token),
                                    lambda: constraint.bind(engine, stop_token),
                                    f"{constraint.kind} grammar").clone()
    plan.processor = plan.constraint
    return plan


def stop_tuple(stop: str | Sequence[str]) -> tuple[str, ...]:
    """Stop strings as a tuple; a plain string is ONE stop string (not its letters)."""
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if not all(isinstance(s, str) for s in stop):
        raise InvalidParameter("stop", "stop strings must be strings")
    return tuple(s for s in stop if s)


def turn_stop_token(engine: Vocabulary, template: ChatTemplate) -> int:
    """The token that ends an assistant turn under ``template``."""
    if template.end_of_turn:
        ids = engine.tokenize(template.end_of_turn, special=True)
        if len(ids) == 1 and engine.is_control(ids[0]):
            return ids[0]
    return engine.eot_id


def _render(ctx: TurnContext, template: ChatTemplate, plan: TurnPlan,
            tools: list[Tool]) -> list[int]:
    engine = ctx.engine
    messages = [*ctx.history, *([plan.user] if plan.user else [])]
    plan.messages = messages
    if messages and messages[0].role == "system" and not template.supports_system:
        _log.info("template %r has no system role: the system prompt opens the first user "
                  "message", template.name)
        messages = fold_system(messages)
    segments = template.render(
        messages,
        add_generation_prompt=True,
        tools=[t.definition.for_template() for t in tools] or None,
        enable_thinking=(False if ctx.no_think else None) if template.supports_thinking
        else None,
        bos_token=engine.detokenize([engine.bos_id]) if engine.bos_id >= 0 else "",
        eos_token=engine.detokenize([engine.eos_id]) if engine.eos_id >= 0 else "",
        special=engine.special_texts(),
    )
    if ctx.no_think and not template.supports_thinking:
        segments.append(Segment("markup", NO_THINK_PREFILL))
    if plan.thinking:
        segments.append(Segment("markup", "<think>"))
    prompt = tokenize_segments(engine, segments)
    if engine.add_bos and (not prompt or prompt[0] != engine.bos_id):
        prompt.insert(0, engine.bos_id)
    return prompt


def _tools_constraint(engine: Vocabulary, tools: list[Tool], loaded: LoadedSchema | None,
                      schema: SchemaArg, options: TurnOptions, stop_token: int) -> Constraint:
    if isinstance(schema, Constraint):
        raise InvalidParameter("schema", "with tools=, give the output as a schema")
    if loaded is not None and not isinstance(loaded.doc, dict):
        raise InvalidParameter("schema", "the output schema must be an object schema")
    out_doc = loaded.doc if loaded is not None and isinstance(loaded.doc, dict) else None
    lark = tool_grammar(tools, options.get("tool_choice", "auto"),
                        parallel=options.get("parallel_tool_calls", True), output=out_doc)

    def build() -> Constraint:
        made = Constraint.lark(lark, model=engine, stop_token=stop_token)
        made.reader = loaded.reader() if loaded is not None else None
        return made

    cls = loaded.model_cls if loaded is not None else None
    return _compiled(engine, ("tools", lark, cls, stop_token), build, "tool grammar").clone()


def _auto_call(engine: Vocabulary, template: ChatTemplate, tools: list[Tool],
               loaded: LoadedSchema | None, schema: SchemaArg, options: TurnOptions,
               stop_token: int, *, after_tools: bool) -> AutoCall | None:
    """``tool_call_threshold`` checked, defaulted and, for ``auto`` on a local engine, the
    decision's two grammars built (from the engine's cache).

    The default applies to a reply to the user, not to the reply after tool results: it is
    calibrated on requests (BFCL), and after a call in context a small model copies the
    pattern (its call probability rises past any useful threshold), so an agent loop would
    call until ``max_steps``; there the model's own sampling decides."""
    choice = options.get("tool_choice", "auto")
    given = "tool_call_threshold" in options
    threshold = options.get("tool_call_threshold")
    if threshold is not None:
        if (isinstance(threshold, bool) or not isinstance(threshold, int | float)
                or not 0.0 <= threshold <= 1.0):
            raise InvalidParameter("tool_call_threshold",
                                   f"must be a probability in [0, 1] or None, got {threshold!r}")
        if choice != "auto":
            raise InvalidParameter("tool_call_threshold",
                                   f"decides tool_choice='auto' only, not {choice!r}")
        if isinstance(engine, GenerateEngine):
            raise InvalidParameter("tool_call_threshold", "a remote engine samples the first "
                                   "token itself; it applies to local engines only")
    if not given:
        threshold = (AUTO_CALL_THRESHOLD if template.name in BUNDLED and not after_tools
                     and not isinstance(engine, GenerateEngine) else None)
    if threshold is None or choice != "auto":
        return None
    _log.debug("tool_choice='auto' under the %s template: decided at the first token, a call "
              "from P(call opening) >= %g", template.name, threshold)
    return AutoCall(
        float(threshold), opening_tokens(engine),
        call=_tools_constraint(engine, tools, loaded, schema,
                               {**options, "tool_choice": "required"}, stop_token),
        text=_tools_constraint(engine, tools, loaded, schema,
                               {**options, "tool_choice": "none"}, stop_token))


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
        doc = bound_numbers(closed_objects(loaded.doc) if isinstance(loaded.doc, dict)
                            else loaded.doc)
        embedded: dict[str, Any] = dict(doc) if isinstance(doc, dict) else {"anyOf": [doc]}
        embedded["x-guidance"] = {**json_options(), **embedded.get("x-guidance", {})}
        lark = (
            'start: think close answer\n'
            'close: "\\n\\n" | "</think>\\n\\n"\n'
            f'think[capture, stop="</think>", max_tokens={think_budget}]: /(?s:.*)/\n'
            f"answer[capture]: %json {json.dumps(embedded)}\n"
        )
        made = Constraint.lark(lark, model=engine, stop_token=stop_token)
        made.reader = loaded.reader()
        return made

    return _compiled(engine, ("think+schema", loaded.key, loaded.model_cls, think_budget,
                              stop_token), build, "think+schema grammar").clone()


def _compiled(engine: Vocabulary, key: Any, build: Callable[[], Constraint],
              what: str) -> Constraint:
    """A grammar compiled once per engine and key (logged: compile time, or a cache hit)."""
    hit = True

    def timed() -> Constraint:
        nonlocal hit
        hit = False
        started = time.perf_counter()
        made = build()
        _log.debug("%s compiled in %.1f ms", what, (time.perf_counter() - started) * 1000)
        return made

    made = engine.cache(key, timed)
    if hit:
        _log.debug("%s: cache hit", what)
    return made


def _schema_note(schema: SchemaArg, loaded: LoadedSchema | None) -> str:
    doc = schema.source if isinstance(schema, Constraint) else (
        loaded.doc if loaded is not None else None)
    return "\n\nAnswer with JSON matching this schema:\n" + json.dumps(doc)


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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Turn:
    """A planned turn, stepped: lease, prefill, sample, emit text deltas, finish.

    ``on_complete`` receives the messages the turn adds (the user message, if any, and
    the assistant's) once the reply passed every check; an abandoned or failed turn
    adds nothing. ``release`` (every exit path) records what the KV sequence holds and
    ends the lease. One thread at a time.
    """

    def __init__(self, engine: Engine, plan: TurnPlan, kv: KVState,
                 on_complete: Callable[[list[Message]], None]) -> None:
        self.engine = engine
        self.plan = plan
        self.kv = kv
        self.on_complete = on_complete
        self.gate = CostGate()
        self._dec: Decoder | None = None
        self.seq: int | None = None
        self.text = ""
        self._detok = IncrementalDetokenizer(engine)
        self._cut = False  # a stop string (or a repeated tool call) ended the text
        self.dropped_calls = 0
        self._held = ""  # text withheld while it may be the start of a stop string
        self._fed = 0  # replayed tokens (remote engines)
        self._row: Logits = np.empty(0, dtype=np.float32)  # the replay's one-hot row
        self._added: list[Message] = []  # checked, not yet recorded (see complete)

    # ------------------------------------------------------------------ steps
    @property
    def local(self) -> StepEngine:
        """The engine as a ``StepEngine`` (a local turn: KV leases, forward passes)."""
        engine = self.engine
        if isinstance(engine, GenerateEngine):
            raise InvalidParameter("engine", "a remote engine is driven by requests, not steps")
        return engine

    @property
    def done(self) -> bool:
        return self._dec is not None and self._dec.done

    def open(self, wait: float | None = None) -> Decoder:
        """Lease the KV sequence (waiting up to ``wait`` seconds for a free one, None: the
        engine's default) and reset the processor; nothing is evaluated yet."""
        plan = self.plan
        self.seq, kept = self.local.acquire_seq(self.kv.owner, self.kv.seq, wait=wait)
        plan.sampler.processor = plan.processor
        plan.sampler.reset()  # per-turn reset: one constraint governs each reply afresh
        self.kv.seq = self.seq
        reuse = common_prefix(self.kv.tokens, plan.prompt) if kept else 0
        self._dec = Decoder(self.local, plan.prompt, plan.sampler,
                            max_tokens=plan.max_tokens, stop_ids=plan.stop_ids,
                            seq_id=self.seq, reuse=reuse)
        if plan.auto_call is not None:
            self._dec.on_first = self._decide_call
        return self._dec

    def _decide_call(self, row: Logits) -> None:
        """``tool_choice="auto"`` with a threshold: the first row decides call or text, and
        that grammar governs the rest of the reply."""
        plan = self.plan
        assert plan.auto_call is not None
        chosen = plan.auto_call.decide(row)
        chosen.reset()
        plan.constraint = chosen
        plan.processor = chosen
        plan.sampler.processor = chosen
        if isinstance(plan.speculative, ConstrainedSource):
            plan.speculative.processor = chosen

    def start(self) -> str:
        """Open (if not yet), prefill, and sample the first token; the first text delta."""
        decoder = self._dec if self._dec is not None else self.open()
        return self._emit(decoder.start())

    def steps(self) -> Iterator[Callable[[], str]]:
        """The turn's blocking steps in order, each returning a text delta: drivers run them
        directly (sync) or in a worker thread (async); then :meth:`finish`."""
        yield self.start
        while not self.done:
            yield self.step

    def finish(self, *, record: bool = True) -> tuple[str, Reply[Any]]:
        """The withheld tail and the checked, recorded Reply (see :meth:`complete`)."""
        tail = self.flush()
        return tail, self.complete(record=record)

    def try_open(self) -> bool:
        """Open now if a KV sequence is free (async drivers wait between tries, outside the
        engine's limiter, so running turns keep stepping)."""
        if self._dec is not None:
            return True
        try:
            self.open(wait=0)
        except InvalidParameter:
            return False
        return True

    def generate_request(self) -> GenerateRequest:
        """The turn as a coarse engine's request: prompt ids, the grammar as llguidance
        Lark, the sampling, and (for engines that render their own template) the messages
        and the JSON schema."""
        plan = self.plan
        if plan.speculative is not None:
            raise InvalidParameter("speculative", "a remote engine does its own decoding "
                                   "(speculation is the server's business)")
        c = plan.constraint
        if plan.processor is not None and c is None:
            raise InvalidParameter("constraint", "a remote engine can enforce chatkit "
                                   "Constraints only, not a custom LogitProcessor")
        params = plan.sampler.params
        return GenerateRequest(
            prompt=plan.prompt, grammar=lark_text(c.grammar) if c is not None else None,
            max_tokens=plan.max_tokens, stop_ids=plan.stop_ids,
            temperature=params.temperature, top_p=params.top_p, seed=params.seed,
            messages=plan.messages,
            schema=c.source if c is not None and c.kind == "json_schema" else None,
            grammar_kind=("tools" if plan.tools else "think+schema" if plan.thinking
                          else c.kind if c is not None else None))

    def begin_replay(self, *, check_grammar: bool = True) -> None:
        """Start replaying a coarse engine's tokens (then :meth:`feed` as they come and
        :meth:`end_replay`): they go through this turn's own sampler and grammar as one-hot
        rows, so the stop strings, tool-call and think parsing, finish rule and second reader
        are a local turn's. A token the grammar forbids (a server that ignored it) is
        ``SchemaViolation``. ``check_grammar=False`` (text re-tokenized locally, not the
        server's own ids) leaves the check to the second reader."""
        plan = self.plan
        plan.sampler.processor = plan.processor if check_grammar else None
        plan.sampler.reset()
        # A replay only samples (first/advance) and detokenizes: no stepping method runs.
        self._dec = Decoder(cast(StepEngine, self.engine), plan.prompt, plan.sampler,
                            max_tokens=plan.max_tokens, stop_ids=plan.stop_ids, seq_id=-1)
        self._dec.mark_start()
        self._fed = 0
        self._row = np.full(self.engine.n_vocab, -np.inf, dtype=np.float32)

    def feed(self, tokens: Sequence[int]) -> str:
        """Replay the engine's next token ids; the text delta."""
        dec = self.decoder
        out = ""
        for tok in tokens:
            if dec.done:
                break
            if tok in self.plan.stop_ids:  # the engine's stop (EOS or end of turn): the turn's
                tok = self.plan.stop_token
            if not 0 <= tok < self.engine.n_vocab:
                raise SchemaViolation(self.text, [f"the engine returned token id {tok}, "
                                                  "outside the vocabulary"])
            row = self._row
            row.fill(-np.inf)  # the sampler may have written into it
            row[tok] = 0.0
            try:
                out += self.first(row) if self._fed == 0 else self.advance(row)
            except (AllTokensMasked, ConstraintError) as exc:
                raise SchemaViolation(self.text, [
                    f"the engine's token {self._fed} ({tok}, "
                    f"{self.engine.token_bytes(tok)!r}) is outside the grammar: it was not "
                    f"enforced ({exc})"]) from exc
            self._fed += 1
        return out

    def end_replay(self, result: GenerateResult) -> str:
        """The engine finished: its stop token (or its limit) ends the replay."""
        dec = self.decoder
        out = ""
        if result.finish == "stop_token" and not dec.done:
            out = self.feed([self.plan.stop_token])
        dec.reuse = max(0, min(result.cached_prompt_tokens, len(self.plan.prompt) - 1))
        dec.finish("length")  # the engine stopped at its own limit (no-op when done)
        return out

    def step(self) -> str:
        """One decode step (a verify step when speculative); returns the text delta."""
        d = self.decoder
        if self.plan.speculative is None:
            return self._emit(d.step())
        out = ""
        for tok in d.speculate(self.plan.speculative, SPEC_K, self.gate):
            if self._cut:
                break
            out += self._emit(tok)
        return out

    def begin(self) -> None:
        """Batch drivers: drop what the sequence holds past the reused prefix."""
        self.decoder.begin()

    def chunk(self) -> SeqChunk | None:
        """Batch drivers: the evaluation the next step needs (None when done)."""
        return self.decoder.chunk()

    def first(self, row: Logits) -> str:
        """Batch drivers: the prompt was prefilled externally; sample the first token."""
        return self._emit(self.decoder.first(row))

    def advance(self, row: Logits) -> str:
        """Batch drivers: ``chunk()`` was evaluated externally; sample the next token."""
        return self._emit(self.decoder.advance(row))

    @property
    def decoder(self) -> Decoder:
        """The decode loop of an opened turn (its prompt, reuse, sequence, counts)."""
        if self._dec is None:
            raise InvalidParameter("turn", "not opened")
        return self._dec

    def _emit(self, tok: int | None) -> str:
        if tok is None:
            return ""
        delta = self._detok.feed(tok)
        self.text += delta
        if self.plan.tools and DEDUP_TOOL_CALLS and self.text.endswith(CALL_CLOSE):
            self._drop_repeated_call()
        stops = self.plan.stop_strings
        if not stops:
            return delta
        for s in stops:
            cut = self.text.find(s)
            if cut >= 0:
                emitted = len(self.text) - len(delta) - len(self._held)
                self.text = self.text[:cut]
                self._cut = True
                self.decoder.finish("stop_string")
                out = self.text[emitted:]
                self._held = ""
                return out
        pending = self._held + delta
        keep = _stop_prefix_len(pending, stops)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def _drop_repeated_call(self) -> None:
        """A greedy model repeats a finished call until the parallel cap: when the call just
        closed is identical to an earlier one of this reply, the reply ends before it (the
        grammar accepts there: calls then the stop token) and ``dropped_calls`` counts it."""
        blocks = [m.group(1) for m in CALL_BLOCK.finditer(self.text)]
        if len(blocks) < 2 or not _same_call(blocks[-1], blocks[:-1]):
            return
        self.text = self.text[: self.text.rindex(CALL_OPEN)].rstrip("\n")
        self.dropped_calls += 1
        self._cut = True
        self.decoder.finish("stop_string")
        _log.info("tool call repeated verbatim in one reply: dropped, reply ended")

    def flush(self) -> str:
        """Text withheld at the end (a partial stop string, an unfinished character)."""
        tail = self._held
        self._held = ""
        if self.decoder.end != "stop_string":
            rest = self._detok.flush()
            self.text += rest
            tail += rest
        return tail

    # ---------------------------------------------------------------- outcome
    def complete(self, *, record: bool = True) -> Reply[Any]:
        """Check the reply (truncation, second reader, tool calls), record it, return it.

        Raises ``Truncated``, ``SchemaViolation`` or ``ToolArgumentsInvalid``; then nothing
        is recorded. ``record=False`` leaves recording to :meth:`record` (the engine loop
        finishes a turn on its thread; the consumer records it when it takes the Reply, so
        a consumer that left first records nothing).
        """
        d = self.decoder
        gen = d.result()
        plan = self.plan
        text = self.text if plan.stop_strings or self._cut else gen.text
        reasoning: str | None = None
        parsed: Any = None
        calls: list[ToolCall] = []
        c = plan.constraint
        end = d.end or "length"
        if c is not None:
            if end == "length" and not c.is_accepting():
                raise Truncated(text, plan.max_tokens)
            if plan.thinking:
                reasoning, text = _thinking_parts(c, text)
            if plan.tools:
                text, calls = parse_calls(text, plan.tools)
            if c.reader is not None and not calls:
                parsed = c.reader.read(text)
        finish = decide_finish(end, grammar_done=c is not None or d.grammar_done,
                               tool_calls=bool(calls),
                               free_text=bool(plan.tools) and c is not None and c.reader is None)
        usage = Usage(
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=len(gen.tokens),
            cached_prompt_tokens=gen.prompt_tokens - gen.prompt_tokens_evaluated,
            prompt_seconds=gen.first_token_seconds,
            total_seconds=gen.seconds,
            draft_tokens=d.drafted,
            accepted_draft_tokens=d.accepted,
        )
        _log.debug("turn: %d prompt tokens (%d cached), %d reply tokens, first token %.3f s, "
                   "total %.3f s, %s", usage.prompt_tokens, usage.cached_prompt_tokens,
                   usage.completion_tokens, usage.prompt_seconds, usage.total_seconds, finish)
        added = [plan.user] if plan.user is not None else []
        added.append(Message("assistant", text, reasoning=reasoning, tool_calls=tuple(calls)))
        self._added = added
        if record:
            self.record()
        return Reply(text=text, finish_reason=finish, usage=usage, parsed=parsed,
                     reasoning=reasoning, tool_calls=calls, dropped_calls=self.dropped_calls)

    def record(self) -> None:
        """Add the completed turn's messages to the conversation (once)."""
        added, self._added = self._added, []
        if added:
            self.on_complete(added)

    def release(self) -> None:
        """Record what the KV sequence now holds and end the lease (every exit path)."""
        if self.seq is None:
            return
        self.kv.tokens = self.decoder.kv_tokens()
        self.local.release_seq(self.seq)
        self.seq = None


def remote_deltas(turn: Turn, pieces: Iterable[list[int] | GenerateResult],
                  out: list[Reply[Any]]) -> Iterator[str]:
    """A coarse engine's streamed token ids replayed through ``turn`` as they come (see
    :meth:`Turn.begin_replay`): text deltas, then the checked Reply appended to ``out``."""
    engine = turn.engine
    assert isinstance(engine, GenerateEngine)
    turn.begin_replay(check_grammar=engine.returns_token_ids)
    for piece in pieces:
        delta = turn.end_replay(piece) if isinstance(piece, GenerateResult) \
            else turn.feed(piece)
        if delta:
            yield delta
    tail, reply = turn.finish()
    out.append(reply)
    if tail:
        yield tail


def run_remote(turn: Turn) -> Reply[Any]:
    """Drive a planned turn on a coarse (remote) engine: one request, then the replay."""
    engine = turn.engine
    assert isinstance(engine, GenerateEngine)
    result = engine.generate(turn.generate_request())
    out: list[Reply[Any]] = []
    for _ in remote_deltas(turn, [list(result.tokens), result], out):
        pass
    return out[0]


DEDUP_TOOL_CALLS = True
"""End a reply at a tool call identical to an earlier one of the same reply (see
``Turn._drop_repeated_call``)."""


def _same_call(body: str, earlier: list[str]) -> bool:
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


def _thinking_parts(c: Constraint, text: str) -> tuple[str, str]:
    caps = dict(c.captures())
    think = caps.get("think", b"").decode("utf-8", errors="replace")
    answer = caps.get("answer")
    if answer is None:
        raise SchemaViolation(text, ["no answer after the think block"])
    return think, answer.decode("utf-8", errors="replace")
