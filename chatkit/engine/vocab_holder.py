"""HoldsVocabulary: an engine's ``Vocabulary`` side, by delegation to the vocabulary it holds
(the one a ``RemoteEngine`` is given; a local ``Model`` lends its own, engine/delegate.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from .protocols import IncrementalDetokenizer, Vocabulary

if TYPE_CHECKING:
    from llguidance import LLTokenizer

__all__: list[str] = []


class HoldsVocabulary:
    """The token facts (copied at :meth:`_hold`) and token methods of ``self.vocab``."""

    vocab: Vocabulary
    n_vocab: int
    """Length of a logits row (padding ids included)."""
    bos_id: int
    eos_id: int
    eot_id: int
    """The end-of-turn id the chat template uses."""
    add_bos: bool
    chat_template: str | None
    """The model's own Jinja chat template, when it ships one."""

    def _hold(self, vocab: Vocabulary) -> None:
        self.vocab = vocab
        self.n_vocab = vocab.n_vocab
        self.bos_id, self.eos_id, self.eot_id = vocab.bos_id, vocab.eos_id, vocab.eot_id
        self.add_bos = vocab.add_bos
        self.chat_template = vocab.chat_template

    @property
    def name(self) -> str:
        """The vocabulary's name (its model file's)."""
        return self.vocab.name

    def tokenize(self, text: str, *, special: bool, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``. ``special=False`` keeps control-token text as plain text
        (message content); ``special=True`` parses markup into control tokens."""
        return self.vocab.tokenize(text, special=special, add_bos=add_bos)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (invalid UTF-8 becomes U+FFFD)."""
        return self.vocab.detokenize(ids)

    def token_bytes(self, token: int) -> bytes:
        """The bytes one token stands for (control tokens render as their text)."""
        return self.vocab.token_bytes(token)

    def is_control(self, token: int) -> bool:
        """True for control tokens (``<|im_end|>``, ``<eos>``, ...)."""
        return self.vocab.is_control(token)

    def llg_tokenizer(self, stop_token: int, *, sliced: bool = False) -> LLTokenizer:
        """llguidance's tokenizer with ``stop_token`` as its EOS (see ``Vocab``)."""
        return self.vocab.llg_tokenizer(stop_token, sliced=sliced)

    def special_texts(self) -> tuple[str, ...]:
        """Texts ``tokenize(special=True)`` turns into special tokens."""
        return self.vocab.special_texts()

    def content_special_ids(self) -> frozenset[int]:
        """Special ids plain-text tokenizing still produces (see ``Vocab``)."""
        return self.vocab.content_special_ids()

    def grammar_token_words(self) -> NDArray[np.int32]:
        """Bitmask words of the ids a grammar may ever allow."""
        return self.vocab.grammar_token_words()

    def incremental_detokenizer(self) -> IncrementalDetokenizer:
        """A streaming decoder that never splits a UTF-8 character across deltas."""
        return IncrementalDetokenizer(self.vocab)
