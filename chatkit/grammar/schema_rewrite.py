"""Saying more of a schema in the grammar's own terms, and relaxing what it cannot read.

Two jobs, both before llguidance compiles a schema:

- exact rewrites (:func:`rewrite_exact`, part of the copy the grammar compiles): a
  ``propertyNames`` with one ``pattern``, ``enum``, ``const`` or length bound becomes the
  object's key language (``patternProperties`` + ``additionalProperties: false``), and a
  ``not`` of string constants becomes a ``pattern`` that excludes them, so the first
  generated character already obeys; ECMA-262 pattern syntax the Rust regex engine reads
  differently (``\\<``, ``\\>``, ``[^]``) is translated. Nothing is checked afterwards:
  the grammar says exactly what the keyword says.
- lookarounds at a value's edges (``^(?!ab)[a-z]{3}$``) become a plain regex for the same
  values (:func:`chatkit.grammar.regex_sets.without_lookarounds`): exact too.
- relaxing (:func:`relax_patterns`, :func:`relax_named_patterns`,
  :func:`relax_cycle`): a pattern the Rust engine cannot compile (lookarounds,
  backreferences, a mid-pattern ``$``), a pattern whose language llguidance cannot decide
  beside a length bound, and a ``$ref`` cycle with sibling keys become a superset the
  grammar compiles; :mod:`chatkit.grammar.value_checks` checks the removed part at the value's
  end (``jsonschema``: Python's ``re``, which reads lookarounds and backreferences as
  ECMA-262 does).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

from ..engine.coldstart import bare_import
from .regex_sets import without_lookarounds
from .schema_walk import local_ref, walk

__all__: list[str] = []

_NOTES = frozenset({"title", "description", "$comment", "examples", "default"})


# ------------------------------------------------------------------ ECMA-262 patterns
def ecma_pattern(pattern: str) -> str:
    r"""``pattern`` (ECMA-262, as JSON Schema reads it) in the Rust engine's syntax where the
    two differ in what they accept: ``\<`` and ``\>`` are literal brackets in ECMA-262 (word
    boundaries in Rust), ``[^]`` is any character."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(nxt if nxt in "<>" else ch + nxt)
            i += 2
            continue
        if pattern.startswith("[^]", i):
            out.append(r"[\s\S]")
            i += 3
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def pattern_compiles(pattern: str) -> bool:
    """Whether the Rust engine reads ``pattern`` (llguidance's regex syntax errors:
    lookarounds, backreferences, a mid-pattern ``$``). A pattern past llguidance's limits
    counts as read: the grammar refuses it by name, never a Python ``re`` check. Cached: the
    1,024 most recently asked patterns."""
    llguidance = bare_import.llguidance()
    try:  # whitespace options do not matter to one string
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps({"type": "string", "pattern": pattern}))
    except ValueError as exc:
        return not any(m in str(exc) for m in _UNREADABLE)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return not (failed and any(m in msg for msg in messages for m in _UNREADABLE))


_UNREADABLE = ("regex parse error", "lookarounds not supported")


def _usable(pattern: Any) -> str | None:
    """``pattern`` as the grammar gets it (translated), or None when it cannot compile or
    llguidance would read it wrongly (a negated class that excludes a quote or a backslash: its
    JSON string lexer lets the escaped character through)."""
    if not isinstance(pattern, str) or _negates_quote(pattern):
        return None
    translated = ecma_pattern(pattern)
    if pattern_compiles(translated):
        return translated
    plain = without_lookarounds(pattern)  # lookarounds at the value's edges: intersected
    return plain if plain is not None and pattern_compiles(plain) else None


