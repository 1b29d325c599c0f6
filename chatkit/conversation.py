"""``Conversation``: messages, a model, and one constrained reply per ``send``.

A turn is written once as a small state machine (:class:`_Turn`: ``start``,
``step``, ``complete``, ``abandon``) and driven twice: synchronously by
``send``/``stream`` and asynchronously by ``asend``/``astream``, which run
each blocking step in a worker thread (anyio). The constraint is reset at
the start of every assistant turn; the KV cache keeps the conversation's
prompt, so each turn evaluates only the new suffix.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from .constraints import Constraint
from .decoding import Decoder, FinishReason
from .errors import InvalidParameter, SchemaViolation, Truncated
from .messages import Message, Reply, ToolCall, Usage
from .model import IncrementalDetokenizer, Model
from .sampling import DraftAwareProcessor, LogitProcessor, Sampler, SamplingParams
from .schema import SchemaInput, SchemaReader, json_options, load_schema
from .speculative import ConstrainedSource, CostGate, DraftSource, PromptLookupSource
from .templates import ChatTemplate, Segment, tokenize_segments
from .tools.definition import check_tools
from .tools.grammar import parse_calls, tool_grammar

__all__ = ["Conversation", "ReplyStream"]

NO_THINK_PREFILL = "<think>\n\n</think>\n\n"
SPEC_K = 4  # draft tokens per verify: 5-row batches stay in the bitwise-equal regime


# One capacity limiter per model and event loop: async steps on one model run one at a time.
_LIMITERS: anyio.lowlevel.RunVar[dict[int, anyio.CapacityLimiter]] = anyio.lowlevel.RunVar(
    "chatkit_limiters")


def _limiter(model: Model) -> anyio.CapacityLimiter:
    try:
        table = _LIMITERS.get()
    except LookupError:
        table = {}
        _LIMITERS.set(table)
    if id(model) not in table:
        table[id(model)] = anyio.CapacityLimiter(1)
    return table[id(model)]


async def _run(model: Model, fn: Any, *args: Any) -> Any:
    """Run a blocking step in a worker thread under the model's limiter."""
    return await anyio.to_thread.run_sync(fn, *args, limiter=_limiter(model))


