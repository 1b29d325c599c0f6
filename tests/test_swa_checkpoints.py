"""Sliding-window checkpoints (``WindowCheckpoints``, chatkit.engine.kvseqs) on Gemma 3, whose
window layers keep 512 positions: a sequence cut back to a prompt's end, or a prefix of that length
copied out of it, gets the window back after a long reply pushed it out, so the next turn
of a conversation starts from the cached prompt without ``swa_full``."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from chatkit import Conversation, Message, Model, SamplingParams, Truncated
from chatkit.chat.scheduler import engine_loop
from chatkit.serve.server import ChatkitServer
from tests.conftest import gemma_path
from tests.helpers import openai_client
from tests.test_server import _Running

pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def pool() -> Iterator[Model]:
    """Gemma on one KV pool without ``swa_full`` (``chatkit serve``'s pool loads it; its
    streams, the default above 8,192 tokens a sequence, keep these checkpoints); small
    batches, so the window layers' slack past the window is small too."""
    model = Model.load(gemma_path(), n_ctx=8192, n_seq_max=2, kv_unified=True, n_batch=64)
    yield model
    model.close()


def _texts(model: Model) -> tuple[list[int], list[int], list[int]]:
    a = model.tokenize("Rule: read a file before you change it, and run the tests after. "
                       * 100, special=False)[:1200]
    b = model.tokenize(" Now tell me which rule is first and why.", special=False)
    d = model.tokenize(" Something else entirely, a long answer that goes on. " * 80,
                       special=False)[:800]
    return a, b, d


def test_a_cut_back_to_the_checkpoint_restores_the_window() -> None:
    """Seen failing without the restore: the window is gone after the cut, and the next
    rows drift far from the same prompt evaluated fresh (mean |diff| about 7x larger
    here, and the argmax moved)."""
    model = Model.load(gemma_path(), n_ctx=8192, n_seq_max=2)  # a stream per sequence
    try:
        a, b, d = _texts(model)
        fresh_cut = len(a)
        model.prefill(1, a)
        fresh = model.prefill(1, b, pos=len(a))

        def resumed(checkpoint: bool) -> np.ndarray:
            model.seq_rm(0)
            model.prefill(0, a)
            if checkpoint:
                model.checkpoint(0, len(a))
            model.prefill(0, d, pos=len(a))  # a reply longer than the window's slack
            assert model.resumable(0, len(a)) == (len(a) if checkpoint else 0)
            model.seq_rm(0, fresh_cut, -1)
            return model.prefill(0, b, pos=len(a))

        restored = np.abs(resumed(True) - fresh).mean()
        missing = np.abs(resumed(False) - fresh).mean()
        assert restored < missing / 3, (restored, missing)
    finally:
        model.close()


def test_a_checkpoint_is_dropped_when_its_prefix_is_cut(pool: Model) -> None:
    a, _, d = _texts(pool)
    pool.seq_rm(0)
    pool.prefill(0, a)
    pool.checkpoint(0, len(a))
    pool.prefill(0, d, pos=len(a))
    pool.seq_rm(0, len(a) - 10, -1)  # below the checkpoint: what it followed is gone
    assert pool.resumable(0, len(a) - 10) == 0
    pool.seq_rm(0)


def test_a_prefix_copied_out_at_the_checkpoint_gets_the_window(pool: Model) -> None:
    a, _, d = _texts(pool)
    for s in (0, 1):
        pool.seq_rm(s)
    pool.prefill(0, a)
    pool.checkpoint(0, len(a))
    pool.prefill(0, d, pos=len(a))
    assert not pool.kv._window_intact(0, len(a))
    pool.seq_cp(0, 1, 0, len(a))
    assert pool.kv._window_intact(1, len(a))  # the checkpoint's window, not 0's cells
    assert pool.resumable(1, len(a)) == len(a)
    for s in (0, 1):
        pool.seq_rm(s)


def test_the_next_turn_starts_from_the_prompt_after_a_long_reply() -> None:
    """Through the engine loop (``send``): the first turn's prompt end is checkpointed, so
    after a reply that pushed the window out, a second turn whose history differs from
    the first reply's first token (an agent's history, rewritten by its client) reports
    the first prompt as cached. Seen failing without the loop's checkpoint: 0 cached.
    (One sequence and small batches: the window layers' slack is smallest.)"""
    pool = Model.load(gemma_path(), n_ctx=4096, n_seq_max=1, kv_unified=True, n_batch=64)
    try:
        conv = Conversation(pool, system="Rules follow. " + "Run the tests after a change. " * 120,
                            sampling=SamplingParams(temperature=0.0))
        with pytest.raises(Truncated) as cut:  # a reply of 700 tokens
            conv.send("Write a long story.", schema={"type": "string", "minLength": 4000},
                      max_tokens=700)
        prompt = cut.value.usage.prompt_tokens
        assert conv.kv.seq is not None
        assert not pool.kv._window_intact(conv.kv.seq, prompt)  # the reply pushed it out
        assert conv.messages == []  # a cut turn is not recorded: the client's own history
        conv.messages += [Message("user", "Write a long story."), Message("assistant", "OK.")]
        second = conv.send("Shorter, please.", max_tokens=2)
        assert second.usage.cached_prompt_tokens >= prompt
    finally:
        pool.close()


def test_an_agent_server_resumes_from_the_checkpoint() -> None:
    """Over HTTP (the openai SDK), as ``chatkit serve`` loads an agent's long contexts (a
    stream per sequence, the loop not ``reproducible``): an agent's second request, whose
    prompt is the first one's plus a history its client rewrote, after a reply that pushed
    the window out, starts from the first prompt cached. Seen failing without the loop's
    checkpoint: 0 of 859 prompt tokens cached."""
    system = "Rules follow. " + "Run the tests after a change. " * 120
    story = {"role": "user", "content": "Write a long story."}
    long = {"type": "object", "properties": {"text": {"type": "string", "minLength": 4000}},
            "required": ["text"]}
    model = Model.load(gemma_path(), n_ctx=4096, n_seq_max=1, kv_unified=False, n_batch=64)
    try:
        engine_loop(model).reproducible = False
        with _Running(ChatkitServer(model, name="gemma")) as running, \
                openai_client(running.base) as c:
            first = c.chat.completions.create(
                model="gemma", temperature=0, max_tokens=700,
                response_format={"type": "json_object", "schema": long},
                messages=[{"role": "system", "content": system}, story])
            assert first.usage.completion_tokens == 700  # past the window and its slack
            second = c.chat.completions.create(
                model="gemma", temperature=0, max_tokens=4,
                messages=[{"role": "system", "content": system}, story,
                          {"role": "assistant", "content": "OK."},
                          {"role": "user", "content": "Shorter, please."}])
            cached = second.usage.prompt_tokens_details.cached_tokens
            assert cached >= first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
    finally:
        model.close()