def _negates_quote(pattern: str) -> bool:
    """Whether a negated character class of ``pattern`` holds ``"`` or a backslash (plain,
    escaped, or as a hex or unicode escape)."""
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            i += 2
            continue
        if pattern.startswith("[^", i):
            j = i + 2
            body: list[str] = []
            while j < len(pattern) and (pattern[j] != "]" or j == i + 2):
                step = 2 if pattern[j] == "\\" else 1
                body.append(pattern[j:j + step])
                j += step
            if any(part in _QUOTE_FORMS or part.lower() in _QUOTE_FORMS for part in body) \
                    or any(f in "".join(body).lower() for f in _QUOTE_CODES):
                return True
            i = j + 1
            continue
        i += 1
    return False


_QUOTE_FORMS = frozenset({'"', '\\"', "\\\\"})
_QUOTE_CODES = ("\\x22", "\\x5c", "\\u0022", "\\u005c")


# ------------------------------------------------------------------ relaxing
def _note(relaxed: dict[str, tuple[str, ...]], pointer: str, keyword: str) -> None:
    """Record that ``keyword`` was relaxed at ``pointer`` (a value check goes there)."""
    relaxed[pointer] = tuple(sorted({*relaxed.get(pointer, ()), keyword}))


def relax_patterns(doc: dict[str, Any], relaxed: dict[str, tuple[str, ...]]
                   ) -> dict[str, Any]:
    """``doc`` without the patterns the Rust engine cannot compile (in values and in
    ``patternProperties`` keys; a copy when something changes): a superset, with
    ``relaxed`` gaining each place (checked at the value's end)."""
    places: list[tuple[str, str]] = []
    for pointer, node in walk(doc, ""):
        if isinstance(node.get("pattern"), str) and _usable(node["pattern"]) is None:
            places.append((pointer, "pattern"))
        keys = node.get("patternProperties")
        if isinstance(keys, dict) and (any(_usable(k) is None for k in keys)
                                       or len({_usable(k) for k in keys}) < len(keys)):
            places.append((pointer, "patternProperties"))  # unreadable, or two read alike
    if not places:
        return doc
    out: dict[str, Any] = copy.deepcopy(doc)
    nodes = dict(walk(out, ""))
    for pointer, keyword in places:
        node = nodes[pointer]
        del node[keyword]
        if keyword == "patternProperties":  # its keys would fall to additionalProperties
            node["additionalProperties"] = True
        _note(relaxed, pointer, keyword)
    return out


_QUOTED = re.compile(r"Regex /(.*?)/\)")


