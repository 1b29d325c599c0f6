"""What a grammar cannot express, checked at value boundaries.

llguidance compiles most of JSON Schema to a grammar; a few keywords it cannot express
(``not``, ``if``/``then``/``else``, ``dependentRequired``, ``uniqueItems``, ``contains``,
``propertyNames``, overlapping ``oneOf``, formats it does not know, ...). For a schema
that uses them, :func:`relax` makes a *superset* the grammar can compile (the keyword
removed, ``oneOf`` read as ``anyOf``), and :func:`place_checks` decides where the removed
meaning is checked back: at the end of each value whose subschema lost a keyword, the value
is validated against its subschema as written (``jsonschema``, deep). Where the instance
location of a relaxed subschema is not fixed by the schema (under ``anyOf``, ``oneOf``,
``not``, ``if``, ``patternProperties``, ``additionalProperties``, a ``$ref`` cycle, ...),
the check moves up to the nearest ancestor whose location is fixed (the root at worst).
So a document whose every check passed at its boundaries is valid: the checks validate,
deep, every part of the schema the grammar was relaxed on.

:mod:`chatkit.grammar.guard` runs the checks while decoding (masking a token that would complete
a failing value, rolling back when nothing is left).
"""

from __future__ import annotations

import copy
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ..errors import SchemaUnsupported
from .meta_schema import load_jsonschema
from .schema_rewrite import relax_cycle, relax_named_patterns, relax_patterns
from .schema_walk import (
    DATA_KEYWORDS,
    SCHEMA_LISTS,
    SCHEMA_MAPS,
    declared_names,
    escape,
    local_ref,
    walk,
)

__all__: list[str] = []

T = TypeVar("T")

_log = logging.getLogger("chatkit")

MAX_MEMO = 4096
"""Most value verdicts a schema's checks remember (:meth:`Checks.passes`)."""

UnknownFormats = Literal["annotate", "refuse"]
"""What to do with a ``format`` neither llguidance nor ``jsonschema`` knows: JSON Schema
makes formats annotations (``annotate``: accepted, logged), or ``refuse`` the schema."""

RELAXED: dict[str, tuple[str, ...]] = {
    "not": ("not",),
    "if": ("if", "then", "else"),
    "then": ("if", "then", "else"),
    "else": ("if", "then", "else"),
    "dependentRequired": ("dependentRequired",),
    "dependentSchemas": ("dependentSchemas",),
    "dependencies": ("dependencies",),
    "uniqueItems": ("uniqueItems",),
    "contains": ("contains", "minContains", "maxContains"),
    "minContains": ("contains", "minContains", "maxContains"),
    "maxContains": ("contains", "minContains", "maxContains"),
    "propertyNames": ("propertyNames",),
    "unevaluatedProperties": ("unevaluatedProperties",),
    "unevaluatedItems": ("unevaluatedItems",),
    "minProperties": ("minProperties", "maxProperties"),
    "maxProperties": ("minProperties", "maxProperties"),
    "oneOf": ("oneOf",),
    "allOf": ("allOf",),
    "format": ("format",),
    "patternProperties": ("patternProperties",),
    "$dynamicRef": ("$dynamicRef",),
    "$dynamicAnchor": ("$dynamicAnchor",),
    "multipleOf": ("multipleOf",),
}
"""The keywords llguidance refuses that a value check enforces instead, and what relaxing
each removes from a subschema (``oneOf`` becomes ``anyOf``)."""

FORMAT_PATTERNS = {
    "json-pointer": r"^(/([^~/]|~[01])*)*$",
    "relative-json-pointer": r"^(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)$",
}
"""Regexes for the checked formats that have one: the grammar gets the pattern (so the
model cannot go astray), the check still decides."""

_NOT_FIXED = ("anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas",
              "patternProperties", "additionalProperties", "additionalItems", "contains",
              "propertyNames", "unevaluatedProperties", "unevaluatedItems", "dependencies",
              "$dynamicRef")
"""Applicators whose subschemas apply at instance locations the schema does not fix."""

_MAPS = ("patternProperties", "dependentSchemas", "dependencies", "properties")

_DYNAMIC = ("$dynamicRef", "$dynamicAnchor")

PathPart = str | int | None
"""An object key, an array index, or None (any index: ``items``)."""


