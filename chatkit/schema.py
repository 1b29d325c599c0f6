"""JSON Schema intake: parse, refuse what cannot be enforced, compile, read back.

Everything here runs before the first token and needs no model: malformed
input is ``SchemaInvalid``, a keyword the grammar engine cannot enforce is
``SchemaUnsupported(keyword, path)`` with a JSON pointer, and the final text
of a reply is checked by :class:`SchemaReader`, a second reader independent
of the grammar mask (``jsonschema``, plus Pydantic when a model class was given).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

import jsonschema
import llguidance
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from .errors import SchemaInvalid, SchemaUnsupported, SchemaViolation

__all__ = ["SchemaInput", "SchemaReader"]

SchemaInput = dict[str, Any] | bool | str | type[BaseModel]
Whitespace = Literal["compact", "spaced"]

_SEPARATORS: dict[str, tuple[str, str]] = {"compact": (",", ":"), "spaced": (", ", ": ")}

# Children of these keywords are maps from names to subschemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
# Children of these keywords are lists of subschemas.
_SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
# Values of these keywords are data or names, never schemas.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required",
                            "dependentRequired", "x-guidance"})


class LoadedSchema(NamedTuple):
    """A schema checked once (:func:`load_schema`), carried through planning and compiling."""

    doc: dict[str, Any] | bool
    """The JSON Schema document."""
    model_cls: type[BaseModel] | None
    """The Pydantic class it came from, if any."""
    key: str
    """Canonical JSON of ``doc``: the cache key of grammars compiled from it."""

    def reader(self) -> SchemaReader:
        return SchemaReader(self.doc, self.model_cls)


def load_schema(schema: SchemaInput | LoadedSchema) -> LoadedSchema:
    """Turn JSON text, a dict, a bool or a Pydantic model class into a checked schema
    (an already loaded schema is returned as is).

    Raises ``SchemaInvalid`` for malformed JSON or a document that is not a valid JSON
    Schema (2020-12 meta-schema, or the draft named by ``$schema``).
    """
    if isinstance(schema, LoadedSchema):
        return schema
    model_cls: type[BaseModel] | None = None
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        model_cls = schema
        doc: Any = schema.model_json_schema()
        if schema.model_config.get("extra") != "allow":
            close_objects(doc)
    elif isinstance(schema, str):
        try:
            doc = json.loads(schema)
        except (ValueError, RecursionError) as exc:  # bad JSON, 4,300+-digit numbers, depth
            raise SchemaInvalid(f"not valid JSON: {exc}") from None
    else:
        doc = schema
    if not isinstance(doc, dict | bool):
        raise SchemaInvalid(f"a JSON Schema is an object or a boolean, not {type(doc).__name__}")
    depth = _schema_depth(doc)
    if depth > MAX_DEPTH:
        raise SchemaUnsupported("nesting", "", f"subschemas nest {depth} levels deep; chatkit "
                                f"compiles at most {MAX_DEPTH}")
    try:
        key = json.dumps(doc, sort_keys=True)
    except (ValueError, TypeError, RecursionError) as exc:  # cycles, huge ints, non-JSON values
        raise SchemaInvalid(f"not a JSON document: {exc}") from None
    _check_meta(doc, key)
    return LoadedSchema(doc, model_cls, key)


# Keywords only the 2019-09 / 2020-12 meta-schemas describe.
_MODERN = frozenset({"prefixItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
                     "$recursiveAnchor", "dependentSchemas", "dependentRequired",
                     "unevaluatedItems", "unevaluatedProperties", "minContains", "maxContains",
                     "$vocabulary", "contentSchema"})


@functools.lru_cache(maxsize=256)
def _meta_validator(cls: Any) -> Any:
    meta = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
    return meta(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER)


_checked_keys: dict[str, None] = {}


def _check_meta(doc: dict[str, Any] | bool, key: str) -> None:
    """``SchemaInvalid`` (with the JSON pointer) unless ``doc`` is a valid JSON Schema.

    The 2020-12 meta-schema's ``$dynamicRef`` resolution costs ~5 ms a schema in
    jsonschema; a schema using none of the 2019-09+ keywords is checked against the
    draft-07 meta-schema (the same rules for those keywords, ~1 ms), the others against
    their own. A schema already checked in this process is not checked again."""
    if key in _checked_keys:
        return
    default = jsonschema.Draft202012Validator
    validator_cls = jsonschema.validators.validator_for(doc, default=default)
    if validator_cls is default and isinstance(doc, dict) and "$schema" not in doc and \
            not any(k in _MODERN for _, node in _walk(doc, "") for k in node):
        validator_cls = jsonschema.Draft7Validator
    try:
        error = jsonschema.exceptions.best_match(_meta_validator(validator_cls).iter_errors(doc))
    except RecursionError:
        raise SchemaUnsupported("nesting", "", "too deeply nested to check") from None
    if error is not None:
        raise SchemaInvalid(f"not a valid JSON Schema: {error.message}",
                            path=_pointer(error.absolute_path))
    if len(_checked_keys) > 4096:
        _checked_keys.clear()
    _checked_keys[key] = None


MAX_DEPTH = 32
"""Deepest nesting of subschemas accepted (``properties``, ``items``, ``anyOf`` ... each add a
level; the 3,797 MaskBench dev schemas nest at most 9): deeper ones are refused by name
before compiling, where llguidance's compile time grows steeply (a 50-deep ``items`` chain
did not finish)."""
MAX_DOCUMENT_DEPTH = 500
"""Deepest JSON document accepted at all (data inside ``enum``/``const`` included)."""


def _schema_depth(doc: Any) -> int:
    """Nesting depth of subschemas (iterative: no recursion on hostile documents); a document
    deeper than ``MAX_DOCUMENT_DEPTH`` reports that depth."""
    deepest = 0
    # (node, subschema level, document level); level None: data, counted for the document only
    stack: list[tuple[Any, int | None, int]] = [(doc, 1, 1)]
    while stack:
        node, level, doc_level = stack.pop()
        if doc_level > MAX_DOCUMENT_DEPTH:
            return doc_level
        if isinstance(node, list):
            stack += [(v, level, doc_level + 1) for v in node]
            continue
        if not isinstance(node, dict):
            continue
        if level is None:
            stack += [(v, None, doc_level + 1) for v in node.values()]
            continue
        deepest = max(deepest, level)
        for key, value in node.items():
            if key in _DATA_KEYWORDS:
                stack.append((value, None, doc_level + 1))
            elif key in _SCHEMA_MAPS and isinstance(value, dict):
                stack += [(v, level + 1, doc_level + 2) for v in value.values()]
            else:
                stack.append((value, level + 1, doc_level + 1))
    return deepest


def closed_objects(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with its objects closed (see :func:`close_objects`)."""
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    close_objects(copy)
    return copy