def relax_named_patterns(doc: dict[str, Any], message: str,
                         relaxed: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
    """``doc`` without the patterns llguidance's ``message`` names (it cannot decide whether
    they admit any string beside a length bound), or None when it names none of ``doc``'s."""
    named = set(_QUOTED.findall(message))
    out: dict[str, Any] = copy.deepcopy(doc)
    found = False
    for pointer, node in walk(out, ""):
        pattern = node.get("pattern")
        if isinstance(pattern, str) and (pattern in named or ecma_pattern(pattern) in named
                                         or any(pattern in n for n in named)):
            del node["pattern"]
            _note(relaxed, pointer, "pattern")
            found = True
    return out if found else None


_TARGET = re.compile(r"circular references with sibling keys are not supported: \S*?#(\S*)")


def relax_cycle(doc: dict[str, Any], message: str,
                relaxed: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
    """``doc`` with the sibling keys of the ``$ref`` cycle llguidance's ``message`` names
    removed (``{"$ref": X, ...}`` becomes ``{"$ref": X}``; an ``allOf`` holding a branch that
    references it is dropped): a superset, checked at the value's end. None when the message
    names nothing in ``doc``."""
    m = _TARGET.search(message)
    if not m:
        return None
    # llguidance fails when every $ref of a cycle has siblings: the named one's first,
    # then every $ref's, then every union's beside other keys
    out = _strip_refs(doc, "#" + m.group(1), relaxed)
    if out is None:
        out = _strip_refs(doc, None, relaxed)
    return out if out is not None else _strip_unions(doc, relaxed)


def _strip_refs(doc: dict[str, Any], ref: str | None,
                relaxed: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
    """``doc`` with the sibling keys of each ``$ref`` to ``ref`` (None: every ``$ref``)
    removed, and every ``allOf`` holding such a reference beside other branches; None when
    there are none."""
    out: dict[str, Any] = copy.deepcopy(doc)
    found = False
    for pointer, node in list(walk(out, "")):
        siblings = set(node) - _KEEP
        if "$ref" in node and (ref is None or node["$ref"] == ref) and siblings:
            meaning = siblings - _NOTES
            for key in siblings:  # annotations too: llguidance counts them
                del node[key]
            target = local_ref(out, node["$ref"])
            if meaning & _OBJECT_KEYS and isinstance(target, dict):
                # the siblings' keys go through the target now: it must not be closed
                target.setdefault("additionalProperties", True)
            found = True
            if meaning:
                _note(relaxed, pointer, "$ref")
        branches = node.get("allOf")
        if isinstance(branches, list) and len(branches) > 1 and any(
                isinstance(b, dict) and "$ref" in b and ref in (None, b["$ref"])
                for b in branches):
            del node["allOf"]
            found = True
            _note(relaxed, pointer, "allOf")
    return out if found else None


def _strip_unions(doc: dict[str, Any], relaxed: dict[str, tuple[str, ...]]
                  ) -> dict[str, Any] | None:
    """``doc`` with the keys beside each ``anyOf``/``oneOf`` removed (a union beside other
    keys is an intersection too, and one of its branches may reach the cycle); None when
    there are none."""
    out: dict[str, Any] = copy.deepcopy(doc)
    found = False
    for pointer, node in walk(out, ""):
        beside = set(node) - _KEEP - _COMBINATORS - _NOTES
        if _COMBINATORS & set(node) and beside:
            for key in beside:
                del node[key]
            found = True
            _note(relaxed, pointer, "$ref")
    return out if found else None


_COMBINATORS = frozenset({"anyOf", "oneOf"})
_OBJECT_KEYS = frozenset({"properties", "required", "patternProperties",
                          "additionalProperties", "dependentRequired", "dependentSchemas"})
_KEEP = frozenset({"$ref", "$defs", "definitions", "$schema", "$id", "id", "$anchor",
                   "$dynamicAnchor"})
"""What stays beside a ``$ref`` whose siblings are removed: definitions and identity."""


# ------------------------------------------------------------------ exact rewrites
def rewrite_exact(doc: dict[str, Any]) -> None:
    """Rewrite ``doc`` in place where the grammar can say a keyword exactly (see the module
    docstring): patterns translated, key languages from ``propertyNames``, ``not`` of string
    constants as a pattern, a ``$dynamicAnchor`` also a plain anchor (as 2020-12 makes it:
    a ``$ref`` to it resolves)."""
    for _, node in list(walk(doc, "")):
        if isinstance(node.get("$dynamicAnchor"), str) and "$anchor" not in node:
            node["$anchor"] = node["$dynamicAnchor"]  # a plain-name fragment too (2020-12)
        if isinstance(node.get("pattern"), str):
            usable = _usable(node["pattern"])
            if usable is not None:
                node["pattern"] = usable
        keys = node.get("patternProperties")
        if isinstance(keys, dict) and all(_usable(k) is not None for k in keys):
            translated = {_usable(k): v for k, v in keys.items()}
            if len(translated) == len(keys):  # two keys reading alike: left as written
                node["patternProperties"] = translated
        _names_as_keys(node)
        _not_as_pattern(node)


def _names_as_keys(node: dict[str, Any]) -> None:
    """``propertyNames`` as the object's key language, where it is one regex and the object
    has no ``patternProperties`` of its own; every declared property must match it."""
    names = node.get("propertyNames")
    if not isinstance(names, dict) or "patternProperties" in node:
        return
    key = _names_regex(names)
    if key is None:
        return
    props = node.get("properties", {})
    if not isinstance(props, dict) or not all(_search(key, name) for name in props):
        return
    extra = node.get("additionalProperties", True)
    if extra is False:  # only the declared keys, and each matches: nothing left to say
        del node["propertyNames"]
    elif not props or extra in (True, {}):  # a pattern's schema would also apply to a
        del node["propertyNames"]  # declared key: exact only when it says nothing more
        node["patternProperties"] = {key: extra}
        node["additionalProperties"] = False


def _names_regex(names: dict[str, Any]) -> str | None:
    """The regex of the keys ``names`` (a ``propertyNames`` schema) admits, when it is one
    keyword the grammar can say (``pattern``, ``enum``/``const`` of strings, a length
    bound); else None."""
    rest = set(names) - _NOTES
    if names.get("type", "string") != "string":
        return None
    rest.discard("type")
    if rest == {"pattern"}:
        return _usable(names["pattern"])
    if rest == {"const"} and isinstance(names["const"], str):
        return "^" + _literal(names["const"]) + "$"
    if rest == {"enum"} and isinstance(names["enum"], list) and names["enum"] and all(
            isinstance(v, str) for v in names["enum"]):
        return "^(?:" + "|".join(_literal(v) for v in names["enum"]) + ")$"
    if rest and rest <= {"minLength", "maxLength"}:
        low, high = names.get("minLength", 0), names.get("maxLength", "")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high or 0)):
            return f"^{_ANY}{{{low},{high}}}$"
    return None


def _search(regex: str, name: str) -> bool:
    try:
        return re.search(regex, name) is not None
    except re.error:
        return False


def _not_as_pattern(node: dict[str, Any]) -> None:
    """``not: {const: s}`` / ``not: {enum: [s, ...]}`` of strings as a ``pattern`` that
    admits every string but those, where ``node`` has no pattern of its own: exact, as a
    pattern constrains strings only and ``not`` of strings admits every other value."""
    banned = node.get("not")
    if not isinstance(banned, dict) or {"pattern", "minLength", "maxLength"} & set(node):
        return  # llguidance may not decide a pattern beside a length: the check stays
    rest = set(banned) - _NOTES - {"type"}
    if banned.get("type", "string") != "string":
        return
    if rest == {"const"} and isinstance(banned["const"], str):
        words = [banned["const"]]
    elif rest == {"enum"} and isinstance(banned["enum"], list) and all(
            isinstance(v, str) for v in banned["enum"]):
        words = list(banned["enum"])
    else:
        return
    if any(c in word for word in words for c in '"\\'):
        return  # the pattern would need a negated class of them (see _usable): checked
    node["pattern"] = "^" + _except(words) + "$"
    del node["not"]


def _except(words: list[str]) -> str:
    """A regex for every string but ``words`` (a trie walked: leave it anywhere, or stop
    where no word ends)."""
    trie: dict[str, Any] = {}
    for word in words:
        at = trie
        for ch in word:
            at = at.setdefault(ch, {})
        at[""] = {}
    return _except_at(trie)


_ANY = r"[\s\S]"


def _except_at(trie: dict[str, Any]) -> str:
    chars = sorted(k for k in trie if k)
    branches = [] if "" in trie else [""]  # stop here: not a word
    if chars:
        cls = "".join(_class_char(c) for c in chars)
        branches.append(f"[^{cls}]{_ANY}*")  # leave the words here
        branches += [_literal(c) + "(?:" + _except_at(trie[c]) + ")" for c in chars]
    else:
        branches.append(f"{_ANY}+")  # past a word's end
    return "(?:" + "|".join(branches) + ")"


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in "\\]^-[" else _literal(ch) if ord(ch) < 32 else ch


_META = frozenset("\\.+*?()|[]{}^$#&-~")


def _literal(text: str) -> str:
    """``text`` as a regex that matches it literally (Rust syntax; control characters as
    hex escapes)."""
    return "".join("\\" + c if c in _META else f"\\x{{{ord(c):x}}}" if ord(c) < 32 else c
                   for c in text)
