"""The sampler's distributions, checked statistically with fixed seeds."""

from __future__ import annotations

import numpy as np
import pytest

from engine.llm.sampler import Sampler, SamplingOptions

LOGITS = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], np.float32)
DRAWS = 20000


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def _frequencies(options: SamplingOptions, previous: list[int] = ()) -> np.ndarray:
    sampler = Sampler(options)
    counts = np.bincount([sampler.sample(LOGITS, previous) for _ in range(DRAWS)], minlength=LOGITS.size)
    return counts / DRAWS


def _close(found: np.ndarray, expected: np.ndarray) -> None:
    """Within 5 standard errors of a multinomial draw, and exactly zero where expected is zero."""
    tolerance = 5 * np.sqrt(expected * (1 - expected) / DRAWS) + 1e-12
    assert np.all(np.abs(found - expected) <= tolerance), (found, expected)


def test_temperature_draws_follow_the_softened_distribution() -> None:
    _close(_frequencies(SamplingOptions(temperature=0.7, seed=1)), _softmax(LOGITS / 0.7))
    _close(_frequencies(SamplingOptions(temperature=1.5, seed=2)), _softmax(LOGITS / 1.5))


def test_top_k_top_p_and_min_p_keep_only_their_tokens_renormalized() -> None:
    p = _softmax(LOGITS.astype(np.float64))
    top3 = np.where(np.arange(8) < 3, p, 0)
    _close(_frequencies(SamplingOptions(top_k=3, seed=3)), top3 / top3.sum())
    # top-p 0.7: the smallest prefix by probability with mass >= 0.7 (p[0] + p[1] = 0.65, + p[2] = 0.80)
    nucleus = np.where(np.arange(8) < 3, p, 0)
    _close(_frequencies(SamplingOptions(top_p=0.7, seed=4)), nucleus / nucleus.sum())
    # min-p 0.2: tokens at least a fifth as likely as the best (e^-1.5 = 0.22 in, e^-2 = 0.14 out)
    kept = np.where(p >= 0.2 * p.max(), p, 0)
    assert np.count_nonzero(kept) == 4
    _close(_frequencies(SamplingOptions(min_p=0.2, seed=5)), kept / kept.sum())


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    adjusted = LOGITS.astype(np.float64).copy()
    adjusted[0] /= 2.0
    adjusted[6] *= 2.0
    found = _frequencies(SamplingOptions(repetition_penalty=2.0, seed=6), previous=[0, 6, 0])
    _close(found, _softmax(adjusted))
    greedy = Sampler(SamplingOptions(temperature=0, repetition_penalty=4.0))
    assert greedy.sample(LOGITS) == 0 and greedy.sample(LOGITS, [0]) == 1


def test_a_seed_reproduces_the_draws_and_another_seed_does_not() -> None:
    def draws(seed: int) -> list[int]:
        sampler = Sampler(SamplingOptions(temperature=1.0, top_p=0.95, seed=seed))
        return [sampler.sample(LOGITS) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"temperature": -1.0}, "temperature=-1.0 must be a number >= 0"),
        ({"top_p": 0.0}, r"top_p=0.0 must be in \(0, 1\]"),
        ({"top_k": -2}, "top_k=-2"),
        ({"min_p": 1.0}, "min_p=1.0"),
        ({"repetition_penalty": 0.0}, "repetition_penalty=0.0"),
    ],
)
def test_bad_options_are_refused_naming_them(option: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingOptions(**option)
