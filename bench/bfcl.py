"""BFCL v4 through chatkit's tools on SmolLM2, with llama-cpp-python's tool calling beside it.

    python3 dev.py bench bfcl [--limit N] [--categories a,b] [--modes a,b]

Each case's functions become tools (BFCL's ``dict``/``float``/``tuple``/``any`` mapped to JSON
Schema; dots in names become ``_``, as BFCL does for OpenAI-style APIs), the case's messages
are the conversation, greedy, ``max_tokens=256``. Modes:

- ``chatkit-auto``: ``tool_choice="auto"`` (chatkit's default), parallel calls allowed;
  SmolLM2 has no tool template, so the call is decided at the first token by the default
  ``tool_call_threshold``;
- ``chatkit-auto-sampled``: the same with ``tool_call_threshold=None``: the first token
  sampled as-is under the auto grammar (chatkit's ``auto`` before the threshold);
- ``chatkit-required``: ``tool_choice="required"``, parallel calls allowed;
- ``llama-cpp-python``: ``Llama(chat_format="chatml-function-calling")``,
  ``create_chat_completion(tools=..., tool_choice="auto", temperature=0)``, its other
  sampling defaults (the peer's own auto mode);
- ``unconstrained``: chatkit's prompt (Hermes tools block) without the grammar, the text's
  ``<tool_call>`` blocks parsed (``tool_choice="none"``).

Scored per case: ``called`` (at least one call), ``valid`` (every call names a real tool with
arguments valid against its schema), ``AST`` (BFCL's AST check, simplified: the calls match
the possible answers one to one, in any order; for ``irrelevance``, right means no call).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import jsonschema
import llama_cpp

from chatkit import ChatkitError, ChatTemplate, Conversation, Model, Tool
from chatkit.engine.compute import run_on_compute
from chatkit.engine.model import default_model_path, default_threads

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "bench" / "corpora" / "bfcl"
CATEGORIES = ["simple_python", "multiple", "live_simple", "live_multiple", "parallel",
              "parallel_multiple", "irrelevance"]
MODES = ["chatkit-auto", "chatkit-auto-sampled", "chatkit-required", "llama-cpp-python"]
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
Call = tuple[str, Any]  # (name, arguments)


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


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def load(category: str, limit: int) -> list[tuple[dict[str, Any], list[dict[str, Any]] | None]]:
    """The first ``limit`` cases with their ground truth (None: irrelevance, no call is right)."""
    cases = _lines(CORPUS / f"BFCL_v4_{category}.json")[:limit]
    answer_file = CORPUS / "possible_answer" / f"BFCL_v4_{category}.json"
    if not answer_file.exists():
        return [(c, None) for c in cases]
    answers = {a["id"]: a["ground_truth"] for a in _lines(answer_file)}
    return [(c, answers[c["id"]]) for c in cases]


def tool_name(name: str) -> str:
    return name.replace(".", "_")


def functions(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The case's functions as OpenAI function definitions (JSON Schema parameters)."""
    out = []
    for fn in case["function"]:
        params = to_json_schema(fn["parameters"])
        params.setdefault("type", "object")
        out.append({"name": tool_name(fn["name"]), "description": fn.get("description", ""),
                    "parameters": params})
    return out


def _equal(value: Any, option: Any) -> bool:
    if isinstance(value, bool) or isinstance(option, bool):
        return value is option if isinstance(value, bool) and isinstance(option, bool) else False
    if isinstance(value, int | float) and isinstance(option, int | float):
        return float(value) == float(option)
    if isinstance(value, str) and isinstance(option, str):
        return value.strip().lower() == option.strip().lower()
    if isinstance(value, list) and isinstance(option, list):
        return len(value) == len(option) and all(_equal(v, o) for v, o in zip(value, option,
                                                                                   strict=True))
    if isinstance(value, dict) and isinstance(option, dict):
        return value.keys() == option.keys() and all(_equal(value[k], option[k]) for k in value)
    return bool(value == option)


def call_matches(call: Call, truth: dict[str, Any]) -> bool:
    """BFCL's AST check for one call, simplified: the right function, every argument given
    among its possible values, every argument without "" among its options present."""
    name, args = call
    ((fname, allowed),) = truth.items()
    if name != tool_name(fname) or not isinstance(args, dict):
        return False
    for key, value in args.items():
        if key not in allowed or not any(_equal(value, o) for o in allowed[key]):
            return False
    return all(key in args or "" in options for key, options in allowed.items())


