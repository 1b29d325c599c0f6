"""llguidance's end-of-turn tokenizer built from the vocabulary disk cache in a worker
thread while the calling thread has llama.cpp load the weights and create the context."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from ..llama_log import llama_log, muted, quiet_sink
from ..lowlevel import llama_cpp
from ..vocab import VocabTable, llama_tokenize, llg_tokens, vocab_cache_load, vocab_cache_path
from . import bare_import

__all__: list[str] = []

_log = logging.getLogger("chatkit")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _PendingVocabTokenizer:
    """llguidance's ``TokenizerWrapper`` protocol (what ``LLTokenizer(wrapper)`` reads:
    ``is_tokenizer_wrapper``, ``tokens``, ``eos_token_id``, ``bos_token_id``,
    ``special_token_ids``, and ``__call__(text) -> ids``) over llama.cpp's tokenizer of a
    vocabulary that is still loading. The trie and slices need only the token bytes;
    llguidance tokenizes later (forced tokens, ``tokenize_str``), by which time ``cell[0]``
    holds the vocabulary (a call before that waits for it). The call is what
    ``LLTokenizer.from_llamacpp`` runs natively: ``llama_tokenize`` without BOS or special
    parsing, the same ids for vocabularies that tokenize "a" as "a" (checked when the cache
    was written; the others add a sentinel byte there). Parsing special tokens
    (``tokenize_str(parse_special=True)``, which chatkit does not use) falls back to plain
    tokenization in llguidance for this protocol."""

    is_tokenizer_wrapper = True
    bos_token_id = None
    special_token_ids = ()  # the tokens already carry the 0xFF marker

    def __init__(self, tokens: list[bytes], eos: int, cell: list[Any],
                 ready: threading.Event) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self._cell = cell
        self._ready = ready

    def __call__(self, text: str | bytes) -> list[int]:
        self._ready.wait()
        vocab = self._cell[0]
        if vocab is None:
            raise RuntimeError("the model's vocabulary did not load")
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return llama_tokenize(vocab, data, False, False)


class TokenizerPrebuild:
    """llguidance's tokenizer for a model's end-of-turn token, built in a worker thread from
    the vocabulary disk cache while the calling thread loads the weights and creates the
    context (both in llama.cpp, without the GIL). The build holds the GIL throughout, so
    llama.cpp logs to a C no-op meanwhile (``llama_log.quiet_sink``); the load stays on the
    calling thread, so Ctrl-C lands where it did. A failed load is redone serially by the
    caller, with chatkit's sink, so its ``ModelLoadError`` carries llama.cpp's message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._go = threading.Event()
        self._vocab_ready = threading.Event()
        self._vocab: list[Any] = [None]
        self._cancelled = False
        self._table: VocabTable | None = None
        self._tokenizer: Any = None
        self._seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="chatkit-llg-tokenizer",
                                        daemon=True)
        self._thread.start()  # it waits for load_alongside (or close)

    @classmethod
    def start(cls, path: Path) -> TokenizerPrebuild | None:
        """Started when it can help: a second core, a cache file for this model file
        (version, n_vocab and end-of-turn id included), a GIL-free log sink, and nobody
        listening to ``chatkit.llama_cpp`` at DEBUG (who then gets every line of a serial
        load). On a machine whose other processes take every core the overlap saves
        nothing and costs a little more CPU (the two threads contend for caches)."""
        if (quiet_sink is None or _usable_cores() < 2
                or llama_log.isEnabledFor(logging.DEBUG)):
            return None
        try:
            if not vocab_cache_path(path).is_file():
                return None
        except OSError:
            return None
        return cls(path)

    def _run(self) -> None:
        try:
            self._go.wait()  # until the load is about to start (it then drops the GIL)
            if self._cancelled:
                return
            table = vocab_cache_load(self.path)
            if table is None or not table.plain_tokenize or self._cancelled:
                return
            llguidance = bare_import.llguidance()
            started = time.perf_counter()
            source = _PendingVocabTokenizer(llg_tokens(table.pieces, table.attrs),
                                            table.eot_id, self._vocab, self._vocab_ready)
            tokenizer = llguidance.LLTokenizer(source, slices=[])
            source.tokens = []  # read into llguidance's trie; the model keeps the pieces
            self._seconds = time.perf_counter() - started
            self._table, self._tokenizer = table, tokenizer
        except BaseException as exc:  # a pyo3 PanicException is a BaseException
            _log.info("llguidance tokenizer not built while loading %s (%s: %s); the first "
                      "constrained turn builds it", self.path.name, type(exc).__name__, exc)

    def load_alongside(self, path: Path, mparams: Any, cparams: Any) -> tuple[Any, Any]:
        """(model, context) from llama.cpp while the build runs; (None, None) when either
        failed (what was made is freed)."""
        model = ctx = None
        try:
            with muted(quiet_sink):
                self._go.set()
                model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
                if model:
                    ctx = llama_cpp.llama_init_from_model(model, cparams)
        except BaseException:
            if ctx:
                llama_cpp.llama_free(ctx)
            if model:
                llama_cpp.llama_model_free(model)
            raise
        if model and not ctx:
            llama_cpp.llama_model_free(model)
            model = None
        return model, ctx

    def finish(self, vocab: Any) -> tuple[VocabTable, Any, float] | None:
        """Give the tokenizer its vocabulary (``llama_vocab *`` of the loaded model) and
        wait for the build: (cache table, tokenizer, build seconds), None if it failed."""
        self._vocab[0] = vocab
        self._vocab_ready.set()
        self._thread.join()
        if self._table is None or self._tokenizer is None:
            return None
        return self._table, self._tokenizer, self._seconds

    def close(self) -> None:
        """Stop (before the build starts) or wait for the worker. Idempotent."""
        self._cancelled = True
        self._go.set()
        self._vocab_ready.set()
        self._thread.join()
