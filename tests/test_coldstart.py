"""Cold start: llguidance's tokenizer built alongside the model load, and lazy imports."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llguidance
import llguidance.numpy
import numpy as np
import pytest

import chatkit.engine.llama_log as llama_log
import chatkit.engine.vocab as cv
from chatkit import Conversation, Model, ModelLoadError
from chatkit.engine.coldstart.llg_prebuild import TokenizerPrebuild
from chatkit.engine.lowlevel import llama_cpp
from chatkit.engine.model import default_model_path

from .conftest import ROOT, gemma_path

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
REPLY = '{"name": "Grüße, 世界 🦙 naïve <|im_end|>", "age": 57, "tags": [" a", "b\\n", ""]}'
TEXTS = ["a", " a", "", "hello world", "  two  spaces", "\n\n\t", "Grüße, 世界! 🦙 naïve café",
         "<|im_end|> <end_of_turn> <eos>", '{"x": [1, 2.5e-3, null]}', "ab" * 300]


def _worker_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "chatkit-llg-tokenizer"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty vocabulary cache for this test."""
    monkeypatch.setenv("CHATKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _warm(path: Path | None) -> None:
    """Load once the way a first process does: no cache yet, the table is written."""
    model = Model.load(path, n_ctx=256, n_seq_max=1)
    try:
        assert ("llg_tokenizer", model.eot_id) not in model.vocab._cache
        model.llg_tokenizer(model.eot_id)  # reads the vocabulary, writes the cache
    finally:
        model.close()


@pytest.fixture(params=["smol", pytest.param("gemma", marks=pytest.mark.gemma)])
def warm_path(request: pytest.FixtureRequest, cache: Path) -> Iterator[Path]:
    path = default_model_path() if request.param == "smol" else gemma_path()
    _warm(path)
    yield path


def test_slices_are_llguidance_json_string_slice() -> None:
    assert cv.LLG_SLICES == llguidance.LLTokenizer.general_slices()[2:3]
    assert cv.LLG_SLICES == llguidance.LLTokenizer.json_slices()[2:3]


def test_cache_records_what_the_build_needs(warm_path: Path) -> None:
    cached = cv.vocab_cache_load(warm_path)
    assert cached is not None
    model = Model.load_vocab(warm_path)
    try:
        assert len(cached.pieces) == model.n_vocab and cached.eot_id == model.eot_id
        assert cached.plain_tokenize  # both bench models take the overlapped path
    finally:
        model.close()


def test_the_tokenizer_built_during_load_is_the_one_turns_use(cache: Path) -> None:
    _warm(None)
    model = Model.load(n_ctx=512, n_seq_max=1)
    try:
        assert not _worker_threads()
        prebuilt = model.vocab._cache.get(("llg_tokenizer", model.eot_id))
        assert prebuilt is not None, "no tokenizer was built alongside the load"
        assert model.llg_tokenizer(model.eot_id) is prebuilt
        assert prebuilt.eos_token == model.eot_id and prebuilt.vocab_size == model.n_vocab
        seen: list[Any] = []
        build = model.llg_tokenizer

        def spy(stop: int, *, sliced: bool = False) -> Any:
            seen.append(made := build(stop, sliced=sliced))
            return made

        model.llg_tokenizer = spy  # type: ignore[method-assign]
        reply = Conversation(model).send("Is it sunny?", max_tokens=16, schema={
            "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
            "additionalProperties": False})
        assert isinstance(reply.parsed, dict) and isinstance(reply.parsed["ok"], bool)
        assert seen and all(t is prebuilt for t in seen)
    finally:
        model.close()


def _masks(tok: Any, grammar: str, ids: list[int], n_vocab: int) -> list[bytes]:
    matcher = llguidance.LLMatcher(tok, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    out = []
    mask = llguidance.numpy.allocate_token_bitmask(1, n_vocab)
    for t in [*ids, None]:
        llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
        out.append(mask.tobytes() + repr(matcher.compute_ff_tokens()).encode())
        if t is None:
            break
        assert matcher.consume_token(t), (t, matcher.get_error())
    return out


def test_prebuilt_and_serial_tokenizers_agree(warm_path: Path) -> None:
    """The build from the cache (llama.cpp's tokenizer behind a Python callback) and the
    serial one (llguidance's from_llamacpp) give the same tokens and the same masks."""
    model = Model.load(warm_path, n_ctx=512, n_seq_max=1)
    try:
        key = ("llg_tokenizer", model.eot_id)
        prebuilt = model.vocab._cache.pop(key)
        serial = model.llg_tokenizer(model.eot_id)
        assert serial is not prebuilt
        for text in TEXTS:
            assert prebuilt.tokenize_str(text) == serial.tokenize_str(text), text
        for raw in (b"\xff\xfe", "é".encode()[:1] + b"a", b"a\x00b"):
            assert prebuilt.tokenize_bytes(raw) == serial.tokenize_bytes(raw), raw
        assert prebuilt.is_special_token(model.eot_id) and serial.is_special_token(model.eot_id)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)
        ids = [*model.tokenize(REPLY, special=False), model.eot_id]
        assert (_masks(prebuilt, grammar, ids, model.n_vocab)
                == _masks(serial, grammar, ids, model.n_vocab))
    finally:
        model.close()


def _truncated_with_cache(tmp_path: Path) -> Path:
    """A GGUF llama.cpp cannot load whose vocabulary cache exists (the overlap starts)."""
    path = tmp_path / "half.gguf"
    with default_model_path().open("rb") as fh:
        path.write_bytes(fh.read(3_000_000))
    donor = Model.load_vocab(None)
    try:
        pieces, attrs = donor.table()
        cv.vocab_cache_write(path, pieces, attrs, eot_id=donor.eot_id, plain_tokenize=True)
    finally:
        donor.close()
    return path


def test_load_failure_keeps_llama_cpp_message(tmp_path: Path, cache: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = _truncated_with_cache(tmp_path)
    with pytest.raises(ModelLoadError) as serial:
        Model.load(path, progress=lambda fraction: None)  # a progress callback: no overlap
    overlapped: list[Path] = []
    real = TokenizerPrebuild.load_alongside

    def spy(self: Any, *args: Any) -> Any:
        overlapped.append(args[0])
        return real(self, *args)

    monkeypatch.setattr(TokenizerPrebuild, "load_alongside", spy)
    with pytest.raises(ModelLoadError) as info:
        Model.load(path)
    assert overlapped == [path]
    assert info.value.path == str(path)
    assert str(info.value) == str(serial.value)
    assert "could not load the model" not in str(info.value)  # llama.cpp's own line
    assert not _worker_threads() and llama_log.muted_depth() == 0


def test_log_sink_restored_after_the_overlapped_window(cache: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    _warm(None)
    model = Model.load(n_ctx=256, n_seq_max=1)
    try:
        assert ("llg_tokenizer", model.eot_id) in model.vocab._cache
    finally:
        model.close()
    assert llama_log.muted_depth() == 0
    with caplog.at_level("DEBUG", logger="chatkit.llama_cpp"):
        Model.load_vocab(None).close()
    assert any(r.name == "chatkit.llama_cpp" for r in caplog.records)


def test_interrupt_during_load_frees_everything(cache: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _warm(None)
    freed: list[Any] = []
    real_free = llama_cpp.llama_model_free

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    def free(model: Any) -> None:
        freed.append(model)
        real_free(model)

    monkeypatch.setattr(llama_cpp, "llama_init_from_model", interrupted)
    monkeypatch.setattr(llama_cpp, "llama_model_free", free)
    with pytest.raises(KeyboardInterrupt):
        Model.load(n_ctx=256, n_seq_max=1)
    assert len(freed) == 1
    assert not _worker_threads() and llama_log.muted_depth() == 0


def test_progress_callback_or_stale_cache_loads_serially(cache: Path) -> None:
    _warm(None)
    seen: list[float] = []
    model = Model.load(n_ctx=256, n_seq_max=1, progress=seen.append)
    try:
        assert seen[-1] == 1.0 and ("llg_tokenizer", model.eot_id) not in model.vocab._cache
    finally:
        model.close()
    target = cv.vocab_cache_path(default_model_path())
    fields = marshal.loads(target.read_bytes())
    target.write_bytes(marshal.dumps(fields[:2] + fields[4:]))  # no end-of-turn id
    model = Model.load(n_ctx=256, n_seq_max=1)
    try:
        assert ("llg_tokenizer", model.eot_id) not in model.vocab._cache
        assert model.detokenize(model.tokenize("hello", special=False)) == "hello"
    finally:
        model.close()
    cached = cv.vocab_cache_load(default_model_path())
    assert cached is not None and cached.plain_tokenize  # rewritten with the new fields


def test_sync_api_does_not_import_async_libraries() -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from chatkit import Conversation, Model\n"
            "print(sorted(m for m in ('anyio', 'asyncio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_loading_a_model_skips_llama_cpp_python_high_level_half() -> None:
    """chatkit imports only llama-cpp-python's ctypes bindings (~0.1 s less of a cold start);
    a later ``import llama_cpp`` still gets the whole package, over the same bindings."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from chatkit import Conversation, Model\n"
            "from chatkit.engine.lowlevel import llama_cpp as bindings, version\n"
            "model = Model.load(None, n_ctx=256, n_seq_max=1)\n"
            "skipped = sorted(m for m in ('llama_cpp', 'llama_cpp.llama', 'diskcache', "
            "'sqlite3', 'multiprocessing') if m in sys.modules)\n"
            "import llama_cpp\n"
            "print(skipped, llama_cpp.llama_cpp is bindings, hasattr(llama_cpp, 'Llama'), "
            "llama_cpp.llama_decode is bindings.llama_decode, "
            "version() == llama_cpp.__version__)\n"
            "import os; print(os.environ.get('GOMP_SPINCOUNT'))\n"
            "model.close()\n")
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                         text=True, check=True, env=env)
    assert out.stdout.strip().splitlines()[-2:] == ["[] True True True True", "1000"]


def test_a_constrained_turn_skips_llguidance_package_init(cache: Path) -> None:
    """chatkit imports llguidance's extension alone (its ``__init__`` pulls in
    ``importlib.metadata`` and grammar converters, ~45 ms on the chain that builds the
    tokenizer during the load); a later ``import llguidance`` gets the same classes."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from chatkit import Conversation, Model\n"
            "from chatkit.engine.coldstart import bare_import\n"
            "model = Model.load(None, n_ctx=256, n_seq_max=1)\n"
            "reply = Conversation(model).send('Yes or no?', schema={'type': 'boolean'}, "
            "max_tokens=8)\n"
            "skipped = sorted(m for m in ('llguidance', 'importlib.metadata') "
            "if m in sys.modules)\n"
            "import llguidance\n"
            "lib = bare_import.llguidance()\n"
            "print(skipped, type(reply.parsed).__name__, llguidance.LLMatcher is lib.LLMatcher, "
            "llguidance.LLTokenizer is lib.LLTokenizer)\n"
            "model.close()\n")
    env = {**os.environ, "CHATKIT_CACHE_DIR": str(cache)}
    for _ in range(2):  # the second process builds the tokenizer alongside the load
        out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                             text=True, check=True, env=env)
        assert out.stdout.strip().splitlines()[-1] == "[] bool True True"


def _marked(pieces: list[bytes], attrs: Any) -> list[bytes]:
    """The special-token marking rule, token by token."""
    return [b"\xff" + p if a & cv.ATTR_CONTROL or (
        a & cv.ATTR_USER_DEFINED and p.startswith(b"<") and p.endswith(b">")) else p
        for p, a in zip(pieces, attrs.tolist(), strict=True)]


@pytest.mark.parametrize("which", ["smol", pytest.param("gemma", marks=pytest.mark.gemma)])
def test_llg_tokens_mark_control_and_markup_tokens(which: str) -> None:
    model = Model.load_vocab(default_model_path() if which == "smol" else gemma_path())
    try:
        pieces, attrs = model.table()
        tokens = cv.llg_tokens(pieces, attrs)
        assert tokens == _marked(pieces, attrs)
        assert tokens[model.eot_id].startswith(b"\xff")
        assert sum(t != p for t, p in zip(tokens, pieces, strict=True)) > 10
    finally:
        model.close()
    # user-defined tokens are marked only when they look like markup
    attrs = np.array([cv.ATTR_USER_DEFINED, cv.ATTR_USER_DEFINED, cv.ATTR_CONTROL, 0],
                     dtype=np.int32)
    pieces = [b"<tool>", b"tool", b"x", b"<y>"]
    assert cv.llg_tokens(pieces, attrs) == [b"\xff<tool>", b"tool", b"\xffx", b"<y>"]
    with pytest.raises(ValueError):
        cv.llg_tokens(pieces[:3], attrs)


def test_vocab_cache_round_trip_and_damage(cache: Path) -> None:
    path = default_model_path()
    pieces = [b"a", b"", b"\xff\x00<b>", "é".encode()]
    attrs = np.array([0, 1, 8, 1 << 9], dtype=np.int32)
    cv.vocab_cache_write(path, pieces, attrs, eot_id=2, plain_tokenize=True)
    got = cv.vocab_cache_load(path)
    assert got is not None and got.pieces == pieces and got.eot_id == 2 and got.plain_tokenize
    assert got.attrs.dtype == np.int32 and got.attrs.tolist() == attrs.tolist()
    target = cv.vocab_cache_path(path)
    good = target.read_bytes()
    fields = marshal.loads(good)
    damaged = [good[: len(good) // 2], b"", b"not marshal",
               marshal.dumps((2, *fields[1:])),  # another format version
               marshal.dumps((*fields[:5], [b"a", "b", b"c", b"d"])),  # a str piece
               marshal.dumps((*fields[:5], pieces[:3])),  # too few pieces
               marshal.dumps((*fields[:2], 9, *fields[3:])),  # end-of-turn id out of range
               marshal.dumps((*fields[:4], b"\x00" * 12, *fields[5:]))]  # short attributes
    for bad in damaged:
        target.write_bytes(bad)
        assert cv.vocab_cache_load(path) is None, bad[:40]
    # a damaged file is a miss: the model reads its vocabulary again and rewrites the cache
    model = Model.load(path, n_ctx=256, n_seq_max=1)
    try:
        assert model.detokenize(model.tokenize("hello", special=False)) == "hello"
    finally:
        model.close()
    again = cv.vocab_cache_load(path)
    assert again is not None and len(again.pieces) == model.n_vocab


BOUNDED = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 60},
                                            "age": {"type": "integer"}},
           "required": ["name", "age"], "additionalProperties": False}


