"""The renderer behind :mod:`chatkit.templates` (its docstring says the contract): the
sandbox, the segment markers, ``ChatTemplate``, and tokenizing segments."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import marshal
import re
import secrets
import sys
import time
import types
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from ..engine import diskcache
from ..errors import TemplateError
from ..messages import Message

if TYPE_CHECKING:
    from ..engine.protocols import Vocabulary

__all__ = ["ChatTemplate", "Segment"]

_log = logging.getLogger("chatkit")

BUNDLED = ("chatml", "hermes", "qwen3", "gemma")

# Texts that end an assistant turn, by family (the first one a template uses is its marker).
_END_MARKERS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eot|>", "<|end|>", "<turn|>",
                "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>", "<|user|>")  # noqa: RUF001

COMMON_SPECIAL_TEXTS = (
    "<|im_start|>", "<|im_end|>", "<|im_sep|>", "<|endoftext|>", "<|begin_of_text|>",
    "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|start_header_id|>",
    "<|end_header_id|>", "<|python_tag|>", "<|header_start|>", "<|header_end|>", "<|eot|>",
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<s>", "</s>", "[INST]", "[/INST]",
    "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<tool_call>", "</tool_call>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|tool_call|>",
    "<|start|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>",
    "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",  # noqa: RUF001
    "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>",  # noqa: RUF001
)
"""Special-token texts of common families, always protected inside content (the engine's
own special tokens are added to these)."""


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered prompt."""

    kind: Literal["markup", "content"]
    """markup: the template's text (special tokens parsed); content: special-token text that
    came from a caller's string (tokenized as plain text)."""
    text: str


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(f"the template refused the messages: {message}")


def _as_list(value: Any) -> Any:
    # ``tools | map(attribute='function') | tojson`` (llama.cpp's DeepSeek R1 template):
    # Jinja's filters return generators where llama.cpp's renderer returns lists.
    if isinstance(value, types.GeneratorType):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_as_list)


def _bounded_tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                    separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    if isinstance(indent, int) and indent > 64:
        raise jinja2.exceptions.SecurityError(f"tojson indent {indent} too large")
    text = _tojson(value, ensure_ascii, indent, separators, sort_keys)
    if len(text) > RENDER_CHARS:
        raise jinja2.exceptions.SecurityError("tojson output too large")
    return text


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}...{% endgeneration %}``: marks assistant text for
    training masks; renders its body unchanged."""

    tags = {"generation"}  # noqa: RUF012  (jinja2 declares it a plain set attribute)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


RENDER_SECONDS = 2.0
"""Wall-time budget of one rendering: a template is untrusted input and must not stall."""
RENDER_CHARS = 2_000_000
"""Largest string a template may build (its output, a concatenation, a repetition)."""


class _OwnList(list[Any]):
    """A list the template built itself (a ``[...]`` literal): the template may ``append``
    to it, ``pop`` it, ... as llama.cpp's renderer lets it (Kimi K2 queues its call ids in
    one); the caller's lists (``messages``, ``tools``) stay immutable."""

    def append(self, item: Any) -> None:
        _bounded(len(self) + 1)
        super().append(item)

    def insert(self, index: Any, item: Any) -> None:
        _bounded(len(self) + 1)
        super().insert(index, item)

    def extend(self, items: Any) -> None:
        items = list(items)
        _bounded(len(self) + len(items))
        super().extend(items)


class _OwnDict(dict[Any, Any]):
    """A dict the template built itself (a ``{...}`` literal): mutable, as ``_OwnList``."""

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        _bounded(len(self))

    def setdefault(self, key: Any, default: Any = None) -> Any:
        _bounded(len(self) + 1)
        return super().setdefault(key, default)


def _bounded(size: int) -> None:
    if size > RENDER_CHARS:
        raise jinja2.exceptions.SecurityError("collection too large")


