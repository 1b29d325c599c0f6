"""Chat templates: sandboxed Jinja that renders messages into segment-safe prompts.

A GGUF's embedded template is untrusted input: it is rendered in jinja2's
``ImmutableSandboxedEnvironment``, and anything the sandbox refuses (or any
other render failure) is ``TemplateError``. Rendering returns *segments*:
template markup, tokenized with special-token parsing, and message content,
tokenized without it, so no message text can ever become a control token.
The trick: contents are swapped for private-use placeholders before
rendering and put back as content segments afterwards.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import jinja2
import jinja2.sandbox

from ..errors import TemplateError
from ..messages import Message

if TYPE_CHECKING:
    from ..engine import Vocabulary

__all__ = ["ChatTemplate", "Segment"]

BUNDLED = ("chatml", "hermes", "qwen3", "gemma")

_PLACEHOLDER = re.compile("\ue000(\\d+)\ue001")
_END_MARKERS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered prompt."""

    kind: Literal["markup", "content"]
    """markup: the template's own text (special tokens parsed); content: message text."""
    text: str


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(f"the template refused the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    # As Hugging Face renders chat templates: trim/lstrip blocks, lenient undefined.
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, autoescape=False
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


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
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template {name!r} does not compile: {exc}") from exc

    @classmethod
    def from_string(cls, source: str, *, name: str = "custom",
                    end_of_turn: str | None = None) -> ChatTemplate:
        return cls(source, name=name, end_of_turn=end_of_turn)

    @classmethod
    def bundled(cls, name: str) -> ChatTemplate:
        """One of chatkit's templates: chatml, hermes (tools), qwen3 (thinking), gemma."""
        if name not in BUNDLED:
            raise TemplateError(f"no bundled template {name!r}; choose from {', '.join(BUNDLED)}")
        text = resources.files(__name__).joinpath(f"{name}.jinja").read_text(encoding="utf-8")
        return cls(text, name=name)

    @classmethod
    def for_model(cls, model: Vocabulary, *, tools: bool = False) -> ChatTemplate:
        """The GGUF's template when present (and able to list tools when ``tools``);
        else the bundled one matching the vocabulary's turn markers (gemma or
        ChatML, with the Hermes tool format when ``tools``)."""
        if model.chat_template and (not tools or "tools" in model.chat_template):
            return cls(model.chat_template, name="gguf")
        if _single_control(model, "<start_of_turn>") and not tools:
            return cls.bundled("gemma")
        return cls.bundled("hermes" if tools else "chatml")

    @property
    def supports_thinking(self) -> bool:
        return "enable_thinking" in self.source

    @property
    def supports_tools(self) -> bool:
        return "tools" in self.source

    def render(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        bos_token: str = "",
        eos_token: str = "",
    ) -> list[Segment]:
        """Render to segments; message texts come back as ``content`` segments only.

        Raises ``TemplateError`` when the template fails, is refused by the
        sandbox, or alters a message's content (which would defeat the
        markup/content separation).
        """
        contents: list[str] = []

        def slot(text: str) -> str:
            if not text:  # nothing to protect; keeps `if message.content` tests truthful
                return ""
            contents.append(text)
            return f"\ue000{len(contents) - 1}\ue001"

        rendered_messages = []
        for m in messages:
            item: dict[str, Any] = {"role": m.role, "content": slot(m.content)}
            item["tool_calls"] = [slot(json.dumps({"name": c.name, "arguments": c.arguments},
                                                  ensure_ascii=False)) for c in m.tool_calls]
            if m.tool_call_id is not None:
                item["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                item["name"] = m.name
            rendered_messages.append(item)
        variables: dict[str, Any] = {
            "messages": rendered_messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": bos_token,
            "eos_token": eos_token,
        }
        if tools is not None:
            variables["tools"] = tools
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        try:
            text = self._template.render(**variables)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"template {self.name!r} tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # any failure inside a foreign template
            raise TemplateError(f"template {self.name!r} failed: {exc}") from exc
        return _split(text, contents, self.name)


def _split(text: str, contents: list[str], name: str) -> list[Segment]:
    if "\ue000" in _PLACEHOLDER.sub("", text) or "\ue001" in _PLACEHOLDER.sub("", text):
        raise TemplateError(f"template {name!r} altered message content")
    segments: list[Segment] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > pos:
            segments.append(Segment("markup", text[pos : match.start()]))
        index = int(match.group(1))
        if index >= len(contents):
            raise TemplateError(f"template {name!r} altered message content")
        if contents[index]:
            segments.append(Segment("content", contents[index]))
        pos = match.end()
    if pos < len(text):
        segments.append(Segment("markup", text[pos:]))
    return segments


def tokenize_segments(model: Vocabulary, segments: list[Segment]) -> list[int]:
    """Token ids: markup with special-token parsing, content never."""
    ids: list[int] = []
    for seg in segments:
        ids += model.tokenize(seg.text, special=seg.kind == "markup")
    return ids


def _single_control(model: Vocabulary, text: str) -> bool:
    ids = model.tokenize(text, special=True)
    return len(ids) == 1 and model.is_control(ids[0])
