"""Chi-square tests of samplers: exact distributions, binning, goodness of fit, homogeneity.

Shared by the sampler, rejection, grammar-sampler and speculative-decoding tests. Critical values
at a significance of 1e-4 by the Wilson-Hilferty approximation; tokens are grouped so that every
group expects at least 20 draws.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from server.engine.base import SamplingParams

Floats = np.ndarray[Any, np.dtype[np.float32]]
Z_1E4 = 3.719016  # the standard normal's upper 1e-4 quantile


def critical_value(df: int, z: float = Z_1E4) -> float:
    """Chi-square upper quantile by the Wilson-Hilferty approximation; infinite with no degree
    of freedom (one group: the draws say nothing at this resolution, the statistic is 0)."""
    if df == 0:
        return math.inf
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def exact_distribution(logits: Floats, params: SamplingParams, banned: frozenset[int]) -> Any:
    """llama.cpp's chain in float64: bias, top-k, top-p and min-p at temperature 1, temperature."""
    x = logits.astype(np.float64)
    x[list(banned)] = -np.inf
    keep = np.isfinite(x)
    order = np.argsort(-x, kind="stable")
    if params.top_k > 0:
        keep[order[params.top_k :]] = False
    if params.top_p < 1.0:
        ranked = [i for i in order if keep[i]]
        probs = np.exp(x[ranked] - x[ranked[0]])
        cumsum = np.cumsum(probs / probs.sum())
        cut = int(np.searchsorted(cumsum, params.top_p, side="left")) + 1
        keep[:] = False
        keep[ranked[:cut]] = True
    if params.min_p > 0.0:
        keep &= x >= x[keep].max() + math.log(params.min_p)
    weights = np.where(keep, np.exp((x - x[keep].max()) / params.temperature), 0.0)
    return weights / weights.sum()


def bins_for(probs: Any, n_draws: int, min_expected: float = 20.0) -> list[np.ndarray[Any, Any]]:
    """Tokens grouped (likeliest first) so that every group expects at least `min_expected`."""
    order = [int(i) for i in np.argsort(-probs) if probs[i] > 0]
    groups: list[list[int]] = [[]]
    mass = 0.0
    for token in order:
        groups[-1].append(token)
        mass += probs[token]
        if mass * n_draws >= min_expected:
            groups.append([])
            mass = 0.0
    if not groups[-1] or mass * n_draws < min_expected:  # fold the short tail into the last
        tail = groups.pop()
        groups[-1].extend(tail)
    return [np.array(g) for g in groups]


def counts(draws: Sequence[int], n_vocab: int) -> Any:
    return np.bincount(np.asarray(draws), minlength=n_vocab)


def goodness_of_fit(draws: Sequence[int], probs: Any) -> tuple[float, float]:
    """(statistic, critical value) of the draws against the exact probabilities."""
    n = len(draws)
    observed = counts(draws, len(probs))
    groups = bins_for(probs, n)
    stat = sum((observed[g].sum() - n * probs[g].sum()) ** 2 / (n * probs[g].sum()) for g in groups)
    return float(stat), critical_value(len(groups) - 1)


def homogeneity(a: Sequence[int], b: Sequence[int], probs: Any) -> tuple[float, float]:
    """(statistic, critical value): do two samples come from one distribution?"""
    ca, cb = counts(a, len(probs)), counts(b, len(probs))
    groups = bins_for(probs, min(len(a), len(b)))
    stat = 0.0
    for g in groups:
        both = ca[g].sum() + cb[g].sum()
        for observed, total in ((ca[g].sum(), len(a)), (cb[g].sum(), len(b))):
            expected = both * total / (len(a) + len(b))
            stat += (observed - expected) ** 2 / expected
    return stat, critical_value(len(groups) - 1)
