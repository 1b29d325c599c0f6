"""The chatkit error tree.

Every error chatkit raises derives from :class:`ChatkitError`. The class is the
code: context travels as attributes, and each class carries, as class data, the exit
code the ``chatkit`` command uses for it (``exit_code``) and the HTTP error a server
answers with (``http_status``, and OpenAI's error ``type``, ``code`` and ``param``:
``error_type``, ``error_code``, ``error_param``). The tree, with exit code and HTTP
status::

    ChatkitError (1, 500)
    ├── UserError (1, 400)             the caller's input is wrong; fixed by changing the call
    │   ├── InvalidParameter (2, 400)      a bad argument value (sampling params, sizes, ...)
    │   ├── SchemaInvalid (10, 400)        not JSON / not a JSON Schema
    │   ├── SchemaUnsupported (11, 400)    a valid schema keyword chatkit cannot enforce
    │   │                                  (keyword, path)
    │   ├── GrammarInvalid (12, 400)       a regex or Lark grammar that fails to compile,
    │   │                                  or outgrows llguidance's limits (diagnostic)
    │   ├── TemplateError (13, 400)        a chat template that fails or is unsafe to render
    │   │   └── ToolFormatUnsupported (16, 400)  tools= with a template whose calls
    │   │                                        match no dialect (what it rendered)
    │   ├── ContextOverflow (17, 400)      prompt + max_tokens exceed n_ctx (numbers), before
    │   │                                  any decode
    │   ├── RemoteUnsupported (18, 400)    a remote engine's kind cannot enforce this
    │   │                                  (kind, what)
    │   ├── SharedProcessorError (14, 400) one processor object given to two streams
    │   └── ToolDefinitionError (15, 400)  a tool that cannot be registered (tool, reason)
    ├── ModelError (1, 500)            the model file or the engine
    │   ├── ModelNotFound (20, 500)        no path given and the default model is not installed
    │   ├── ModelLoadError (21, 500)       missing, unreadable or corrupt GGUF (path)
    │   ├── DecodeError (22, 503)          llama_decode failed (context full, ...)
    │   ├── EngineBusy (23, 429)           the engine loop's queue is full, or no KV sequence
    │   │                                  came free (``Retry-After: 1``)
    │   └── RemoteError (24, 500)          a remote engine failed: down, timeout, 5xx, bad body
    │                                      (url)
    ├── ToolServerError (25, 500)      an MCP tool server is unreachable or its session gone
    │                                  (server)
    └── GenerationError (1, 500)       what the model produced cannot be returned as a success
        ├── AllTokensMasked (30, 500)      the processor left no selectable token
        ├── ConstraintError (31, 500)      the grammar matcher entered an error state (message)
        ├── Truncated (32, 500)            max_tokens hit before the constraint completed
        │                                  (partial text)
        ├── SchemaViolation (33, 500)      the independent reader rejected the final text
        │                                  (text, errors)
        ├── ToolArgumentsInvalid (34, 500) a tool call whose arguments fail validation
        │                                  (name, errors)
        ├── MaxStepsExceeded (35, 500)     the agent loop hit max_steps (transcript)
        └── ChecksExhausted (36, 500)      a schema's value checks found no valid
                                           continuation within the rollback budget
                                           (keywords, path, rollbacks)

The OpenAI error fields (``chatkit.serve.openai_api.translate_error`` reads them):

=====================  ======================  =========================  ==================
class                  ``type``                ``code``                   ``param``
=====================  ======================  =========================  ==================
ChatkitError           server_error            the class's name           --
UserError              invalid_request_error   the class's name           --
InvalidParameter       invalid_request_error   invalid_value              the argument named
SchemaInvalid          invalid_request_error   schema_invalid             the schema field
SchemaUnsupported      invalid_request_error   schema_unsupported         the schema field
GrammarInvalid         invalid_request_error   grammar_invalid            the schema field
TemplateError          invalid_request_error   template_error             messages
ToolFormatUnsupported  invalid_request_error   tool_format_unsupported    tools
ContextOverflow        invalid_request_error   context_length_exceeded    messages
ToolDefinitionError    invalid_request_error   tool_definition_invalid    tools
EngineBusy             rate_limit_error        engine_busy                --
=====================  ======================  =========================  ==================

A class not in the table has its parent's fields ("the class's name" is always the
raised class's own). The schema field is the endpoint's (``response_format``, the
Responses API's ``text.format``). A 5xx message is prefixed with the class's name.

Foreign exceptions are translated at the boundary with ``raise ... from exc``.

Outside the tree, not raised by the library's API (so not in ``__all__``): ``UsageError``,
the ``chatkit`` command's refusal of its command line; ``RequestError``, the HTTP error
``chatkit serve`` answers with (any exception becomes one at the route); ``MCPToolError``,
an MCP tool's failed call, which the agent loop shows the model as an error result.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Final

__all__ = [
    "AllTokensMasked",
    "ChatkitError",
    "ChecksExhausted",
    "ConstraintError",
    "ContextOverflow",
    "DecodeError",
    "EngineBusy",
    "GenerationError",
    "GrammarInvalid",
    "InvalidParameter",
    "MaxStepsExceeded",
    "ModelError",
    "ModelLoadError",
    "ModelNotFound",
    "RemoteError",
    "RemoteUnsupported",
    "SchemaInvalid",
    "SchemaUnsupported",
    "SchemaViolation",
    "SharedProcessorError",
    "TemplateError",
    "ToolArgumentsInvalid",
    "ToolDefinitionError",
    "ToolFormatUnsupported",
    "ToolServerError",
    "Truncated",
    "UserError",
]


SCHEMA_PARAM: Final = "{schema}"
"""``error_param`` of an error about the requested output format: the endpoint names its
own field (``response_format``, or ``text.format`` in the Responses API)."""


class ChatkitError(Exception):
    """Root of every chatkit error. ``exit_code`` is the CLI's exit status for it; the
    ``http_*`` and ``error_*`` class data are the HTTP error a server answers with."""

    exit_code: ClassVar[int] = 1
    http_status: ClassVar[int] = 500
    http_headers: ClassVar[Mapping[str, str]] = MappingProxyType({})
    error_type: ClassVar[str] = "server_error"
    """OpenAI's error ``type``."""
    error_code: ClassVar[str | None] = None
    """OpenAI's error ``code``; None: the raised class's own name."""
    error_param: ClassVar[str | None] = None
    """The request field at fault (``SCHEMA_PARAM``: the endpoint's schema field)."""
    message_prefix: ClassVar[str] = ""
    """Put before the message in the HTTP error's body."""

    def api_code(self) -> str:
        """The OpenAI error ``code`` of this error."""
        return self.error_code or type(self).__name__

    def api_param(self, schema_param: str) -> str | None:
        """The request field at fault; ``schema_param``: the endpoint's schema field."""
        return schema_param if self.error_param == SCHEMA_PARAM else self.error_param


