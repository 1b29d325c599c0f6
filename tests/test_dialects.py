"""Tool calls in every family's own format (chatkit/tools/dialects.py, grammar.py, parser.py,
detect.py).

- every dialect: the grammar accepts the family's own wire text for one call and, where the
  family has them, parallel calls; refuses a wrong name, wrong argument types, and calls under
  ``tool_choice="none"``; the parser reads the wire text back to the same calls;
- detection: each real template (tests/corpora/chat-templates and tool-templates) is the
  dialect its own renderings show; a template whose calls match no dialect is
  ``ToolFormatUnsupported`` naming what it rendered; no silent template switch;
- per family, on SmolLM2 under the family's real template: ``tool_choice`` named, required,
  auto and none; the calls parse; ``reply.raw`` is what the template renders for the parsed
  calls (whitespace aside); ``run()`` goes two steps through a tool result.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import llguidance
import pytest
from pydantic import Field

from chatkit import (
    ChatTemplate,
    Conversation,
    MaxStepsExceeded,
    Message,
    Model,
    Reply,
    ToolArgumentsInvalid,
    ToolCall,
    ToolFormatUnsupported,
    Truncated,
    tool,
)
from chatkit.tools.definition import check_tools
from chatkit.tools.detect import detect_dialect, history_for, tool_setup
from chatkit.tools.dialects import DIALECTS, Dialect, render_calls
from chatkit.tools.grammar import call_head, tool_grammar
from chatkit.tools.parser import parse_calls
from tests.helpers import get_weather

CORPORA = Path(__file__).resolve().parent / "corpora"
BYTE = llguidance.LLTokenizer("byte")


@tool
def add(a: Annotated[int, Field(ge=-99, le=99)], b: Annotated[int, Field(ge=-99, le=99)]) -> int:
    """Add two integers.

    Args:
        a: One.
        b: The other.
    """
    return a + b


TOOLS = check_tools([get_weather, add])  # described: Command R+'s template reads that
ONE = (ToolCall(id="call_1", name="get_weather", arguments={"city": "Oslo", "days": 2}),)
TWO = (*ONE, ToolCall(id="call_2", name="add", arguments={"a": 1, "b": -2}))


def accepts(grammar: str, text: str) -> bool:
    m = llguidance.LLMatcher(BYTE, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    toks = BYTE.tokenize_str(text)
    return m.try_consume_tokens(toks) == len(toks) and m.is_accepting()


def same_calls(got: list[ToolCall], want: tuple[ToolCall, ...]) -> bool:
    return [(c.name, c.arguments) for c in got] == [(c.name, c.arguments) for c in want]


# ------------------------------------------------------------- every dialect, no model
@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_grammar_and_parser_speak_the_dialect(name: str) -> None:
    d = DIALECTS[name]
    one = render_calls(d, ONE)
    required = tool_grammar(TOOLS, "required", dialect=d)
    assert accepts(required, one), (required, one)
    assert accepts(tool_grammar(TOOLS, "get_weather", dialect=d), one)
    assert not accepts(tool_grammar(TOOLS, "add", dialect=d), one)
    assert not accepts(tool_grammar(TOOLS, "none", dialect=d), one)
    assert accepts(tool_grammar(TOOLS, "auto", dialect=d), one)
    text, calls = parse_calls(one, TOOLS, d)
    assert text == "" and same_calls(calls, ONE)
    wrong_name = render_calls(d, (ToolCall(id="call_1", name="get_weathers",
                                           arguments={"city": "Oslo"}),))
    assert not accepts(required, wrong_name)
    wrong_type = render_calls(d, (ToolCall(id="call_1", name="add",
                                           arguments={"a": "one", "b": 2}),))
    assert not accepts(required, wrong_type)
    with pytest.raises(ToolArgumentsInvalid):
        parse_calls(wrong_type, TOOLS, d)


@pytest.mark.parametrize("name", sorted(n for n, d in DIALECTS.items() if d.max_calls is None))
def test_parallel_calls_in_the_dialect(name: str) -> None:
    d = DIALECTS[name]
    two = render_calls(d, TWO)
    assert accepts(tool_grammar(TOOLS, "required", dialect=d), two), two
    assert not accepts(tool_grammar(TOOLS, "required", parallel=False, dialect=d), two)
    text, calls = parse_calls(two, TOOLS, d)
    assert text == "" and same_calls(calls, TWO)


def test_xml_values_are_typed_by_the_schema() -> None:
    """``<parameter=n>5</parameter>``: 5 for an integer, "5" for a string; a string value is
    raw text (quotes and newlines kept), anything else JSON."""
    d = DIALECTS["qwen3-xml"]
    wire = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n5\n</parameter>\n"
            "<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>")
    _, calls = parse_calls(wire, TOOLS, d)
    assert calls[0].arguments == {"city": "5", "days": 5}
    g = tool_grammar(TOOLS, "required", dialect=d)
    assert accepts(g, wire)
    assert not accepts(g, wire.replace("<parameter=days>\n5\n", '<parameter=days>\n"5"\n'))
    # the raw string cannot hold its own closing marker
    assert not accepts(g, wire.replace("\n5\n</parameter>\n<parameter=days>",
                                       "\nOs\n</parameter>\nlo\n</parameter>\n<parameter=days>"))
    # nor the marker without its whitespace (the parser ends a value at its first marker)
    glm = DIALECTS["glm-4.5"]
    wire = render_calls(glm, ONE)
    assert accepts(tool_grammar(TOOLS, "required", dialect=glm), wire)
    assert not accepts(tool_grammar(TOOLS, "required", dialect=glm),
                       wire.replace("Oslo</arg_value>", "Oslo</arg_value>x</arg_value>"))


def test_pythonic_arguments() -> None:
    d = DIALECTS["lfm2"]
    wire = render_calls(d, TWO)
    assert "get_weather(city='Oslo', days=2)" in wire
    _, calls = parse_calls(wire, TOOLS, d)
    assert same_calls(calls, TWO)
    g = tool_grammar(TOOLS, "required", dialect=d)
    assert not accepts(g, wire.replace("days=2", "days='2'"))


def test_harmony_calls_and_final_text() -> None:
    d = DIALECTS["harmony"]
    g = tool_grammar(TOOLS, "auto", dialect=d)
    assert accepts(g, " to=functions.add<|channel|>commentary json<|message|>{\"a\":1,\"b\":2}"
                   "<|call|>")
    assert accepts(g, "<|channel|>final<|message|>It is sunny.")
    assert not accepts(g, "It is sunny.")  # text goes in the final channel
    assert parse_calls("<|channel|>final<|message|>It is sunny.", TOOLS, d) == ("It is sunny.", [])


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_plain_text_is_never_empty_nor_a_call(name: str) -> None:
    d = DIALECTS[name]
    g = tool_grammar(TOOLS, "none", dialect=d)
    wrap = d.text_open, d.text_close
    text = json.dumps if d.text_json else str  # the generic envelope's {"response": "..."}
    assert accepts(g, wrap[0] + text("Sunny.") + wrap[1])
    assert not accepts(g, wrap[0] + text("") + wrap[1])
    if d.trigger.strip():  # Functionary v3.2's text after "all" is free
        assert not accepts(g, wrap[0] + render_calls(d, ONE) + wrap[1])


# ------------------------------------------------------------------ the real templates
def _manifest() -> dict[str, str]:
    doc = json.loads((CORPORA / "tool-templates" / "manifest.json").read_text())
    return {t["family"]: t["dialect"] for t in doc["templates"] if t["dialect"]}


CHAT_TEMPLATES = {  # tests/corpora/chat-templates families that write calls
    "deepseek-r1-distill-qwen": "deepseek-r1", "deepseek-v3.1": "deepseek-v3.1",
    "glm-4.6": "glm-4.5", "gpt-oss": "harmony", "hermes-3-llama-3.1-tool_use": "hermes",
    "llama-3.1-instruct": "llama3-json", "llama-3.2-instruct": "llama3-json",
    "llama-4": "llama4-json", "mistral-nemo-instruct-2407": "mistral-v3",
    "mistral-small-3.2-instruct-2506": "mistral-v11-ids", "phi-4-mini-instruct": "phi-4-mini",
    "qwen2.5-instruct": "hermes", "qwen3-coder": "qwen3-xml", "qwen3": "hermes",
    "qwq-32b": "hermes", "command-r-plus-tool_use": "command-r-plus",
}
FAMILIES = {**CHAT_TEMPLATES, **_manifest()}


def _turn_families() -> list[str]:
    """The families whose tool turns run on a real model: the first corpus's 34, then one
    template per record the later ones add, and every derived format (the rest are checked
    without a model, by their renderings: tests/test_tool_turns.py)."""
    doc = json.loads((CORPORA / "tool-templates" / "manifest.json").read_text())
    chosen = [*CHAT_TEMPLATES, *(t["family"] for t in doc["templates"][:19])]
    seen = {FAMILIES[f] for f in chosen}
    for t in doc["templates"][19:]:
        d = t["dialect"]
        if d and (d == "derived" or d not in seen):
            chosen.append(t["family"])
            seen.add(d)
    return sorted(chosen)


def family_template(family: str) -> ChatTemplate:
    path = next(CORPORA.glob(f"*/templates/{family}.jinja"))
    return ChatTemplate.from_string(path.read_text(), name=family)


def test_the_tool_corpus_is_whole() -> None:
    import hashlib

    doc = json.loads((CORPORA / "tool-templates" / "manifest.json").read_text())
    assert len(doc["templates"]) == 55 and doc["licence"].startswith("MIT")
    for t in doc["templates"]:
        data = (CORPORA / "tool-templates" / t["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == t["sha256"], t["file"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_dialect_comes_from_the_template(family: str) -> None:
    found = detect_dialect(family_template(family))
    assert found is not None and found.name == FAMILIES[family]


HISTORY_FORM = {  # templates that write stored calls unlike the model's own turn
    "apriel-1.5": "adds an id to every call but the last assistant turn's",
    "apriel-1.6-15b-thinker-fixed": "adds an id to every call but the last assistant turn's",
}


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.xfail(strict=True, reason=HISTORY_FORM[f]))
    if f in HISTORY_FORM else f for f in sorted(FAMILIES)])
def test_stored_calls_render_back_as_written(family: str) -> None:
    """The family's template renders chatkit's stored calls (ids in its scheme, arguments
    as it reads them) as the dialect writes them; parallel calls where it keeps them."""
    t = family_template(family)
    d = detect_dialect(t)
    assert d is not None
    calls = TWO if d.max_calls is None else ONE
    rendered = _render_calls(t, d, calls)
    assert _squash(render_calls(d, calls)) in _squash(rendered)


def _render_calls(t: ChatTemplate, d: Dialect, calls: tuple[ToolCall, ...] | list[ToolCall],
                  results: bool = True) -> str:
    msgs = [Message("user", "What is the weather in Oslo?"),
            Message("assistant", "", tool_calls=tuple(calls))]
    if results:
        msgs += [Message("tool", f"result {i}", tool_call_id=c.id, name=c.name)
                 for i, c in enumerate(calls)]
    segments = t.render(history_for(msgs, d), tools=[x.definition.for_template() for x in TOOLS],
                        add_generation_prompt=False, arguments_as_text=d.args_as == "string")
    return "".join(s.text for s in segments)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


UNWRITABLE = ChatTemplate.from_string(  # a call whose name is written reversed
    "{%- if tools %}<|tools|>{{ tools | tojson }}<|end|>{% endif -%}"
    "{%- for m in messages -%}{%- if m.role == 'assistant' and m.tool_calls -%}<|assistant|>"
    "{%- for c in m.tool_calls %}CALL {{ c.function.name | reverse }}{% endfor %}<|end|>"
    "{%- else -%}<|{{ m.role }}|>{{ m.content }}<|end|>{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}", name="unwritable")


def test_a_format_chatkit_cannot_write_is_named(smol: Model) -> None:
    """A template whose calls match no record and cannot be derived (every corpus template
    is served now): refused with what it rendered, and the conversation does not fall back
    to another template."""
    t = UNWRITABLE
    with pytest.raises(ToolFormatUnsupported, match=r"CALLnf_eborp"):
        tool_setup(smol, t)
    with pytest.raises(ToolFormatUnsupported):
        Conversation(smol, template=t).send("Weather in Oslo?", tools=[get_weather])


def test_no_tool_format_uses_bundled_hermes_and_says_so(smol: Model,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="chatkit"):
        template, d = tool_setup(smol, family_template("smollm2-instruct"))
    assert template.name == "hermes" and d.name == "hermes"
    assert "bundled 'hermes' template" in caplog.text


def test_tool_format_overrides_and_unknown_is_refused(smol: Model) -> None:
    from chatkit import InvalidParameter

    t = family_template("qwen3")
    chosen, d = tool_setup(smol, t, "qwen3-xml")  # the record, as the template lays it out
    assert chosen is t and d.name == "qwen3-xml" and d.call == DIALECTS["qwen3-xml"].call
    with pytest.raises(InvalidParameter, match="tool_format"):
        tool_setup(smol, t, "yaml")
    with pytest.raises(ToolFormatUnsupported, match="renders no tools"):
        tool_setup(smol, family_template("smollm2-instruct"), "hermes")


def test_tool_format_against_the_templates_own_is_said(
        smol: Model, caplog: pytest.LogCaptureFixture) -> None:
    """Forcing a format the template does not render is allowed, and logged with both
    (once per template and format)."""
    from chatkit.tools import detect

    detect._forced.cache_clear()
    with caplog.at_level(logging.WARNING, logger="chatkit"):
        tool_setup(smol, family_template("qwen3"), "qwen3-xml")
    assert "renders calls as 'hermes'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chatkit"):
        tool_setup(smol, family_template("qwen3"), "hermes")
    assert "renders calls as" not in caplog.text


# ------------------------------------------------------------ per family, real model
CALL_TOKENS, TEXT_TOKENS = 400, 40  # markers as text cost tokens (DeepSeek: 12 a marker)
THINK = 12  # a think block's budget where the template thinks before its calls


@pytest.fixture(scope="module")
def smol_long() -> Iterator[Model]:
    """SmolLM2 with 4,096 tokens for one sequence: some templates' tool prompts are long."""
    model = Model.load(n_ctx=4096, n_seq_max=1)
    yield model
    model.close()