def close_objects(doc: dict[str, Any]) -> None:
    """Pydantic ignores (or forbids) undeclared fields, so the grammar need not generate them:
    objects without an ``additionalProperties`` decision get ``false``."""
    for _, node in _walk(doc, ""):
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)


def json_options(whitespace: Whitespace = "compact") -> dict[str, Any]:
    """llguidance JSON compile options: bounded whitespace, unknown keywords refused.
    Also the ``x-guidance`` block of a schema embedded in a Lark grammar (``%json``)."""
    item_sep, key_sep = _SEPARATORS[whitespace]
    return {"whitespace_flexible": False, "item_separator": item_sep,
            "key_separator": key_sep, "lenient": False}


NUMBER_DIGITS = (15, 6)
"""The default bound on a number the grammar lets the model write: at most 15 integer digits
and 6 fractional digits (floats), so a number field always ends; a small model otherwise
writes ``1.0000...`` or ``1000000...`` until ``max_tokens``. Applied to the grammar only (the
second reader checks the schema as written); a schema's own ``multipleOf``, ``minimum`` and
``maximum`` take precedence. ``None`` (per constraint) turns it off."""

Digits = tuple[int, int] | None


def bound_numbers(schema: Any, digits: Digits = NUMBER_DIGITS) -> Any:
    """A copy of ``schema`` whose number and integer subschemas carry the digit bound (see
    ``NUMBER_DIGITS``) where the schema sets none; ``schema`` itself is not changed."""
    if digits is None or not isinstance(schema, dict):
        return schema
    copy = json.loads(json.dumps(schema))
    whole, fraction = digits
    limit = 10**whole - 1
    for _, node in _walk(copy, ""):
        kind = node.get("type")
        kinds = {k for k in (kind if isinstance(kind, list) else [kind]) if isinstance(k, str)}
        if not kinds & {"number", "integer"} or "enum" in node or "const" in node:
            continue
        low = node.get("minimum", node.get("exclusiveMinimum"))
        high = node.get("maximum", node.get("exclusiveMaximum"))
        if not all(v is None or _is_number(v) for v in (low, high)):
            continue  # not a real bound (e.g. data under an unknown keyword): leave it
        if "number" in kinds and "multipleOf" not in node:
            node["multipleOf"] = float(f"1e-{fraction}")
        if high is None and (low is None or low < limit):
            node["maximum"] = limit
        if low is None and (high is None or high > -limit):
            node["minimum"] = -limit
    return copy


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compile_json_schema(schema: dict[str, Any] | bool, whitespace: Whitespace = "compact",
                        digits: Digits = NUMBER_DIGITS, *, validate: bool = True) -> str:
    """Compile a checked schema to an llguidance grammar, refusing what it cannot enforce.

    JSON whitespace is bounded: ``compact`` (``,`` and ``:``) by default, or
    ``spaced`` (``, `` and ``: ``); never free whitespace runs. Raises
    ``SchemaUnsupported`` (keyword, JSON pointer) or ``SchemaInvalid``. ``validate=False``
    leaves llguidance's grammar validation to the matcher the caller builds at once
    (which reports the same errors: see ``schema_refusal``); it costs ~0.8 ms a schema.
    """
    if schema is False:
        raise SchemaInvalid("the schema `false` accepts nothing")
    options = json_options(whitespace)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(bound_numbers(schema, digits)), overrides=options  # type: ignore[arg-type]
        )
    except ValueError as exc:
        raise SchemaInvalid(str(exc)) from exc
    problem = None
    if validate:
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
        problem = "; ".join(messages) if failed else None
    if problem is None and isinstance(schema, dict) and _uses_refs(schema):
        problem = grammar_problem(grammar)  # a $ref cycle can leave no document at all
    if problem:
        raise _translate(schema, problem)
    return str(grammar)