class Conversation:
    """A chat with one model. Not thread-safe: one ``send`` at a time per conversation
    (different conversations may share a model; their steps interleave safely).

    ``sampling`` applies to every turn unless a ``send`` overrides it; the
    sampler's RNG persists across turns, so a seeded conversation reproduces.
    ``stop`` strings end free-text replies (not constrained ones).
    """

    def __init__(
        self,
        model: Model,
        *,
        system: str | None = None,
        no_think: bool = False,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        max_tokens: int = 512,
        template: ChatTemplate | str | None = None,
        think_budget: int = 256,
    ) -> None:
        if max_tokens < 1:
            raise InvalidParameter("max_tokens", f"must be >= 1, got {max_tokens}")
        if think_budget < 1:
            raise InvalidParameter("think_budget", f"must be >= 1, got {think_budget}")
        self.model = model
        self.system = system
        self.no_think = no_think
        self.sampling = sampling or SamplingParams()
        self.stop = tuple(stop)
        self.max_tokens = max_tokens
        self.think_budget = think_budget
        self.template = (ChatTemplate.bundled(template) if isinstance(template, str)
                         else template or ChatTemplate.for_model(model))
        self.messages: list[Message] = []
        self._sampler = Sampler(self.sampling)
        self._seq: int | None = None
        self._kv: list[int] = []
        self._finalizer = weakref.finalize(self, model.release_seq_owner, id(self))

    # --------------------------------------------------------------- sync API
    def send(self, text: str, **options: Any) -> Reply:
        """Add a user message and return the assistant's reply.

        Options: ``schema`` (Pydantic class, JSON-schema dict/text, or a
        Constraint), ``constraint`` (a Constraint or any LogitProcessor),
        ``max_tokens``, ``sampling``, ``stop``, ``schema_in_prompt``.
        Raises ``Truncated`` (cut before the constraint completed),
        ``SchemaViolation`` (the second reader disagrees), refusals from the
        schema layer, and ``DecodeError``. On any error the conversation is
        left as it was (the turn is not appended).
        """
        return self._send_turn(text, options)

    def run(self, text: str, tools: Sequence[Any], *, max_steps: int = 8, output: Any = None,
            **options: Any) -> Reply:
        """The agent loop: send, execute the called tools, feed the results back, repeat
        until the model answers without a tool call (that Reply is returned).

        Tools run concurrently (async tools as tasks, sync tools in worker threads,
        each under its ``timeout``); a tool that raises becomes an error tool response
        the model sees; ``ModelRetry`` asks for a corrected call. ``output`` constrains
        the final answer to a schema. Raises ``MaxStepsExceeded`` (with the transcript)
        after ``max_steps`` model turns.
        """
        from .tools.loop import run_agent

        return run_agent(self, text, tools, max_steps=max_steps, output=output, **options)

    async def arun(self, text: str, tools: Sequence[Any], *, max_steps: int = 8,
                   output: Any = None, **options: Any) -> Reply:
        """``run`` for async code."""
        from .tools.loop import arun_agent

        return await arun_agent(self, text, tools, max_steps=max_steps, output=output,
                                **options)

    def _send_turn(self, text: str | None, options: dict[str, Any]) -> Reply:
        turn = self._turn(text, options)
        try:
            turn.start()
            while not turn.done:
                turn.step()
            turn.flush()
            return turn.complete()
        finally:
            turn.release()

    def stream(self, text: str, **options: Any) -> ReplyStream:
        """Like ``send``, but iterate the returned object for text deltas; its
        ``reply`` attribute holds the Reply once the iteration ends."""
        return ReplyStream(self._turn(text, options))

    # -------------------------------------------------------------- async API
    async def asend(self, text: str, **options: Any) -> Reply:
        """``send`` for async code: every llama.cpp step runs in a worker thread, one at a
        time per model (an anyio ``CapacityLimiter(1)``), so other tasks keep running."""
        return await self._asend_turn(text, options)

    async def _asend_turn(self, text: str | None, options: dict[str, Any]) -> Reply:
        turn: _Turn = await _run(self.model, self._turn, text, options)
        try:
            await _run(self.model, turn.start)
            while not turn.done:
                await _run(self.model, turn.step)
            turn.flush()
            return turn.complete()
        finally:
            turn.release()

    async def astream(self, text: str, **options: Any) -> AsyncIterator[str]:
        """Async text deltas. Cancelling (or leaving the loop) abandons the turn:
        the conversation's messages are unchanged."""
        turn: _Turn = await _run(self.model, self._turn, text, options)
        try:
            delta = await _run(self.model, turn.start)
            if delta:
                yield delta
            while not turn.done:
                delta = await _run(self.model, turn.step)
                if delta:
                    yield delta
            tail = turn.flush()
            if tail:
                yield tail
            turn.complete()
        finally:
            turn.release()

    # --------------------------------------------------------------- internals
    def _turn(self, text: str | None, options: dict[str, Any]) -> _Turn:
        known = {"schema", "constraint", "max_tokens", "sampling", "stop", "schema_in_prompt",
                 "tools", "tool_choice", "parallel_tool_calls", "speculative"}
        unknown = set(options) - known
        if unknown:
            raise InvalidParameter(sorted(unknown)[0], "unknown send option")
        return _Turn(self, text, **options)

    def prompt_ids(self, text: str, **options: Any) -> list[int]:
        """The token ids ``send(text, **options)`` would evaluate (nothing is sent)."""
        return list(self._turn(text, options).plan.prompt)

    def history(self) -> list[Message]:
        """The messages sent to the template: system first, then the turns."""
        head = [Message("system", self.system)] if self.system else []
        return head + list(self.messages)


@dataclass
class _Plan:
    processor: LogitProcessor | None
    constraint: Constraint | None
    thinking: bool
    prompt: list[int]
    stop_ids: set[int]