def ast_right(calls: list[Call], truth: list[dict[str, Any]] | None) -> bool:
    """The calls match the ground truth one to one, in any order (irrelevance: no call)."""
    if truth is None:
        return not calls
    if len(calls) != len(truth):
        return False
    left = list(truth)
    for call in calls:
        hit = next((t for t in left if call_matches(call, t)), None)
        if hit is None:
            return False
        left.remove(hit)
    return True


_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def parse_free(text: str) -> list[Call]:
    """The unconstrained baseline's parser: every <tool_call> JSON body."""
    calls = []
    for m in _CALL.finditer(text):
        try:
            body = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if isinstance(body, dict):
            calls.append((str(body.get("name")), body.get("arguments")))
    return calls


def run_chatkit(model: Model, case: dict[str, Any], mode: str,
                template: ChatTemplate | None = None) -> list[Call] | None:
    """The calls chatkit's reply made (None: a named error ended the reply)."""
    fns = functions(case)
    tools = [Tool.from_schema(f["name"], f["parameters"], f["description"]) for f in fns]
    *history, last = case["question"][0]
    conv = Conversation(model, messages=history, max_tokens=256, template=template)
    try:
        if mode == "unconstrained":
            return parse_free(conv.send(last["content"], tools=tools, tool_choice="none").text)
        if mode == "chatkit-required":
            reply = conv.send(last["content"], tools=tools, tool_choice="required")
        elif mode == "chatkit-auto-sampled":
            reply = conv.send(last["content"], tools=tools, tool_call_threshold=None)
        else:
            reply = conv.send(last["content"], tools=tools)
    except ChatkitError:
        return None
    return [(c.name, c.arguments) for c in reply.tool_calls]


def run_peer(llm: llama_cpp.Llama, case: dict[str, Any]) -> list[Call] | None:
    tools = [{"type": "function", "function": f} for f in functions(case)]
    out: Any = llm.create_chat_completion(messages=case["question"][0], tools=tools,
                                          tool_choice="auto", temperature=0.0, max_tokens=256)
    message = out["choices"][0]["message"]
    calls = []
    for c in message.get("tool_calls") or []:
        try:
            args = json.loads(c["function"]["arguments"])
        except json.JSONDecodeError:
            args = None
        calls.append((c["function"]["name"], args))
    return calls


def score(case: dict[str, Any], calls: list[Call] | None,
          truth: list[dict[str, Any]] | None) -> dict[str, bool]:
    schemas = {f["name"]: f["parameters"] for f in functions(case)}
    calls = calls or []

    def valid(call: Call) -> bool:
        name, args = call
        if name not in schemas or not isinstance(args, dict):
            return False
        try:
            jsonschema.validate(args, schemas[name])
        except jsonschema.ValidationError:
            return False
        return True

    return {"called": bool(calls), "valid": bool(calls) and all(valid(c) for c in calls),
            "ast": ast_right(calls, truth)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--limit", type=int, default=25, help="cases per category")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, of {', '.join([*MODES, 'unconstrained'])}")
    ap.add_argument("--dialects", default=None,
                    help="comma-separated dialects (or 'all'): each through a family template "
                         "that writes it (tests/corpora), chatkit modes only")
    ap.add_argument("--model", choices=("smol", "gemma"), default="smol")
    args = ap.parse_args()
    if args.dialects:
        return by_dialect(args)
    modes = args.modes.split(",")
    threads = default_threads()
    model = Model.load(n_ctx=4096, n_seq_max=2, n_threads=threads)
    llm = None
    if "llama-cpp-python" in modes:
        with contextlib.redirect_stderr(io.StringIO()):
            llm = llama_cpp.Llama(str(default_model_path()), n_ctx=4096, n_threads=threads,
                                  n_threads_batch=threads, verbose=False,
                                  chat_format="chatml-function-calling")
    runners: dict[str, Callable[[dict[str, Any]], list[Call] | None]] = {
        m: (lambda c, m=m: run_chatkit(model, c, m)) for m in modes if m != "llama-cpp-python"}
    if llm is not None:
        runners["llama-cpp-python"] = lambda c: run_on_compute(run_peer, llm, c)
    rows = []
    for category in args.categories.split(","):
        cases = load(category, args.limit)
        for mode in modes:
            if mode == "chatkit-required" and cases and cases[0][1] is None:
                continue  # irrelevance: a required call is wrong by construction
            t0 = time.perf_counter()
            scores = [score(c, runners[mode](c), truth) for c, truth in cases]
            n = len(scores)
            rows.append((category, mode, n, {k: sum(s[k] for s in scores) for k in
                                             ("called", "valid", "ast")},
                         time.perf_counter() - t0))
            print(f"  {category} {mode}: {rows[-1][3]} of {n}", flush=True)
    print(f"{date.today()}, SmolLM2-135M-Instruct Q4_1, greedy, max_tokens 256, first "
          f"{args.limit} cases per category; corpora from bench/corpora/bfcl")
    print("| category | mode | cases | called | all calls valid | AST right | seconds |")
    print("|---|---|---|---|---|---|---|")
    for category, mode, n, k, secs in rows:
        print(f"| {category} | {mode} | {n} | {k['called']} | {k['valid']} | {k['ast']} "
              f"| {secs:.0f} |")


