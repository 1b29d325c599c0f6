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
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeGuard

if TYPE_CHECKING:  # pydantic is imported by whoever passes a Pydantic class (cold start)
    import jsonschema  # imported on first use (_jsonschema)
    from pydantic import BaseModel

from .errors import SchemaInvalid, SchemaUnsupported, SchemaViolation

__all__ = ["SchemaInput", "SchemaReader"]

SchemaInput = dict[str, Any] | bool | str | type["BaseModel"]
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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# Keywords only the 2019-09 / 2020-12 meta-schemas describe.
_MODERN = frozenset({"prefixItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
                     "$recursiveAnchor", "dependentSchemas", "dependentRequired",
                     "unevaluatedItems", "unevaluatedProperties", "minContains", "maxContains",
                     "$vocabulary", "contentSchema"})
# One of them as an object key in canonical JSON text (json.dumps' default separators).
_MODERN_KEY = re.compile("|".join(re.escape(f'"{k}": ') for k in sorted(_MODERN)))


MetaCheck = Callable[[Any], bool]
"""A compiled meta-schema node: True when the value surely passes it."""


def _jsonschema() -> Any:
    """The ``jsonschema`` module, imported on first use: ~50 ms of imports (``referencing``,
    ``attrs``, the draft meta-schemas) that ``import chatkit`` leaves out, and that a
    schema turn needs only to validate its reply (a schema jsonschema would refuse is
    refused by it; ``_fast_draft7_check`` passes the others without it). Not imported
    ahead of time in a background thread: on 2 cores that thread took a core from
    llama.cpp's prefill (every core is one of its threads) and cost more than it saved."""
    import jsonschema

    return jsonschema


@functools.lru_cache(maxsize=256)
def _meta_validator(cls: Any) -> Any:
    meta = _jsonschema().validators.validator_for(cls.META_SCHEMA, default=cls)
    return meta(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER)


@functools.lru_cache(maxsize=256)
def _fast_meta_check(cls: Any) -> MetaCheck | None:
    """``cls``'s meta-schema as a boolean check (drafts 4, 6 and 7; None for the others:
    2019-09+ ``$dynamicRef`` and vocabularies), compiled once. True only when
    ``_meta_validator(cls)`` surely finds no error: the same format checker (so a ``pattern``
    is still compiled by ``re``); in doubt (a float where an integer is wanted, objects under
    ``uniqueItems``) it says False and jsonschema's check decides."""
    meta = cls.META_SCHEMA
    try:
        return _MetaCheckBuilder(meta, _meta_validator(cls).format_checker).schema(meta)
    except (_NotCompiled, KeyError, TypeError):
        return None


class _LocalFormats:
    """jsonschema's draft-07 format checks of the formats its meta-schema uses, without
    importing jsonschema: ``regex`` as jsonschema checks it (``re.compile``); ``uri`` and
    ``uri-reference`` pass, as they do in jsonschema when none of its optional URI packages
    is installed (when one is, they say False and jsonschema decides)."""

    _URI_PACKAGES = ("rfc3987", "rfc3986_validator", "rfc3987_syntax")

    def __init__(self) -> None:
        import importlib.util

        self.uri_checked = any(importlib.util.find_spec(m) is not None
                               for m in self._URI_PACKAGES)

    def conforms(self, value: Any, fmt: str) -> bool:
        if fmt == "regex":
            if not isinstance(value, str):
                return True
            try:
                re.compile(value)
            except Exception:  # re.error: jsonschema says invalid too; others: it decides
                return False
            return True
        if fmt in ("uri", "uri-reference"):
            return not self.uri_checked
        return False


