"""The meta-schema check: is a document a valid JSON Schema at all?

:func:`check_meta` raises ``SchemaInvalid`` with jsonschema's message and JSON pointer for
a document its meta-schema (2020-12, or the draft named by ``$schema``) rejects. The
draft-04/06/07 meta-schemas are also compiled into boolean closures that say True only when
jsonschema would surely find no error; jsonschema itself runs (and is imported) only when
they say no or cannot tell. A document already checked in this process is not checked again.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema  # imported on first use (load_jsonschema)

from ..errors import SchemaInvalid, SchemaUnsupported
from .schema_walk import is_number, pointer, walk

__all__: list[str] = []

# Keywords only the 2019-09 / 2020-12 meta-schemas describe.
_MODERN = frozenset({"prefixItems", "$dynamicRef", "$dynamicAnchor", "$recursiveRef",
                     "$recursiveAnchor", "dependentSchemas", "dependentRequired",
                     "unevaluatedItems", "unevaluatedProperties", "minContains", "maxContains",
                     "$vocabulary", "contentSchema"})
# One of them as an object key in canonical JSON text (json.dumps' default separators).
_MODERN_KEY = re.compile("|".join(re.escape(f'"{k}": ') for k in sorted(_MODERN)))


MetaCheck = Callable[[Any], bool]
"""A compiled meta-schema node: True when the value surely passes it."""


def load_jsonschema() -> Any:
    """The ``jsonschema`` module, imported on first use: ``import chatkit`` leaves it out, and
    a schema turn needs it only to validate its reply (the compiled draft-07 check passes
    most schemas without it)."""
    import jsonschema

    return jsonschema


@functools.lru_cache(maxsize=256)
def _meta_validator(cls: Any) -> Any:
    """``cls``'s meta-schema validator (one per validator class: a handful; at most 256)."""
    meta = load_jsonschema().validators.validator_for(cls.META_SCHEMA, default=cls)
    return meta(cls.META_SCHEMA, format_checker=meta.FORMAT_CHECKER)


@functools.lru_cache(maxsize=256)
def _fast_meta_check(cls: Any) -> MetaCheck | None:
    """``cls``'s meta-schema as a boolean check (drafts 4, 6 and 7; None for the others:
    2019-09+ ``$dynamicRef`` and vocabularies), compiled once. True only when
    ``_meta_validator(cls)`` surely finds no error: the same format checker (so a ``pattern``
    is still compiled by ``re``); in doubt (a float where an integer is wanted, objects under
    ``uniqueItems``) it says False and jsonschema's check decides. Cached per validator class
    (a handful; at most 256)."""
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
    """The draft-07 meta-schema as a boolean check built without importing jsonschema,
    formats by ``_LocalFormats``. None when the meta-schema is not found (jsonschema's check
    runs)."""
    meta = _draft7_meta()
    if meta is None:
        return None
    try:
        return _MetaCheckBuilder(meta, _LocalFormats()).schema(meta)
    except (_NotCompiled, KeyError, TypeError):
        return None


MAX_CHECKED = 4096
"""Most schemas remembered as checked (canonical JSON keys); past it the memo starts
again empty (a schema seen again is checked again)."""
_checked_keys: dict[str, None] = {}


def check_meta(doc: dict[str, Any] | bool, key: str) -> None:
    """``SchemaInvalid`` (with the JSON pointer) unless ``doc`` is a valid JSON Schema
    (``key``: its canonical JSON, the memo key); ``SchemaUnsupported("nesting")`` when it is
    too deep to check.

    A schema using none of the 2019-09+ keywords is checked against the draft-07
    meta-schema (the same rules for those keywords; no costly ``$dynamicRef`` resolution),
    the others against their own. A draft-04/06/07 check runs as compiled closures first;
    jsonschema runs only when they say no or cannot tell, and names the error. A schema
    already checked in this process is not checked again."""
    if key in _checked_keys:
        return
    draft7 = (isinstance(doc, dict) and "$schema" not in doc
              and not _uses_modern_keywords(doc, key))
    if draft7 and isinstance(doc, dict) and _surely_valid_draft7(doc):
        _remember_checked(key)
        return
    default = load_jsonschema().Draft202012Validator
    validator_cls: Any = default
    if isinstance(doc, dict) and isinstance(doc.get("$schema"), str):
        validator_cls = load_jsonschema().validators.validator_for(doc, default=default)
    elif draft7:
        validator_cls = load_jsonschema().Draft7Validator
    if not _surely_valid(validator_cls, doc):
        try:
            error = load_jsonschema().exceptions.best_match(
                _meta_validator(validator_cls).iter_errors(doc))
        except RecursionError:
            raise SchemaUnsupported("nesting", "", "too deeply nested to check") from None
        if error is not None:
            if error.validator == "format" and isinstance(error.instance, str) \
                    and _UNICODE_PROPERTY.search(error.instance):
                # valid ECMA-262 (unicode mode), which Python's re cannot compile: the
                # second reader could not check it
                raise SchemaUnsupported("pattern", pointer(error.absolute_path),
                                        f"{error.instance!r}: Unicode property escapes "
                                        "(\\p{...}) are not supported")
            raise SchemaInvalid(f"not a valid JSON Schema: {error.message}",
                                path=pointer(error.absolute_path))
    _remember_checked(key)


_UNICODE_PROPERTY = re.compile(r"\\[pP]\{")


def _remember_checked(key: str) -> None:
    if len(_checked_keys) >= MAX_CHECKED:
        _checked_keys.clear()
    _checked_keys[key] = None


def _surely_valid_draft7(doc: dict[str, Any]) -> bool:
    return _passes(_fast_draft7_check(), doc)


def _uses_modern_keywords(doc: dict[str, Any], key: str) -> bool:
    """Whether a subschema of ``doc`` uses a 2019-09+ keyword (``key``: its canonical JSON;
    a scan of it rules most documents out without a walk)."""
    return _MODERN_KEY.search(key) is not None and any(
        not node.keys().isdisjoint(_MODERN) for _, node in walk(doc, ""))


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
                return lambda value: not is_number(value) or value > arg
            return lambda value: not is_number(value) or value >= arg
        if keyword == "exclusiveMinimum":
            if isinstance(arg, bool):  # draft 4: read with minimum
                return None
            return lambda value: not is_number(value) or value > arg
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
    "number": is_number,
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