def test_a_turn_without_tools_renders_earlier_calls_in_the_family_form(
        smol_long: Model) -> None:
    """Mistral Small 3.2's template refuses ids that are not 9 alphanumerics: a later turn
    offering no tools still renders the earlier call and result with mapped ids."""
    history = [Message("user", "What is the weather in Oslo?"),
               Message("assistant", "", tool_calls=ONE),
               Message("tool", "sunny", tool_call_id=ONE[0].id, name=ONE[0].name)]
    conv = Conversation(smol_long, template=family_template("mistral-small-3.2-instruct-2506"),
                        messages=history, max_tokens=4)
    assert conv.resume().text is not None  # the answer after the result, no tools offered


def _check_reply(t: ChatTemplate, d: Dialect, reply: Any) -> None:
    """The calls as the template renders them back (from the calls' markup on: a think
    block or text before them is the turn's, rendered or dropped as the template does)."""
    assert reply.tool_calls, reply.raw
    for c in reply.tool_calls:
        {"get_weather": get_weather, "add": add}[c.name].validate(c.arguments)
    raw, head = reply.raw, call_head(d)
    if reply.reasoning is not None and d.reasoning and d.reasoning[1].strip() in raw:
        close = d.reasoning[1].strip()
        raw = raw[raw.index(close) + len(close):]
    elif reply.reasoning and d.reasoning and reply.reasoning in raw:
        # the budget ran out where the close is text: the calls follow the think text
        raw = raw[raw.index(reply.reasoning) + len(reply.reasoning):]
    if head and head in raw:
        raw = raw[raw.index(head):]
    assert _squash(raw) in _squash(_render_calls(t, d, reply.tool_calls, results=False))


