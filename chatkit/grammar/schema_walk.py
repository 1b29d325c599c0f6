"""Walking a JSON Schema document: its subschemas with their JSON pointers.

Shared by the schema modules (intake, the meta-schema check, number bounds): which
keywords hold subschemas and which hold data, pointers escaped as RFC 6901 says, and the
nesting limits a document is held to before anything compiles it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__: list[str] = []

# Children of these keywords are maps from names to subschemas.
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                         "dependentSchemas"})
# Children of these keywords are lists of subschemas.
SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
# Values of these keywords are data or names, never schemas.
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "required",
                           "dependentRequired", "x-guidance"})

MAX_DEPTH = 32
"""Deepest nesting of subschemas accepted (``properties``, ``items``, ``anyOf`` ... each add a
level): deeper ones are refused by name before compiling, where llguidance's compile time
grows steeply with depth."""
MAX_DOCUMENT_DEPTH = 500
"""Deepest JSON document accepted at all (data inside ``enum``/``const`` included)."""


def is_number(value: Any) -> bool:
    """A JSON number: an int or a float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def subschemas(doc: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON pointer, subschema) for every subschema of ``doc``, depth first; data keywords
    (``enum``, ``const``, ``default``, ``examples``) are not walked, and a property named
    like a keyword is a name, not the keyword."""
    return walk(doc, "")


def walk(node: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (pointer, subschema) for every schema object under ``node`` (``path``: its own
    pointer), depth first, in document order."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key, value in node.items():
        here = f"{path}/{escape(key)}"
        if key in DATA_KEYWORDS:
            continue
        if key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from walk(sub, f"{here}/{escape(name)}")
        elif key in SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from walk(sub, f"{here}/{i}")
        elif isinstance(value, dict):
            yield from walk(value, here)
        elif key == "items" and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from walk(sub, f"{here}/{i}")


def find(schema: Any, pred: Callable[[dict[str, Any]], bool]) -> str | None:
    """JSON pointer of the first subschema for which ``pred`` holds, or None."""
    for path, node in walk(schema, ""):
        if pred(node):
            return path
    return None


def keyword_path(schema: Any, keyword: str) -> str | None:
    """JSON pointer of the first schema object using ``keyword``, or None."""
    found = find(schema, lambda node: keyword in node)
    return None if found is None else f"{found}/{escape(keyword)}"


def local_ref(doc: Any, ref: Any) -> dict[str, Any] | None:
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


APPLICATORS = ("allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas",
               "dependencies")
"""Keywords whose subschemas apply to the same instance as the schema that holds them
(``dependencies`` in its schema form): an object's keys may be declared there too."""


def beside(node: dict[str, Any]) -> list[Any]:
    """The subschemas ``node``'s applicators (:data:`APPLICATORS`) apply to its own instance."""
    out: list[Any] = []
    for key in APPLICATORS:
        value = node.get(key)
        if isinstance(value, list) and key in SCHEMA_LISTS:
            out += value
        elif isinstance(value, dict) and key in ("dependentSchemas", "dependencies"):
            out += [v for v in value.values() if isinstance(v, dict)]
        elif isinstance(value, dict):
            out.append(value)
    return out


def declared_names(doc: Any, node: dict[str, Any]) -> list[str]:
    """The object keys ``node``'s ``dependentRequired`` and the subschemas beside it declare
    (``properties``, ``required``, ``dependentRequired`` and ``dependencies`` names, through
    nested applicators and local ``$ref``s), in document order: the keys an instance of
    ``node`` may need although ``node``'s ``properties`` do not list them."""
    names: dict[str, None] = {}
    seen: set[int] = set()
    todo: list[Any] = [{"dependentRequired": node.get("dependentRequired"),
                        "dependencies": node.get("dependencies")}, *beside(node)]
    for sub in todo:  # grows while it is read: breadth first
        if not isinstance(sub, dict) or id(sub) in seen:
            continue
        seen.add(id(sub))
        if isinstance(sub.get("properties"), dict):
            names.update(dict.fromkeys(sub["properties"]))
        if isinstance(sub.get("required"), list):
            names.update(dict.fromkeys(n for n in sub["required"] if isinstance(n, str)))
        for key in ("dependentRequired", "dependencies"):
            if isinstance(sub.get(key), dict):
                names.update(dict.fromkeys(sub[key]))
                names.update(dict.fromkeys(n for v in sub[key].values() if isinstance(v, list)
                                           for n in v if isinstance(n, str)))
        todo += beside(sub)
        target = local_ref(doc, sub.get("$ref"))
        if target is not None:
            todo.append(target)
    return list(names)


def escape(token: str) -> str:
    """One JSON pointer token, escaped (``~`` as ``~0``, ``/`` as ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(parts: Any) -> str:
    """The JSON pointer of a path of keys and indexes (``""``: the root)."""
    return "".join(f"/{escape(str(p))}" for p in parts)


def schema_depth(doc: Any) -> int:
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
            if key in DATA_KEYWORDS:
                stack.append((value, None, doc_level + 1))
            elif key in SCHEMA_MAPS and isinstance(value, dict):
                stack += [(v, level + 1, doc_level + 2) for v in value.values()]
            else:
                stack.append((value, level + 1, doc_level + 1))
    return deepest
