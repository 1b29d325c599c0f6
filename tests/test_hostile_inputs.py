"""Inputs an outside fuzz broke: each ends in the README's named error and exit code, before
any model loads, never a traceback, a hang or an abort."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from chatkit import (
    Constraint,
    GrammarInvalid,
    InvalidParameter,
    SamplingParams,
    SchemaInvalid,
    SchemaReader,
    SchemaUnsupported,
    SchemaViolation,
)

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chatkit", "run", "--prompt", "x", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def nested(key: str, depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        doc = {"type": "array", "items": doc} if key == "items" else {"anyOf": [doc]}
    return doc


@pytest.mark.parametrize("key", ["items", "anyOf"])
def test_deep_schemas_are_refused_by_name_quickly(key: str) -> None:
    started = time.monotonic()
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema(nested(key, 50))
    assert info.value.keyword == "nesting"
    for depth in (500, 5000):
        with pytest.raises(SchemaUnsupported):
            Constraint.json_schema(nested(key, depth))
    assert time.monotonic() - started < 10
    Constraint.json_schema(nested(key, 12))  # real schemas nest far less than the cap


def test_ref_cycles_and_self_references() -> None:
    with pytest.raises(SchemaInvalid, match="admits no text"):
        Constraint.json_schema({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})
    cyclic: dict[str, Any] = {"type": "object", "properties": {}}
    cyclic["properties"]["self"] = cyclic  # a Python object cycle: endless nesting
    with pytest.raises((SchemaInvalid, SchemaUnsupported)):
        Constraint.json_schema(cyclic)


def test_huge_integers_are_named_errors() -> None:
    with pytest.raises(SchemaInvalid):
        Constraint.json_schema('{"const": ' + "9" * 5000 + "}")
    with pytest.raises(SchemaViolation):
        SchemaReader({"type": "integer"}).read("9" * 5000)


def test_regex_repetition_bomb_is_refused_before_the_model() -> None:
    with pytest.raises(GrammarInvalid):
        Constraint.regex("a{1000000}")
    proc = run("--regex", "a{1000000}")
    assert proc.returncode == GrammarInvalid.exit_code and "Traceback" not in proc.stderr


def test_cli_long_inline_value_and_non_utf8_file(tmp_path: Path) -> None:
    proc = run("--json-schema", "x" * 300)
    assert proc.returncode == SchemaInvalid.exit_code, proc.stderr
    bad = tmp_path / "schema.json"
    bad.write_bytes(b'{"type": "\xff\xfe"}')
    proc = run("--json-schema", f"@{bad}")
    assert proc.returncode == SchemaInvalid.exit_code, proc.stderr
    proc = run("--lark", f"@{bad}")
    assert proc.returncode == GrammarInvalid.exit_code, proc.stderr
    proc = run("--json-schema", json.dumps(nested("items", 50)))
    assert proc.returncode == SchemaUnsupported.exit_code, proc.stderr
    for p in (proc,):
        assert "Traceback" not in p.stderr


@pytest.mark.parametrize("kw", [{"temperature": 1e39}, {"temperature": float("nan")},
                                {"temperature": "hot"}, {"seed": -1}, {"seed": 1.5},
                                {"top_k": 2.5}])
def test_sampling_values_outside_their_range(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidParameter):
        SamplingParams(**kw)


@pytest.mark.parametrize(("schema", "keyword"), [
    ({"$ref": "https://example.com/remote.json"}, "$ref"),
])
def test_valid_but_unenforceable_schemas_name_their_keyword(schema: dict[str, Any],
                                                            keyword: str) -> None:
    """Valid JSON Schema that llguidance cannot enforce is SchemaUnsupported (exit 11) with
    the keyword and its path, not SchemaInvalid ("not a JSON Schema")."""
    with pytest.raises(SchemaUnsupported) as info:
        Constraint.json_schema(schema)
    assert info.value.keyword == keyword and info.value.path == f"/{keyword}"


def test_data_under_unknown_keywords_is_not_read_as_bounds() -> None:
    """Found by bench/fuzz.py: a dict under an unknown keyword whose "type" is not a string
    (or whose minimum is not a number) crashed the number-digit bound with a TypeError."""
    for schema in ({"type": "object", "x-meta": {"type": {"a": 1}}},
                   {"type": "object", "x-meta": {"type": "number", "minimum": "5"}}):
        Constraint.json_schema(schema)