class _BoundedCodegen(jinja2.compiler.CodeGenerator):
    """Compiles ``a ~ b`` to a length-checked join (string doubling in a loop is a bomb),
    and the template's own list and dict literals to ``_OwnList`` / ``_OwnDict``."""

    def visit_List(self, node: jinja2.nodes.List, frame: Any) -> None:
        self.write("environment.own_list(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: jinja2.nodes.Dict, frame: Any) -> None:
        self.write("environment.own_dict(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Const(self, node: jinja2.nodes.Const, frame: Any) -> None:
        # jinja2 folds a literal of constants ("[]", "{'a': 1}") to a Const before writing it.
        own = {list: "environment.own_list(", dict: "environment.own_dict("}.get(type(node.value))
        if own is None:
            super().visit_Const(node, frame)
            return
        self.write(own)
        super().visit_Const(node, frame)
        self.write(")")

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Any) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The reference renderer's sandbox, with bounds on what arithmetic and concatenation
    may build (``range`` is already capped by jinja2's sandbox)."""

    code_generator_class = _BoundedCodegen
    intercepted_binops = frozenset({"**", "*", "+"})
    own_list = _OwnList
    own_dict = _OwnDict

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, _OwnList | _OwnDict):
            return jinja2.sandbox.SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and (
                right > 0 and abs(left) > 1 and right * max(1, abs(left).bit_length()) > 4096):
            raise jinja2.exceptions.SecurityError("integer power too large")
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int) and \
                        len(seq) * times > RENDER_CHARS:
                    raise jinja2.exceptions.SecurityError("repetition too large")
        result = super().call_binop(context, operator, left, right)
        if isinstance(result, str | list) and len(result) > RENDER_CHARS:
            raise jinja2.exceptions.SecurityError("value too large")
        return result

    @staticmethod
    def bounded_concat(parts: Any) -> str:
        text = "".join(map(str, parts))
        if len(text) > RENDER_CHARS:
            raise jinja2.exceptions.SecurityError("string too large")
        return text


def _environment(now: Callable[[], datetime]) -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    # As transformers renders chat templates: trim/lstrip blocks, loop controls, no escaping.
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
    )
    env.filters["tojson"] = _bounded_tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: now().strftime(fmt)
    return env


_TEMPLATE_CODE_FORMAT = 2
"""Part of a compiled template's cache name, with the template text, the environment's
settings, jinja2's version and the Python version: bump it when ``_environment`` changes
what jinja2 generates in a way those settings do not show (a filter or global is looked up
by name when the template runs, so those do not count)."""


def _template_code(env: jinja2.Environment, source: str) -> CodeType:
    """jinja2's compiled code of ``source`` (what ``env.from_string`` compiles), from the
    disk cache when a previous process compiled the same text (as jinja2's own bytecode
    cache does for loaded templates): compiling is a visible share of a process's first
    token, more so for large GGUF templates."""
    setup = (type(env).__qualname__, env.sandboxed, sorted(env.extensions), env.trim_blocks,
             env.lstrip_blocks, env.autoescape, env.keep_trailing_newline, env.newline_sequence,
             env.block_start_string, env.block_end_string, env.variable_start_string,
             env.variable_end_string, env.comment_start_string, env.comment_end_string,
             env.line_statement_prefix, env.line_comment_prefix, env.optimized,
             sorted(getattr(env, "intercepted_binops", ())),
             sorted(getattr(env, "intercepted_unops", ())))
    key = (f"{_TEMPLATE_CODE_FORMAT}|{jinja2.__version__}|{sys.version}|{marshal.version}|"
           f"{setup!r}|{source}")
    path = diskcache.cache_dir() / f"template-{hashlib.sha256(key.encode()).hexdigest()[:24]}.bin"
    raw = diskcache.read(path)
    if raw is not None:
        try:
            code = marshal.loads(raw)
        except (EOFError, ValueError, TypeError):
            code = None
        if isinstance(code, CodeType):
            return code
    code = env.compile(source)
    diskcache.write(path, marshal.dumps(code), "compiled template")
    return code