@dataclass(frozen=True)
class Check:
    """Validate the value at instance locations ``pattern`` against ``node`` (deep)."""

    pattern: tuple[PathPart, ...]
    node: dict[str, Any] | bool
    pointer: str
    """The schema location of ``node`` (a JSON pointer)."""
    keywords: tuple[str, ...]
    """The relaxed keywords this check stands for (for messages)."""
    unique: bool = False
    """``node`` has ``uniqueItems``: an array is also checked at each item's end."""
    names: dict[str, Any] | bool | None = None
    """``node``'s ``propertyNames``: each key is also checked at its end."""

    def matches(self, path: tuple[str | int, ...]) -> bool:
        return len(self.pattern) == len(path) and matches_from_root(self.pattern, path)


def matches_from_root(pattern: tuple[PathPart, ...], path: tuple[str | int, ...]) -> bool:
    """Whether ``path`` matches the first ``len(path)`` parts of ``pattern`` (None: any
    array index)."""
    if len(pattern) < len(path):
        return False
    for want, got in zip(pattern, path, strict=False):
        if want is None:
            if not isinstance(got, int):
                return False
        elif want != got:
            return False
    return True


@dataclass
class Checks:
    """A relaxed schema's value checks (shared by every stream of a constraint)."""

    doc: dict[str, Any] | bool
    """The schema as written."""
    checks: list[Check]
    relaxed: dict[str, tuple[str, ...]]
    """Schema pointer -> the keywords relaxed there."""
    budget: int = 32
    """Rollbacks allowed per reply (``ChecksExhausted`` past it)."""
    after_think: bool = False
    """The document follows a think block (the grammar's ``think`` capture, then a blank
    line): the checks start there."""
    _validator: Any = field(default=None, repr=False)
    _memo: dict[tuple[int, str], bool] = field(default_factory=dict, repr=False)
    _evolved: dict[int, Any] = field(default_factory=dict, repr=False)

    @property
    def keywords(self) -> tuple[str, ...]:
        return tuple(sorted({k for ks in self.relaxed.values() for k in ks}))

    def validator(self) -> Any:
        if self._validator is None:
            js = load_jsonschema()
            cls = js.validators.validator_for(self.doc, default=js.Draft202012Validator)
            self._validator = cls(self.doc, format_checker=cls.FORMAT_CHECKER)
        return self._validator

    def _for(self, schema: dict[str, Any] | bool) -> Any:
        """The validator of a subschema (the root's, so ``$ref`` resolves), kept."""
        made = self._evolved.get(id(schema))
        if made is None:
            made = self._evolved[id(schema)] = self.validator().evolve(schema=schema)
        return made

    def at(self, path: tuple[str | int, ...]) -> list[Check]:
        """The checks of the value at ``path``."""
        return [c for c in self.checks if c.matches(path)]

    def passes(self, check: Check, text: bytes) -> bool:
        """Whether the complete value ``text`` passes ``check`` (memoised per value: at most
        :data:`MAX_MEMO` values per schema, then the memo starts again empty)."""
        key = (id(check), text.decode("utf-8", "replace"))
        hit = self._memo.get(key)
        if hit is None:
            try:
                value = json.loads(key[1])
            except ValueError:  # e.g. an integer past Python's digit limit (digits=None)
                return False
            hit = bool(self._for(check.node).is_valid(value))
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
            self._memo[key] = hit
        return hit

    def name_passes(self, names: dict[str, Any] | bool, key_text: bytes) -> bool:
        """Whether a complete key (its JSON string) passes ``propertyNames``."""
        return bool(self._for(names).is_valid(json.loads(key_text)))

    def unique_so_far(self, items_text: bytes) -> bool:
        """Whether an array's items so far (``[a,b,...`` without its ``]``) are unique."""
        items = json.loads(items_text + b"]")
        return bool(self._for(_UNIQUE).is_valid(items))


_UNIQUE = {"uniqueItems": True}