def _uses_refs(schema: dict[str, Any]) -> bool:
    return any("$ref" in node or "$dynamicRef" in node for _, node in _walk(schema, ""))


@functools.cache
def _byte_tokenizer() -> Any:
    return llguidance.LLTokenizer("byte")


def grammar_problem(grammar: str) -> str | None:
    """What llguidance reports when it builds a matcher for ``grammar`` (over a byte-level
    tokenizer: no model needed), or None. Catches what validation alone lets through
    (``$ref`` cycles, lexer limits such as ``a{1000000}``) before any model loads."""
    matcher = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
    if not matcher.is_error():
        matcher.compute_bitmask()  # the first mask: an empty language errors here
    if not matcher.is_error():
        return None
    error = str(matcher.get_error())
    if error.startswith("NoExtension"):
        return "the grammar admits no text at all (e.g. a $ref cycle without a base case)"
    return error


def schema_refusal(schema: dict[str, Any] | bool, message: str) -> Exception:
    """The named refusal for llguidance's message about ``schema`` (``SchemaUnsupported``
    with the keyword and path where it names one, else ``SchemaInvalid``)."""
    return _translate(schema, message)


def _translate(schema: dict[str, Any] | bool, message: str) -> Exception:
    """Map llguidance's JSON compiler message to a named refusal with a path."""
    m = re.search(r"Unimplemented keys: \[(.*?)\]", message)
    if m:
        keys = [k.strip().strip('"') for k in m.group(1).split(",") if k.strip()]
        keyword = keys[0] if keys else "?"
        return SchemaUnsupported(keyword, keyword_path(schema, keyword) or "", message)
    m = re.search(r"Unknown format: (\S+)", message)
    if m:
        path = _find(schema, lambda node: node.get("format") == m.group(1))
        return SchemaUnsupported("format", (path or "") + "/format", message)
    if "is not present in a registry" in message or "retriev" in message:
        path = _find(schema, lambda node: isinstance(node.get("$ref"), str)
                     and not node["$ref"].startswith("#"))
        return SchemaUnsupported("$ref", (path or "") + "/$ref", message)
    for needle, keyword in _UNSUPPORTED_MESSAGES:
        if needle in message:
            return SchemaUnsupported(keyword, keyword_path(schema, keyword) or "", message)
    if "regex parse error" in message:
        return SchemaInvalid(f"invalid pattern: {message}",
                             path=_find(schema, lambda node: "pattern" in node) or "")
    return SchemaInvalid(message)