@pytest.mark.slow
@pytest.mark.parametrize("family", _turn_families())
def test_family_tool_turns_on_a_real_model(smol_long: Model, family: str) -> None:
    t = family_template(family)
    d = detect_dialect(t)
    assert d is not None
    conv = Conversation(smol_long, template=t, max_tokens=CALL_TOKENS, think_budget=THINK)
    _check_reply(t, d, conv.send("What is the weather in Oslo?", tools=TOOLS,
                                 tool_choice="required", parallel_tool_calls=2, seed=1))
    # run(): the first step named, then auto, rendered through the tool result
    conv = Conversation(smol_long, template=t, max_tokens=CALL_TOKENS, think_budget=THINK)
    try:
        conv.run("What is the weather in Oslo?", tools=TOOLS, tool_choice="get_weather",
                 parallel_tool_calls=False, max_steps=2, seed=1)
        transcript: list[Any] = conv.messages[1:]
    except MaxStepsExceeded as e:  # the second step called again: it was rendered
        transcript = e.transcript
    except Truncated:
        assert d.text_close, "only a text wrapper's closing marker can be cut"
        return
    first, result = transcript[0], transcript[1]
    assert first.tool_calls and first.tool_calls[0].name == "get_weather"
    if isinstance(first, Reply):
        _check_reply(t, d, first)
    assert "sunny in" in str(result.content)
    # auto and none: a text answer (or calls, under auto), never the call markup as text
    for choice in ("auto", "none"):
        conv = Conversation(smol_long, template=t, max_tokens=TEXT_TOKENS, think_budget=THINK)
        try:
            r = conv.send("Say hello.", tools=TOOLS, tool_choice=choice, seed=1)
        except Truncated as cut:  # a text wrapper's end, or a call auto chose, cut short
            assert d.text_close or (choice == "auto" and call_head(d) and call_head(d) in
                                    cut.text), cut.text
            continue
        if r.tool_calls:
            assert choice == "auto"
            _check_reply(t, d, r)
            continue
        own = d.text_open.strip() and r.raw.lstrip().startswith(d.text_open.strip())
        assert r.text.strip() and (own or not r.raw.lstrip().startswith(d.trigger.strip()
                                                                         or "\0"))