# ------------------------------------------------------------------ relaxing
def relax(doc: dict[str, Any], keywords: list[str], relaxed: dict[str, tuple[str, ...]],
          *, format_name: str | None = None, every: bool = False) -> dict[str, Any]:
    """A copy of ``doc`` with ``keywords`` relaxed wherever they occur (a superset of what
    ``doc`` accepts); ``relaxed`` gains each place's pointer and keywords. ``format``:
    only subschemas whose format is ``format_name``. ``min``/``maxProperties``: only
    objects whose listed properties are not all required (llguidance's rule), or every one
    with ``every``."""
    out: dict[str, Any] = copy.deepcopy(doc)
    for pointer, node in list(walk(out, "")):
        if _MERGED.intersection(node).intersection(
                name for keyword in keywords for name in RELAXED[keyword]):
            _keep_keys(out, node)
        removed: list[str] = []
        for keyword in keywords:
            for name in RELAXED[keyword]:
                if name not in node or not (every or _applies(node, name, format_name)):
                    continue
                if name == "oneOf":  # at least one branch: anyOf (beside an anyOf: allOf)
                    if "anyOf" in node:
                        node.setdefault("allOf", []).append({"anyOf": node["oneOf"]})
                    else:
                        node["anyOf"] = node["oneOf"]
                if name == "format" and format_name in FORMAT_PATTERNS \
                        and "pattern" not in node:
                    node["pattern"] = FORMAT_PATTERNS[format_name]  # the grammar helps
                if name == "unevaluatedProperties":
                    node.setdefault("additionalProperties", True)  # keep it open
                if name == "patternProperties":  # its keys would fall to additionalProperties
                    node["additionalProperties"] = True
                if name == "$dynamicAnchor" and isinstance(node[name], str):
                    node.setdefault("$anchor", node[name])  # a plain anchor too (2020-12)
                del node[name]
                removed.append(name)
        if removed:
            relaxed[pointer] = tuple(sorted({*relaxed.get(pointer, ()), *removed}))
    return out


_MERGED = frozenset({"if", "then", "else", "dependentSchemas", "dependencies",
                     "dependentRequired"})
"""Relaxed keywords that may declare an object's keys (merged before the object closes)."""


def _keep_keys(doc: dict[str, Any], node: dict[str, Any]) -> None:
    """Before keywords beside an object's ``properties`` are relaxed away, the keys they
    declare join those properties as ``{}`` and a property they also declare stays open,
    so that closing the object for generation (``schema.close_objects``) keeps every key the
    value check may ask for. Both say nothing new of an object that was open."""
    props = node.get("properties")
    if not isinstance(props, dict) or "additionalProperties" in node:
        return
    for name in declared_names(doc, node):
        if name not in props:
            props[name] = {}
        elif isinstance(props[name], dict) and "properties" in props[name]:
            props[name].setdefault("additionalProperties", True)


def _applies(node: dict[str, Any], name: str, format_name: str | None) -> bool:
    if name == "format":
        return node.get("format") == format_name
    if name in ("minProperties", "maxProperties"):
        props = node.get("properties")
        required = node.get("required", [])
        return isinstance(props, dict) and bool(props) and isinstance(required, list) \
            and not set(props) <= set(required)
    return True


def known_format(name: str) -> bool:
    """Whether ``jsonschema``'s format checker checks ``name`` here."""
    js = load_jsonschema()
    return name in js.Draft202012Validator.FORMAT_CHECKER.checkers


def relax_format(doc: dict[str, Any], name: str, relaxed: dict[str, tuple[str, ...]],
                 annotations: set[str], unknown: UnknownFormats,
                 pointer: str) -> dict[str, Any]:
    """``doc`` with the format llguidance does not know removed: checked when
    ``jsonschema`` knows it, else an annotation (logged) or refused by name."""
    if known_format(name):
        return relax(doc, ["format"], relaxed, format_name=name)
    if unknown == "refuse":
        raise SchemaUnsupported("format", pointer, f"unknown format {name!r} (refused: "
                                "unknown_formats='refuse')")
    annotations.add(name)
    _log.info("chatkit: format %r is unknown: an annotation, not enforced", name)
    ignored: dict[str, tuple[str, ...]] = {}
    return relax(doc, ["format"], ignored, format_name=name)


MAX_RELAXATIONS = 12


