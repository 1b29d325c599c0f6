"""Tools from typed Python functions and Pydantic models.

``@tool`` turns a function's signature and docstring (sync or async) into a
JSON schema plus a Pydantic validator and a ``call()``; a Pydantic model class
becomes a tool whose fields are the arguments. Anything chatkit cannot
enforce is refused when the tool is made (``ToolDefinitionError``).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Protocol,
    TypeAlias,
    cast,
    get_type_hints,
    overload,
    runtime_checkable,
)

if TYPE_CHECKING:  # pydantic (~90 ms) is imported where tools are made or validated
    from pydantic import BaseModel

from ..errors import ChatkitError, SchemaViolation, ToolArgumentsInvalid, ToolDefinitionError
from ..grammar.schema import SchemaReader, closed_objects, compile_json_schema, load_schema
from ..messages import JSON, JSONObject

__all__ = ["ModelRetry", "Tool", "ToolDefinition", "ToolLike", "Toolset", "tool"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


class ModelRetry(Exception):
    """Raised by a tool to ask the model for a corrected call; the message is shown to it."""


ToolTarget: TypeAlias = "Callable[..., object] | type[BaseModel] | Tool"
"""What ``@tool`` makes a tool of: a typed function, a Pydantic model class, or a Tool."""


@dataclass(frozen=True)
class ToolDefinition:
    """What the model is told about a tool."""

    name: str
    """The name the model calls it by."""
    description: str
    """What it does (the docstring's first paragraph)."""
    parameters_schema: JSONObject
    """JSON Schema of the arguments object."""

    def for_template(self) -> JSONObject:
        """The OpenAI/Hermes shape templates expect in their ``tools`` variable."""
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters_schema}}


