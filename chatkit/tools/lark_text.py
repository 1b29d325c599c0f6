"""Literal text and string schemas as Lark, shared by the tool-grammar builders: markers
as a vocabulary spells them, text as a Lark string or a literal regex, string schemas' regexes."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from ..engine.coldstart import bare_import
from ..engine.protocols import Vocabulary
from ..grammar.regex_sets import without_lookarounds

__all__: list[str] = []

RAW_STRING_MAX = 8192
"""Characters an XML dialect's raw string value may hold when its schema sets no
``maxLength`` (the value's only end is its close marker, which a model may never write)."""


def text_markup(text: str) -> str:
    """Literal text as a Lark string (no token ids)."""
    return json.dumps(text, ensure_ascii=False) if text else ""


Markup = Callable[[str], str]
"""Renders literal text as a Lark fragment."""
_REGEX_META = set("\\.+*?()|[]{}^$/-&~#")


def markup_for(engine: Vocabulary) -> Markup:
    """Literal text as Lark for ``engine``'s vocabulary: each special-token text in it that
    is one token becomes ``<[id]>`` (a control token cannot be matched as text), the rest
    quoted text. Cached per engine."""
    return engine.cache(("tool_markup",), lambda: _markup(engine))


def _markup(engine: Vocabulary) -> Markup:
    specials = sorted(engine.special_texts(), key=len, reverse=True)
    cache: dict[str, str] = {}

    def single(text: str) -> int | None:
        ids = engine.tokenize(text, special=True)
        return ids[0] if len(ids) == 1 else None

    def render(text: str) -> str:
        if text in cache:
            return cache[text]
        parts: list[str] = []
        plain = ""
        i = 0
        while i < len(text):
            hit = next((s for s in specials if text.startswith(s, i)), None)
            tok = single(hit) if hit else None
            if hit is None or tok is None:
                plain += text[i]
                i += 1
                continue
            if plain:
                parts.append(text_markup(plain))
                plain = ""
            parts.append(f"<[{tok}]>")
            i += len(hit)
        if plain:
            parts.append(text_markup(plain))
        cache[text] = " ".join(parts)
        return cache[text]

    return render


def regex_text(text: str) -> str:
    """``text`` as a regex matching it literally (Rust regex: only meta characters are
    escaped; an escaped ``<`` would be a word boundary)."""
    return "".join("\\" + c if c in _REGEX_META else "\\n" if c == "\n" else c
                   for c in text)


def resolves_to_string(schema: Any) -> bool:
    """Whether every value ``schema`` admits is a string (so XML writes it raw)."""
    if not isinstance(schema, dict):
        return False
    kind = schema.get("type")
    if kind == "string" or kind == ["string"]:
        return True
    values = string_values(schema)
    return values is not None


def string_values(schema: dict[str, Any]) -> list[str] | None:
    """The strings an ``enum`` / ``const`` schema allows (None: not only strings)."""
    values = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if not values or not all(isinstance(v, str) for v in values):
        return None
    return list(values)


_MONTH_DAY = (r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = rf"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
         r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": rf"(?:{_OCTET}\.){{3}}{_OCTET}",
}
"""A raw string's ``format`` as a regex, exactly the RFC 3339 / RFC 4122 / dotted-quad
syntax (a date's day within its month, February 29th in leap years only). Other formats
are checked by the tool's validator alone."""


def string_regexes(schema: dict[str, Any]) -> list[str]:
    """What a raw string's ``pattern`` and ``format`` add to its grammar: regexes in Lark's
    syntax, each matched by the whole value (a pattern anchored, as llguidance anchors one
    in JSON). A pattern with lookarounds is said without them where
    :func:`~chatkit.grammar.regex_sets.without_lookarounds` can; one the grammar's regex
    engine still cannot compile, and a format not in :data:`FORMATS`, is left to the tool's
    validator (which checks every value after parsing)."""
    out = []
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        for candidate in (pattern, without_lookarounds(pattern)):
            lark = None if candidate is None else candidate.replace("/", "\\/")
            if lark is not None and _compiles(lark):
                out.append(lark)
                break
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt in FORMATS:
        out.append(FORMATS[fmt])
    return out


@functools.lru_cache(maxsize=256)
def _compiles(regex: str) -> bool:
    """Whether llguidance compiles ``regex`` as a Lark terminal."""
    matcher = bare_import.llguidance().LLMatcher
    return not matcher.validate_grammar(matcher.grammar_from_lark(f"start: V\nV: /{regex}/\n"))


def string_also(schema: dict[str, Any]) -> str:
    """A raw string's pattern and format as Lark intersections (``" & /re/"``), or ""."""
    return "".join(f" & /{r}/" for r in string_regexes(schema))