def compile_relaxed(doc: dict[str, Any] | bool, build: Callable[[dict[str, Any] | bool], T], *,
                    unknown_formats: UnknownFormats = "annotate") -> tuple[T, Checks | None]:
    """``build(doc)`` (a compile that raises ``SchemaUnsupported``), relaxing the keywords
    it refuses that a value check can enforce, until it compiles: the result and the checks
    (None: nothing relaxed, ``doc`` compiled as it is). A keyword no check enforces is
    refused as ``build`` refused it."""
    relaxed: dict[str, tuple[str, ...]] = {}
    annotations: set[str] = set()
    current = relax_patterns(doc, relaxed) if isinstance(doc, dict) else doc
    for _ in range(MAX_RELAXATIONS):
        try:
            built = build(current)
        except SchemaUnsupported as exc:
            if not isinstance(current, dict):
                raise
            current = _relaxed_for(current, exc, relaxed, annotations, unknown_formats)
            continue
        if not relaxed:
            return built, None
        assert isinstance(doc, dict)
        return built, Checks(doc, place_checks(doc, relaxed), relaxed)
    raise SchemaUnsupported("schema", "", f"still refused after {MAX_RELAXATIONS} relaxations")


def relaxed_schema(doc: dict[str, Any] | bool, unknown_formats: UnknownFormats = "annotate"
                   ) -> tuple[dict[str, Any] | bool, Checks | None]:
    """The schema a grammar can compile for ``doc`` (``doc`` itself, or relaxed) and the
    checks of what was relaxed (None: nothing to check), for a caller that embeds the
    schema in a grammar of its own (a think block, then the document)."""
    from .schema import compile_json_schema

    def build(current: dict[str, Any] | bool) -> dict[str, Any] | bool:
        compile_json_schema(current)
        return current

    return compile_relaxed(doc, build, unknown_formats=unknown_formats)


_LISTED = re.compile(r"Unimplemented keys: \[(.*?)\]")
_FORMAT = re.compile(r"Unknown format: (\S*)")


def _relaxed_for(doc: dict[str, Any], exc: SchemaUnsupported,
                 relaxed: dict[str, tuple[str, ...]], annotations: set[str],
                 unknown: UnknownFormats) -> dict[str, Any]:
    """``doc`` relaxed on what ``exc`` refuses, or ``exc`` raised again (not relaxable, or
    relaxing changed nothing)."""
    before = json.dumps(doc, sort_keys=True)
    fmt = _FORMAT.search(exc.detail)
    if exc.keyword in ("pattern", "$ref"):  # targeted: the patterns or cycle it names
        named = (relax_named_patterns if exc.keyword == "pattern" else relax_cycle)(
            doc, exc.detail, relaxed)
        if named is None:
            raise exc
        return named
    if exc.keyword == "format" and fmt:
        out = relax_format(doc, fmt.group(1).strip('"'), relaxed, annotations, unknown,
                           exc.path)
    else:
        listed = _LISTED.search(exc.detail)
        keys = [k.strip().strip('"') for k in listed.group(1).split(",")] if listed \
            else [exc.keyword]
        if not keys or any(k not in RELAXED for k in keys):
            raise exc
        out = relax(doc, keys, relaxed)
        if json.dumps(out, sort_keys=True) == before:
            out = relax(doc, keys, relaxed, every=True)
    if json.dumps(out, sort_keys=True) == before:
        raise exc
    return out


