"""Sampler seam semantics on synthetic rows (fast); the real-model twins are in test_decoding."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from chatkit import AllTokensMasked, InvalidParameter, LogitProcessor, Sampler, SamplingParams
from tests.helpers import AllowList, Recorder

N = 1000


def _row(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, N).astype(np.float32)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.8, seed=3),
        SamplingParams(temperature=0.8, top_p=0.95, seed=3),
        SamplingParams(temperature=1.5, top_k=5, min_p=0.05, seed=3),
        SamplingParams(temperature=0.7, repeat_penalty=1.3, presence_penalty=0.5,
                       frequency_penalty=0.2, seed=4),
    ],
)
def test_mask_applied_and_one_commit_per_selection(params: SamplingParams) -> None:
    allowed = {7, 70, 700}
    rec = Recorder(AllowList(allowed))
    sampler = Sampler(params, rec)
    history: list[int] = [1, 2, 7, 7]
    for i in range(50):
        tok = sampler.next(_row(i), history)
        assert tok in allowed
        history.append(tok)
    assert rec.commits == history[4:]  # exactly one commit per next(), the token returned
    assert rec.process_calls == 50


def test_all_masked_raises_and_commits_nothing() -> None:
    for params in (SamplingParams(), SamplingParams(temperature=1.0, seed=1)):
        rec = Recorder(AllowList(set()))
        with pytest.raises(AllTokensMasked):
            Sampler(params, rec).next(_row(), [])
        assert rec.commits == []


def test_nan_row_is_all_masked() -> None:
    row = np.full(N, np.nan, dtype=np.float32)
    with pytest.raises(AllTokensMasked):
        Sampler().next(row, [])


def test_minus_inf_survives_penalties() -> None:
    """A masked token stays masked even when penalties would raise a negative logit."""
    params = SamplingParams(temperature=1.0, repeat_penalty=0.5, presence_penalty=-50.0,
                            frequency_penalty=-50.0, seed=0)
    allowed = {5}
    history = [3] * 40  # token 3 is "penalised" upwards by the negative penalties
    for i in range(30):
        tok = Sampler(params, AllowList(allowed)).next(_row(i), history)
        assert tok == 5


def test_seeded_sampling_reproducible_and_seeds_differ() -> None:
    def run(seed: int) -> list[int]:
        s = Sampler(SamplingParams(temperature=1.0, top_p=0.9, seed=seed))
        return [s.next(_row(i), []) for i in range(40)]

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_greedy_is_argmax() -> None:
    row = _row(5)
    assert Sampler().next(row.copy(), []) == int(np.argmax(row))


def _empirical(params: SamplingParams, row: np.ndarray, draws: int) -> np.ndarray:
    s = Sampler(params)
    counts = np.zeros(row.shape[0])
    for _ in range(draws):
        counts[s.next(row.copy(), [])] += 1
    return counts / draws


def test_sampling_matches_reference_distribution() -> None:
    """temperature + top-p + min-p against a straightforward full-sort reference."""
    rng = np.random.default_rng(0)
    row = rng.normal(0, 1, 400).astype(np.float32)
    row[:6] += 4  # a few clear favourites and a long tail
    t, top_p, min_p = 0.9, 0.8, 0.02
    order = np.argsort(-row, kind="stable")
    probs = np.exp((row[order] - row[order][0]) / t)
    probs /= probs.sum()
    keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
    keep = min(keep, int(np.count_nonzero(probs[:keep] >= min_p * probs[0])))
    ref = np.zeros(row.shape[0])
    ref[order[:keep]] = probs[:keep] / probs[:keep].sum()
    got = _empirical(SamplingParams(temperature=t, top_p=top_p, min_p=min_p, seed=1), row, 4000)
    assert set(np.flatnonzero(got)) <= set(order[:keep])
    assert np.abs(got - ref).max() < 0.03


def test_wide_vocab_plain_temperature_reaches_the_tail() -> None:
    """No top-k/top-p: every token keeps its probability (not only the top candidates)."""
    row = np.zeros(2000, dtype=np.float32)  # uniform over 2000 > candidate window
    got = _empirical(SamplingParams(temperature=1.0, seed=2), row, 3000)
    assert np.count_nonzero(got) > 1000


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"min_p": 1}, {"top_k": -2},
     {"repeat_penalty": 0}, {"penalty_window": -1}, {"temperature": float("nan")}],
)
def test_bad_params_are_named(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.name == next(iter(kwargs))


def test_processor_protocol_is_runtime_checkable() -> None:
    class Nothing:
        def process(self, logits: np.ndarray, history: Sequence[int]) -> None: ...
        def commit(self, token: int) -> None: ...
        def reset(self) -> None: ...

    assert isinstance(Nothing(), LogitProcessor)
    assert not isinstance(object(), LogitProcessor)


def test_nucleus_wider_than_the_first_candidate_window() -> None:
    """A flat tail 11 logits down carries real mass: the nucleus must reach into it."""
    n = 50_000
    row = np.full(n, -11.0, dtype=np.float32)
    row[:3] = [0.0, -0.5, -1.0]
    w = np.exp(row.astype(np.float64))
    z = w.sum()
    head = w[:3].sum()
    kept_tail = int(np.ceil((0.95 * z - head) / w[3]))  # tail tokens kept, lowest ids first
    p_tail = kept_tail * w[3] / (head + kept_tail * w[3])
    s = Sampler(SamplingParams(temperature=1.0, top_p=0.95, seed=5))
    draws = np.array([s.next(row.copy(), []) for _ in range(800)])
    tail = draws[draws >= 3]
    assert abs(tail.size / draws.size - p_tail) < 0.06
    assert tail.max() < 3 + kept_tail + 1
