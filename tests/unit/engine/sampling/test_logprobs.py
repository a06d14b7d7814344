"""Log-probabilities from logits that hold NaN or infinities: finite numbers that sum to one,
the way the samplers treat such logits (a NaN never wins; +inf takes the whole mass)."""

from __future__ import annotations

import math

import numpy as np

from server.engine.sampling.logprobs import token_logprob


def logits(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_finite_logits_are_a_log_softmax() -> None:
    scored = token_logprob(logits(1.0, 2.0, 3.0), 2, 3)
    expected = 3.0 - math.log(math.exp(1) + math.exp(2) + math.exp(3))
    assert math.isclose(scored.logprob, expected, rel_tol=1e-6)
    assert [t for t, _ in scored.top] == [2, 1, 0]
    assert math.isclose(sum(math.exp(lp) for _, lp in scored.top), 1.0, rel_tol=1e-6)


def test_a_nan_logit_is_impossible_and_the_rest_normalised() -> None:
    scored = token_logprob(logits(1.0, math.nan, 3.0), 2, 3)
    expected = 3.0 - math.log(math.exp(1) + math.exp(3))
    assert math.isclose(scored.logprob, expected, rel_tol=1e-6)
    assert [t for t, _ in scored.top][:2] == [2, 0]
    assert all(not math.isnan(lp) for _, lp in scored.top)
    assert token_logprob(logits(1.0, math.nan, 3.0), 1, 0).logprob == -math.inf


def test_a_negative_infinite_logit_is_impossible() -> None:
    scored = token_logprob(logits(-math.inf, 0.0, 0.0), 1, 3)
    assert math.isclose(scored.logprob, math.log(0.5), rel_tol=1e-6)
    assert token_logprob(logits(-math.inf, 0.0, 0.0), 0, 0).logprob == -math.inf


def test_positive_infinite_logits_share_the_whole_mass() -> None:
    values = logits(1.0, math.inf, 3.0, math.inf, math.nan)
    assert math.isclose(token_logprob(values, 1, 0).logprob, math.log(0.5), rel_tol=1e-9)
    assert token_logprob(values, 2, 0).logprob == -math.inf
    top = token_logprob(values, 1, 5).top
    assert sorted(t for t, _ in top[:2]) == [1, 3]
    assert not any(math.isnan(lp) for _, lp in top)


def test_no_finite_logit_at_all() -> None:
    scored = token_logprob(logits(math.nan, -math.inf), 0, 2)
    assert scored.logprob == -math.inf
    assert not any(math.isnan(lp) for _, lp in scored.top)
