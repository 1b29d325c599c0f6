"""Errors as data: every public error class carries its exit code and its HTTP error, and
the server's translation (``translate_error``) reads them, no class named there."""

from __future__ import annotations

import inspect

import pytest

from chatkit import errors
from chatkit.serve.openai_api import translate_error

PUBLIC = [getattr(errors, name) for name in errors.__all__
          if inspect.isclass(getattr(errors, name))]

# The HTTP contract the server has answered with (status, type, code, param): a change here
# is a change clients see. "{schema}": the endpoint's schema field.
EXPECTED = {
    "ChatkitError": (500, "server_error", "ChatkitError", None),
    "UserError": (400, "invalid_request_error", "UserError", None),
    "InvalidParameter": (400, "invalid_request_error", "invalid_value", "temperature"),
    "SchemaInvalid": (400, "invalid_request_error", "schema_invalid", "{schema}"),
    "SchemaUnsupported": (400, "invalid_request_error", "schema_unsupported", "{schema}"),
    "GrammarInvalid": (400, "invalid_request_error", "grammar_invalid", "{schema}"),
    "TemplateError": (400, "invalid_request_error", "template_error", "messages"),
    "ToolFormatUnsupported": (400, "invalid_request_error", "tool_format_unsupported",
                              "tools"),
    "ContextOverflow": (400, "invalid_request_error", "context_length_exceeded", "messages"),
    "RemoteUnsupported": (400, "invalid_request_error", "RemoteUnsupported", None),
    "SharedProcessorError": (400, "invalid_request_error", "SharedProcessorError", None),
    "ToolDefinitionError": (400, "invalid_request_error", "tool_definition_invalid", "tools"),
    "ModelError": (500, "server_error", "ModelError", None),
    "ModelNotFound": (500, "server_error", "ModelNotFound", None),
    "ModelLoadError": (500, "server_error", "ModelLoadError", None),
    "DecodeError": (503, "server_error", "DecodeError", None),
    "EngineBusy": (429, "rate_limit_error", "engine_busy", None),
    "RemoteError": (500, "server_error", "RemoteError", None),
    "ToolServerError": (500, "server_error", "ToolServerError", None),
    "GenerationError": (500, "server_error", "GenerationError", None),
    "AllTokensMasked": (500, "server_error", "AllTokensMasked", None),
    "ConstraintError": (500, "server_error", "ConstraintError", None),
    "Truncated": (500, "server_error", "Truncated", None),
    "SchemaViolation": (500, "server_error", "SchemaViolation", None),
    "ToolArgumentsInvalid": (500, "server_error", "ToolArgumentsInvalid", None),
    "MaxStepsExceeded": (500, "server_error", "MaxStepsExceeded", None),
    "ChecksExhausted": (500, "server_error", "ChecksExhausted", None),
}


def _instance(cls: type[errors.ChatkitError]) -> errors.ChatkitError:
    """An instance with the message "boom", whatever the class's constructor wants."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, "boom")
    if isinstance(exc, errors.InvalidParameter):
        exc.name = "temperature"
    return exc


def test_every_public_error_class_carries_its_exit_code_and_http_error() -> None:
    assert {cls.__name__ for cls in PUBLIC} == set(EXPECTED)
    for cls in PUBLIC:
        assert isinstance(cls.exit_code, int) and cls.exit_code > 0, cls
        assert 400 <= cls.http_status < 600, cls
        assert cls.error_type in {"invalid_request_error", "rate_limit_error",
                                  "server_error"}, cls
        assert _instance(cls).api_code(), cls


@pytest.mark.parametrize("schema_param", ["response_format", "text.format"])
def test_translate_error_follows_the_class_data(schema_param: str) -> None:
    for cls in PUBLIC:
        exc = _instance(cls)
        err = translate_error(exc, schema_param=schema_param)
        status, kind, code, param = EXPECTED[cls.__name__]
        param = schema_param if param == "{schema}" else param
        assert (err.status, err.type, err.code, err.param) == (status, kind, code, param), cls
        assert (err.status, err.type, err.code) == (cls.http_status, cls.error_type,
                                                   exc.api_code()), cls
        assert err.param == exc.api_param(schema_param), cls
        assert err.headers == dict(cls.http_headers), cls
        assert err.body()["error"]["code"] == code
        if status >= 500:
            assert err.message == f"{cls.__name__}: boom"
        elif cls is errors.TemplateError:
            assert err.message == "the chat template refused the messages: boom"
        else:
            assert err.message == "boom", cls
    busy = translate_error(_instance(errors.EngineBusy))
    assert busy.headers == {"Retry-After": "1"}


def test_translate_error_reads_the_class_data_not_the_class(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing a class's data changes the answer: nothing is decided by class name."""
    monkeypatch.setattr(errors.SchemaInvalid, "http_status", 422)
    monkeypatch.setattr(errors.SchemaInvalid, "error_code", "bad_schema")
    monkeypatch.setattr(errors.DecodeError, "http_headers", {"Retry-After": "5"})
    err = translate_error(errors.SchemaInvalid("nope"), schema_param="text.format")
    assert (err.status, err.code, err.param) == (422, "bad_schema", "text.format")
    assert translate_error(_instance(errors.DecodeError)).headers == {"Retry-After": "5"}

    class Custom(errors.UserError):  # a subclass: its parent's data, its own name
        error_param = "tools"

    err = translate_error(Custom("x"))
    assert (err.status, err.code, err.param) == (400, "Custom", "tools")


def test_foreign_exceptions_keep_their_own_translation() -> None:
    timeout = translate_error(TimeoutError())
    assert (timeout.status, timeout.type, timeout.code) == (504, "server_error", "timeout")
    other = translate_error(KeyError("k"))
    assert (other.status, other.code, other.message) == (500, "internal_error",
                                                        "internal error (KeyError)")


def test_the_cli_exits_with_the_class_exit_code(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from chatkit import cli

    for cls in PUBLIC:
        def fail(args: object, cls: type[errors.ChatkitError] = cls) -> int:
            raise _instance(cls)

        monkeypatch.setattr(cli, "_info", fail)
        assert cli.main(["info"]) == cls.exit_code, cls
        assert f"chatkit: {cls.__name__}: boom" in capsys.readouterr().err