# one family template per dialect (tests/corpora/*/templates)
DIALECT_TEMPLATES = {
    "hermes": "qwen2.5-instruct", "qwen3-xml": "qwen3-coder", "llama3-json": "llama-3.2-instruct",
    "llama4-json": "llama-4", "mistral-v3": "mistral-nemo-instruct-2407",
    "mistral-v11-ids": "mistral-small-3.2-instruct-2506", "mistral-v11": "devstral-small-2507",
    "harmony": "gpt-oss", "deepseek-r1": "deepseek-r1", "deepseek-v3.1": "deepseek-v3.1",
    "command-r7b": "command-r7b", "granite-3": "granite-3.3",
    "functionary-v3.1": "functionary-v3.1", "functionary-v3.2": "functionary-v3.2",
    "kimi-k2": "kimi-k2", "glm-4.5": "glm-4.6", "minimax-m2": "minimax-m2",
    "seed-oss": "seed-oss", "nemotron-v2": "nemotron-nano-v2", "phi-4-mini": "phi-4-mini-instruct",
    "apertus": "apertus", "lfm2": "lfm2.5", "lfm2-content": "lfm2",
}


def by_dialect(args: argparse.Namespace) -> None:
    """``--dialects``: chatkit's modes under each dialect's family template."""
    dialects = list(DIALECT_TEMPLATES) if args.dialects == "all" else args.dialects.split(",")
    modes = [m for m in args.modes.split(",") if m.startswith("chatkit")]
    if args.model == "gemma":
        sys.path.insert(0, str(ROOT))
        from tests.conftest import gemma_path

        model = Model.load(gemma_path(), n_ctx=4096, n_seq_max=1, n_threads=default_threads())
    else:
        model = Model.load(n_ctx=4096, n_seq_max=1, n_threads=default_threads())
    rows = []
    for dialect in dialects:
        family = DIALECT_TEMPLATES[dialect]
        path = next((ROOT / "tests" / "corpora").glob(f"*/templates/{family}.jinja"))
        template = ChatTemplate.from_string(path.read_text(), name=family)
        for category in args.categories.split(","):
            cases = load(category, args.limit)
            for mode in modes:
                if mode == "chatkit-required" and cases and cases[0][1] is None:
                    continue
                t0 = time.perf_counter()
                scores = [score(c, run_chatkit(model, c, mode, template), truth)
                          for c, truth in cases]
                k = {key: sum(x[key] for x in scores) for key in ("called", "valid", "ast")}
                rows.append((dialect, family, category, mode, len(scores), k,
                             time.perf_counter() - t0))
                print(f"  {dialect} {category} {mode}: {k} of {len(scores)}", flush=True)
    print(f"{date.today()}, {Path(str(model.path)).name}, greedy, max_tokens 256, first "
          f"{args.limit} cases per category; each dialect under its family's template")
    print("| dialect (template) | category | mode | cases | called | all calls valid "
          "| AST right | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for dialect, family, category, mode, n, k, secs in rows:
        print(f"| `{dialect}` ({family}) | {category} | {mode} | {n} | {k['called']} "
              f"| {k['valid']} | {k['ast']} | {secs:.0f} |")


if __name__ == "__main__":
    main()
