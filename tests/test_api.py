"""The public API's shape: typed for users, exported whole, layered one way."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import chatkit

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "chatkit"


def _mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "--config-file", "/dev/null", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_readme_tour_passes_mypy_strict_without_casts() -> None:
    tour = ROOT / "tests" / "typed" / "tour.py"
    assert "cast(" not in tour.read_text()
    proc = _mypy(tour)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_check_can_fail() -> None:
    """Positive control: a wrong parsed type, a misspelt option and a write to a read-only
    lent value are each reported."""
    proc = _mypy(ROOT / "tests" / "typed" / "wrong.py")
    assert proc.returncode == 1, proc.stdout
    assert 'Expression is of type "Verdict", not "int"' in proc.stdout
    assert '"max_token"' in proc.stdout
    assert 'wrong.py:20: error: Incompatible types in assignment' in proc.stdout


def _modules() -> list[str]:
    names = ["chatkit"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="chatkit."):
        names.append(info.name)
    return sorted(n for n in names if n not in {"chatkit.__main__"})


def test_every_public_name_is_exported() -> None:
    """httpx's tests/test_exported_members.py: every name a module declares public (its
    ``__all__``) is exported by ``chatkit``, and ``chatkit`` exports nothing else."""
    declared: dict[str, str] = {}
    for name in _modules():
        if name == "chatkit":
            continue
        module = importlib.import_module(name)
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for member in module.__all__:
            declared.setdefault(member, name)
    exported = set(chatkit.__all__) - {"__version__"}
    assert set(declared) - exported == set(), "declared public but not exported"
    assert exported - set(declared) == set(), "exported but no module declares it"
    for member in chatkit.__all__:
        assert getattr(chatkit, member) is not None, member


def test_design_contract_names_import() -> None:
    from chatkit import (  # noqa: F401  (DESIGN.md's public API)
        Constraint,
        Conversation,
        Model,
        ModelRetry,
        SamplingParams,
        Tool,
        send_batch,
        tool,
    )


def _imports(path: Path) -> list[tuple[str, list[str], bool]]:
    """(imported chatkit module, names, under TYPE_CHECKING) for each import in a file."""
    module = "chatkit." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    module = module.removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    found: list[tuple[str, list[str], bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            guarded = typing_only or (isinstance(child, ast.If)
                                      and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    target = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    target = child.module or ""
                if target.startswith("chatkit"):
                    found.append((target, [a.name for a in child.names], typing_only))
            elif isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.startswith("chatkit"):
                        found.append((a.name, [], typing_only))
            visit(child, guarded)

    visit(tree, False)
    return found


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_imports_another_modules_private_names() -> None:
    """Checked on the syntax tree: ``from .x import _name``, and ``obj._name`` on anything
    but ``self``/``cls`` (reaching into another object's privates)."""
    offences = []
    for path in _files():
        for target, names, _ in _imports(path):
            offences += [f"{path.name}: from {target} import {n}" for n in names
                         if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in {"self", "cls", "other"})):
                offences.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert offences == []


def test_the_module_graph_has_no_cycles() -> None:
    """Layers import one way (TYPE_CHECKING imports included): e.g. conversation -> agent
    -> tools, never back. The lazy ``chatkit/__init__`` is left out (it imports on use)."""
    graph: dict[str, set[str]] = {}
    for path in _files():
        if path == PACKAGE / "__init__.py":
            continue
        module = "chatkit." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        graph[module] = {t for t, _, _ in _imports(path) if t != "chatkit" and t != module}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack, node, nxt]))
            if nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert graph["chatkit.tools.definition"].isdisjoint(
        {"chatkit.chat.conversation", "chatkit.chat.agent", "chatkit.chat.turn"})


# ------------------------------------------------------------------ layers
# The package's floors, lowest first: a module may import its own floor and the floors
# below it, never one above (each subpackage's ``__init__`` says the same in words).
LAYERS: list[set[str]] = [
    {"chatkit.errors", "chatkit.messages"},
    {"chatkit.engine"},
    {"chatkit.templates"},
    {"chatkit.grammar"},
    {"chatkit.decode"},
    {"chatkit.remote", "chatkit.tools"},
    {"chatkit.chat"},
    {"chatkit.serve"},
    {"chatkit.cli"},
]