def test_slices_only_for_grammars_with_bounded_strings(cache: Path) -> None:
    """The model's tokenizer has no slices (the fastest build, on the path to the first
    token); a grammar with a maxLength string gets the sliced copy once it pays (after
    ``SLICES_AFTER`` masks made without it), switching mid-reply with the same masks."""
    from chatkit import Constraint
    from chatkit.grammar.slices import SLICES_AFTER

    _warm(None)
    model = Model.load(n_ctx=512, n_seq_max=1)
    key = ("llg_tokenizer_sliced", model.eot_id)
    try:
        base = model.vocab._cache[("llg_tokenizer", model.eot_id)]
        assert key not in model.vocab._cache
        Constraint.json_schema(SCHEMA, model=model)
        bounded = Constraint.json_schema(BOUNDED, model=model)
        assert key not in model.vocab._cache  # a cold lane's reply does not pay for it
        reply = '{"name": "' + "Ada Lovelace, née Byron; " * 2 + '", "age": 36}'
        ids = [*model.tokenize(reply, special=False), model.eot_id]
        grammar = llguidance.LLMatcher.grammar_from_json_schema(BOUNDED)
        plain_masks = _masks(base, grammar, ids, model.n_vocab)
        out = Conversation(model).send("Name a scientist.", schema=BOUNDED, max_tokens=48,
                                       temperature=0.8, seed=3)
        assert isinstance(out.parsed, dict) and len(out.parsed["name"]) <= 60
        # past the threshold, mid-reply: the switch replays the tokens so far
        bounded.reset()
        compact = '{"name":"' + "Ada Lovelace, née Byron; " * 2 + '","age":36}'
        for i, token in enumerate(model.tokenize(compact, special=False)):
            row = np.zeros(model.n_vocab, dtype=np.float32)
            for _ in range(SLICES_AFTER if i == 3 else 1):
                bounded.process(row, [])
            bounded.commit(token)
            if i == 3:
                assert key in model.vocab._cache and bounded._slice_demand is None
        assert bounded.is_accepting()
        sliced = model.vocab._cache[key]
        assert sliced is not base and model.llg_tokenizer(model.eot_id, sliced=True) is sliced
        assert _masks(sliced, grammar, ids, model.n_vocab) == plain_masks
        assert Constraint.json_schema(BOUNDED, model=model)._slice_demand is None
    finally:
        model.close()


def test_wants_slices() -> None:
    from chatkit.grammar.slices import wants_slices

    assert wants_slices(llguidance.LLMatcher.grammar_from_json_schema(BOUNDED))
    assert not wants_slices(llguidance.LLMatcher.grammar_from_json_schema(SCHEMA))
