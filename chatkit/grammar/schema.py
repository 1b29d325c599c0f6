"""JSON Schema intake: parse, refuse what cannot be enforced, compile.

Everything here runs before the first token and needs no model: malformed
input is ``SchemaInvalid``, a keyword the grammar engine cannot enforce is
``SchemaUnsupported(keyword, path)`` with a JSON pointer. The work is split by job:

- here: :func:`load_schema` (intake), closing objects (:func:`close_objects`), the
  llguidance compile options (:func:`json_options`), compiling (:func:`json_grammar`,
  :func:`compile_json_schema`) and llguidance's messages as named refusals;
- :mod:`chatkit.grammar.meta_schema`: is the document a valid JSON Schema (its meta-schema);
- :mod:`chatkit.grammar.schema_numbers`: the digit bound on number fields (:func:`bound_numbers`);
- :mod:`chatkit.grammar.schema_walk`: subschemas and their JSON pointers;
- :mod:`chatkit.grammar.reader`: :class:`SchemaReader`, the second reader of a reply's final
  text, independent of the grammar mask.

The names other modules use are importable from here.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeGuard

if TYPE_CHECKING:  # pydantic is imported by whoever passes a Pydantic class (cold start)
    from pydantic import BaseModel

from ..engine.coldstart import bare_import
from ..errors import SchemaInvalid, SchemaUnsupported
from ..messages import JSONObject
from .limits import native_limits
from .meta_schema import check_meta
from .reader import SchemaReader as SchemaReader
from .schema_numbers import NUMBER_DIGITS as NUMBER_DIGITS
from .schema_numbers import Digits as Digits
from .schema_numbers import Survey, bounded, survey_of
from .schema_numbers import bound_numbers as bound_numbers
from .schema_rewrite import rewrite_exact
from .schema_walk import (
    MAX_DEPTH,
    beside,
    declared_names,
    find,
    keyword_path,
    local_ref,
    schema_depth,
    walk,
)
from .schema_walk import subschemas as subschemas

__all__ = ["SchemaInput", "SchemaReader"]

SchemaInput = JSONObject | bool | str | type["BaseModel"]
Whitespace = Literal["compact", "spaced"]

_SEPARATORS: dict[str, tuple[str, str]] = {"compact": (",", ":"), "spaced": (", ", ": ")}


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


def is_model_class(value: Any) -> TypeGuard[type[BaseModel]]:
    """A Pydantic model class (without importing pydantic: a caller that has one has)."""
    pydantic = sys.modules.get("pydantic")
    return (pydantic is not None and isinstance(value, type)
            and issubclass(value, pydantic.BaseModel))


def load_schema(schema: SchemaInput | LoadedSchema) -> LoadedSchema:
    """Turn JSON text, a dict, a bool or a Pydantic model class into a checked schema
    (an already loaded schema is returned as is).

    Raises ``SchemaInvalid`` for malformed JSON or a document that is not a valid JSON
    Schema (2020-12 meta-schema, or the draft named by ``$schema``).
    """
    if isinstance(schema, LoadedSchema):
        return schema
    model_cls: type[BaseModel] | None = None
    if is_model_class(schema):
        model_cls = schema
        doc: Any = schema.model_json_schema()
    elif isinstance(schema, str):
        try:
            doc = json.loads(schema)
        except (ValueError, RecursionError) as exc:  # bad JSON, 4,300+-digit numbers, depth
            raise SchemaInvalid(f"not valid JSON: {exc}") from None
    else:
        doc = schema
    if not isinstance(doc, dict | bool):
        raise SchemaInvalid(f"a JSON Schema is an object or a boolean, not {type(doc).__name__}")
    depth = schema_depth(doc)
    if depth > MAX_DEPTH:
        raise SchemaUnsupported("nesting", "", f"subschemas nest {depth} levels deep; chatkit "
                                f"compiles at most {MAX_DEPTH}")
    try:
        key = json.dumps(doc, sort_keys=True)
    except (ValueError, TypeError, RecursionError) as exc:  # cycles, huge ints, non-JSON values
        raise SchemaInvalid(f"not a JSON document: {exc}") from None
    check_meta(doc, key)
    return LoadedSchema(doc, model_cls, key)


def closed_objects(doc: dict[str, Any]) -> dict[str, Any]:
    """The copy of ``doc`` a grammar compiles: its objects closed (see :func:`close_objects`)
    and what the grammar can say exactly said its way
    (:func:`chatkit.grammar.schema_rewrite.rewrite_exact`: key languages, ``not`` of
    strings, ECMA-262 patterns)."""
    copy: dict[str, Any] = json.loads(json.dumps(doc))
    close_objects(copy)
    rewrite_exact(copy)
    return copy


_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties",
           "maxProperties", "minContains", "maxContains")


def close_objects(doc: dict[str, Any]) -> None:
    """Close, for generation, the objects that make no ``additionalProperties`` decision
    (one rule for the library, ``chatkit run`` and ``chatkit serve``, as OpenAI's strict
    mode, llama.cpp and XGrammar do): a small model otherwise adds keys until
    ``max_tokens``, and a Pydantic model ignores or forbids them anyway. The second reader
    still checks the schema as written, which admits the closed objects' documents.

    Merged before closing: the keys that subschemas beside an object declare (``allOf``,
    ``anyOf``, ``oneOf``, ``if``/``then``/``else``, ``dependentSchemas``, a ``$ref`` with
    siblings; :func:`chatkit.grammar.schema_walk.declared_names`) join its ``properties``
    as ``{}`` (the branch says what the value is), and those subschemas, and what they
    reference, are left open (each closed apart would reject the other parts' keys; every
    part is found before any is closed). Left open, because closing would change what the
    schema means: objects whose ``required`` names a key nobody declares, and objects with
    ``patternProperties`` or ``unevaluatedProperties``. Counts written as integral floats
    (``"maxItems": 2.0``, an integer in JSON Schema) become integers, as llguidance wants
    them, and a ``propertyNames`` every key passes (``{}``, ``{"type": "string"}``: Claude
    Code's tools send it) is dropped."""
    parts: set[int] = set()

    def mark(branch: Any) -> None:  # a branch and every local $ref it reaches
        for _, sub in walk(branch, ""):
            if id(sub) in parts:
                continue
            parts.add(id(sub))
            target = local_ref(doc, sub.get("$ref"))
            if target is not None:
                mark(target)

    nodes = [node for _, node in walk(doc, "")]
    for node in nodes:  # composition first, so no part is closed before it is seen as one
        shared = beside(node) if _OBJECT_KEYS.intersection(node) else node.get("allOf")
        for branch in shared if isinstance(shared, list) else []:
            mark(branch)
        props = node.get("properties")
        if shared and isinstance(props, dict):  # a key declared here and beside: merged too
            for name in set(props).intersection(declared_names(doc, node)):
                mark(props[name])
        if "$ref" in node and _COMPOSING.intersection(node):  # $ref + siblings: allOf
            mark(node)
    for node in nodes:
        for keyword in _COUNTS:  # 2.0 is an integer in JSON Schema; llguidance wants 2
            if isinstance(node.get(keyword), float) and node[keyword].is_integer():
                node[keyword] = int(node[keyword])
        if _every_key(node.get("propertyNames", False)):
            del node["propertyNames"]  # a JSON key is a string: nothing to enforce
        if id(node) not in parts:
            _close(doc, node)


def _close(doc: dict[str, Any], node: dict[str, Any]) -> None:
    """Close one object schema (see :func:`close_objects`), its merged keys added first."""
    props = node.get("properties")
    required = node.get("required", [])
    if (node.get("type") != "object" or not isinstance(props, dict)
            or "additionalProperties" in node or "patternProperties" in node
            or "unevaluatedProperties" in node or not isinstance(required, list)):
        return
    merged = [name for name in declared_names(doc, node) if name not in props]
    if any(name not in props and name not in merged for name in required):
        return
    for name in merged:
        props[name] = {}
    node["additionalProperties"] = False


_OBJECT_KEYS = frozenset({"properties", "required"})
"""An object schema's own keys: subschemas beside them are merged with it before closing."""

_COMPOSING = frozenset({"properties", "required", "additionalProperties", "patternProperties",
                        "allOf", "anyOf", "oneOf"})
"""Keywords beside a ``$ref`` that make it a composition (2019-09+; llguidance reads every
draft so): the object it names and the one beside it merge, as ``allOf`` branches do."""


def _every_key(names: Any) -> bool:
    """Whether a ``propertyNames`` schema admits every string."""
    if names is True:
        return True
    return isinstance(names, dict) and names.get("type", "string") == "string" and not (
        set(names) - {"type", "title", "description", "$comment"})


def json_options(whitespace: Whitespace = "compact") -> dict[str, Any]:
    """llguidance JSON compile options: bounded whitespace, unknown keywords refused.
    Also the ``x-guidance`` block of a schema embedded in a Lark grammar (``%json``)."""
    item_sep, key_sep = _SEPARATORS[whitespace]
    return {"whitespace_flexible": False, "item_separator": item_sep,
            "key_separator": key_sep, "lenient": False}


class JsonGrammar(NamedTuple):
    """A schema compiled to an llguidance grammar, not yet validated (:func:`json_grammar`)."""

    grammar: str
    may_be_empty: bool
    """It uses ``$ref``: a cycle without a base case admits no text at all, which only a
    matcher's first mask shows (:func:`matcher_problem` words it)."""


def json_grammar(schema: dict[str, Any] | bool, whitespace: Whitespace = "compact",
                 digits: Digits = NUMBER_DIGITS) -> JsonGrammar:
    """Compile a checked schema to an llguidance grammar, without validating it: for a caller
    that builds the model's matcher at once (``Constraint.json_schema`` with a model), which
    reports the same errors (see :func:`schema_refusal`) without a separate validation pass.
    Numbers are bounded (``digits``, shared definitions: see :func:`bound_numbers`)."""
    if schema is False:
        raise SchemaInvalid("the schema `false` accepts nothing")
    if schema is True:
        schema = {}  # accepts anything: llguidance takes only objects
    if isinstance(schema, dict):
        schema = closed_objects(schema)
    survey = survey_of(schema) if isinstance(schema, dict) else Survey(False, False, False)
    doc = schema
    if isinstance(schema, dict) and digits is not None and (survey.numbers or survey.anys):
        # shared definitions' $refs inside an intersection (anyOf/allOf beside other
        # keywords) outgrow llguidance's intersection stack: there, numbers bound in place
        doc = bounded(schema, digits, survey, share=not survey.intersects)
    try:
        llguidance = bare_import.llguidance()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(doc), overrides=json_options(whitespace)
        )
    except ValueError as exc:
        raise SchemaInvalid(str(exc)) from exc
    return JsonGrammar(str(grammar), survey.refs)