class _Turn:
    """One assistant turn: prepared in ``__init__``, decoded by steps, then either
    ``complete`` (validated, appended) or dropped (nothing appended)."""

    def __init__(
        self,
        conv: Conversation,
        text: str | None,
        *,
        schema: SchemaInput | Constraint | None = None,
        constraint: Constraint | LogitProcessor | None = None,
        max_tokens: int | None = None,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] | None = None,
        schema_in_prompt: bool = False,
        tools: Sequence[Any] | None = None,
        tool_choice: str = "auto",
        parallel_tool_calls: bool = True,
        speculative: bool = False,
    ) -> None:
        if text is not None and not isinstance(text, str):
            raise InvalidParameter("text", f"must be a str, not {type(text).__name__}")
        if schema is not None and constraint is not None:
            raise InvalidParameter("schema", "give schema= or constraint=, not both")
        if tools and constraint is not None:
            raise InvalidParameter("constraint", "tools= builds its own grammar")
        self.conv = conv
        model = conv.model
        self.max_tokens = max_tokens if max_tokens is not None else conv.max_tokens
        if self.max_tokens < 1:
            raise InvalidParameter("max_tokens", f"must be >= 1, got {self.max_tokens}")
        if schema_in_prompt and schema is None:
            raise InvalidParameter("schema_in_prompt", "needs schema=")
        self.user = None if text is None else Message(
            "user", text + _schema_note(schema) if schema_in_prompt else text)
        self.tools = check_tools(tools) if tools else []
        constrained = schema is not None or constraint is not None or bool(self.tools)
        if stop and constrained:
            raise InvalidParameter("stop", "stop strings end free text; a constraint ends itself")
        self.stop_strings = tuple(stop if stop is not None else ([] if constrained else conv.stop))

        template = conv.template
        if self.tools and not template.supports_tools:
            template = ChatTemplate.for_model(model, tools=True)
        stop_token = _turn_stop(model, template)
        thinking = (constrained and not self.tools and not conv.no_think
                    and template.supports_thinking)
        self.plan = _Plan(None, None, thinking, [], {stop_token, model.eos_id})
        if self.tools:
            self.plan.constraint = self._tools_constraint(schema, tool_choice,
                                                          parallel_tool_calls, stop_token)
            self.plan.processor = self.plan.constraint
        elif schema is not None:
            self.plan.constraint = self._schema_constraint(schema, stop_token, thinking)
            self.plan.processor = self.plan.constraint
        elif isinstance(constraint, Constraint):
            self.plan.constraint = constraint.bind(model, stop_token)
            self.plan.processor = self.plan.constraint
        elif constraint is not None:
            self.plan.processor = constraint
        segments = template.render(
            [*conv.history(), *([self.user] if self.user else [])],
            add_generation_prompt=True,
            tools=[t.definition.for_template() for t in self.tools] or None,
            enable_thinking=(False if conv.no_think else None) if template.supports_thinking
            else None,
            bos_token=model.detokenize([model.bos_id]) if model.bos_id >= 0 else "",
            eos_token=model.detokenize([model.eos_id]) if model.eos_id >= 0 else "",
        )
        if conv.no_think and not template.supports_thinking:
            segments.append(Segment("markup", NO_THINK_PREFILL))
        if thinking:
            segments.append(Segment("markup", "<think>"))
        prompt = tokenize_segments(model, segments)
        if model.add_bos and (not prompt or prompt[0] != model.bos_id):
            prompt.insert(0, model.bos_id)
        self.plan.prompt = prompt

        self.sampler = conv._sampler
        if sampling is not None:
            self.sampler = Sampler(sampling)
        self.spec: DraftSource | None = None
        self.gate = CostGate()
        if speculative:
            proc = self.plan.processor
            self.spec = (ConstrainedSource(proc, PromptLookupSource())
                         if isinstance(proc, DraftAwareProcessor) else PromptLookupSource())
        self._cut = False  # a stop string ended the text
        self.detok: IncrementalDetokenizer = model.incremental_detokenizer()
        self.decoder: Decoder | None = None
        self.seq: int | None = None
        self.text = ""
        self._held = ""  # text withheld while it may be the start of a stop string

    # ------------------------------------------------------------ preparation
    def _tools_constraint(self, output: Any, tool_choice: str, parallel: bool,
                          stop_token: int) -> Constraint:
        out_doc: dict[str, Any] | None = None
        reader = None
        if output is not None:
            if isinstance(output, Constraint):
                raise InvalidParameter("schema", "with tools=, give the output as a schema")
            doc, cls = load_schema(output)
            if not isinstance(doc, dict):
                raise InvalidParameter("schema", "the output schema must be an object schema")
            out_doc = doc
            reader = SchemaReader(doc, cls)
        lark = tool_grammar(self.tools, tool_choice, parallel=parallel, output=out_doc)
        model = self.conv.model
        proto: Constraint = model.cache(("tools", lark, stop_token), lambda: Constraint.lark(
            lark, model=model, stop_token=stop_token))
        made = proto.clone()
        made.reader = reader
        return made

    def _schema_constraint(self, schema: SchemaInput | Constraint, stop_token: int,
                           thinking: bool) -> Constraint:
        model = self.conv.model
        if isinstance(schema, Constraint):
            if schema.kind != "json_schema":
                raise InvalidParameter("schema", "a Constraint given as schema= must be JSON")
            if thinking:
                raise InvalidParameter("schema", "thinking needs a schema, not a Constraint")
            return schema.bind(model, stop_token)
        doc, cls = load_schema(schema)
        if not thinking:
            key = ("schema", json.dumps(doc, sort_keys=True), stop_token)
            proto: Constraint = model.cache(key, lambda: Constraint.json_schema(
                schema, model=model, stop_token=stop_token))
            return proto.clone()
        embedded: dict[str, Any] = dict(doc) if isinstance(doc, dict) else {"anyOf": [doc]}
        embedded["x-guidance"] = {**json_options(), **embedded.get("x-guidance", {})}
        # The think budget leaves at least half of max_tokens to the answer.
        budget = max(1, min(self.conv.think_budget, self.max_tokens // 2))
        lark = (
            'start: think close answer\n'
            'close: "\\n\\n" | "</think>\\n\\n"\n'
            f'think[capture, stop="</think>", max_tokens={budget}]: /(?s:.*)/\n'
            f"answer[capture]: %json {json.dumps(embedded)}\n"
        )
        made = Constraint.lark(lark, model=model, stop_token=stop_token)
        made.reader = SchemaReader(doc, cls)
        return made

    # ------------------------------------------------------------------ steps
    @property
    def done(self) -> bool:
        return self.decoder is not None and self.decoder.done

    def open(self) -> Decoder:
        """Lease the KV sequence and reset the processor; nothing is evaluated yet."""
        conv, model = self.conv, self.conv.model
        self.sampler.processor = self.plan.processor
        self.sampler.reset()  # per-turn reset: one constraint governs each reply afresh
        self.seq, kept = model.acquire_seq(id(conv), conv._seq)
        conv._seq = self.seq
        reuse = _common_prefix(conv._kv, self.plan.prompt) if kept else 0
        self.decoder = Decoder(model, self.plan.prompt, self.sampler,
                               max_tokens=self.max_tokens, stop_ids=self.plan.stop_ids,
                               seq_id=self.seq, reuse=reuse)
        return self.decoder

    def start(self) -> str:
        """Open, prefill, and sample the first token."""
        return self._emit(self.open().start())

    def step(self) -> str:
        d = self.decoder
        assert d is not None
        if self.spec is None:
            return self._emit(d.step())
        toks = d.speculate(self.spec, SPEC_K, self.gate)
        out = ""
        for tok in toks:
            if self._cut:
                break
            out += self._emit(tok)
        return out

    def first(self, row: Any) -> str:
        """Batch drivers: the prompt was prefilled externally; sample the first token."""
        assert self.decoder is not None
        return self._emit(self.decoder.first(row))

    def advance(self, row: Any) -> str:
        """Batch drivers: the pending token was evaluated externally; sample the next."""
        assert self.decoder is not None
        return self._emit(self.decoder.advance(row))

    def _emit(self, tok: int | None) -> str:
        if tok is None:
            return ""
        delta = self.detok.feed(tok)
        self.text += delta
        if not self.stop_strings:
            return delta
        for s in self.stop_strings:
            cut = self.text.find(s)
            if cut >= 0:
                emitted = len(self.text) - len(delta) - len(self._held)
                self.text = self.text[:cut]
                self._cut = True
                assert self.decoder is not None
                self.decoder.finish("stop")
                out = self.text[emitted:]
                self._held = ""
                return out
        pending = self._held + delta
        keep = _stop_prefix_len(pending, self.stop_strings)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """Text withheld at the end (a partial stop string, an unfinished character)."""
        tail = self._held
        self._held = ""
        assert self.decoder is not None
        if self.decoder.finish_reason != "stop" or not self.stop_strings:
            rest = self.detok.flush()
            self.text += rest
            tail += rest
        return tail

    # ---------------------------------------------------------------- outcome
    def complete(self) -> Reply:
        """Validate, append the turn to the conversation and return the Reply."""
        assert self.decoder is not None
        gen = self.decoder.result()
        text = self.text if self.stop_strings else gen.text
        finish: FinishReason = gen.finish_reason
        reasoning: str | None = None
        parsed: Any = None
        calls: list[ToolCall] = []
        c = self.plan.constraint
        if c is not None:
            if finish == "length" and not c.is_accepting():
                raise Truncated(text, self.max_tokens)
            if self.plan.thinking:
                reasoning, text = _thinking_parts(c, text)
            if self.tools:
                text, calls = parse_calls(text, self.tools)
            if c.reader is not None and not calls:
                parsed = c.reader.read(text)
            if calls:
                finish = "tool_calls"
            elif self.tools and c.reader is None:
                finish = "stop" if finish != "length" else finish  # free text ended itself
            elif finish == "stop":
                finish = "constraint_complete"
        usage = Usage(
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=len(gen.tokens),
            cached_prompt_tokens=gen.prompt_tokens - gen.prompt_tokens_evaluated,
            prompt_seconds=gen.first_token_seconds,
            total_seconds=gen.seconds,
            draft_tokens=self.decoder.drafted,
            accepted_draft_tokens=self.decoder.accepted,
        )
        if self.user is not None:
            self.conv.messages.append(self.user)
        self.conv.messages.append(Message("assistant", text, reasoning=reasoning,
                                          tool_calls=tuple(calls)))
        return Reply(text=text, finish_reason=finish, usage=usage, parsed=parsed,
                     reasoning=reasoning, tool_calls=calls)

    def release(self) -> None:
        """Record what the KV cache now holds and free the sequence (every exit path)."""
        if self.seq is None:
            return
        assert self.decoder is not None
        self.conv._kv = self.decoder.kv_tokens()
        self.conv.model.release_seq(self.seq)
        self.seq = None


class ReplyStream:
    """Iterate for text deltas; ``reply`` is set when the iteration ends normally.

    Leaving the loop early abandons the turn (nothing is appended).
    """

    def __init__(self, turn: _Turn) -> None:
        self._turn = turn
        self.reply: Reply | None = None

    def __iter__(self) -> Iterator[str]:
        turn = self._turn
        try:
            delta = turn.start()
            if delta:
                yield delta
            while not turn.done:
                delta = turn.step()
                if delta:
                    yield delta
            tail = turn.flush()
            if tail:
                yield tail
            self.reply = turn.complete()
        finally:
            turn.release()


def _turn_stop(model: Model, template: ChatTemplate) -> int:
    if template.end_of_turn:
        ids = model.tokenize(template.end_of_turn, special=True)
        if len(ids) == 1 and model.is_control(ids[0]):
            return ids[0]
    return model.eot_id


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


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


def _schema_note(schema: Any) -> str:
    if schema is None:
        return ""
    if isinstance(schema, Constraint):
        doc = schema.source
    else:
        doc, _ = load_schema(schema)
    return "\n\nAnswer with JSON matching this schema:\n" + json.dumps(doc)