class UserError(ChatkitError):
    """The caller's input is wrong: fixed by changing the call, not by retrying."""

    http_status = 400
    error_type = "invalid_request_error"


class InvalidParameter(UserError, ValueError):
    """An argument value is out of range or of the wrong kind (``name`` says which)."""

    exit_code = 2
    error_code = "invalid_value"

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name

    def api_param(self, schema_param: str) -> str | None:
        """The argument this error names."""
        return self.name


class SchemaInvalid(UserError):
    """The schema is not JSON, or not a valid JSON Schema (``path``: JSON pointer, may be "")."""

    exit_code = 10
    error_code = "schema_invalid"
    error_param = SCHEMA_PARAM

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(f"{message} (at {path or '/'})" if path else message)
        self.path = path


class SchemaUnsupported(UserError):
    """A valid schema keyword that chatkit cannot enforce; refused, never ignored."""

    exit_code = 11
    error_code = "schema_unsupported"
    error_param = SCHEMA_PARAM

    def __init__(self, keyword: str, path: str, detail: str = "") -> None:
        msg = f"keyword {keyword!r} at {path or '/'} cannot be enforced"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.keyword = keyword
        self.path = path
        self.detail = detail


class GrammarInvalid(UserError):
    """A regex or Lark grammar failed to compile; ``diagnostic`` is the engine's message."""

    exit_code = 12
    error_code = "grammar_invalid"
    error_param = SCHEMA_PARAM

    def __init__(self, kind: str, diagnostic: str) -> None:
        super().__init__(f"{kind}: {diagnostic}")
        self.kind = kind
        self.diagnostic = diagnostic


