"""BFCL v4 (simple_python, multiple) through chatkit tools on SmolLM2, side by side.

    python3 dev.py bench bfcl [--limit N]

Each case's functions become tools (BFCL's ``dict``/``float``/``tuple``/``any``
mapped to JSON Schema), the question is the user turn, and the model answers
with ``tool_choice="required"`` and one call. The unconstrained baseline runs
the same prompt (same Hermes template and tools block) without the grammar and
parses its text the same way. Reported per mode: parse rate, valid function
name rate, argument-schema validity, and AST accuracy against possible_answer.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import date
from pathlib import Path
from typing import Any

import jsonschema

from chatkit import ChatkitError, Conversation, Model, Tool

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "bench" / "corpora" / "bfcl"
CATEGORIES = ["simple_python", "multiple"]
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


def to_json_schema(node: Any) -> Any:
    """BFCL parameter schemas to JSON Schema (dict->object, float->number, tuple->array)."""
    if isinstance(node, list):
        return [to_json_schema(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str) and value in _TYPES:
            if _TYPES[value] is not None:
                out[key] = _TYPES[value]
            continue
        if key in ("properties",) and isinstance(value, dict):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        elif key in ("optional",):  # BFCL annotation, not JSON Schema
            continue
        else:
            out[key] = to_json_schema(value)
    return out


def load(category: str, limit: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    cases = [json.loads(x) for x in (CORPUS / f"BFCL_v4_{category}.json").read_text()
             .splitlines() if x.strip()]
    answers = {a["id"]: a for a in (json.loads(x) for x in (
        CORPUS / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines()
        if x.strip())}
    return [(c, answers[c["id"]]) for c in cases[:limit]]


def make_tools(case: dict[str, Any]) -> list[Tool]:
    tools = []
    for fn in case["function"]:
        params = to_json_schema(fn["parameters"])
        params.setdefault("type", "object")
        tools.append(Tool.from_schema(fn["name"], params, fn.get("description", "")))
    return tools


_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_free(text: str) -> dict[str, Any] | None:
    """The unconstrained baseline's parser: the first <tool_call> JSON, else bare JSON."""
    m = _CALL.search(text)
    raw = m.group(1) if m else text.strip()
    try:
        body = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def ast_match(name: str, args: dict[str, Any], truth: dict[str, Any]) -> bool:
    """BFCL's AST check, simplified: right function, every given argument among the allowed
    values, every argument without "" among its options present."""
    if name not in truth:
        return False
    allowed = truth[name]
    for key, value in args.items():
        if key not in allowed:
            return False
        options = allowed[key]
        if value not in options and not (isinstance(value, int | float) and any(
                isinstance(o, int | float) and float(o) == float(value) for o in options)):
            return False
    return all(key in args or "" in options for key, options in allowed.items())


def evaluate(model: Model, case: dict[str, Any], answer: dict[str, Any],
             constrained: bool) -> dict[str, bool]:
    tools = make_tools(case)
    by_name = {t.name: t for t in tools}
    question = case["question"][0][-1]["content"]
    conv = Conversation(model, max_tokens=256)
    result = {"parsed": False, "name": False, "schema": False, "ast": False}
    try:
        if constrained:
            reply = conv.send(question, tools=tools, tool_choice="required",
                              parallel_tool_calls=False)
            body: dict[str, Any] | None = ({"name": reply.tool_calls[0].name,
                                            "arguments": reply.tool_calls[0].arguments}
                                           if reply.tool_calls else None)
        else:
            reply = conv.send(question, tools=tools, tool_choice="none")
            body = parse_free(reply.text)
    except ChatkitError:
        return result
    if body is None:
        return result
    result["parsed"] = True
    name, args = body.get("name"), body.get("arguments")
    if name not in by_name or not isinstance(args, dict):
        return result
    result["name"] = True
    try:
        jsonschema.validate(args, by_name[name].definition.parameters_schema)
        result["schema"] = True
    except jsonschema.ValidationError:
        pass
    truth = answer["ground_truth"][0]
    result["ast"] = ast_match(name, args, truth)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--limit", type=int, default=40, help="cases per category")
    args = ap.parse_args()
    model = Model.load(n_ctx=4096, n_seq_max=2)
    rows = []
    for category in CATEGORIES:
        cases = load(category, args.limit)
        for constrained in (True, False):
            t0 = time.perf_counter()
            scores = [evaluate(model, c, a, constrained) for c, a in cases]
            n = len(scores)
            rate = {k: sum(s[k] for s in scores) / n for k in ("parsed", "name", "schema", "ast")}
            rows.append((category, "chatkit (grammar)" if constrained else
                         "same model, unconstrained", n, rate, time.perf_counter() - t0))
    print(f"{date.today()}, SmolLM2-135M-Instruct Q4_1, greedy, first {args.limit} cases "
          "per category; corpora from bench/corpora")
    print("| category | mode | cases | parse rate | valid name | argument schema valid "
          "| AST accuracy | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for category, mode, n, rate, secs in rows:
        print(f"| {category} | {mode} | {n} | {rate['parsed']:.0%} | {rate['name']:.0%} "
              f"| {rate['schema']:.0%} | {rate['ast']:.0%} | {secs:.0f} |")


if __name__ == "__main__":
    main()