# llguidance messages about valid schemas it cannot enforce, and the keyword each names.
_UNSUPPORTED_MESSAGES = (
    ("oneOf constraints are not supported", "oneOf"),
    ("patternProperty regexes", "patternProperties"),
    ("intersection stack level exceeded", "allOf"),
    ("minProperties", "minProperties"),
    ("maxProperties", "maxProperties"),
    ("propertyNames", "propertyNames"),
)


def keyword_path(schema: Any, keyword: str) -> str | None:
    """JSON pointer of the first schema object using ``keyword``, or None."""
    found = _find(schema, lambda node: keyword in node)
    return None if found is None else f"{found}/{_escape(keyword)}"


def _find(schema: Any, pred: Any) -> str | None:
    for path, node in _walk(schema, ""):
        if pred(node):
            return path
    return None


def _walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (pointer, subschema) for every schema object, depth first, in document order."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key, value in node.items():
        here = f"{path}/{_escape(key)}"
        if key in _DATA_KEYWORDS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from _walk(sub, f"{here}/{_escape(name)}")
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _walk(sub, f"{here}/{i}")
        elif isinstance(value, dict):
            yield from _walk(value, here)
        elif key == "items" and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _walk(sub, f"{here}/{i}")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pointer(parts: Any) -> str:
    return "".join(f"/{_escape(str(p))}" for p in parts)


class SchemaReader:
    """The second reader: checks a final text against the schema without the grammar.

    ``read(text)`` returns the parsed value (a Pydantic instance when a model
    class was given, else the decoded JSON) or raises ``SchemaViolation``.
    Thread-safe; cheap to call (microseconds for small documents).
    """

    def __init__(self, schema: dict[str, Any] | bool, model_cls: type[BaseModel] | None = None):
        self.schema = schema
        self.model_cls = model_cls
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        self._validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def read(self, text: str) -> Any:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # incl. integers past Python's digit limit
            raise SchemaViolation(text, [f"not valid JSON: {exc}"]) from None
        errors = [
            f"{_pointer(e.absolute_path) or '/'}: {e.message}"
            for e in self._validator.iter_errors(value)
        ]
        if errors:
            raise SchemaViolation(text, errors)
        if self.model_cls is None:
            return value
        try:
            return self.model_cls.model_validate_json(text)
        except PydanticValidationError as exc:
            raise SchemaViolation(text, [str(err["msg"]) for err in exc.errors()]) from exc