def compile_json_schema(schema: dict[str, Any] | bool, whitespace: Whitespace = "compact",
                        digits: Digits = NUMBER_DIGITS, *, validate: bool = True) -> str:
    """Compile a checked schema to an llguidance grammar, refusing what it cannot enforce.

    JSON whitespace is bounded: ``compact`` (``,`` and ``:``) by default, or
    ``spaced`` (``, `` and ``: ``); never free whitespace runs. Raises
    ``SchemaUnsupported`` (keyword, JSON pointer) or ``SchemaInvalid``. ``validate=False``
    leaves llguidance's grammar validation to the matcher the caller builds at once
    (which reports the same errors: see ``schema_refusal``), saving a validation pass.
    A grammar that admits no text (a ``$ref`` cycle) is refused either way, from a matcher
    over a byte-level tokenizer: no model needed.
    """
    compiled = json_grammar(schema, whitespace, digits)
    problem = None
    if validate:
        llguidance = bare_import.llguidance()
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            compiled.grammar, limits=native_limits())
        problem = "; ".join(messages) if failed else None
    if problem is None and compiled.may_be_empty:
        problem = grammar_problem(compiled.grammar)
    if problem:
        raise _translate(schema, problem)
    return compiled.grammar


@functools.cache
def _byte_tokenizer() -> Any:
    llguidance = bare_import.llguidance()
    return llguidance.LLTokenizer("byte")


