"""The numpy sampler draws from the same distribution as llama.cpp's sampler chain.

Chi-square tests over many draws on fixed logits, with fixed seeds (so the outcome is the same
on every run) and a significance of 1e-4: the sampler against the exact distribution computed
here in float64, and against draws of llama.cpp's own chain (logit bias, top-k, top-p, min-p,
temperature, dist) applied to the same logits through the C API. Each test also shows that it
can fail: draws at a slightly different temperature are rejected.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import warnings
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np
import pytest

from server.engine.base import SamplingParams
from server.engine.sampling.banned import Banned, banned_of
from server.engine.sampling.llama_chain import chain_seed, sampler_stages
from server.engine.sampling.numpy_sampler import NumpySampler, Workspace
from server.engine.sampling.temperature import is_greedy
from tests.support.chi_square import (
    exact_distribution,
    goodness_of_fit,
    homogeneity,
)

Floats = np.ndarray[Any, np.dtype[np.float32]]
VOCAB = 3000
BLOCK = 64  # small blocks: the draw crosses many of them
BANNED = frozenset(range(2900, 3000)) | {5, 17, 18, 19}


def fixed_logits(n: int = VOCAB, seed: int = 7) -> Floats:
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, n)
    logits[rng.choice(n, 20, replace=False)] += 6.0  # a few likely tokens, as a model has
    logits[5], logits[17] = 12.0, 11.0  # banned tokens that would otherwise take most mass
    return logits.astype(np.float32)


def our_draws(
    logits: Floats, params: SamplingParams, banned: frozenset[int], n: int, block: int = BLOCK
) -> list[int]:
    sampler = NumpySampler(
        Workspace(len(logits), block), params, np.random.default_rng(params.seed)
    )
    mask = Banned.of(banned, len(logits)) if banned else None
    return [sampler.sample(logits, mask) for _ in range(n)]


def llama_draws(
    logits: Floats, params: SamplingParams, banned: frozenset[int], n: int
) -> list[int]:
    """Draws of llama.cpp's chain (as LlamaContext builds it) applied to the same logits."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if banned:
        ids = sorted(banned)
        biases = (lc.llama_logit_bias * len(ids))(*(lc.llama_logit_bias(t, -math.inf) for t in ids))
        lc.llama_sampler_chain_add(
            chain, lc.llama_sampler_init_logit_bias(len(logits), len(ids), biases)
        )
    for stage in sampler_stages(params, chain_seed(np.random.default_rng(params.seed))):
        lc.llama_sampler_chain_add(chain, stage)
    template = (lc.llama_token_data * len(logits))(
        *(lc.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits))
    )
    data = (lc.llama_token_data * len(logits))()
    array = lc.llama_token_data_array(data, len(logits), -1, False)
    out = []
    try:
        for _ in range(n):
            ctypes.memmove(data, template, ctypes.sizeof(template))
            array.size, array.selected, array.sorted = len(logits), -1, False
            lc.llama_sampler_apply(chain, ctypes.byref(array))
            out.append(int(data[array.selected].id))
    finally:
        lc.llama_sampler_free(chain)
    return out


CASES = {
    "temperature": SamplingParams(max_tokens=1, temperature=0.8, seed=1),
    "temperature-1": SamplingParams(max_tokens=1, temperature=1.0, seed=2),
    "top-k": SamplingParams(max_tokens=1, temperature=1.3, top_k=40, seed=3),
    "top-p": SamplingParams(max_tokens=1, temperature=0.9, top_p=0.8, seed=4),
    "top-k-top-p": SamplingParams(max_tokens=1, temperature=1.0, top_k=200, top_p=0.9, seed=5),
    "min-p": SamplingParams(max_tokens=1, temperature=1.1, min_p=0.02, seed=6),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("banned", [frozenset(), BANNED], ids=["open", "banned"])
def test_draws_follow_the_exact_distribution(case: str, banned: frozenset[int]) -> None:
    logits, params = fixed_logits(), CASES[case]
    probs = exact_distribution(logits, params, banned)
    draws = our_draws(logits, params, banned, 10_000)
    assert not banned & set(draws)
    assert all(probs[t] > 0 for t in set(draws))  # nothing outside what the stages keep
    stat, critical = goodness_of_fit(draws, probs)
    assert stat < critical, f"{case}: chi-square {stat:.1f} >= {critical:.1f}"
    # the test can fail: the same draws do not fit a slightly different temperature
    other = exact_distribution(logits, _at(params, params.temperature * 1.15), banned)
    wrong, critical = goodness_of_fit(draws, other)
    assert wrong > critical


@pytest.mark.parametrize("case", ["temperature", "top-k", "top-p", "min-p"])
def test_draws_match_llama_cpp_chain(case: str) -> None:
    logits, params = fixed_logits(), CASES[case]
    probs = exact_distribution(logits, params, BANNED)
    ours = our_draws(logits, params, BANNED, 10_000)
    theirs = llama_draws(logits, params, BANNED, 10_000)
    assert not BANNED & set(theirs)
    stat, critical = homogeneity(ours, theirs, probs)
    assert stat < critical, f"{case}: chi-square {stat:.1f} >= {critical:.1f}"
    hotter = llama_draws(logits, _at(params, params.temperature * 1.15), BANNED, 10_000)
    assert homogeneity(ours, hotter, probs)[0] > critical


def test_full_vocabulary_with_harmony_specials_banned() -> None:
    """The real shape: 201,088 logits, the specials' tail banned, default blocks."""
    n_vocab, first_special = 201_088, 199_998
    logits = fixed_logits(n_vocab, seed=11)
    logits[first_special + 9] = 50.0  # a banned special the model likes
    banned = frozenset(range(first_special, n_vocab)) - {200_002}
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=12)
    probs = exact_distribution(logits, params, banned)
    draws = our_draws(logits, params, banned, 4_000, block=1024)
    assert not banned & set(draws)
    stat, critical = goodness_of_fit(draws, probs)
    assert stat < critical


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    logits = fixed_logits()
    for params in CASES.values():
        first = our_draws(logits, params, BANNED, 200)
        assert our_draws(logits, params, BANNED, 200) == first
        assert our_draws(logits, _seeded(params, (params.seed or 0) + 100), BANNED, 200) != first