# ------------------------------------------------------------------ placing
def place_checks(doc: dict[str, Any], relaxed: dict[str, tuple[str, ...]]) -> list[Check]:
    """Where each relaxed subschema of ``doc`` (pointers in ``relaxed``) is checked: at
    its own instance location when the schema fixes it, else at its nearest ancestor's
    whose location is fixed (validated deep, so the relaxed part is covered)."""
    nodes = {id(node): pointer for pointer, node in walk(doc, "") if pointer in relaxed}
    below = _Below(doc, set(nodes))
    checks: dict[tuple[tuple[PathPart, ...], int], Check] = {}
    visits = [0]

    def add(path: tuple[PathPart, ...], node: dict[str, Any], pointer: str) -> None:
        kws = tuple(sorted({k for p, ks in relaxed.items()
                            if p == pointer or p.startswith(pointer + "/") for k in ks}))
        here = relaxed.get(pointer, ())
        unique = "uniqueItems" in here and node.get("uniqueItems") is True
        names = node.get("propertyNames") if "propertyNames" in here else None
        checks.setdefault((path, id(node)), Check(path, node, pointer, kws or ("$ref",),
                                                  unique, names))

    def visit(node: Any, pointer: str, path: tuple[PathPart, ...], chain: tuple[int, ...]
              ) -> None:
        if not isinstance(node, dict) or visits[0] > MAX_VISITS:
            return
        visits[0] += 1
        ref = node.get("$ref")
        target = local_ref(doc, ref)
        unresolved = isinstance(ref, str) and target is None and bool(nodes)
        if not (unresolved or below.has(node)):
            return
        if unresolved or id(node) in nodes or (id(target) in chain and below.has(target)) \
                or any(k in node and below.has_kw(node, k) for k in _NOT_FIXED):
            add(path, node, pointer)  # validated deep here (a $ref resolved elsewhere,
            return  # a cycle, a place the schema does not fix)
        if isinstance(ref, str) and target is not None and below.has(target):
            visit(target, ref[1:] if ref != "#" else "", path, (*chain, id(target)))
        for i, branch in enumerate(node.get("allOf") or []):
            visit(branch, f"{pointer}/allOf/{i}", path, chain)
        for name, sub in (node.get("properties") or {}).items():
            visit(sub, f"{pointer}/properties/{escape(name)}", (*path, name), chain)
        prefix, tuple_at = node.get("prefixItems"), "prefixItems"
        items = node.get("items")
        if isinstance(items, list):  # draft 4-2019: items as a tuple
            prefix, items, tuple_at = items, None, "items"
        for i, sub in enumerate(prefix or []):
            visit(sub, f"{pointer}/{tuple_at}/{i}", (*path, i), chain)
        if isinstance(items, dict):
            if prefix:
                if below.has(items):
                    add(path, node, pointer)
            else:
                visit(items, f"{pointer}/items", (*path, None), chain)

    visit(doc, "", (), (id(doc),))
    if len(checks) > MAX_CHECKS or visits[0] > MAX_VISITS:
        checks.clear()  # $refs reused on many paths: the whole document, validated whole
    if _needs_whole(doc, relaxed, bool(checks)):
        add((), doc, "")
    return list(checks.values())


def _needs_whole(doc: dict[str, Any], relaxed: dict[str, tuple[str, ...]], placed: bool
                 ) -> bool:
    """Whether the whole document must be checked too: dynamic scope (``$dynamicRef``),
    nested ``$id`` resources (a ``#/...`` there is not the root's), or nothing placed."""
    return (any(k in _DYNAMIC for ks in relaxed.values() for k in ks)
            or any("$id" in node for p, node in walk(doc, "") if p)
            or (bool(relaxed) and not placed))


MAX_CHECKS = 256
MAX_VISITS = 20_000
"""Past these (a ``$ref`` reused on many paths multiplies the places), one check of the
whole document replaces the placed ones."""


class _Below:
    r"""Which subschemas have a relaxed subschema at or below them (local ``$ref``\ s
    followed): a fixpoint over the child and reference edges, so a cycle cannot hide one."""

    def __init__(self, doc: dict[str, Any], relaxed: set[int]) -> None:
        nodes = [node for _, node in walk(doc, "")]
        edges: dict[int, list[int]] = {}
        for node in nodes:
            out = [id(child) for child in _children(node)]
            target = local_ref(doc, node.get("$ref"))
            if target is not None:
                out.append(id(target))
            edges[id(node)] = out
        reach = set(relaxed)
        changed = True
        while changed:
            changed = False
            for node in nodes:
                key = id(node)
                if key not in reach and any(e in reach for e in edges[key]):
                    reach.add(key)
                    changed = True
        self.reach = reach

    def has_kw(self, node: dict[str, Any], keyword: str) -> bool:
        """Whether ``node[keyword]`` (a schema, a list or a map of schemas) holds one."""
        value = node[keyword]
        if keyword in _MAPS and isinstance(value, dict):
            return any(self.has(v) for v in value.values())
        if isinstance(value, list):
            return any(self.has(v) for v in value)
        return self.has(value)

    def has(self, node: Any) -> bool:
        return isinstance(node, dict) and id(node) in self.reach


def _children(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The subschemas directly under ``node`` (as ``schema_walk.walk`` descends)."""
    out: list[dict[str, Any]] = []
    for key, value in node.items():
        if key in DATA_KEYWORDS:
            continue
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out += [v for v in value.values() if isinstance(v, dict)]
        elif (key in SCHEMA_LISTS or key == "items") and isinstance(value, list):
            out += [v for v in value if isinstance(v, dict)]
        elif isinstance(value, dict):
            out.append(value)
    return out