def grammar_problem(grammar: str) -> str | None:
    """What llguidance reports when it builds a matcher for ``grammar`` (over a byte-level
    tokenizer: no model needed), or None. Catches what validation alone lets through
    (``$ref`` cycles, lexer limits such as ``a{1000000}``) before any model loads. A grammar
    naming a model's token ids (``<[151657]>``) beyond that tokenizer is left to the model's
    own matcher (its first mask)."""
    llguidance = bare_import.llguidance()
    byte = _byte_tokenizer()
    if any(int(i) >= byte.vocab_size for i in re.findall(r"<\[(\d+)\]>", grammar)):
        return None
    matcher = llguidance.LLMatcher(byte, grammar, log_level=0,
                                   limits=native_limits())
    if not matcher.is_error():
        matcher.compute_bitmask()  # the first mask: an empty language errors here
    if not matcher.is_error():
        return None
    return matcher_problem(str(matcher.get_error()))


def matcher_problem(error: str) -> str:
    """llguidance's matcher error as a refusal message: an empty language in words."""
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
    m = re.search(r"Unknown format: (\S*)", message)
    if m:
        path = find(schema, lambda node: node.get("format") == m.group(1))
        return SchemaUnsupported("format", (path or "") + "/format", message)
    if "is not present in a registry" in message or "retriev" in message:
        path = find(schema, lambda node: isinstance(node.get("$ref"), str)
                     and not node["$ref"].startswith("#"))
        return SchemaUnsupported("$ref", (path or "") + "/$ref", message)
    for needle, keyword in _UNSUPPORTED_MESSAGES:
        if needle in message:
            return SchemaUnsupported(keyword, keyword_path(schema, keyword) or "", message)
    if "regex parse error" in message:
        return SchemaInvalid(f"invalid pattern: {message}",
                             path=find(schema, lambda node: "pattern" in node) or "")
    return SchemaInvalid(message)


# llguidance messages about valid schemas it cannot enforce, and the keyword each names.
_UNSUPPORTED_MESSAGES = (
    ("oneOf constraints are not supported", "oneOf"),
    ("patternProperty regexes", "patternProperties"),
    ("intersection stack level exceeded", "allOf"),
    ("minProperties", "minProperties"),
    ("maxProperties", "maxProperties"),
    ("propertyNames", "propertyNames"),
    ("Unable to determine if regex is empty", "pattern"),
    ("circular references with sibling keys", "$ref"),
    ("Value for 'multipleOf' has too many digits", "multipleOf"),
)