def _unit(module: str) -> str:
    """``chatkit.chat.turn`` -> ``chatkit.chat``; root modules are their own unit."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _floor(module: str) -> int:
    unit = _unit(module)
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise AssertionError(f"{module} sits on no floor: add its unit to LAYERS")


def _layer_offences() -> list[str]:
    offences = []
    for path in _files():
        if path == PACKAGE / "__init__.py" or path.name == "__main__.py":
            continue
        module = "chatkit." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        for target, names, _ in _imports(path):
            if target == "chatkit":
                continue
            if names and target.count(".") == 1 and _unit(target) == target:
                # ``from chatkit.engine import diskcache``: the modules imported
                targets = [f"{target}.{n}" for n in names]
            else:
                targets = [target]
            for t in targets:
                if _unit(t) != _unit(module) and _floor(t) > _floor(module):
                    offences.append(f"{module} -> {t}")
    return offences


def test_subpackages_import_only_lower_layers() -> None:
    """Layers by subpackage: engine < templates < grammar < decode < tools, remote < chat
    < serve < cli (TYPE_CHECKING imports included)."""
    assert _layer_offences() == []


def test_layer_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: the server put on the floor under the engine is an offence."""
    lowered = [LAYERS[0], {"chatkit.serve"}, *(s for s in LAYERS[1:] if s != {"chatkit.serve"})]
    monkeypatch.setattr(sys.modules[__name__], "LAYERS", lowered)
    assert any(o.startswith("chatkit.serve.") for o in _layer_offences())