def test_greedy_is_the_first_largest_allowed_logit() -> None:
    logits = fixed_logits()
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    assert our_draws(logits, greedy, frozenset(), 1) == [5]
    logits[17] = logits[5]
    assert our_draws(logits, greedy, frozenset(), 1) == [5]  # a tie: the first
    allowed = np.where(np.isin(np.arange(VOCAB), list(BANNED)), -np.inf, logits)
    assert our_draws(logits, greedy, BANNED, 1) == [int(np.argmax(allowed))]


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-45, 1e-40, 1e-38, 1e-30])
@pytest.mark.parametrize("case", sorted(CASES))
def test_temperatures_whose_scaling_overflows_are_greedy(case: str, temperature: float) -> None:
    """1/T or logits/T overflow float32 or float64 there: the numpy sampler and llama.cpp's
    chain (as sampler_stages builds it) both take the argmax, banned tokens aside."""
    logits = fixed_logits()
    params = _at(CASES[case], temperature)
    allowed = np.where(np.isin(np.arange(VOCAB), list(BANNED)), -np.inf, logits)
    with warnings.catch_warnings():
        # greedy: nothing is scaled, nothing overflows; at 1e-30 the rejection draws' banned
        # proposals overflow exp (an infinite weight), and are rejected as banned
        warnings.simplefilter("error" if is_greedy(temperature) else "ignore", RuntimeWarning)
        assert set(our_draws(logits, params, BANNED, 20)) == {int(np.argmax(allowed))}
    assert set(llama_draws(logits, params, BANNED, 5)) == {int(np.argmax(allowed))}


@pytest.mark.parametrize("banned", [frozenset(), BANNED], ids=["open", "banned"])
def test_greedy_never_takes_nan(banned: frozenset[int]) -> None:
    """numpy's argmax returns the first NaN: greedy takes the first largest finite logit."""
    logits = fixed_logits()
    logits[[0, 1, 700, 2950]] = np.nan
    allowed = np.where(np.isin(np.arange(VOCAB), list(banned)), -np.inf, logits)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    assert our_draws(logits, greedy, banned, 3) == [int(np.nanargmax(allowed))] * 3


@pytest.mark.parametrize("params", [CASES["temperature"], CASES["top-p"], CASES["top-k"]])
def test_malformed_logits_are_survived(params: SamplingParams) -> None:
    logits = fixed_logits()
    logits[[1, 2, 3]] = np.nan
    draws = our_draws(logits, params, BANNED, 500)
    assert not {1, 2, 3} & set(draws)
    logits[42] = np.inf  # an infinite logit takes all the mass
    assert set(our_draws(logits, params, BANNED, 50)) == {42}
    everything = frozenset(range(VOCAB))  # nothing allowed: some token, no crash
    assert len(our_draws(logits, params, everything, 3)) == 3


def test_banned_runs_and_scattered_ids() -> None:
    runs = Banned.of(BANNED | {VOCAB + 5, -1}, VOCAB)
    assert runs.runs == ((5, 6), (17, 20), (2900, 3000))
    assert runs.allowed == ((0, 5), (6, 17), (20, 2900))
    assert not runs.scattered
    scattered = Banned.of(range(0, VOCAB, 7), VOCAB)
    values = np.zeros(VOCAB, dtype=np.float32)
    scattered.apply(values, -1.0)
    assert np.flatnonzero(values).tolist() == list(range(0, VOCAB, 7))


def test_a_banned_set_is_laid_out_once_for_every_generation() -> None:
    shared = banned_of(frozenset(BANNED), VOCAB)
    assert shared is banned_of(frozenset(BANNED), VOCAB)  # the next generation's
    assert shared is not None
    assert shared.runs == Banned.of(BANNED, VOCAB).runs
    with pytest.raises(ValueError, match="read-only"):
        shared.ids[0] = 1  # shared, so nobody may change it
    assert banned_of(frozenset(), VOCAB) is None


def _at(params: SamplingParams, temperature: float) -> SamplingParams:
    return dataclasses.replace(params, temperature=temperature)


def _seeded(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed)


def test_chain_seeds_are_never_llama_default_seed() -> None:
    """llama.cpp draws at random with LLAMA_DEFAULT_SEED: a chain never gets it."""
    params = CASES["temperature"]
    with pytest.raises(ValueError, match="not a 32-bit seed"):
        sampler_stages(params, lc.LLAMA_DEFAULT_SEED)
    for seed in (2**32 - 1, 2**64 - 1, 2**33 - 1, 0):
        seeds = [chain_seed(np.random.default_rng(seed)) for _ in range(2)]
        assert seeds[0] == seeds[1]
        assert 0 <= seeds[0] < lc.LLAMA_DEFAULT_SEED
    assert chain_seed(np.random.default_rng(1)) != chain_seed(np.random.default_rng(1 + 2**32))
