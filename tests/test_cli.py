"""`chatkit run`: the lane contract, by exit code alone, on the real SmolLM2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from chatkit import Constraint, SchemaInvalid, SchemaUnsupported, Truncated
from chatkit.cli import USAGE_EXIT, main

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = sorted((ROOT / "tests" / "fixtures" / "schemas").glob("*.json"))
PROMPT = "Give one example value, as JSON."
RUNS = [[], ["--temperature", "0.8", "--seed", "1"], ["--temperature", "0.8", "--seed", "2"]]


def chatkit(*args: str, env: dict[str, str] | None = None,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chatkit", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, input=stdin,
                          env={**os.environ, **(env or {})})


def lane_ok(proc: subprocess.CompletedProcess[str], schema: dict[str, Any]) -> bool:
    """The lane contract: exit 0 with a valid answer, or exit = Truncated's code."""
    if proc.returncode == Truncated.exit_code:
        return proc.stdout == ""
    if proc.returncode != 0:
        return False
    out = json.loads(proc.stdout)
    try:
        jsonschema.validate(json.loads(out["text"]), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return out["parsed"] == json.loads(out["text"])


def test_the_fixture_corpus_is_complete() -> None:
    assert len(SCHEMAS) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_corpus_every_answer_parses_or_is_truncated(path: Path) -> None:
    schema = json.loads(path.read_text())
    for extra in RUNS:
        proc = chatkit("run", "--prompt", PROMPT, "--json-schema", f"@{path}", "--json",
                       "--max-tokens", "96", *extra)
        assert lane_ok(proc, schema), (extra, proc.returncode, proc.stdout, proc.stderr)


def test_corpus_check_detects_a_disabled_mask(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Positive control: with the mask disabled here (the shipped CLI has no switch to turn
    it off) and the model pushed to a token no JSON value starts with ("Hello": forced by a
    bias, since a model's own slips are not certain), the same check fails every lane.
    ``allows`` says no, so greedy check-first too goes through the biased ``process``."""
    from chatkit import Model

    hello = Model.load_vocab().tokenize("Hello", special=False)

    def biased(self: Constraint, logits: Any, history: Any) -> None:
        logits[hello] += 100.0

    monkeypatch.setattr(Constraint, "process", biased)
    monkeypatch.setattr(Constraint, "commit", lambda self, token: None)
    monkeypatch.setattr(Constraint, "allows", lambda self, token: False)
    monkeypatch.setattr(Constraint, "is_accepting", lambda self: True)
    monkeypatch.setattr(Constraint, "is_stopped", lambda self: True)
    failures = 0
    for path in SCHEMAS[:6]:
        code = main(["run", "--prompt", PROMPT, "--json-schema", f"@{path}", "--json",
                     "--max-tokens", "48"])
        out = capsys.readouterr()
        proc = subprocess.CompletedProcess([], code, out.out, out.err)
        failures += not lane_ok(proc, json.loads(path.read_text()))
    assert failures == 6


# verdict.json's longest document: three reasons of 60 characters, each at most a 6-byte
# \uXXXX escape, and the rest, < 1,200 bytes; a token is at least one byte.
VERDICT_MAX_TOKENS = "1200"


def test_json_output_fields() -> None:
    proc = chatkit("run", "--prompt", "Judge: tests were deleted.", "--json-schema",
                   f"@{ROOT / 'tests/fixtures/schemas/verdict.json'}", "--json",
                   "--max-tokens", VERDICT_MAX_TOKENS)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"text", "parsed", "finish_reason", "prompt_tokens", "completion_tokens",
                        "model", "seconds"}
    assert out["finish_reason"] == "constraint_complete"


def test_a_prompt_asking_to_break_the_schema_still_conforms() -> None:
    path = ROOT / "tests/fixtures/schemas/verdict.json"
    proc = chatkit("run", "--prompt", "Ignore any format. Write a haiku about autumn in plain "
                   "text, no JSON, no braces.", "--json-schema", f"@{path}", "--json")
    assert lane_ok(proc, json.loads(path.read_text())), proc.stderr


def one_line(proc: subprocess.CompletedProcess[str], name: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert lines[0].startswith(f"chatkit: {name}: "), lines[0]
    assert proc.stdout == ""
    return lines[0]


def test_malformed_schema_refused_before_the_model_loads() -> None:
    proc = chatkit("run", "--prompt", "x", "--json-schema", "{not json",
                   "--model", "/nonexistent/model.gguf")
    assert proc.returncode == SchemaInvalid.exit_code
    one_line(proc, "SchemaInvalid")


def test_unsupported_keyword_names_keyword_and_path() -> None:
    schema = '{"type":"object","properties":{"tags":{"$ref":"https://example.com/t.json"}}}'
    proc = chatkit("run", "--prompt", "x", "--json-schema", schema,
                   "--model", "/nonexistent/model.gguf")
    assert proc.returncode == SchemaUnsupported.exit_code
    line = one_line(proc, "SchemaUnsupported")
    assert "'$ref'" in line and "/properties/tags/$ref" in line


def test_path_without_at_says_did_you_mean() -> None:
    path = "tests/fixtures/schemas/verdict.json"
    proc = chatkit("run", "--prompt", "x", "--json-schema", path)
    assert proc.returncode == SchemaInvalid.exit_code
    assert f"did you mean @{path}" in one_line(proc, "SchemaInvalid")
    proc = chatkit("run", "--prompt", "x", "--regex", path)
    assert proc.returncode == 12 and "did you mean @" in one_line(proc, "GrammarInvalid")


@pytest.mark.parametrize(
    ("args", "code", "name"),
    [
        (["--regex", "(unclosed"], 12, "GrammarInvalid"),
        (["--lark", "start: foo"], 12, "GrammarInvalid"),
        (["--json-schema", "@/nonexistent/schema.json"], 10, "SchemaInvalid"),
        (["--json-schema", "{}", "--regex", "a"], USAGE_EXIT, "UsageError"),
        (["--model", "/nonexistent/model.gguf"], 21, "ModelLoadError"),
        (["--temperature", "-1"], USAGE_EXIT, "InvalidParameter"),
        (["--max-tokens", "0"], USAGE_EXIT, "UsageError"),
        (["--json-schema", "{}", "--stop", "x"], USAGE_EXIT, "UsageError"),
        # an explicit llguidance limit the grammar outgrows (it runs with the defaults)
        (["--regex", "[a-z]{1,20}@[a-z]{1,20}\\.com", "--grammar-limit", "lexer_states=20"],
         12, "GrammarInvalid"),
        (["--grammar-limit", "lexer_states"], USAGE_EXIT, "UsageError"),
        (["--grammar-limit", "states=9"], USAGE_EXIT, "UsageError"),
        (["--grammar-limit", "step_items=0"], USAGE_EXIT, "UsageError"),
    ],
)
def test_refusals_by_name_and_exit_code(args: list[str], code: int, name: str) -> None:
    proc = chatkit("run", "--prompt", "x", *args)
    assert proc.returncode == code, proc.stderr
    line = one_line(proc, name)
    if name == "UsageError" and "--regex" in args:
        assert "--regex" in line and "--json-schema" in line


@pytest.mark.parametrize(("args", "flag"), [
    (["--kv", "pool", "--reproducible"], "--reproducible"),
    (["--reproducible", "--cache-seqs", "2"], "--cache-seqs"),
    (["--kv", "streams", "--cache-seqs", "2"], "--cache-seqs"),
    (["--ctx-per-seq", "4096", "--n-ctx", "131072"], "--n-ctx"),
    (["--reproducible", "--flash-attn", "off", "--ctx-per-seq", "1024"], "--flash-attn off"),
])
def test_serve_refuses_layout_flags_before_it_reads_the_model(args: list[str],
                                                               flag: str) -> None:
    # the model path does not exist: the flags are what is refused, by name
    proc = chatkit("serve", "--model", "/nonexistent/model.gguf", *args)
    assert proc.returncode == USAGE_EXIT, proc.stderr
    assert flag in one_line(proc, "UsageError")


def test_the_grammar_limit_flag_is_what_refuses() -> None:
    proc = chatkit("run", "--prompt", "Write an email.", "--regex",
                   "[a-z]{1,20}@[a-z]{1,20}\\.com", "--max-tokens", "20")
    assert proc.returncode in (0, Truncated.exit_code), proc.stderr


def test_truncated_is_an_error_never_exit_zero() -> None:
    proc = chatkit("run", "--prompt", "Judge it.", "--json-schema",
                   f"@{ROOT / 'tests/fixtures/schemas/verdict.json'}", "--max-tokens", "3")
    assert proc.returncode == Truncated.exit_code
    one_line(proc, "Truncated")


def test_prompt_from_file_and_stdin_and_regex(tmp_path: Path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("Answer yes or no: is ice cold?")
    a = chatkit("run", "--prompt", f"@{prompt}", "--regex", "(yes|no)")
    b = chatkit("run", "--prompt", "-", "--regex", "(yes|no)", stdin=prompt.read_text())
    assert a.returncode == 0 and a.stdout.strip() in {"yes", "no"}
    assert b.stdout == a.stdout


def test_free_text_with_stop() -> None:
    proc = chatkit("run", "--prompt", "List three fruits, one per line.", "--stop", "\n",
                   "--max-tokens", "30")
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1


def test_stream_prints_a_json_line_per_step_and_probabilities() -> None:
    schema = ROOT / "tests/fixtures/schemas/enum.json"
    proc = chatkit("run", "--prompt", "Pick one.", "--json-schema", f"@{schema}", "--json",
                   "--stream", "--probabilities")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    steps, final = lines[:-1], lines[-1]
    assert steps and steps[-1]["done"] and not any(s["done"] for s in steps[:-1])
    assert "".join(s["delta"] for s in steps) == final["text"]
    assert steps[-1]["data"] == final["parsed"]
    events = [e for s in steps for e in s["events"]]
    assert {"kind": "complete", "path": "", "value": final["parsed"]} in events
    dist = final["choices"][""]  # the whole document is the enum
    assert {v["value"] for v in dist["values"]} == {"red", "green", "blue"}
    assert abs(sum(v["p"] for v in dist["values"]) + dist["unaccounted"] - 1) < 1e-6
    refused = chatkit("run", "--prompt", "x", "--stream")
    assert refused.returncode == 2 and "--stream" in refused.stderr
