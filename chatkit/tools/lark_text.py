"""Literal text and string schemas as Lark, shared by the tool-grammar builders."""

from __future__ import annotations

import json
from typing import Any

__all__: list[str] = []

RAW_STRING_MAX = 8192
"""Characters an XML dialect's raw string value may hold when its schema sets no
``maxLength`` (the value's only end is its close marker, which a model may never write)."""


def text_markup(text: str) -> str:
    """Literal text as a Lark string (no token ids)."""
    return json.dumps(text, ensure_ascii=False) if text else ""


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