def message_dict(m: Message, *, arguments_as_text: bool = False) -> dict[str, Any]:
    """A message as templates expect it (OpenAI / transformers shape): tool-call arguments
    as an object (or JSON text), the think text as ``reasoning_content``."""
    item: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning is not None:
        item["reasoning_content"] = m.reasoning
    if m.tool_calls:
        item["tool_calls"] = [{"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": json.dumps(
                                   c.arguments, ensure_ascii=False) if arguments_as_text
                                   else c.arguments}}
                              for c in m.tool_calls]
    if m.tool_call_id is not None:
        item["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        item["name"] = m.name
    return item


def _normalize(message: Mapping[str, Any]) -> dict[str, Any]:
    """transformers' message normalisation: None-valued keys dropped; reasoning given as
    ``reasoning_content``, ``thinking`` or ``reasoning`` is offered under both
    ``reasoning_content`` and ``thinking``."""
    out = {k: v for k, v in message.items() if v is not None}
    for key in ("reasoning_content", "thinking", "reasoning"):
        if key in out:
            out.setdefault("reasoning_content", out[key])
            out.setdefault("thinking", out[key])
            break
    return out


class _SpecialIndex:
    """Finds special-token texts in a string fast (thousands of them for a 262k vocabulary):
    candidate positions by their first character, then the longest text that starts there."""

    def __init__(self, specials: tuple[str, ...]) -> None:
        by_first: dict[str, list[str]] = {}
        for t in sorted(set(specials), key=len, reverse=True):
            if t:
                by_first.setdefault(t[0], []).append(t)
        self.by_first = by_first
        self.first = (re.compile("[" + "".join(map(re.escape, sorted(by_first))) + "]")
                      if by_first else None)

    def sub(self, text: str, swap: Callable[[str], str]) -> str:
        if self.first is None:
            return text
        out: list[str] = []
        pos = 0
        m = self.first.search(text)
        while m is not None:
            i = m.start()
            hit = next((t for t in self.by_first[text[i]] if text.startswith(t, i)), None)
            if hit is None:
                m = self.first.search(text, i + 1)
                continue
            out += [text[pos:i], swap(hit)]
            pos = i + len(hit)
            m = self.first.search(text, pos)
        out.append(text[pos:])
        return "".join(out)


@functools.lru_cache(maxsize=8)
def _index(specials: tuple[str, ...]) -> _SpecialIndex:
    """The index of ``specials`` (one per vocabulary's special texts; at most 8 kept)."""
    return _SpecialIndex(tuple(dict.fromkeys((*COMMON_SPECIAL_TEXTS, *specials))))


class _Marker:
    """Swaps special-token texts inside caller strings for ASCII markers, and back."""

    def __init__(self, specials: tuple[str, ...]) -> None:
        self.index = _index(specials)
        self.nonce = secrets.token_hex(4)
        self.found: list[str] = []
        self.marker = re.compile(f"CKSEG{self.nonce}x(\\d{{6}})x")

    def mark(self, value: Any, *, key: str | None = None) -> Any:
        if isinstance(value, str):
            return value if key in ("role", "type") else self.index.sub(value, self._swap)
        if isinstance(value, Mapping):
            return {k: self.mark(v, key=k) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.mark(v) for v in value]
        return value

    def _swap(self, text: str) -> str:
        self.found.append(text)
        return f"CKSEG{self.nonce}x{len(self.found) - 1:06d}x"

    def restore(self, text: str) -> str:
        return self.marker.sub(lambda m: self.found[int(m.group(1))], text)

    def segments(self, text: str) -> list[Segment]:
        out: list[Segment] = []
        pos = 0
        for m in self.marker.finditer(text):
            if m.start() > pos:
                out.append(Segment("markup", text[pos : m.start()]))
            out.append(Segment("content", self.found[int(m.group(1))]))
            pos = m.end()
        if pos < len(text):
            out.append(Segment("markup", text[pos:]))
        return _merge(out)


def _merge(segments: list[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for seg in segments:
        if merged and merged[-1].kind == seg.kind:
            merged[-1] = Segment(seg.kind, merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return merged


class ChatTemplate:
    """A Jinja chat template plus the end-of-turn text that stops a reply.

    Build with :meth:`for_model` (the GGUF's own, or a bundled one when the
    GGUF has none), :meth:`bundled` or :meth:`from_string`. Compiling a
    template that does not parse raises ``TemplateError``.
    """

    def __init__(self, source: str, *, name: str, end_of_turn: str | None = None) -> None:
        self.source = source
        self.name = name
        self.end_of_turn = end_of_turn or next((m for m in _END_MARKERS if m in source), None)
        self._now: datetime | None = None
        env = _environment(lambda: self._now or datetime.now())
        try:
            self._template = env.template_class.from_code(
                env, _template_code(env, source), env.make_globals(None), None)
        except (jinja2.TemplateError, SyntaxError, RecursionError, MemoryError) as exc:
            # SyntaxError: jinja2 emits Python that does not compile (`{% break %}` outside a
            # loop); RecursionError: absurdly nested source. Both are the template's fault.
            raise TemplateError(f"template {name!r} does not compile: {exc}") from None

    @classmethod
    def from_string(cls, source: str, *, name: str = "custom",
                    end_of_turn: str | None = None) -> ChatTemplate:
        return cls(source, name=name, end_of_turn=end_of_turn)

    @classmethod
    def bundled(cls, name: str) -> ChatTemplate:
        """One of chatkit's templates: chatml, hermes (tools), qwen3 (thinking), gemma."""
        if name not in BUNDLED:
            raise TemplateError(f"no bundled template {name!r}; choose from {', '.join(BUNDLED)}")
        folder = resources.files(__package__ or "chatkit.templates")
        text = folder.joinpath(f"{name}.jinja").read_text(encoding="utf-8")
        return cls(text, name=name)

    @classmethod
    def for_model(cls, model: Vocabulary) -> ChatTemplate:
        """The template a model's conversation uses, and the choice logged: the GGUF's own
        template, when it has one; else a bundled one, only when the model's own control
        tokens spell its markup: ``gemma`` for ``<start_of_turn>`` vocabularies, ``chatml``
        for ``<|im_start|>``/``<|im_end|>`` ones; any other vocabulary is ``TemplateError``:
        pass ``template=``. (A turn with tools takes its dialect from this template:
        ``chatkit.tools.detect``.)"""
        if model.chat_template:
            _log.info("template: the model's own (GGUF)")
            return cls(model.chat_template, name="gguf")
        if single_control(model, "<start_of_turn>"):
            _log.info("template: bundled 'gemma' (the GGUF has none)")
            return cls.bundled("gemma")
        if single_control(model, "<|im_start|>") and single_control(model, "<|im_end|>"):
            _log.info("template: bundled 'chatml' (the GGUF has none)")
            return cls.bundled("chatml")
        raise TemplateError(f"{model.name} has no chat template and its vocabulary matches no "
                            "bundled one; pass template= (a ChatTemplate)")

    @property
    def supports_thinking(self) -> bool:
        """The template has a thinking switch (``enable_thinking``)."""
        return "enable_thinking" in self.source

    @property
    def mentions_tools(self) -> bool:
        """The template reads a ``tools`` variable."""
        return re.search(r"\btools\b", self.source) is not None

    @functools.cached_property
    def supports_system(self) -> bool:
        """The template renders a system message (probed once): else a conversation's
        system prompt is folded into its first user message."""
        probe = [Message("system", "SYSTEMPROBE"), Message("user", "hi")]
        no_tools: tuple[list[dict[str, Any]] | None, ...] = (None, [])
        for tools in no_tools:  # tool-use templates may need a tools list, even empty
            try:
                return "SYSTEMPROBE" in "".join(s.text for s in self.render(probe, tools=tools))
            except TemplateError:
                continue
        return False

    def render(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        bos_token: str = "",
        eos_token: str = "",
        special: Collection[str] = (),
        now: datetime | None = None,
        arguments_as_text: bool = False,
    ) -> list[Segment]:
        """Render chatkit messages to segments (see :meth:`render_context`);
        ``arguments_as_text``: tool-call arguments as JSON text, for templates that
        concatenate them (else a mapping)."""
        variables: dict[str, Any] = {
            "messages": [message_dict(m, arguments_as_text=arguments_as_text)
                         for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": bos_token,
            "eos_token": eos_token,
        }
        if tools is not None:
            variables["tools"] = tools
        if "functions" in self._reads:  # Firefunction v2: as llama.cpp passes them
            variables["functions"] = json.dumps(tools, indent=2, ensure_ascii=False) \
                if tools else ""
        if "datetime" in self._reads:
            variables["datetime"] = (now or datetime.now()).strftime("%b %d %Y %H:%M:%S GMT")
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        return self.render_context(variables, special=special, now=now)

    @functools.cached_property
    def _reads(self) -> frozenset[str]:
        """The variables beyond transformers' that the template reads and chatkit passes
        (``functions``: the tools as JSON text; ``datetime``: the time, as
        ``%b %d %Y %H:%M:%S GMT``), as llama.cpp passes them to Firefunction v2's."""
        try:  # the names it loads and never sets (no code generated: nothing folded)
            env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, _GenerationTag])
            nodes = list(env.parse(self.source).find_all(jinja2.nodes.Name))
        except (jinja2.TemplateError, RecursionError):
            return frozenset()
        loads = {n.name for n in nodes if n.ctx == "load"} - {
            n.name for n in nodes if n.ctx != "load"}
        return frozenset(loads & {"functions", "datetime"})

    def render_context(self, variables: Mapping[str, Any], *, special: Collection[str] = (),
                       now: datetime | None = None) -> list[Segment]:
        """Render template variables (``messages`` as OpenAI-style dicts, ``tools``,
        ``add_generation_prompt``, ``bos_token``, ...) exactly as transformers'
        ``apply_chat_template`` does, to segments.

        ``special``: special-token texts of the tokenizer (added to
        ``COMMON_SPECIAL_TEXTS``); where they occur inside caller strings they come back
        as ``content`` segments. ``now`` pins ``strftime_now``. Raises ``TemplateError``
        when the template fails, raises, is refused by the sandbox, or makes its output
        depend on special-token text inside content.
        """
        plain = dict(variables)
        plain["messages"] = [_normalize(m) for m in variables.get("messages", [])]
        if plain.get("tools") is None:
            plain["tools"] = None
        marker = _Marker(tuple(special))
        marked = {k: marker.mark(v) if k in ("messages", "tools") else v
                  for k, v in plain.items()}
        if not marker.found:
            text = self._render(plain, now)
            return [Segment("markup", text)] if text else []
        try:
            text = self._render(marked, now)
        except TemplateError:
            self._render(plain, now)  # the template's own error, in the caller's words
            raise self._depends() from None
        if marker.restore(text) != self._render(plain, now):
            raise self._depends()
        return marker.segments(text)

    def _depends(self) -> TemplateError:
        return TemplateError(f"template {self.name!r} treats special-token text inside "
                             "message content as markup (its output depends on it); refused")

    def _render(self, variables: Mapping[str, Any], now: datetime | None) -> str:
        self._now = now
        try:
            with _deadline(RENDER_SECONDS):
                out: list[str] = []
                size = 0
                for piece in self._template.generate(**variables):
                    size += len(piece)
                    if size > RENDER_CHARS:
                        raise jinja2.exceptions.SecurityError("output too large")
                    out.append(piece)
                return "".join(out)
        except TemplateError:
            raise
        except _OverBudget as exc:
            raise TemplateError(f"template {self.name!r} exceeded its render budget: {exc}"
                                ) from None
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"template {self.name!r} tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # any failure inside a foreign template
            raise TemplateError(f"template {self.name!r} failed: {type(exc).__name__}: {exc}"
                                ) from exc
        finally:
            self._now = None


class _OverBudget(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise inside a template's own code once ``seconds`` have passed: a line tracer on
    compiled-template frames only (jinja2 compiles templates to Python), restored after."""
    end = time.monotonic() + seconds
    previous = sys.gettrace()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > end:
            raise _OverBudget(f"more than {seconds:g} s")
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code.co_filename == "<template>":
            return local
        return None

    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(previous)


def fold_system(messages: list[Message]) -> list[Message]:
    """For templates without a system role: the system text opens the first user message
    (as Gemma's own templates do), never dropped."""
    if not messages or messages[0].role != "system":
        return messages
    system, rest = messages[0].content, list(messages[1:])
    for i, m in enumerate(rest):
        if m.role == "user":
            rest[i] = Message("user", f"{system}\n\n{m.content}")
            return rest
    return [Message("user", system), *rest]


def tokenize_segments(model: Vocabulary, segments: list[Segment]) -> list[int]:
    """Token ids: markup with special-token parsing, content never (not even the
    user-defined tokens llama.cpp matches in any text: :func:`content_ids`)."""
    ids: list[int] = []
    for seg in segments:
        ids += model.tokenize(seg.text, special=True) if seg.kind == "markup" \
            else content_ids(model, seg.text)
    return ids


def content_ids(model: Vocabulary, text: str) -> list[int]:
    """``text`` as plain-text tokens: where llama.cpp's tokenizer still turns a piece of it
    into a user-defined special token (``<tool_call>``, gpt-oss's ``<|end|>``), that piece
    is tokenized in two halves, so content can never spell a special token. Costs one
    set lookup per token; the split only when such a piece occurs."""
    ids = model.tokenize(text, special=False)
    special = model.content_special_ids()
    if special.isdisjoint(ids):
        return ids
    out: list[int] = []
    pos = 0
    for t in ids:
        if t not in special:
            continue
        piece = model.detokenize([t])
        at = text.find(piece, pos) if piece else -1
        if at < 0:
            continue
        out += model.tokenize(text[pos:at], special=False) if at > pos else []
        out += model.tokenize(piece[:1], special=False) + \
            model.tokenize(piece[1:], special=False)
        pos = at + len(piece)
    if pos == 0:
        return ids  # no special piece found in the text itself
    return out + (content_ids(model, text[pos:]) if pos < len(text) else [])


def single_control(model: Vocabulary, text: str) -> bool:
    """Whether ``text`` is one control token of ``model``'s vocabulary."""
    ids = model.tokenize(text, special=True)
    return len(ids) == 1 and model.is_control(ids[0])
