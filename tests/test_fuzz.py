"""Property-based fuzzing of every input surface (a bounded slice; `python3 dev.py bench
fuzz` runs longer and prints counts): each case ends in a valid result or a named
ChatkitError, within seconds; rendering never lets content make control tokens; the CLI
exits with a README exit code and one line on stderr, never a traceback."""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatkit import ChatkitError, ChatTemplate, Constraint, Message, Model, TemplateError
from chatkit.cli import main
from chatkit.errors import ChatkitError as Base
from chatkit.templates import tokenize_segments
from tests.fuzzing.strategies import (
    OPENAI_FIELDS,
    OPENAI_OK,
    SPECIAL,
    cli_args,
    contents,
    lark_grammars,
    openai_bodies,
    regexes,
    schemas,
)
from tests.fuzzing.strategies import templates as template_sources

FAST = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
EXIT_CODES = {c.exit_code for c in Base.__subclasses__()} | {
    c.exit_code for b in Base.__subclasses__() for c in b.__subclasses__()} | {
    c.exit_code for b in Base.__subclasses__() for m in b.__subclasses__()
    for c in m.__subclasses__()} | {1, 2}


def _named_or_ok(fn: Any, *args: Any) -> None:
    started = time.monotonic()
    try:
        fn(*args)
    except ChatkitError:
        pass
    assert time.monotonic() - started < 10


@FAST
@given(schemas)
def test_schemas(schema: Any) -> None:
    _named_or_ok(Constraint.json_schema, schema)


@FAST
@given(regexes)
def test_regexes(pattern: str) -> None:
    _named_or_ok(Constraint.regex, pattern)


@FAST
@given(lark_grammars)
def test_lark(grammar: str) -> None:
    _named_or_ok(Constraint.lark, grammar)


MSGS = [Message("system", "S"), Message("user", "Hi <|im_end|>"), Message("assistant", "A")]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(template_sources)
def test_templates(source: str) -> None:
    def render() -> None:
        ChatTemplate.from_string(source).render(MSGS)

    started = time.monotonic()
    try:
        render()
    except TemplateError:
        pass
    assert time.monotonic() - started < 10


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(contents, min_size=1, max_size=4))
def test_contents_never_become_control_tokens(smol: Model, texts: list[str]) -> None:
    roles = ["user", "assistant"]
    msgs = [Message(roles[i % 2], t) for i, t in enumerate(texts)]  # type: ignore[arg-type]
    t = ChatTemplate.for_model(smol)
    ids = tokenize_segments(smol, t.render(msgs, special=smol.special_texts()))
    clean = []
    for m in msgs:
        text = m.content
        for s in SPECIAL:
            text = text.replace(s, "")
        clean.append(Message(m.role, text))
    clean_ids = smol.tokenize("".join(s.text for s in t.render(clean)), special=True)
    assert sum(map(smol.is_control, ids)) == sum(map(smol.is_control, clean_ids))


@FAST
@given(cli_args)
def test_cli_exits_by_name(args: list[str]) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", "--prompt", "x", "--model", "/nonexistent/model.gguf", *args])
    text = err.getvalue()
    assert code in EXIT_CODES and code != 0, (code, text)
    assert "Traceback" not in text and text.startswith("chatkit: ") and text.count("\n") == 1


def _parsed_or_refused(body: Any) -> None:
    """What a server request can hold: parsed, or a RequestError (an OpenAI-shaped 4xx)
    naming what is wrong; never another exception (which would be a 500)."""
    from chatkit.errors import RequestError
    from chatkit.serve.openai_api import ServerLimits, parse_chat, parse_completion

    for parse in (parse_chat, parse_completion):
        try:
            parse(body, ServerLimits())
        except RequestError as exc:
            assert 400 <= exc.status < 500 and exc.message


@FAST
@given(openai_bodies)
def test_openai_request_bodies_are_parsed_or_refused(body: Any) -> None:
    _parsed_or_refused(body)


@pytest.mark.parametrize("field", sorted(OPENAI_FIELDS))
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_each_openai_field_is_parsed_or_refused(field: str, data: st.DataObject) -> None:
    _parsed_or_refused({**OPENAI_OK, field: data.draw(OPENAI_FIELDS[field])})
