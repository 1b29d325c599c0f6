"""The second reader: a reply's final text checked against its schema, without the grammar.

Independent of the grammar mask: ``jsonschema`` checks the schema as written (not the
closed, number-bounded copy the grammar was compiled from), and Pydantic validates the
text when the schema came from a model class.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic is imported by whoever passes a Pydantic class (cold start)
    from pydantic import BaseModel

from ..errors import SchemaViolation
from ..messages import JSON, JSONObject
from .meta_schema import load_jsonschema
from .schema_walk import pointer

__all__ = ["SchemaReader"]


class SchemaReader:
    """The second reader: checks a final text against the schema without the grammar.

    ``read(text)`` returns the parsed value (a Pydantic instance when a model
    class was given, else the decoded JSON) or raises ``SchemaViolation``.
    Thread-safe; the jsonschema validator is built on first use.
    """

    def __init__(self, schema: JSONObject | bool, model_cls: type[BaseModel] | None = None):
        self.schema = schema
        self.model_cls = model_cls
        self._validator: Any = None  # built on first use (most constraints are compiled once
        # per process and read many times, some never read)

    def read(self, text: str) -> JSON:
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # incl. integers past Python's digit limit
            raise SchemaViolation(text, [f"not valid JSON: {exc}"]) from None
        errors = [
            f"{pointer(e.absolute_path) or '/'}: {e.message}"
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
            js = load_jsonschema()
            cls = js.validators.validator_for(self.schema, default=js.Draft202012Validator)
            validator = self._validator = cls(self.schema, format_checker=cls.FORMAT_CHECKER)
        return validator