def test_the_tree_shows_the_layers() -> None:
    """At most four modules at the root besides ``__init__`` and ``__main__``; at least five
    subpackages, none over 14 modules, each with a docstring that says its job and what it
    must never import."""
    root = sorted(p.name for p in PACKAGE.glob("*.py")
                  if p.name not in {"__init__.py", "__main__.py"})
    assert len(root) <= 4, root
    subpackages = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))
    assert len(subpackages) >= 5, subpackages
    for sub in subpackages:
        modules = [p for p in sub.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 14, (sub.name, len(modules))
        doc = ast.get_docstring(ast.parse((sub / "__init__.py").read_text())) or ""
        assert "Job:" in doc and "Never imports:" in doc, sub.name


# ------------------------------------------------------------------ the package's shape
MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 600, 250, 60
SHAPE_EXCEPTIONS: dict[str, str] = {
    # "module.py:Name": why it is allowed to be larger (keep this list short)
}


def _shape_offences() -> list[str]:
    offences = []
    for path in _files():
        rel = str(path.relative_to(PACKAGE))
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES and rel not in SHAPE_EXCEPTIONS:
            offences.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > limit and f"{rel}:{node.name}" not in SHAPE_EXCEPTIONS:
                offences.append(f"{rel}:{node.lineno} {node.name}: {size} lines")
    return offences


NEAR_CAP: dict[str, str] = {
    # classes within 10 lines of MAX_CLASS_LINES, each with why it is one unit
    "grammar/guard.py:Guard": "one incremental scan state that commit, rollback and the mask "
                              "filter all read and move; split, each half would reach into it",
    "chat/turn.py:Turn": "the steps a scheduler drives (open, chunk, verify, first, advance, "
                         "complete, release), one short method each, over one decoder",
    "chat/conversation.py:Conversation": "the public face: each entry point with its async "
                                         "twin and its typed overloads, each a one-line "
                                         "hand-over to the runner",
    "decode/decoding.py:Decoder": "the token loop's state (the sampler, rows, rollbacks) that "
                                  "plain, chunked and verified steps share",
}


def _near_cap() -> set[str]:
    found = set()
    for path in _files():
        rel = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and \
                    (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_CLASS_LINES - 10:
                found.add(f"{rel}:{node.name}")
    return found


def test_classes_near_their_cap_say_why() -> None:
    """A class within 10 lines of the cap is one on purpose (``NEAR_CAP`` says why), not
    one split to fit it; an entry that is no longer near the cap goes."""
    assert _near_cap() == set(NEAR_CAP)


def test_units_stay_small() -> None:
    """One job per unit: no module over 600 lines, no class over 250, no function over 60
    (``SHAPE_EXCEPTIONS`` names the few allowed, with the reason)."""
    assert _shape_offences() == []


def test_shape_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "MAX_FUNCTION_LINES", 5)
    assert any("plan_turn" in o for o in _shape_offences())


ANY_ALLOWED = {"send_batch:return", "asend_batch:return"}
"""Public annotations that say ``Any`` outright (docs/DESIGN.md, "Any in the public API"):
a batch's replies, whose items may each name their own schema class. Arbitrary JSON is
spelled ``JSON`` / ``JSONObject`` (``chatkit.messages``), never ``Any``."""


def _public_any() -> set[str]:
    """``name:annotation`` of each public function, method and field whose annotation, as
    written, says ``Any``."""
    import inspect
    import re

    found: set[str] = set()

    def scan(obj: object, name: str) -> None:
        for key, value in (getattr(obj, "__annotations__", None) or {}).items():
            if not key.startswith("_") and re.search(r"\bAny\b", str(value)):
                found.add(f"{name}:{key}")

    for member in chatkit.__all__:
        obj = getattr(chatkit, member)
        if not inspect.isclass(obj):
            scan(obj, member)
            continue
        for klass in obj.__mro__:
            if klass.__module__.startswith("chatkit"):
                scan(klass, member)
                for attr, value in vars(klass).items():
                    value = getattr(value, "__func__", value)
                    value = value.fget if isinstance(value, property) else value
                    if callable(value) and (attr == "__init__" or not attr.startswith("_")):
                        scan(value, f"{member}.{attr}")
    return found


def test_any_in_the_public_api_is_json_only() -> None:
    """Public signatures and fields type what they take; ``Any`` only as ``JSON`` (a value
    ``json.loads`` could return) or in ``ANY_ALLOWED``."""
    assert _public_any() - ANY_ALLOWED == set()


def test_the_any_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    from chatkit.messages import ToolCall

    monkeypatch.setitem(ToolCall.__annotations__, "parsed", "Any")
    assert "ToolCall:parsed" in _public_any()


def test_no_two_classes_share_a_name() -> None:
    """A class name says one thing across the package (two ``Dialect`` classes, or two
    builder protocols called ``Rules``, read as one to a newcomer)."""
    seen: dict[str, str] = {}
    twice = []
    for path in _files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                rel = str(path.relative_to(PACKAGE))
                if node.name in seen:
                    twice.append(f"{node.name}: {seen[node.name]}, {rel}")
                seen.setdefault(node.name, rel)
    assert twice == []


def _nodes(predicate: Any) -> list[str]:
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if predicate(node):
                found.append(f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}")
    return found


def _kind_check(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance" and len(node.args) == 2
            and any(isinstance(n, ast.Name) and n.id in {"GenerateEngine", "StepEngine"}
                    for n in ast.walk(node.args[1])))


def test_the_engine_kind_is_dispatched_in_one_module() -> None:
    """A local engine steps turns, a remote one answers requests: only ``runner`` asks
    which one it has."""
    sites = _nodes(_kind_check)
    assert sites and {s.split(":")[0] for s in sites} == {"chat/runner.py"}, sites


def _reach_through(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
            and node.value.attr in {"decoder", "plan"})


def test_nothing_reaches_through_a_turn() -> None:
    """``turn.decoder.x`` / ``turn.plan.x`` stay inside ``turn.py``: drivers, the server and
    the conversation use the turn's own accessors."""
    sites = _nodes(_reach_through)
    assert sites and {s.split(":")[0] for s in sites} == {"chat/turn.py"}, sites


OPTIONS_MODULES = {"decode/options.py", "tools/options.py", "chat/options.py"}
CONTEXT_REFUSALS = {
    # where an option's refusal depends on more than the call's options (docs/DESIGN.md)
    ("chat/batch.py", "speculative"),  # a lockstep batch cannot speculate
    ("chat/conversation.py", "tools"),  # run / arun: the agent loop needs tools
    ("chat/plan.py", "constraint"),  # a grammar a remote engine cannot take (no Lark form)
    ("grammar/constraints.py", "constraint"),  # a Constraint not bound to a model
    ("grammar/choices.py", "probabilities"),  # a pointer to a field the schema cannot enumerate
}


def _option_refusal(node: ast.AST) -> bool:
    from chatkit.chat.options import OPTION_NAMES

    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "InvalidParameter" and bool(node.args)
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in OPTION_NAMES)


def test_each_option_is_checked_in_one_place() -> None:
    """Every refusal of a per-call option's value is raised in its layer's ``options.py``
    (the library, the CLI and the server reach them through ``chat.options.resolve``),
    except the refusals that depend on the engine, the schema or the driver, listed in
    ``CONTEXT_REFUSALS`` and docs/DESIGN.md."""
    found = set()
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if _option_refusal(node):
                found.add((str(path.relative_to(PACKAGE)), node.args[0].value))  # type: ignore[attr-defined]
    elsewhere = {(f, o) for f, o in found if f not in OPTIONS_MODULES}
    assert elsewhere == CONTEXT_REFUSALS, elsewhere
    assert {f for f, _ in found} >= OPTIONS_MODULES
