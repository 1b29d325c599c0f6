"""The engine seam: what the conversation layer needs from whatever runs the model.

Two levels, both ``typing.Protocol``s (``Model`` is the first implementation):

- :class:`Vocabulary` — tokenize / detokenize, special ids, the chat template,
  the facts llguidance needs (its tokenizer, the ids a mask must never allow)
  and a per-engine cache. Planning a turn (template, segments, token ids,
  grammar) needs only this, so it runs the same for every engine.
- :class:`StepEngine` — "evaluate these token chunks for these KV sequences and
  give me logit rows", plus KV sequence leases and edits. The in-process
  decode loop (``Sampler`` seam, processors, speculation, lockstep batches)
  drives it one step at a time.

A remote engine (an OpenAI-compatible server that takes token-id prompts and a
grammar and returns tokens, not logit rows) implements :class:`Vocabulary`
(from the same GGUF's vocabulary, loaded vocab-only) and the coarse level,
:class:`GenerateEngine`: "generate under this grammar from these prompt
tokens". The turn planner is the same; only the driver differs, and the
second reader checks every answer either way.
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import AsyncIterator, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..messages import JSONObject, Message

if TYPE_CHECKING:
    from llguidance import LLTokenizer

__all__ = ["Engine", "GenerateEngine", "GenerateRequest", "GenerateResult", "SeqChunk",
           "StepEngine", "Vocabulary"]

V = TypeVar("V")

SAFE_VERIFY_KV = 104
"""Verify batches (one sequence, 2-8 rows) give logits bitwise equal to one-at-a-time steps
while the sequence holds at most ~110 KV cells on llama.cpp's CPU build (docs/DESIGN.md
"Numerics"); beyond, they differ in the last bits and greedy ties can flip. Speculation
drafts only below this length, so its output equals plain decoding."""

SAFE_PREFILL_CHUNK = 32
"""Prompt tokens per forward pass that keep logits bitwise equal to one-token-at-a-time
evaluation on llama.cpp's CPU build (docs/DESIGN.md "Numerics"): below the measured
threshold of 48-64 (the 64-row tile of its flash attention), and a multiple of the 16-row
matmul tiles. Past ~256 cells of a sequence (its flash attention splits a lone row over
512 cells or more across threads) and for K-quant weights (Gemma 3 270M's Q4_K_M agrees
only between steps of 8, 12, ... 32 rows) it holds only with
``Model.load(batch_invariant=True)`` (docs/running.md, "Reproducibility")."""


@dataclass(frozen=True)
class SeqChunk:
    """Tokens of one KV sequence for one ``StepEngine.decode`` call."""

    seq_id: int
    """The KV sequence the tokens belong to (0 <= seq_id < n_seq_max)."""
    pos: int
    """Position of ``tokens[0]`` in that sequence."""
    tokens: Sequence[int]
    """Token ids, evaluated in order at pos, pos+1, ..."""
    logits: Literal["last", "all", "none"] = "last"
    """Which rows to return: the last token's, every token's, or none."""


@runtime_checkable
class Vocabulary(Protocol):
    """Token facts and the chat template: enough to plan a turn and compile a grammar."""

    @property
    def name(self) -> str: ...

    n_vocab: int
    """Length of a logits row (padding ids included)."""
    bos_id: int
    eos_id: int
    eot_id: int
    """The end-of-turn id the chat template uses."""
    add_bos: bool
    n_ctx_seq: int
    """The most tokens one sequence can hold (prompt and reply)."""
    chat_template: str | None
    """The model's own Jinja chat template, when it ships one."""

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        """``special=False`` keeps control-token text as plain text (message content)."""
        ...

    def detokenize(self, ids: Sequence[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def is_control(self, token: int) -> bool: ...

    def llg_tokenizer(self, stop_token: int, *, sliced: bool = False) -> LLTokenizer:
        """llguidance's ``LLTokenizer`` for this vocabulary, with ``stop_token`` as its EOS
        (``sliced``: with the slices that speed up ``maxLength`` strings)."""
        ...

    def special_texts(self) -> tuple[str, ...]:
        """Texts that tokenizing with ``special=True`` turns into special tokens (control and
        user-defined tokens): the strings that must never come from content."""
        ...

    def content_special_ids(self) -> frozenset[int]:
        """Special token ids that tokenizing with ``special=False`` still produces (llama.cpp
        matches user-defined tokens in any text): content must be kept from spelling them."""
        ...

    def grammar_token_words(self) -> NDArray[np.int32]:
        """Bitmask words (llguidance layout) of the ids a grammar may ever allow: padding and
        undefined ids cleared."""
        ...

    def cache(self, key: Hashable, build: Callable[[], V]) -> V:
        """Memoise ``build()`` under ``key`` for the engine's lifetime (compiled grammars,
        tokenizers)."""
        ...


@runtime_checkable
class Forward(Protocol):
    """Forward passes over KV sequences: what a decoder and the engine loop step with."""

    n_seq_max: int
    n_batch: int
    n_threads: int
    """Threads the engine computes with (a mask prefetch thread only helps with a spare core)."""
    lock: threading.RLock
    """Held across a decode and the reading of its rows."""

    def decode(self, chunks: Sequence[SeqChunk]) -> list[NDArray[np.float32]]:
        """Evaluate every chunk in one forward pass; per chunk, its requested logit rows."""
        ...

    def prefill(self, seq_id: int, tokens: Sequence[int], pos: int = 0, *,
                chunk: int = SAFE_PREFILL_CHUNK) -> NDArray[np.float32]:
        """Evaluate a prompt suffix in chunks; the last row (a copy)."""
        ...


@runtime_checkable
class KVSequences(Protocol):
    """What a KV sequence holds, edited: cut back, or a prefix copied from another."""

    kv_unified: bool
    """One KV pool shared by every sequence (prefix copies with seq_cp work)."""

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None: ...

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None: ...


@runtime_checkable
class SequenceLeases(Protocol):
    """Which owner holds which KV sequence: leased for a turn, kept for the owner's next."""

    seq_wait: float
    """Seconds a turn waits for a free KV sequence before giving up by name."""

    def acquire_seq(self, owner: int, preferred: int | None = None, *,
                    wait: float | None = None) -> tuple[int, bool]:
        """Lease a KV sequence; ``(seq_id, kept)`` where kept means it still holds the owner's
        tokens. Waits up to ``wait`` seconds (None: the engine's default) for a free one."""
        ...

    def lease_seq(self, owner: int, preferred: int | None, prompt: Sequence[int], *,
                  min_shared: int = 1, cells: int = 0, wait: float | None = None
                  ) -> tuple[int, list[int] | None]:
        """Lease a KV sequence for a turn evaluating ``prompt``; ``(seq_id, held)`` where
        held is None when it still holds the owner's tokens, else the prompt prefix it now
        holds (another sequence's, routed by content)."""
        ...

    def release_seq(self, seq_id: int, holds: Sequence[int] | None = None) -> None: ...

    def release_seq_owner(self, owner: int) -> None: ...

    def free_seqs(self) -> int: ...


@runtime_checkable
class StepEngine(Vocabulary, Forward, KVSequences, SequenceLeases, Protocol):
    """An engine the in-process decode loop drives one forward pass at a time: the
    vocabulary, forward passes, sequence edits and leases together (a caller that needs
    one of them takes that protocol)."""


@dataclass(frozen=True)
class GenerateRequest:
    """One reply to generate remotely: token ids in, the grammar in llguidance Lark."""

    prompt: Sequence[int]
    grammar: str | None
    """llguidance Lark (``%json`` embeds a JSON schema); None: unconstrained."""
    max_tokens: int
    stop_ids: frozenset[int]
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    messages: Sequence[Message] = ()
    """The turn's messages, for engines that render their own chat template."""
    schema: JSONObject | bool | None = None
    """The JSON schema when the grammar is exactly one (for engines that take only that)."""
    grammar_kind: str | None = None
    """What the grammar is: json_schema, regex, lark, tools or think+schema."""


@dataclass(frozen=True)
class GenerateResult:
    """What a coarse engine returns: tokens, not logit rows."""

    tokens: list[int]
    """Generated ids, the stop token excluded."""
    finish: Literal["stop_token", "length"]
    prompt_tokens: int
    cached_prompt_tokens: int = 0
    text: str | None = None
    """The engine's text, when it returns text rather than its own token ids."""


@runtime_checkable
class GenerateEngine(Vocabulary, Protocol):
    """The coarse level, for engines that sample themselves (remote servers)."""

    returns_token_ids: bool
    """The engine returns its own token ids (else text, re-tokenized locally, which only
    the second reader can check)."""

    def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def agenerate(self, request: GenerateRequest) -> GenerateResult: ...

    def stream(self, request: GenerateRequest) -> Iterator[list[int] | GenerateResult]:
        """Token ids as they come, then the GenerateResult."""
        ...

    def astream(self, request: GenerateRequest) -> AsyncIterator[list[int] | GenerateResult]:
        ...


Engine = StepEngine | GenerateEngine
"""What a ``Conversation`` runs on: a local ``Model`` or a ``RemoteEngine``."""


class IncrementalDetokenizer:
    """Text deltas from tokens of any vocabulary; holds back the bytes of an incomplete
    UTF-8 character, so no delta splits one."""

    def __init__(self, vocab: Vocabulary) -> None:
        self._vocab = vocab
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token: int) -> str:
        return str(self._decoder.decode(self._vocab.token_bytes(token)))

    def flush(self) -> str:
        return str(self._decoder.decode(b"", final=True))
