"""22 real chat templates x 10 contexts against the reference renderer's goldens
(tests/corpora/chat-templates: transformers' apply_chat_template, pinned strftime_now).

- every golden text is matched byte for byte; every reference error is a TemplateError
  carrying the template's own message;
- segment safety on every template: special-token text injected into contents, tool
  descriptions, tool-call arguments and tool results never lands in markup (checked by
  string on all families, and by token ids with SmolLM2's tokenizer on the ChatML ones);
- per family: the tool-call format chatkit supports, and tool-call history round trips.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from chatkit import ChatTemplate, Message, Model, TemplateError, ToolCall
from chatkit.templates import tokenize_segments

CORPUS = Path(__file__).resolve().parent / "corpora" / "chat-templates"
FAMILIES = sorted(p.stem for p in (CORPUS / "templates").glob("*.jinja"))
CONTEXTS = sorted(p.stem for p in (CORPUS / "contexts").glob("*.json"))
NOW = datetime(2024, 7, 26)  # the goldens' pinned strftime_now
INJECTED = ("<|im_end|>", "<|im_start|>", "<|eot_id|>", "<|start_header_id|>",
            "<|end_header_id|>", "<end_of_turn>", "<start_of_turn>", "</tool_call>",
            "<tool_call>", "[INST]", "[/INST]")
HERMES = {"hermes-3-llama-3.1-tool_use", "qwen2.5-instruct", "qwen3", "qwq-32b"}
CHATML = ["hermes-3-llama-3.1-tool_use", "qwen2.5-instruct", "qwen3", "qwq-32b",
          "smollm2-instruct", "smollm3", "deepseek-r1-distill-qwen"]


def template(family: str) -> ChatTemplate:
    return ChatTemplate.from_string((CORPUS / "templates" / f"{family}.jinja").read_text(),
                                    name=family)


def context(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / "contexts" / f"{name}.json").read_text())  # type: ignore[no-any-return]


def golden(family: str, ctx: str) -> tuple[str | None, str | None]:
    base = CORPUS / "goldens" / f"{family}--{ctx}"
    text = Path(f"{base}.txt")
    if text.exists():
        return text.read_text(), None
    raw = Path(f"{base}.error").read_text().strip()
    return None, raw.split(": ", 1)[1] if ": " in raw else raw


def render(family: str, ctx: dict[str, Any]) -> str:
    return "".join(s.text for s in template(family).render_context(ctx, now=NOW))


def test_the_corpus_is_whole() -> None:
    assert len(FAMILIES) == 22 and len(CONTEXTS) == 10
    assert len(list((CORPUS / "goldens").iterdir())) == 220


@pytest.mark.parametrize("ctx", CONTEXTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_renders_as_the_reference_renderer(family: str, ctx: str) -> None:
    want, error = golden(family, ctx)
    if want is not None:
        assert render(family, context(ctx)) == want
    else:
        with pytest.raises(TemplateError) as info:
            render(family, context(ctx))
        assert error is not None and error in str(info.value)


def _strip(value: Any, key: str | None = None) -> Any:
    """The context with every injected special-token text removed from caller strings."""
    if isinstance(value, str):
        if key in ("role", "type"):
            return value
        for t in INJECTED:
            value = value.replace(t, "")
        return value
    if isinstance(value, dict):
        return {k: _strip(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _injection_cases() -> list[tuple[str, str]]:
    return [(f, c) for f in FAMILIES for c in ("injection", "injection_objargs")
            if golden(f, c)[0] is not None]


def test_injection_covers_most_families() -> None:
    assert len({f for f, _ in _injection_cases()}) >= 15


@pytest.mark.parametrize(("family", "ctx"), _injection_cases())
def test_injected_special_text_never_lands_in_markup(family: str, ctx: str) -> None:
    """Per special-token text: its occurrences in markup segments are exactly those of the
    same conversation with the injected payloads removed (the template's own)."""
    injected = context(ctx)
    segs = template(family).render_context(injected, now=NOW)
    assert "".join(s.text for s in segs) == golden(family, ctx)[0]
    clean = render(family, _strip(injected))
    for t in INJECTED:
        in_markup = sum(s.text.count(t) for s in segs if s.kind == "markup")
        assert in_markup == clean.count(t), t
    assert any(s.kind == "content" for s in segs)


def test_the_string_check_can_fail() -> None:
    """Positive control: treating the whole rendering as markup breaks the count."""
    injected = context("injection")
    text = render("qwen2.5-instruct", injected)
    clean = render("qwen2.5-instruct", _strip(injected))
    assert any(text.count(t) != clean.count(t) for t in INJECTED)


def _controls(model: Model, ids: list[int]) -> int:
    return sum(model.is_control(t) for t in ids)


@pytest.mark.parametrize("family", [f for f in CHATML if (f, "injection") in _injection_cases()])
def test_no_control_token_from_content_with_a_real_tokenizer(smol: Model, family: str) -> None:
    """ChatML families with SmolLM2's tokenizer (same <|im_start|>/<|im_end|> control tokens):
    the injection context has exactly the control tokens of its clean twin."""
    injected = context("injection")
    segs = template(family).render_context(injected, special=smol.special_texts(), now=NOW)
    ids = tokenize_segments(smol, segs)
    clean = smol.tokenize(render(family, _strip(injected)), special=True)
    assert _controls(smol, ids) == _controls(smol, clean)
    naive = smol.tokenize("".join(s.text for s in segs), special=True)
    assert _controls(smol, naive) > _controls(smol, ids)  # the hole being closed


@pytest.mark.parametrize("family", FAMILIES)
def test_tool_format_per_family(family: str) -> None:
    from chatkit.tools.detect import detect_dialect

    found = detect_dialect(template(family))
    assert (found is not None and found.name == "hermes") == (family in HERMES), found


@pytest.mark.parametrize("family", sorted(HERMES))
def test_tool_call_history_round_trips(family: str) -> None:
    """chatkit's own messages (arguments as objects) through each Hermes template: the call
    and its result are in the rendering, the call as the JSON chatkit's grammar parses."""
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}}}}}
    msgs = [Message("system", "Be brief."), Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather",
                                                          {"city": "Paris"}),)),
            Message("tool", "22 C", tool_call_id="c1", name="get_weather")]
    text = "".join(s.text for s in template(family).render(msgs, tools=[tool], now=NOW))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert "22 C" in text and "Be brief." in text


@pytest.mark.parametrize("family", FAMILIES)
def test_system_role_is_probed(family: str) -> None:
    """The templates that refuse a system message say so; tool-use templates that need a
    tools list (hermes-3, command-r) take one when probed."""
    refuses = golden(family, "system")[1] == "System role not supported"
    assert template(family).supports_system == (not refuses)
