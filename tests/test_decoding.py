"""The plain decode loop and the sampler seam on the real model."""

from __future__ import annotations

import pytest

from chatkit import AllTokensMasked, Model, Sampler, SamplingParams, generate
from tests.helpers import AllowList, Ban, Recorder, chat_prompt

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
PENALISED = SamplingParams(temperature=0.7, repeat_penalty=1.5, presence_penalty=1.0,
                           frequency_penalty=0.5, seed=3)


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED, PENALISED])
def test_mask_and_one_commit_per_selection_on_real_logits(
    smol: Model, params: SamplingParams
) -> None:
    allowed = set(smol.tokenize(" yes no maybe", special=False)) | {smol.eot_id}
    rec = Recorder(AllowList(allowed))
    g = generate(smol, chat_prompt(smol, "Say hello."), Sampler(params, rec), max_tokens=12)
    assert set(g.tokens) <= allowed
    expected = g.tokens + ([g.stop_token] if g.stop_token is not None else [])
    assert rec.commits == expected
    assert rec.process_calls == len(expected)


def test_all_masked_on_real_logits(smol: Model) -> None:
    rec = Recorder(AllowList(set()))
    with pytest.raises(AllTokensMasked):
        generate(smol, chat_prompt(smol, "Hi"), Sampler(SAMPLED, rec), max_tokens=4)
    assert rec.commits == []


def test_seeded_generation_reproducible(smol: Model) -> None:
    """The same seed, the same tokens: 16 sampled ones (the stop tokens are banned, so the
    reply cannot end early and the comparison is never between two empty replies)."""
    prompt = chat_prompt(smol, "Write a word.")
    no_stop = [smol.eos_id, smol.eot_id]
    runs = [generate(smol, prompt, Sampler(SAMPLED, Ban(no_stop)), max_tokens=16).tokens
            for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 16


@pytest.mark.bitwise  # a prefill reusing the KV prefix against a fresh one
def test_max_tokens_and_reuse(smol: Model) -> None:
    prompt = chat_prompt(smol, "Count to ten.")
    no_stop = [smol.eos_id, smol.eot_id]  # the reply cannot end before max_tokens
    first = generate(smol, prompt, Sampler(processor=Ban(no_stop)), max_tokens=5)
    assert first.finish_reason == "length" and len(first.tokens) == 5
    again = generate(smol, prompt, Sampler(processor=Ban(no_stop)), max_tokens=5,
                     reuse=len(prompt) - 3)
    assert again.prompt_tokens_evaluated == 3
    assert again.tokens == first.tokens