class TemplateError(UserError):
    """A chat template failed to render, or tried something the sandbox forbids."""

    exit_code = 13
    error_code = "template_error"
    error_param = "messages"
    message_prefix = "the chat template refused the messages: "


class ToolFormatUnsupported(TemplateError):
    """``tools=`` with a template whose tool-call format chatkit cannot constrain (or whose
    model has no tool format at all): refused rather than rendered in foreign markup."""

    exit_code = 16
    error_code = "tool_format_unsupported"
    error_param = "tools"
    message_prefix = ""

    def __init__(self, template: str, reason: str) -> None:
        super().__init__(f"template {template!r}: {reason}")
        self.template = template
        self.reason = reason


class ContextOverflow(UserError):
    """A turn cannot fit the context: ``prompt_tokens`` + ``max_tokens`` > ``n_ctx``
    (decided before any decode). Shorten the conversation, lower ``max_tokens``, load the
    model with a larger ``n_ctx``, or opt in to ``context_policy="drop_oldest"``."""

    exit_code = 17
    error_code = "context_length_exceeded"
    error_param = "messages"

    def __init__(self, prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
        super().__init__(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) "
                         f"exceed the context ({n_ctx} tokens)")
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.n_ctx = n_ctx


class RemoteUnsupported(UserError):
    """A remote engine of this ``kind`` cannot enforce what the turn needs (``what``: a
    regex, a Lark grammar, tools, thinking + schema...): refused before any request, never
    sent unenforced."""

    exit_code = 18

    def __init__(self, kind: str, what: str) -> None:
        super().__init__(f"a {kind!r} engine cannot enforce {what}")
        self.kind = kind
        self.what = what


class SharedProcessorError(UserError):
    """Two streams of one batch were given the same processor object."""

    exit_code = 14


class ModelError(ChatkitError):
    """The model file or the inference engine failed."""


class ModelNotFound(ModelError):
    """No model path was given and the embedded default model is not installed."""

    exit_code = 20


class ModelLoadError(ModelError):
    """The GGUF at ``path`` is missing, unreadable or not a model llama.cpp can load."""

    exit_code = 21

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"cannot load {path}: {reason}")
        self.path = path
        self.reason = reason


class DecodeError(ModelError):
    """``llama_decode`` returned an error status (``status``), e.g. the context is full."""

    exit_code = 22
    http_status = 503

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"llama_decode failed ({status}): {message}")
        self.status = status


class EngineBusy(ModelError):
    """The engine loop cannot take this turn now: its waiting queue is full (``queued`` of
    ``max_queue``), or no KV sequence came free within the engine's ``seq_wait``. Running
    turns are never failed to make room; retry later (a server answers 429)."""

    exit_code = 23
    http_status = 429
    http_headers = MappingProxyType({"Retry-After": "1"})
    error_type = "rate_limit_error"
    error_code = "engine_busy"

    def __init__(self, reason: str, *, queued: int = 0, max_queue: int = 0) -> None:
        self.reason = reason
        self.queued = queued
        self.max_queue = max_queue
        super().__init__(f"engine busy: {reason}")


class RemoteError(ModelError):
    """A remote engine failed: unreachable, timed out, an HTTP error, a body that is not
    what its API returns, or a stream cut short (``url``, ``status`` when there was one).
    Retried first when it is a 429 or 503; the conversation is unchanged."""

    exit_code = 24

    def __init__(self, url: str, reason: str, *, status: int | None = None) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.status = status


class ToolServerError(ChatkitError):
    """An MCP tool server could not be started or reached, or its session is gone (its
    process died, the connection closed) while the agent loop needed it (``server``: the
    command or URL). A tool's own failure is not this: the model sees it as an error
    response."""

    exit_code = 25

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"MCP server {server}: {reason}")
        self.server = server
        self.reason = reason


