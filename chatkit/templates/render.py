"""The renderer behind :mod:`chatkit.templates` (its docstring says the contract): the
sandbox, the segment markers, ``ChatTemplate``, and tokenizing segments."""

from __future__ import annotations

import functools
import json
import logging
import re
import secrets
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from ..errors import TemplateError
from ..messages import JSON, JSONObject, Message
from .sandbox import RENDER_CHARS as RENDER_CHARS
from .sandbox import RENDER_SECONDS as RENDER_SECONDS
from .sandbox import GenerationTag, OverBudget, deadline, environment, template_code

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
        env = environment(lambda: self._now or datetime.now())
        try:
            self._template = env.template_class.from_code(
                env, template_code(env, source), env.make_globals(None), None)
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
        tools: list[JSONObject] | None = None,
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
            env = jinja2.Environment(extensions=[jinja2.ext.loopcontrols, GenerationTag])
            nodes = list(env.parse(self.source).find_all(jinja2.nodes.Name))
        except (jinja2.TemplateError, RecursionError):
            return frozenset()
        loads = {n.name for n in nodes if n.ctx == "load"} - {
            n.name for n in nodes if n.ctx != "load"}
        return frozenset(loads & {"functions", "datetime"})

    def render_context(self, variables: Mapping[str, JSON], *, special: Collection[str] = (),
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
            with deadline(RENDER_SECONDS):
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
        except OverBudget as exc:
            raise TemplateError(f"template {self.name!r} exceeded its render budget: {exc}"
                                ) from None
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"template {self.name!r} tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # any failure inside a foreign template
            hint = " (the template reads a description on every tool and parameter: give " \
                "each one, e.g. an Args: docstring section)" if isinstance(
                    exc, jinja2.exceptions.UndefinedError) and "'description'" in str(exc) else ""
            raise TemplateError(f"template {self.name!r} failed: {type(exc).__name__}: {exc}"
                                f"{hint}") from exc
        finally:
            self._now = None


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
