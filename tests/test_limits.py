"""Bad sizes and long conversations: named errors before any decode, never an abort; work
beyond the free KV sequences waits; an opt-in policy keeps a long conversation going; every
cache that client input can grow holds at most its stated bound."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import threading

import pytest

import chatkit
from chatkit import (
    Constraint,
    ContextOverflow,
    Conversation,
    InvalidParameter,
    Message,
    Model,
)
from chatkit.chat import plan
from chatkit.grammar import meta_schema, value_checks


@pytest.mark.parametrize(("name", "value"), [
    ("n_ctx", 16), ("n_ctx", 0), ("n_ctx", 1 << 30), ("n_seq_max", 0), ("n_seq_max", 300),
    ("n_batch", 0), ("n_threads", 0), ("n_threads", -2), ("n_ctx", 31.5)])
def test_load_parameters_are_validated(name: str, value: object) -> None:
    with pytest.raises(InvalidParameter) as info:
        Model.load(**{name: value})  # type: ignore[arg-type]
    assert info.value.name == name


def test_a_small_context_is_not_an_abort() -> None:
    """n_ctx below n_batch used to abort the process (GGML_ASSERT n_tokens <= n_batch) on the
    first send: run it in a child, so an abort would show as a signal, not kill the suite."""
    code = ("from chatkit import Conversation, Model, ContextOverflow\n"
            "m = Model.load(n_ctx=64, n_seq_max=1)\n"
            "print(m.n_batch)\n"
            "try:\n"
            "    print(Conversation(m).send('Hi', max_tokens=8).usage.completion_tokens)\n"
            "except ContextOverflow as e:\n"
            "    print('overflow', e.prompt_tokens)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split()
    assert int(lines[0]) <= 64


def test_a_prompt_that_cannot_fit_is_refused_before_any_decode(smol: Model) -> None:
    before = smol.stats.decode_calls
    conv = Conversation(smol)
    with pytest.raises(ContextOverflow) as info:
        conv.send("word " * 3000, max_tokens=16)
    err = info.value
    assert err.prompt_tokens > smol.n_ctx_seq and err.max_tokens == 16
    assert err.n_ctx == smol.n_ctx_seq
    with pytest.raises(ContextOverflow):
        conv.send("Hi", max_tokens=smol.n_ctx_seq)
    assert smol.stats.decode_calls == before and conv.messages == []


def test_drop_oldest_keeps_a_long_conversation_going(smol: Model) -> None:
    long = "tell me about the sea. " * 60  # ~360 tokens a message
    history = []
    for i in range(8):
        history += [Message("user", f"{i}: {long}"), Message("assistant", f"answer {i}")]
    strict = Conversation(smol, system="Be brief.", messages=history)
    with pytest.raises(ContextOverflow):
        strict.send("And now?", max_tokens=8)
    conv = Conversation(smol, system="Be brief.", messages=history,
                        context_policy="drop_oldest")
    turn = conv.plan("And now?", max_tokens=8)
    rendered = smol.detokenize(turn.plan.prompt)
    assert "Be brief." in rendered and "7: tell" in rendered and "0: tell" not in rendered
    reply = conv.send("And now?", max_tokens=8)
    assert reply.usage.prompt_tokens + 8 <= smol.n_ctx_seq
    assert len(conv.messages) == 18  # everything is kept in the record
    with pytest.raises(InvalidParameter):
        Conversation(smol, context_policy="truncate")  # type: ignore[arg-type]


def test_more_threads_than_sequences_wait_instead_of_failing(smol: Model) -> None:
    errors: list[BaseException] = []
    texts: list[str] = []

    def worker(i: int) -> None:
        try:
            texts.append(Conversation(smol).send(f"Count to {i}.", max_tokens=6).text)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3 * smol.n_seq_max)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(texts) == 3 * smol.n_seq_max
    assert smol.free_seqs() == smol.n_seq_max


# ------------------------------------------------------------------ bounded caches
def test_every_function_cache_is_bounded_or_holds_one_value() -> None:
    """A ``functools`` cache keyed by its arguments states a ``maxsize``; only one without
    arguments (one value: a library handle, a tokenizer) may be unbounded."""
    unbounded = []
    for info in pkgutil.walk_packages(chatkit.__path__, "chatkit."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if not hasattr(obj, "cache_parameters") or obj.__module__ != module.__name__:
                continue
            if obj.cache_parameters()["maxsize"] is None \
                    and inspect.signature(obj.__wrapped__).parameters:
                unbounded.append(f"{module.__name__}.{name}")
    assert unbounded == []


def test_compiled_grammars_are_kept_up_to_their_bound(smol: Model,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = plan.grammar_cache(smol)
    monkeypatch.setattr(cache, "bound", 3)

    def send(i: int) -> int:
        before = plan.COMPILES.read()[0]
        Conversation(smol).send("Say it.", schema={"const": f"v{i}"}, max_tokens=8)
        return plan.COMPILES.read()[0] - before

    for i in range(5):
        assert send(i) == 1
        assert len(cache) <= 3
    assert send(4) == 0  # among the three most recent: kept
    assert send(0) == 1  # dropped past the bound: compiled again


def test_checked_schemas_are_remembered_up_to_their_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meta_schema, "MAX_CHECKED", 3)
    for i in range(7):
        Constraint.json_schema({"type": "string", "maxLength": 100 + i})
        assert len(meta_schema._checked_keys) <= 3


def test_value_verdicts_are_remembered_up_to_their_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(value_checks, "MAX_MEMO", 3)
    c = Constraint.json_schema({"type": "array", "items": {"type": "integer"},
                                "uniqueItems": True})
    assert c.checks is not None
    check = c.checks.checks[0]
    for i in range(7):
        c.checks.passes(check, f"[{i},{i}]".encode())
        assert len(c.checks._memo) <= 3
