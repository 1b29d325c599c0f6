"""The sandbox a chat template runs in: jinja2's ``ImmutableSandboxedEnvironment`` with
what the reference renderers offer templates, bounds on what a template may build and how
long it may run, and the compiled-template disk cache."""

from __future__ import annotations

import contextlib
import hashlib
import json
import marshal
import sys
import time
import types
from collections.abc import Callable, Iterator
from datetime import datetime
from types import CodeType, FrameType
from typing import Any, NoReturn

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

from ..engine.coldstart import diskcache
from ..errors import TemplateError

__all__: list[str] = []


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


class GenerationTag(jinja2.ext.Extension):
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
        value = node.value
        own = ("environment.own_list(" if isinstance(value, list) else
               "environment.own_dict(" if isinstance(value, dict) else None)
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


def environment(now: Callable[[], datetime]) -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    # As transformers renders chat templates: trim/lstrip blocks, loop controls, no escaping.
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, autoescape=False,
        extensions=[jinja2.ext.loopcontrols, GenerationTag],
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


def template_code(env: jinja2.Environment, source: str) -> CodeType:
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


class OverBudget(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise inside a template's own code once ``seconds`` have passed: a line tracer on
    compiled-template frames only (jinja2 compiles templates to Python), restored after."""
    end = time.monotonic() + seconds
    previous = sys.gettrace()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > end:
            raise OverBudget(f"more than {seconds:g} s")
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