def _draft7_meta() -> dict[str, Any] | None:
    """The draft-07 meta-schema from the file jsonschema itself reads it from
    (``jsonschema_specifications``' data, read without importing either); None when it is
    not there."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("jsonschema_specifications")
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = next(iter(spec.submodule_search_locations))
        with open(f"{folder}/schemas/draft7/metaschema.json", encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError, ImportError):
        return None
    if not isinstance(meta, dict) or meta.get("$schema") != "http://json-schema.org/draft-07/schema#":
        return None
    return meta


@functools.lru_cache(maxsize=1)
def _fast_draft7_check() -> MetaCheck | None:
    """The draft-07 meta-schema as a boolean check built without importing jsonschema
    (~50 ms of imports kept off the path to a process's first constrained token), formats
    by ``_LocalFormats``. None when the meta-schema is not found (jsonschema's check runs)."""
    meta = _draft7_meta()
    if meta is None:
        return None
    try:
        return _MetaCheckBuilder(meta, _LocalFormats()).schema(meta)
    except (_NotCompiled, KeyError, TypeError):
        return None


_checked_keys: dict[str, None] = {}


def _check_meta(doc: dict[str, Any] | bool, key: str) -> None:
    """``SchemaInvalid`` (with the JSON pointer) unless ``doc`` is a valid JSON Schema.

    The 2020-12 meta-schema's ``$dynamicRef`` resolution costs ~5 ms a schema in
    jsonschema; a schema using none of the 2019-09+ keywords is checked against the
    draft-07 meta-schema (the same rules for those keywords), the others against their
    own. A draft-04/06/07 check runs as compiled closures (~0.03 ms, where jsonschema takes
    ~0.5 ms); jsonschema runs only when they say no or cannot tell, and names the error.
    A schema already checked in this process is not checked again."""
    if key in _checked_keys:
        return
    draft7 = (isinstance(doc, dict) and "$schema" not in doc
              and not _uses_modern_keywords(doc, key))
    if draft7 and isinstance(doc, dict) and _surely_valid_draft7(doc):
        _remember_checked(key)
        return
    default = _jsonschema().Draft202012Validator
    validator_cls: Any = default
    if isinstance(doc, dict) and isinstance(doc.get("$schema"), str):
        validator_cls = _jsonschema().validators.validator_for(doc, default=default)
    elif draft7:
        validator_cls = _jsonschema().Draft7Validator
    if not _surely_valid(validator_cls, doc):
        try:
            error = _jsonschema().exceptions.best_match(
                _meta_validator(validator_cls).iter_errors(doc))
        except RecursionError:
            raise SchemaUnsupported("nesting", "", "too deeply nested to check") from None
        if error is not None:
            raise SchemaInvalid(f"not a valid JSON Schema: {error.message}",
                                path=_pointer(error.absolute_path))
    _remember_checked(key)


def _remember_checked(key: str) -> None:
    if len(_checked_keys) > 4096:
        _checked_keys.clear()
    _checked_keys[key] = None


def _surely_valid_draft7(doc: dict[str, Any]) -> bool:
    return _passes(_fast_draft7_check(), doc)


def _uses_modern_keywords(doc: dict[str, Any], key: str) -> bool:
    """Whether a subschema of ``doc`` uses a 2019-09+ keyword (``key``: its canonical JSON;
    a scan of it rules most documents out without a walk)."""
    return _MODERN_KEY.search(key) is not None and any(
        not node.keys().isdisjoint(_MODERN) for _, node in _walk(doc, ""))


def _surely_valid(validator_cls: Any, doc: Any) -> bool:
    return _passes(_fast_meta_check(validator_cls), doc)


def _passes(check: MetaCheck | None, doc: Any) -> bool:
    """A compiled meta-schema check's answer; False (jsonschema decides) when there is no
    check or the document is too deep for it."""
    if check is None:
        return False
    try:
        return check(doc)
    except RecursionError:
        return False


# Meta-schema keys that check nothing (``definitions`` is reached through ``$ref``).
_META_ANNOTATIONS = frozenset({"$schema", "$id", "id", "title", "description", "default",
                               "definitions", "$comment", "examples", "readOnly", "writeOnly"})


class _NotCompiled(Exception):
    """A meta-schema construct the fast check does not compile (jsonschema checks it all)."""


class _MetaCheckBuilder:
    """Compiles a draft-04/06/07 meta-schema into closures. Each covers one meta-schema node
    exactly as jsonschema applies it, or says False where that is not certain."""

    def __init__(self, meta: dict[str, Any],
                 formats: jsonschema.FormatChecker | _LocalFormats) -> None:
        self.meta = meta
        self.formats = formats
        self.built: dict[int, MetaCheck] = {}

    def schema(self, node: Any) -> MetaCheck:
        """The check of a meta-schema node, compiled once (``$ref: "#"`` recursion included)."""
        key = id(node)
        if key not in self.built:
            done: list[MetaCheck] = []  # filled once compiled; recursive uses go through it
            self.built[key] = lambda value: done[0](value)
            done.append(self._compile(node))
            self.built[key] = done[0]
        return self.built[key]

    def _compile(self, node: Any) -> MetaCheck:
        if node is True or node == {}:
            return _always
        if not isinstance(node, dict):
            raise _NotCompiled(repr(node))
        if "$ref" in node:  # drafts 4 to 7 ignore the siblings of $ref
            return self.schema(self._resolve(node["$ref"]))
        checks = [check for k, v in node.items() if k not in _META_ANNOTATIONS
                  for check in [self._keyword(node, k, v)] if check is not None]
        if len(checks) == 1:
            return checks[0]
        return lambda value: all(check(value) for check in checks)

    def _resolve(self, ref: str) -> Any:
        if ref == "#":
            return self.meta
        if not ref.startswith("#/"):
            raise _NotCompiled(ref)
        node: Any = self.meta
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def _keyword(self, node: dict[str, Any], keyword: str, arg: Any) -> MetaCheck | None:
        """The check of one keyword of a meta-schema node (None: it checks nothing here)."""
        if keyword == "type":
            return _type_check(arg if isinstance(arg, list) else [arg])
        if keyword == "enum":
            if not all(isinstance(v, str) for v in arg):
                raise _NotCompiled("enum")
            names = frozenset(arg)
            return lambda value: isinstance(value, str) and value in names
        if keyword == "minimum":
            if node.get("exclusiveMinimum") is True:  # draft 4
                return lambda value: not _is_number(value) or value > arg
            return lambda value: not _is_number(value) or value >= arg
        if keyword == "exclusiveMinimum":
            if isinstance(arg, bool):  # draft 4: read with minimum
                return None
            return lambda value: not _is_number(value) or value > arg
        if keyword == "minItems":
            return lambda value: not isinstance(value, list) or len(value) >= arg
        if keyword == "uniqueItems":
            return _surely_unique if arg is True else None
        if keyword == "items":
            if not isinstance(arg, dict | bool):
                raise _NotCompiled("items array")
            item = self.schema(arg)
            return lambda value: not isinstance(value, list) or all(item(v) for v in value)
        if keyword == "properties":
            return _properties_check({name: self.schema(sub) for name, sub in arg.items()})
        if keyword == "additionalProperties":
            if "patternProperties" in node:
                raise _NotCompiled("patternProperties")
            known = frozenset(node.get("properties", ()))
            extra = self.schema(arg)
            return lambda value: not isinstance(value, dict) or all(
                extra(v) for k, v in value.items() if k not in known)
        if keyword == "propertyNames":
            name_check = self.schema(arg)
            return lambda value: not isinstance(value, dict) or all(map(name_check, value))
        if keyword == "format":
            return lambda value: bool(self.formats.conforms(value, arg))
        if keyword == "anyOf":
            options = [self.schema(sub) for sub in arg]
            return lambda value: any(check(value) for check in options)
        if keyword == "allOf":
            parts = [self.schema(sub) for sub in arg]
            return lambda value: all(check(value) for check in parts)
        if keyword == "dependencies":
            if not all(isinstance(names, list) for names in arg.values()):
                raise _NotCompiled("schema dependency")
            needs = [(name, tuple(names)) for name, names in arg.items()]
            return lambda value: not isinstance(value, dict) or all(
                all(n in value for n in names) for name, names in needs if name in value)
        raise _NotCompiled(keyword)


def _always(value: Any) -> bool:
    return True


_TYPE_TESTS: dict[str, MetaCheck] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": _is_number,
    # Not ``1.0``: jsonschema's answer for a float depends on the draft.
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def _type_check(names: list[Any]) -> MetaCheck:
    if not all(name in _TYPE_TESTS for name in names):
        raise _NotCompiled(f"type {names}")
    tests = [_TYPE_TESTS[name] for name in names]
    if len(tests) == 1:
        return tests[0]
    return lambda value: any(test(value) for test in tests)


def _properties_check(checks: dict[str, MetaCheck]) -> MetaCheck:
    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name, item in value.items():
            item_check = checks.get(name)
            if item_check is not None and not item_check(item):
                return False
        return True

    return check


def _surely_unique(value: Any) -> bool:
    """Pairwise distinct as jsonschema compares (``1 == 1.0``, ``True != 1``); False for
    containers (then jsonschema decides)."""
    if not isinstance(value, list):
        return True
    seen: set[tuple[str, Any]] = set()
    for item in value:
        if isinstance(item, bool):
            key: tuple[str, Any] = ("bool", item)
        elif isinstance(item, int | float | str) or item is None:
            key = ("scalar", item)
        else:
            return False
        if key in seen:
            return False
        seen.add(key)
    return True


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
    """Close, for generation, the objects that make no ``additionalProperties`` decision
    (one rule for the library, ``chatkit run`` and ``chatkit serve``, as OpenAI's strict
    mode, llama.cpp and XGrammar do): a small model otherwise adds keys until
    ``max_tokens``, and a Pydantic model ignores or forbids them anyway. The second reader
    still checks the schema as written, which admits the closed objects' documents.

    Left open, because closing would change what the schema means: objects under ``allOf``
    (each branch closed would reject the other branches' keys), objects whose ``required``
    names a key ``properties`` does not declare, and objects with ``patternProperties``
    or ``unevaluatedProperties``."""
    in_all_of: set[int] = set()

    def mark(branch: Any) -> None:  # a branch and every local $ref it reaches
        for _, sub in _walk(branch, ""):
            if id(sub) in in_all_of:
                continue
            in_all_of.add(id(sub))
            target = _local_ref(doc, sub.get("$ref"))
            if target is not None:
                mark(target)

    for _, node in _walk(doc, ""):
        if id(node) in in_all_of:
            continue
        branches = node.get("allOf")
        if isinstance(branches, list):
            for branch in branches:
                mark(branch)
        props = node.get("properties")
        if node.get("type") != "object" or not isinstance(props, dict):
            continue
        required = node.get("required", [])
        if ("patternProperties" in node or "unevaluatedProperties" in node
                or not isinstance(required, list)
                or any(name not in props for name in required)):
            continue
        node.setdefault("additionalProperties", False)


def _local_ref(doc: Any, ref: Any) -> dict[str, Any] | None:
    """The subschema a ``#/...`` reference names in ``doc`` (None: not local, or absent)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node: Any = doc
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


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

# The shared bounded definitions bound_numbers(root=True) adds to ``$defs``, per kind.
_SHARED_NUMBERS = {"number": "__chatkit_number", "integer": "__chatkit_integer"}
# Every JSON Schema keyword (drafts 4 to 2020-12) but the pure annotations, and llguidance's
# own: a number subschema with none of these but ``type`` may use the shared definition
# (llguidance ignores other keys).
_KEYWORDS = frozenset("""$schema $id id $ref $defs definitions $anchor $dynamicRef
$dynamicAnchor $recursiveRef $recursiveAnchor $vocabulary type enum const multipleOf maximum
exclusiveMaximum minimum exclusiveMinimum maxLength minLength pattern items additionalItems
prefixItems contains minContains maxContains maxItems minItems uniqueItems unevaluatedItems
properties patternProperties additionalProperties unevaluatedProperties propertyNames required
dependentRequired dependentSchemas dependencies maxProperties minProperties allOf anyOf oneOf
not if then else format contentEncoding contentMediaType contentSchema x-guidance""".split())


def bound_numbers(schema: Any, digits: Digits = NUMBER_DIGITS, *, root: bool = False) -> Any:
    """A copy of ``schema`` whose number and integer subschemas carry the digit bound (see
    ``NUMBER_DIGITS``) where the schema sets none; ``schema`` itself is not changed (and is
    returned as is when it has no number to bound).

    ``root=True``, for a whole document (its ``#`` pointers resolve against it): a number or
    integer subschema with no keyword but ``type`` becomes a ``$ref`` to one bounded
    definition per kind, added to ``$defs`` (llguidance builds a bounded number's lexer once
    per definition, not per use: ~1 ms each). Not under ``oneOf``/``allOf``, nor in a
    document with nested base URIs (``$id``) or the names already taken."""
    if digits is None or not isinstance(schema, dict):
        return schema
    survey = _survey(schema)
    return _bounded(schema, digits, survey, share=root) if survey.numbers else schema


class _Survey(NamedTuple):
    """What compiling a schema document needs to know about it (one walk)."""

    refs: bool
    """A ``$ref`` or ``$dynamicRef``: the language may be empty (a cycle with no base case)."""
    numbers: bool
    """Number or integer subschemas: the digit bound applies."""
    nested_ids: bool
    """A subschema sets its own base URI (``$id``, draft-04 ``id``)."""


def _survey(schema: dict[str, Any]) -> _Survey:
    refs = numbers = nested_ids = False
    for path, node in _walk(schema, ""):
        refs = refs or "$ref" in node or "$dynamicRef" in node
        numbers = numbers or bool(_number_kinds(node))
        if path and ("$id" in node or isinstance(node.get("id"), str)):
            nested_ids = True
    return _Survey(refs, numbers, nested_ids)


def _number_kinds(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return {k for k in kinds if k == "number" or k == "integer"}


def _bounded(schema: dict[str, Any], digits: tuple[int, int], survey: _Survey, *,
             share: bool) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(schema))
    defs = copy.get("$defs", {})
    share = share and not survey.nested_ids and isinstance(defs, dict) and \
        defs.keys().isdisjoint(_SHARED_NUMBERS.values())
    shared: set[str] = set()
    for path, node in list(_walk(copy, "")):
        kinds = _number_kinds(node)
        if not kinds or "enum" in node or "const" in node:
            continue
        if share and _plain_type(node) and "/oneOf/" not in path and "/allOf/" not in path:
            shared.add(_use_shared_number(node, kinds))
        else:
            _bound_in_place(node, kinds, digits)
    if shared:
        copy["$defs"] = {**defs, **{_SHARED_NUMBERS[kind]: _number_bound(kind, digits)
                                    for kind in sorted(shared)}}
    return copy


def _plain_type(node: dict[str, Any]) -> bool:
    """Whether ``type`` (a name or a list of names) is the only keyword of ``node``."""
    kind = node["type"]
    names = kind if isinstance(kind, list) else [kind]
    return all(isinstance(k, str) for k in names) and \
        all(k == "type" or k not in _KEYWORDS for k in node)


def _use_shared_number(node: dict[str, Any], kinds: set[str]) -> str:
    """Make ``node`` a ``$ref`` to the shared definition (in an ``anyOf`` with its other
    types, if any); returns the kind used."""
    kind = "number" if "number" in kinds else "integer"  # ["integer", "number"] is a number
    ref = {"$ref": f"#/$defs/{_SHARED_NUMBERS[kind]}"}
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    others = [t for t in types if t not in ("number", "integer")]
    node.clear()
    if others:
        node["anyOf"] = [ref, {"type": others if len(others) > 1 else others[0]}]
    else:
        node.update(ref)
    return kind


def _number_bound(kind: str, digits: tuple[int, int]) -> dict[str, Any]:
    """The shared definition of a bounded number or integer."""
    bound: dict[str, Any] = {"type": kind}
    _bound_in_place(bound, {kind}, digits)
    return bound


def _bound_in_place(node: dict[str, Any], kinds: set[str], digits: tuple[int, int]) -> None:
    """Bound a number subschema's digits where it sets no bound of its own.

    Floats: strictly between -10**whole and 10**whole (at most ``whole`` integer digits; an
    exclusive float bound compiles ~1 ms faster in llguidance than ``10**whole - 1``);
    integers: within ±(10**whole - 1), the same set."""
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    if not all(v is None or _is_number(v) for v in (low, high)):
        return  # not a real bound (e.g. data under an unknown keyword): leave it
    whole, fraction = digits
    limit = 10**whole - 1
    if "number" in kinds:
        node.setdefault("multipleOf", float(f"1e-{fraction}"))
        upper: tuple[str, float] = ("exclusiveMaximum", float(10**whole))
        lower: tuple[str, float] = ("exclusiveMinimum", -float(10**whole))
    else:
        upper, lower = ("maximum", limit), ("minimum", -limit)
    if high is None and (low is None or low < limit):
        node[upper[0]] = upper[1]
    if low is None and (high is None or high > -limit):
        node[lower[0]] = lower[1]


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
    reports the same errors (see :func:`schema_refusal`) ~0.8 ms sooner than validation does.
    Numbers are bounded (``digits``, shared definitions: see :func:`bound_numbers`)."""
    if schema is False:
        raise SchemaInvalid("the schema `false` accepts nothing")
    if isinstance(schema, dict):
        schema = closed_objects(schema)
    survey = _survey(schema) if isinstance(schema, dict) else _Survey(False, False, False)
    doc = schema
    if isinstance(schema, dict) and digits is not None and survey.numbers:
        doc = _bounded(schema, digits, survey, share=True)
    try:
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(doc), overrides=json_options(whitespace)  # type: ignore[arg-type]
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
    (which reports the same errors: see ``schema_refusal``); it costs ~0.8 ms a schema.
    A grammar that admits no text (a ``$ref`` cycle) is refused either way, from a matcher
    over a byte-level tokenizer: no model needed.
    """
    compiled = json_grammar(schema, whitespace, digits)
    problem = None
    if validate:
        import llguidance

        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(compiled.grammar)
        problem = "; ".join(messages) if failed else None
    if problem is None and compiled.may_be_empty:
        problem = grammar_problem(compiled.grammar)
    if problem:
        raise _translate(schema, problem)
    return compiled.grammar


@functools.cache
def _byte_tokenizer() -> Any:
    import llguidance

    return llguidance.LLTokenizer("byte")


def grammar_problem(grammar: str) -> str | None:
    """What llguidance reports when it builds a matcher for ``grammar`` (over a byte-level
    tokenizer: no model needed), or None. Catches what validation alone lets through
    (``$ref`` cycles, lexer limits such as ``a{1000000}``) before any model loads."""
    import llguidance

    matcher = llguidance.LLMatcher(_byte_tokenizer(), grammar, log_level=0)
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


def subschemas(doc: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, subschema) for every subschema of ``doc``, depth first; data keywords
    (``enum``, ``const``, ``default``, ``examples``) are not walked, and a property named
    like a keyword is a name, not the keyword."""
    return _walk(doc, "")


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
        self._validator: Any = None  # built on first use (most constraints are compiled once
        # per process and read many times, some never read)

    def read(self, text: str) -> Any:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # incl. integers past Python's digit limit
            raise SchemaViolation(text, [f"not valid JSON: {exc}"]) from None
        errors = [
            f"{_pointer(e.absolute_path) or '/'}: {e.message}"
            for e in self._jsonschema_validator().iter_errors(value)
        ]
        if errors:
            raise SchemaViolation(text, errors)
        if self.model_cls is None:
            return value
        from pydantic import ValidationError

        try:
            return self.model_cls.model_validate_json(text)
        except ValidationError as exc:
            raise SchemaViolation(text, [str(err["msg"]) for err in exc.errors()]) from exc

    def _jsonschema_validator(self) -> Any:
        validator = self._validator
        if validator is None:  # two threads may both build one: either will do
            js = _jsonschema()
            cls = js.validators.validator_for(self.schema, default=js.Draft202012Validator)
            validator = self._validator = cls(self.schema, format_checker=cls.FORMAT_CHECKER)
        return validator