class Tool:
    """A callable tool: definition, argument validator and the function (if any)."""

    def __init__(self, definition: ToolDefinition, args_model: type[BaseModel] | None,
                 function: Callable[..., object] | None, *, timeout: float | None = None,
                 unpack: bool = True) -> None:
        self.definition = definition
        self.args_model = args_model
        self.function = function
        self.timeout = timeout
        self._unpack = unpack
        self._reader = None if args_model is not None else SchemaReader(
            definition.parameters_schema)

    @classmethod
    def from_schema(cls, name: str, parameters: JSONObject, description: str = "",
                    function: Callable[..., object] | None = None) -> Tool:
        """A tool from a JSON-schema arguments object (e.g. an OpenAI-style definition).

        Objects without an ``additionalProperties`` decision are closed (as OpenAI's
        strict tools): a call names only declared arguments. Arguments are validated
        with jsonschema; ``parsed`` is the plain dict and a
        ``function`` is called with the arguments as keywords. Raises
        ``ToolDefinitionError`` when the schema cannot be enforced.
        """
        doc = _checked_schema(name, parameters)
        return cls(ToolDefinition(name, description, doc), None, function)

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def is_async(self) -> bool:
        return self.function is not None and inspect.iscoroutinefunction(self.function)

    def validate(self, arguments: JSON) -> object:
        """The arguments as the args model instance (a dict for schema tools);
        ``ToolArgumentsInvalid`` otherwise."""
        if self._reader is not None:
            try:
                return self._reader.read(json.dumps(arguments))
            except SchemaViolation as exc:
                raise ToolArgumentsInvalid(self.name, arguments, exc.errors) from exc
        assert self.args_model is not None
        from pydantic import ValidationError

        try:
            return self.args_model.model_validate(arguments)
        except ValidationError as exc:
            errors = [f"{'/'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
            raise ToolArgumentsInvalid(self.name, arguments, errors) from exc

    def bind_call(self, parsed: object) -> Callable[[], object]:
        """A zero-argument callable that runs the tool with validated arguments."""
        fn = self.function
        if fn is None:
            raise ToolDefinitionError(self.name, "has no function to call (a schema-only tool)")
        if isinstance(parsed, dict):
            return lambda: fn(**parsed)
        if self._unpack:
            fields = cast("type[BaseModel]", type(parsed)).model_fields
            kwargs = {name: getattr(parsed, name) for name in fields}
            return lambda: fn(**kwargs)
        return lambda: fn(parsed)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


@overload
def tool(target: ToolTarget, *, name: str | None = None, description: str | None = None,
         timeout: float | None = None) -> Tool: ...


@overload
def tool(target: None = None, *, name: str | None = None, description: str | None = None,
         timeout: float | None = None) -> Callable[[ToolTarget], Tool]: ...


def tool(
    target: ToolTarget | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Tool | Callable[[ToolTarget], Tool]:
    """Make a tool from a typed function (sync or async) or a Pydantic model class.

    Usable bare (``@tool``) or with options (``@tool(name=..., timeout=...)``).
    Parameter descriptions come from a Google-style ``Args:`` docstring section.
    Raises ``ToolDefinitionError`` for untyped or unsupported parameters and
    for argument schemas chatkit cannot enforce.
    """

    def make(obj: ToolTarget) -> Tool:
        from pydantic import BaseModel

        if isinstance(obj, Tool):
            return obj
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            return _from_model(obj, name, description, timeout)
        if callable(obj):
            return _from_function(obj, name, description, timeout)
        raise ToolDefinitionError(repr(obj), "a tool is a function, a Pydantic model class or "
                                  "a Tool (a toolset: an object with tools())")

    return make if target is None else make(target)


def _from_model(cls: type[BaseModel], name: str | None, description: str | None,
                timeout: float | None) -> Tool:
    tool_name = name or _snake(cls.__name__)
    doc = description if description is not None else _summary(inspect.getdoc(cls) or "")
    schema = _checked_schema(tool_name, cls)
    return Tool(ToolDefinition(tool_name, doc, schema), cls, None, timeout=timeout,
                unpack=False)


def _from_function(fn: Callable[..., Any], name: str | None, description: str | None,
                   timeout: float | None) -> Tool:
    from pydantic import ConfigDict, Field, create_model

    tool_name = name or fn.__name__
    doc = inspect.getdoc(fn) or ""
    param_docs = _param_docs(doc)
    try:
        hints = get_type_hints(fn, include_extras=True)  # keeps Annotated[..., Field(...)]
    except Exception as exc:
        raise ToolDefinitionError(tool_name, f"cannot resolve type hints: {exc}") from exc
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(tool_name, f"*{pname} parameters cannot be tool arguments")
        if pname not in hints:
            raise ToolDefinitionError(tool_name, f"parameter {pname!r} has no type annotation")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hints[pname], Field(default, description=param_docs.get(pname)))
    try:
        args_model = create_model(
            f"{_camel(tool_name)}Args", __config__=ConfigDict(extra="forbid"), **fields)
    except Exception as exc:
        raise ToolDefinitionError(tool_name, f"unsupported parameter type: {exc}") from exc
    schema = _checked_schema(tool_name, args_model)
    summary = description if description is not None else _summary(doc)
    return Tool(ToolDefinition(tool_name, summary, schema), args_model, fn, timeout=timeout)


def _checked_schema(tool_name: str, source: type[BaseModel] | dict[str, Any]
                    ) -> dict[str, Any]:
    """The arguments' schema of a tool named ``tool_name``, from a Pydantic model or a JSON
    schema: closed (as OpenAI's strict tools) and compiled once; ``ToolDefinitionError``
    naming what cannot be enforced."""
    if not _NAME.match(tool_name):
        raise ToolDefinitionError(tool_name, "names are letters, digits, _ . - (max 64)")
    try:
        doc = load_schema(source).doc
        if isinstance(doc, dict):
            doc = closed_objects(doc)  # arguments are closed, as OpenAI's strict tools
        compile_json_schema(doc)
    except ChatkitError as exc:
        raise ToolDefinitionError(tool_name, f"arguments cannot be enforced: {exc}") from exc
    except Exception as exc:  # pydantic cannot describe a parameter type
        raise ToolDefinitionError(tool_name, f"unsupported parameter type: {exc}") from exc
    if not isinstance(doc, dict):
        raise ToolDefinitionError(tool_name, "the arguments schema must be an object schema")
    return doc


@runtime_checkable
class Toolset(Protocol):
    """Tools offered together (an ``MCPToolset``, or a class of your own): anything whose
    ``tools()`` returns them. A toolset in ``tools=`` stands for all of its tools."""

    def tools(self) -> Sequence[Tool]:
        """The tools, each a :class:`Tool`."""
        ...


ToolLike: TypeAlias = "Tool | Toolset | Callable[..., object] | type[BaseModel]"
"""What ``tools=`` takes: a ``Tool``, a typed function (sync or async), a Pydantic model
class (schema only), or a :class:`Toolset`."""


def check_tools(tools: Sequence[ToolLike]) -> list[Tool]:
    """Normalise a tools list (functions, model classes, Tools, toolsets expanded); refuse
    duplicate names and an empty list (``ToolDefinitionError``)."""
    made = [tool(cast("ToolTarget", t)) for item in tools
            for t in (item.tools() if _is_toolset(item) else [item])]  # type: ignore[union-attr]
    seen: set[str] = set()
    for t in made:
        if t.name in seen:
            raise ToolDefinitionError(t.name, "two tools share this name")
        seen.add(t.name)
    if not made:
        raise ToolDefinitionError("-", "tools= is empty")
    return made


def _is_toolset(item: object) -> bool:
    """A toolset, not a tool: a function or a model class with a ``tools`` attribute is a
    tool (``isinstance`` on the protocol only looks for the attribute)."""
    return isinstance(item, Toolset) and not isinstance(item, (Tool, type)) \
        and not inspect.isroutine(item)


def _summary(doc: str) -> str:
    return doc.split("\n\n", 1)[0].strip().replace("\n", " ")


def _param_docs(doc: str) -> dict[str, str]:
    out: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*$(.*?)(?:^\S|\Z)", doc,
                      re.MULTILINE | re.DOTALL)
    if not match:
        return out
    current = None
    for line in match.group(1).splitlines():
        m = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current and line.strip():
            out[current] += " " + line.strip()
    return out


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[_.\-]", name) if part)
