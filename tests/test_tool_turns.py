"""Every real template's own tool turns pass chatkit's ``auto`` grammar, and come back.

For each template of both corpora (the 71 of llama-cpp-python's sdist among them) that
chatkit serves with tools, the template renders an assistant turn after a user's question:
one call; two parallel calls; a sentence then a call; reasoning then a call (where the
template renders reasoning). What the template writes past its generation prompt, up to the
end of the turn, is what a model trained on it writes; the ``auto`` grammar in the detected
dialect (its separators, text and think block learned from the template) must accept it,
the parser must read it back, and the template must render the parsed message back byte for
byte. Markers are text here (a byte tokenizer); tests/test_tiny_vocab.py runs them as tokens.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import llguidance
import pytest

from chatkit.errors import TemplateError
from chatkit.messages import Message, ToolCall
from chatkit.templates import ChatTemplate
from chatkit.tools.definition import check_tools, tool
from chatkit.tools.derive import derive, probe_render, respaced
from chatkit.tools.detect import (
    PROBE_CALLS,
    PROBE_TOOL,
    _detect,
    _turn_text,
    assistant_rendering,
    history_for,
    tool_reasoning,
)
from chatkit.tools.dialects import DIALECTS, GENERIC, Dialect, render_calls
from chatkit.tools.grammar import tool_grammar
from chatkit.tools.parser import parse_calls, split_reasoning

BYTE = llguidance.LLTokenizer("byte")
CORPORA = Path(__file__).parent / "corpora"
TEMPLATES = sorted([*CORPORA.glob("chat-templates/templates/*.jinja"),
                    *CORPORA.glob("tool-templates/templates/*.jinja")])


@tool
def probe_fn(probe_arg: str, n: int = 0) -> str:
    """A probe."""
    return probe_arg


TOOLS = check_tools([probe_fn])
CALL = ToolCall(id="abcDEF123", name="probe_fn", arguments={"probe_arg": "Oslo", "n": 5})
CALL2 = ToolCall(id="xyzXYZ789", name="probe_fn", arguments={"probe_arg": "Bergen", "n": 7})
SHAPES: dict[str, Message] = {
    "one call": Message("assistant", "", tool_calls=(CALL,)),
    "two calls": Message("assistant", "", tool_calls=(CALL, CALL2)),
    "text then call": Message("assistant", "Let me look that up.", tool_calls=(CALL,)),
    "reasoning then call": Message("assistant", "", reasoning="The user wants Oslo.",
                                   tool_calls=(CALL,)),
}
HARD_ENDS = ("<|END_OF_TURN_TOKEN|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>",
             "<｜end▁of▁sentence｜>", "[e~[")  # noqa: RUF001
"""Markup that only ever ends a turn (some templates render a next prompt after it)."""
ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "</s>", "<|return|>",
        "<end_of_turn>", "<|END_OF_TURN_TOKEN|>", "<｜end▁of▁sentence｜>",  # noqa: RUF001
        "<|endoftext|>", "<|im_end|>", "[/TOOL_CALLS]", "<|user|>", "<|observation|>",
        "<turn|>", "<|end_of_text|>", "<|tool_response>", "<|close|>message<|sep|><|end_of_msg|>")


def served(source: str) -> Dialect | None:
    found = _detect(source)
    return found if isinstance(found, Dialect) else None


def turn_end(template: ChatTemplate, d: Dialect) -> str:
    """The markup the template writes after a plain answer (the end of a turn)."""
    answer = assistant_rendering(template, Message("assistant", "PROBEEND"),
                                 as_text=d.args_as == "string") or ""
    return answer[answer.find("PROBEEND") + len("PROBEEND"):] if "PROBEEND" in answer else ""


def reply_text(template: ChatTemplate, message: Message, d: Dialect) -> str | None:
    """What the template writes for ``message`` (as chatkit hands it over: calls in the
    content where the template drops them) past the generation prompt, up to where the turn
    ends (the markup it writes after a plain answer)."""
    message = history_for([message], d)[0]
    text = assistant_rendering(template, message, as_text=d.args_as == "string")
    end = turn_end(template, d)
    if text is None:
        return None
    hard = [i for e in HARD_ENDS if (i := text.find(e)) >= 0]
    text = text[:min(hard)] if hard else text
    body = text.rstrip()
    for e in (end.strip(), *ENDS):
        if e and body.endswith(e):
            return text[:len(body) - len(e)]
    return text


def accepts(grammar: str, text: str) -> tuple[bool, str]:
    m = llguidance.LLMatcher(BYTE, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    toks = BYTE.tokenize_str(text)
    n = m.try_consume_tokens(toks)
    if n < len(toks):
        return False, f"refused at byte {n}: {text[:n][-40:]!r} | {text[n:n + 20]!r}"
    return m.is_accepting(), "ends too early" if not m.is_accepting() else ""


def prompt_of(template: ChatTemplate, d: Dialect, *, thinking: bool = False) -> str:
    """The generation prompt; ``thinking``: with the template's thinking switch on, where
    it has one (Gemma 4's prompt closes an empty think block unless it is on)."""
    return "".join(s.text for s in template.render(
        [Message("user", "QUESTION")], tools=[PROBE_TOOL], add_generation_prompt=True,
        arguments_as_text=d.args_as == "string",
        enable_thinking=True if thinking and template.supports_thinking else None))


def check_turn(template: ChatTemplate, d: Dialect, shape: str) -> str | None:
    """None when the shape passes (or the template does not render it); else why not."""
    message = SHAPES[shape]
    text = reply_text(template, message, d)
    if text is None or (shape == "reasoning then call" and "The user wants" not in text) or \
            (shape == "text then call" and not said_before_call(template, d, text)) or \
            (shape == "two calls" and (d.max_calls == 1 or "Bergen" not in text)):
        return None  # the template does not write this turn
    turn, opened = tool_reasoning(d, prompt_of(template, d))
    if shape == "reasoning then call" and turn.reasoning is None:  # thinking off by default
        turn, opened = tool_reasoning(d, prompt_of(template, d, thinking=True))
    written = text
    if shape != "reasoning then call" and opened and turn.reasoning is not None:
        # the prompt opened a think block the history does not keep: the model reasons
        # first, then writes what the template renders (its close, where that holds it)
        close = turn.reasoning[1]
        written = "Hmm." + (text if text.lstrip().startswith(close.strip()) else close + text)
    grammar = tool_grammar(TOOLS, "auto", dialect=turn, think_budget=4096,
                           think_opened=opened)
    ok, why = accepts(grammar, written)
    if not ok:
        return f"{shape}: grammar: {why}"
    reasoning, rest = split_reasoning(written, turn, opened=opened)
    content, calls = parse_calls(rest, TOOLS, turn)
    if message.content and not content and reasoning == message.content:
        # harmony writes a call's text in its analysis channel: text and reasoning are one
        # there, and either renders the turn back the same
        message = dataclasses.replace(message, content="", reasoning=message.content)
    want = [(c.name, c.arguments) for c in message.tool_calls]
    if [(c.name, c.arguments) for c in calls] != want:
        return f"{shape}: parsed {calls}"
    if (message.content or "") != content:
        return f"{shape}: content {content!r}"
    ids = [c.id if d.ids != "none" else o.id for c, o in zip(calls, message.tool_calls,
                                                              strict=True)]
    back = Message("assistant", content, reasoning=reasoning if message.reasoning else None,
                   tool_calls=tuple(dataclasses.replace(c, id=i, parsed=None)
                                    for c, i in zip(calls, ids, strict=True)))
    again = reply_text(template, back, d)
    if again != text:
        return f"{shape}: re-rendered {again!r} != {text!r}"
    return None


def said_before_call(template: ChatTemplate, d: Dialect, text: str) -> bool:
    """Whether the template writes a "text then call" turn as one generation: the sentence
    before the call, with no end of turn between them. Gemma 4 writes a turn's text after
    its calls (where the tool results go, interleaved: the model stops at
    ``<|tool_response>`` and the text is the next generation); Nemotron Nano v2 writes the
    text and the calls as two assistant turns (the model ends its turn after the text)."""
    at, call = text.find("Let me look"), text.find("Oslo")
    if at < 0 or call < at:
        return False
    end = turn_end(template, d).strip()
    return not (end and end in text[at:call])


def _ids(paths: list[Path]) -> list[Any]:
    return [pytest.param(p, id=p.stem) for p in paths]


@pytest.mark.parametrize("path", _ids(TEMPLATES))
def test_every_template_is_served_or_refused_by_name(path: Path) -> None:
    """A template that writes calls is served; one without tool syntax gets the generic
    fallback (tool_setup, tested with a model in test_dialects); none else is refused
    without a reason naming what it rendered."""
    source = path.read_text()
    found = _detect(source)
    template = ChatTemplate.from_string(source, name=path.stem)
    if isinstance(found, Dialect):
        return
    if not template.mentions_tools:
        return  # generic fallback
    assert isinstance(found, str) and found, path.stem


SERVED = [p for p in TEMPLATES if served(p.read_text()) is not None]
KNOWN = {  # a turn shape the template writes that chatkit does not generate yet
}


def _served_ids() -> list[Any]:
    return [pytest.param(p, id=p.stem, marks=[pytest.mark.xfail(strict=True,
                                                                 reason=KNOWN[p.stem])])
            if p.stem in KNOWN else pytest.param(p, id=p.stem) for p in SERVED]


@pytest.mark.parametrize("path", _served_ids())
def test_the_auto_grammar_accepts_the_templates_own_turns(path: Path) -> None:
    source = path.read_text()
    d = served(source)
    assert d is not None
    template = ChatTemplate.from_string(source, name=path.stem)
    failures = [why for shape in SHAPES if (why := check_turn(template, d, shape))]
    assert not failures, "\n".join(failures)


def test_generic_dialect_round_trip() -> None:
    """The generic envelope: text as a JSON string, calls as ``tool_calls``."""
    grammar = tool_grammar(TOOLS, "auto", dialect=GENERIC)
    text = '{"tool_calls": [{"name": "probe_fn", "arguments": {"probe_arg": "Oslo", "n": 5}}]}'
    assert accepts(grammar, text)[0]
    assert parse_calls(text, TOOLS, GENERIC)[1][0].arguments == {"probe_arg": "Oslo", "n": 5}
    answer = '{"response": "It is \\"sunny\\"."}'
    assert accepts(grammar, answer)[0]
    assert parse_calls(answer, TOOLS, GENERIC) == ('It is "sunny".', [])
    assert not accepts(grammar, '{"response": 5}')[0]


def summary() -> dict[str, Any]:
    """For the issue note: how many templates pass each shape."""
    out: dict[str, Any] = {"templates": len(TEMPLATES), "served": len(SERVED), "fail": {}}
    for p in SERVED:
        src = p.read_text()
        d = served(src)
        assert d is not None
        t = ChatTemplate.from_string(src, name=p.stem)
        for shape in SHAPES:
            try:
                why = check_turn(t, d, shape)
            except Exception as exc:
                why = f"{shape}: {type(exc).__name__}: {exc}"
            if why:
                out["fail"].setdefault(p.stem, []).append(why[:200])
    return out


if __name__ == "__main__":
    print(json.dumps(summary(), indent=1, ensure_ascii=False))


DERIVED = {"apriel-1.5", "gigachat3-10b-a1.8b", "gigachat3.1-10b-a1.8b", "hy3", "minicpm5-1b",
           "minimax-m1", "solar-open-100b"}
"""Templates no record matches whose format is read from their renderings."""


@pytest.mark.parametrize("stem", sorted(DERIVED))
def test_a_format_no_record_knows_is_read_from_the_renderings(stem: str) -> None:
    d = served(next(p for p in TEMPLATES if p.stem == stem).read_text())
    assert d is not None and d.name == "derived", stem


def test_markup_that_depends_on_a_values_type_is_not_derived() -> None:
    """DeepSeek V4 writes ``string="true"`` or ``"false"`` by the value's type: derivation
    cannot say it (no record is made from the renderings), its own record does."""
    path = next(p for p in TEMPLATES if p.stem == "deepseek-v4")
    template = ChatTemplate.from_string(path.read_text(), name=path.stem)
    assert derive(probe_render(lambda m, tool: _turn_text(template, m, tool)), PROBE_TOOL,
                  PROBE_CALLS) is None
    d = served(path.read_text())
    assert d is not None and d.name == "deepseek-v4"


def test_a_template_that_reads_parameter_descriptions_says_so() -> None:
    """Command R+'s template reads a description on every parameter: a tool without one is
    a TemplateError that says what to give, not a bare UndefinedError."""
    source = (CORPORA / "chat-templates/templates/command-r-plus-tool_use.jinja").read_text()
    template = ChatTemplate.from_string(source, name="command-r-plus-tool_use")
    bare = {"type": "function", "function": {"name": "f", "description": "F.", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}}
    with pytest.raises(TemplateError, match="give each one"):
        template.render([Message("user", "Hi")], tools=[bare], add_generation_prompt=True)
    bare["function"]["parameters"]["properties"]["x"]["description"] = "X."  # type: ignore[index]
    assert template.render([Message("user", "Hi")], tools=[bare], add_generation_prompt=True)


SPACED = {  # records' markers with the space a template writes between them
    "mistral-v3": (
        "{%- for m in messages -%}{%- if m.role == 'user' -%}[INST]{{ m.content }}[/INST]"
        "{%- elif m.role == 'assistant' and m.tool_calls -%}[TOOL_CALLS] ["
        "{%- for c in m.tool_calls -%}{\"name\": \"{{ c.function.name }}\", \"arguments\": "
        "{{ c.function.arguments | tojson }}, \"id\": \"{{ c.id }}\"}"
        "{%- if not loop.last %}, {% endif %}{%- endfor -%}]</s>"
        "{%- elif m.role == 'assistant' -%}{{ m.content }}</s>"
        "{%- else -%}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{%- endif -%}{%- endfor -%}"
        "{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}",
        ("[TOOL_CALLS] [", "]"), ", "),
    "deepseek-v3.1": (  # indentation a template leaks between the markers
        "{%- for m in messages -%}{%- if m.role == 'user' -%}<｜User｜>{{ m.content }}"  # noqa: RUF001
        "{%- elif m.role == 'assistant' and m.tool_calls -%}<｜Assistant｜><｜tool▁calls▁begin｜>"  # noqa: RUF001
        "{%- for c in m.tool_calls -%}<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>"  # noqa: RUF001
        "{{ c.function.arguments | tojson }}<｜tool▁call▁end｜>{% if not loop.last %}"  # noqa: RUF001
        "{{ '\\n    ' }}{% endif %}{%- endfor %}{{ '\\n  ' }}<｜tool▁calls▁end｜>"  # noqa: RUF001
        "<｜end▁of▁sentence｜>"  # noqa: RUF001
        "{%- elif m.role == 'assistant' -%}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>"  # noqa: RUF001
        "{%- else -%}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>{%- endif -%}"  # noqa: RUF001
        "{%- endfor -%}{%- if tools %}TOOLS {{ tools | tojson }}{% endif %}"
        "{%- if add_generation_prompt %}<｜Assistant｜>{% endif %}",  # noqa: RUF001
        ("<｜tool▁calls▁begin｜>", "\n  <｜tool▁calls▁end｜>"), "\n    "),  # noqa: RUF001
}


@pytest.mark.parametrize("name", sorted(SPACED))
def test_space_between_a_records_markers_is_learned(name: str) -> None:
    """A template that writes a record's markers with space between them (vLLM's Mistral 3
    ``[TOOL_CALLS] [``, its DeepSeek templates' leaked indentation): the record is taken
    with that space, so the grammar accepts the template's own call turns and the parser
    reads them back (before, the grammar refused them or the calls read as text)."""
    source, section, separator = SPACED[name]
    d = served(source)
    assert d is not None and d.name == name
    assert (d.section, d.separator) == (section, separator)
    template = ChatTemplate.from_string(source, name=name)
    for shape in ("one call", "two calls"):
        assert check_turn(template, d, shape) is None, shape


def test_respacing_keeps_the_space_at_a_calls_edges() -> None:
    """Space learned between markers; the space before the first marker and after the last,
    which the rendering does not delimit, stays as the record writes it (harmony's call
    opens with ' to='; seen failing when the edges took only the text's core)."""
    d = DIALECTS["harmony"]
    written = render_calls(d, PROBE_CALLS[:1]).replace("commentary json", "commentary  json")
    found = respaced(d, PROBE_CALLS, "QUESTION" + written, None)
    assert found is not d and found.call[0] == d.call[0]
    assert render_calls(found, PROBE_CALLS[:1]) == written


def test_a_template_that_writes_the_time_renders_alike_while_probed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Firefunction v2's template writes the current time into its prompt: the probe's
    renderings all see one time, so a second ticking between two of them cannot make the
    prompt stop being a prefix of the history (a clock that ticks at every call: seen
    failing without the pinned time)."""
    import datetime as dt

    import chatkit.templates.render as render

    class Ticking(dt.datetime):
        ticks = 0

        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Ticking:
            cls.ticks += 1
            return cls(2026, 1, 1, 0, 0, cls.ticks % 60)

    monkeypatch.setattr(render, "datetime", Ticking)
    path = next(p for p in TEMPLATES if p.stem == "llama-3-firefunction-v2")
    template = ChatTemplate.from_string(path.read_text(), name=path.stem)
    written = assistant_rendering(template, Message("assistant", "", tool_calls=PROBE_CALLS[:1]))
    assert written is not None and "probe_fn" in written
