"""Sampling among a few candidates (sampling/among.py) and the temperatures that act as greedy
(sampling/temperature.py): llama.cpp's stages in llama.cpp's order, checked by chi-square
against the exact distribution (tests/support/chi_square.py, significance 1e-4, fixed seeds),
and non-finite logits that never crash a draw, never leave the allowed set, never win as NaN.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from server.engine.base import SamplingParams
from server.engine.sampling import among
from server.engine.sampling.among import sample_among, tempered
from server.engine.sampling.temperature import GREEDY_BELOW, is_greedy
from tests.support.chi_square import exact_distribution, goodness_of_fit

Floats = np.ndarray[Any, np.dtype[np.float32]]
N_VOCAB = 64
ALLOWED = (3, 9, 10, 20, 33, 40, 41, 63)
VALUES = [2.0, 1.6, 1.5, 1.0, 0.2, -0.5, -1.0, -3.0]
NAN, INF = math.nan, math.inf


def logits_with(values: list[float], allowed: tuple[int, ...] = ALLOWED) -> Floats:
    logits = np.full(N_VOCAB, 50.0, dtype=np.float32)  # outside the set: likelier than any
    logits[list(allowed)] = values
    return logits


def draws(
    logits: Floats, params: SamplingParams, n: int, allowed: tuple[int, ...] = ALLOWED
) -> list[int]:
    rng = np.random.default_rng(params.seed)
    return [sample_among(logits, allowed, params, rng) for _ in range(n)]


CASES = {
    "temperature": SamplingParams(max_tokens=1, temperature=0.7, seed=1),
    "top-k": SamplingParams(max_tokens=1, temperature=1.5, top_k=3, seed=2),
    # at temperature 1 top-p keeps 3 tokens, at temperature 2 it would keep 4
    "top-p before temperature": SamplingParams(max_tokens=1, temperature=2.0, top_p=0.7, seed=3),
    "min-p": SamplingParams(max_tokens=1, temperature=1.0, min_p=0.3, seed=4),
    "all": SamplingParams(max_tokens=1, temperature=1.3, top_k=6, top_p=0.9, min_p=0.1, seed=5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_draws_follow_llama_cpp_order(case: str) -> None:
    params, logits = CASES[case], logits_with(VALUES)
    outside = frozenset(range(N_VOCAB)) - set(ALLOWED)
    probs = exact_distribution(logits, params, outside)
    drawn = draws(logits, params, 8000)
    assert {t for t in drawn if probs[t] == 0} == set()
    stat, critical = goodness_of_fit(drawn, probs)
    assert stat < critical, f"{case}: chi-square {stat:.1f} >= {critical:.1f}"
    # the test can fail: the draws do not fit the stages left out, or another temperature
    staged = params.top_k > 0 or params.top_p < 1.0 or params.min_p > 0.0
    temperature = params.temperature * (1.0 if staged else 1.5)
    other = exact_distribution(
        logits, SamplingParams(max_tokens=1, temperature=temperature), outside
    )
    wrong, critical = goodness_of_fit(drawn, other)
    assert wrong > critical


@pytest.mark.parametrize("temperature", [0.0, 1e-300, 5e-324, 1e-40, 0.8])
@pytest.mark.parametrize(
    ("values", "may"),
    [
        ([NAN, 1.0, 2.0, NAN], {9, 10}),
        ([1.0, INF, NAN, 2.0], {9}),
        ([INF, 1.0, INF, NAN], {3, 10}),
        ([-INF, -INF, 0.5, -INF], {10}),
        ([NAN, -INF, NAN, -INF], {3, 9, 10, 20}),
    ],
    ids=["nan", "inf", "two-inf", "-inf", "nothing-finite"],
)
def test_non_finite_logits(values: list[float], may: set[int], temperature: float) -> None:
    allowed = ALLOWED[:4]
    logits = logits_with(values, allowed)
    for params in (
        SamplingParams(max_tokens=1, temperature=temperature, seed=6),
        SamplingParams(max_tokens=1, temperature=temperature, top_k=2, top_p=0.5, seed=7),
        SamplingParams(max_tokens=1, temperature=temperature, min_p=0.2, seed=8),
    ):
        assert set(draws(logits, params, 50, allowed)) <= may


def test_greedy_takes_the_first_largest_finite_logit() -> None:
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    assert draws(logits_with([NAN, 1.0, 2.0, 2.0], ALLOWED[:4]), greedy, 1, ALLOWED[:4]) == [10]
    tiny = SamplingParams(max_tokens=1, temperature=GREEDY_BELOW / 2, seed=1)
    assert set(draws(logits_with(VALUES), tiny, 20)) == {3}


def test_the_temperatures_that_act_as_greedy() -> None:
    assert all(is_greedy(t) for t in (0.0, -1.0, NAN, 5e-324, 1e-300, 1e-45, 1e-38, 9.9e-31))
    assert not any(is_greedy(t) for t in (GREEDY_BELOW, 1e-6, 0.7, 2.0))
    x = np.array([1.0, 3.0, NAN, 3.0, -INF])
    assert tempered(x.copy(), 1e-300).tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    weights = tempered(x.copy(), GREEDY_BELOW)  # the smallest sampled temperature: no overflow
    assert weights.tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert tempered(np.array([NAN, -INF]), 1.0).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_a_few_candidates_are_drawn_in_python_as_numpy_draws_them(n: int) -> None:
    """At plain temperature up to eight candidates are drawn with Python floats (`_few`): the
    same token as the numpy draw (`_staged`) for the same uniform number, draw after draw."""
    source = np.random.default_rng(n)
    params = SamplingParams(max_tokens=1, temperature=0.8)
    for _ in range(300):
        allowed = tuple(sorted(source.choice(N_VOCAB, n, replace=False).tolist()))
        logits = (source.standard_normal(N_VOCAB) * 3).astype(np.float32)
        logits[allowed[0]] = -np.inf  # a candidate without weight is never drawn
        seed = int(source.integers(1 << 31))
        few = among._few(logits, allowed, params.temperature, np.random.default_rng(seed))
        staged = among._staged(logits, allowed, params, np.random.default_rng(seed))
        assert few == staged
        assert few != allowed[0]
    nan = logits_with([NAN, 1.0, 2.0, NAN, 0.0, 0.0, 0.0, 0.0])
    assert among._few(nan, ALLOWED, 1.0, np.random.default_rng(0)) is None  # left to numpy


def nucleus_weights(kind: str, n: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(len(kind) + n)
    if kind == "flat":  # random weights' distribution: top-p keeps most of it
        return np.exp(rng.normal(0.0, 1.0, n) - 5.0).astype(np.float32)
    if kind == "float64 with zeros and ties":
        weights = np.exp(rng.normal(0.0, 3.0, n))
        weights[rng.choice(n, n // 10, replace=False)] = 0.0
        weights[rng.choice(n, n // 10, replace=False)] = 0.5  # many equal: ties in a bucket
        return weights
    weights = np.exp(rng.normal(-12.0, 2.0, n)).astype(np.float32)  # peaked: a few carry it
    weights[rng.choice(n, 20, replace=False)] = rng.uniform(0.2, 1.0, 20)
    return weights


@pytest.mark.parametrize("kind", ["flat", "float64 with zeros and ties", "peaked"])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.9, 0.999, 1.0 + 1e-9])
def test_a_large_nucleus_cut_by_buckets_is_the_sorted_one(kind: str, p: float) -> None:
    """Past SORTED_NUCLEUS candidates the nucleus is cut by buckets of the weights: the same
    tokens as sorting them all (ties at the cut may be taken in any order, as llama.cpp's)."""
    n = 3 * among.SORTED_NUCLEUS
    weights = nucleus_weights(kind, n)
    kept = np.arange(1000, 1000 + n)
    mass = p * float(weights.sum(dtype=np.float64))
    cut = among.nucleus(kept, weights, mass)
    reference = kept[among._sorted_cut(weights, mass)]
    assert len(cut) == len(reference)
    chosen, expected = weights[cut - 1000], weights[reference - 1000]
    assert sorted(chosen.tolist()) == sorted(expected.tolist())  # equal up to ties' order
    assert float(chosen.sum(dtype=np.float64)) >= mass * (1 - 1e-12) or len(cut) == n
    if len(np.unique(expected)) == len(expected) and float(expected.min()) != 0.5:
        assert set(cut.tolist()) == set(reference.tolist())