class GenerationError(ChatkitError):
    """What the model produced cannot be returned as a success."""


class AllTokensMasked(GenerationError):
    """The logit processor left no selectable token (every logit is -inf or NaN)."""

    exit_code = 30


class ConstraintError(GenerationError):
    """The grammar matcher entered an error state; ``message`` is llguidance's."""

    exit_code = 31

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Truncated(GenerationError):
    """``max_tokens`` was reached before the constraint completed; ``text`` is the partial text."""

    exit_code = 32

    def __init__(self, text: str, max_tokens: int, *, usage: object = None) -> None:
        super().__init__(f"cut at max_tokens={max_tokens} before the grammar completed")
        self.text = text
        self.max_tokens = max_tokens
        self.usage = usage
        """The cut reply's ``chatkit.Usage`` (None where no decode ran; typed ``object``:
        errors sit below messages)."""


class SchemaViolation(GenerationError):
    """The independent reader rejected the final text; ``errors`` lists its findings."""

    exit_code = 33

    def __init__(self, text: str, errors: list[str]) -> None:
        super().__init__("; ".join(errors) or "the reply does not validate")
        self.text = text
        self.errors = errors


class ToolDefinitionError(UserError):
    """A tool cannot be registered: duplicate name, unsupported parameter type, or a
    schema chatkit cannot enforce (``tool`` names it)."""

    exit_code = 15
    error_code = "tool_definition_invalid"
    error_param = "tools"

    def __init__(self, tool: str, reason: str) -> None:
        super().__init__(f"tool {tool!r}: {reason}")
        self.tool = tool
        self.reason = reason


class ToolArgumentsInvalid(GenerationError):
    """A tool call's arguments failed validation (only possible for constraints the
    grammar cannot express); never silently dropped."""

    exit_code = 34

    def __init__(self, name: str, arguments: object, errors: list[str]) -> None:
        super().__init__(f"arguments of {name!r} are invalid: {'; '.join(errors)}")
        self.name = name
        self.arguments = arguments
        self.errors = errors


class MaxStepsExceeded(GenerationError):
    """The agent loop made ``max_steps`` model calls without a final answer."""

    exit_code = 35

    def __init__(self, max_steps: int, transcript: list[object]) -> None:
        super().__init__(f"no final answer after {max_steps} steps")
        self.max_steps = max_steps
        self.transcript = transcript


class ChecksExhausted(GenerationError):
    """A schema's value checks (the keywords its grammar cannot express: ``not``,
    ``uniqueItems``, ...) rejected every continuation the model offered, and the rollbacks
    allowed per reply are spent; ``text`` is the reply so far (unchecked, not a success)."""

    exit_code = 36

    def __init__(self, text: str, keywords: tuple[str, ...], path: str,
                 rollbacks: int) -> None:
        super().__init__(f"no value at {path or '/'} passed its checks "
                         f"({', '.join(keywords)}) after {rollbacks} rollbacks")
        self.text = text
        self.keywords = keywords
        self.path = path
        self.rollbacks = rollbacks
        self.usage: Any = None
        """The reply's ``chatkit.Usage`` so far (None where no decode loop ran)."""


# ------------------------------------------------------------ outside the public tree
# Errors of one front end each, not raised by the library's API (so not in ``__all__``).


class UsageError(InvalidParameter):
    """The ``chatkit`` command's refusal of its command line (unknown flag, two
    constraints, missing value): ``InvalidParameter``'s exit code (2)."""

    def __init__(self, message: str) -> None:
        UserError.__init__(self, message)
        self.name = "command line"


class RequestError(Exception):
    """An HTTP error in OpenAI's shape, raised and answered inside ``chatkit serve``
    (``serve.openai_api.translate_error`` makes one of any exception)."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class MCPToolError(Exception):
    """A call the MCP server answered with an error (``isError``), content a text model
    cannot take, or a result its ``outputSchema`` rejects: the agent loop shows it to the
    model as an error response, as it does a raising Python tool."""

    def __init__(self, tool: str, message: str) -> None:
        super().__init__(message)
        self.tool = tool
