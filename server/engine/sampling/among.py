"""Among: one token drawn among a few candidates (an allowed set of header tokens, or what top-k,
top-p and min-p kept), and the pieces the other samplers share for such draws.

`sample_among` follows llama.cpp's chain in its order: top-k, then top-p and min-p on the
probabilities at temperature 1, then the temperature and the draw (greedy below the temperatures
that act as greedy, sampling/temperature.py). Non-finite logits never crash it and never win
unless they should: NaN counts as -inf, a +inf logit takes all the mass (the first +inf under
greedy), and when no candidate has a finite logit the first candidate is taken. Weights are
exp((x - max) / T) in float64, the largest logit subtracted before the scaling, so no temperature
overflows them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from server.engine.base import SamplingParams
from server.engine.sampling.running_sums import Running
from server.engine.sampling.temperature import is_greedy

Floats = np.ndarray[Any, np.dtype[np.float32]]
Doubles = np.ndarray[Any, np.dtype[np.float64]]
Indices = np.ndarray[Any, np.dtype[np.intp]]


FEW = 8  # at most this many candidates at plain temperature: drawn in Python (`_few`)


def sample_among(
    logits: Floats, allowed: Sequence[int], params: SamplingParams, rng: np.random.Generator
) -> int:
    """A token of `allowed` drawn from `logits` with llama.cpp's stages, in llama.cpp's order."""
    plain = params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0.0
    if 1 < len(allowed) <= FEW and plain and not is_greedy(params.temperature):
        token = _few(logits, allowed, params.temperature, rng)
        if token is not None:
            return token
    return _staged(logits, allowed, params, rng)


def _few(
    logits: Floats, allowed: Sequence[int], temperature: float, rng: np.random.Generator
) -> int | None:
    """The draw of `_staged` at plain temperature among a few candidates, in Python floats:
    the same weights, running sums and uniform number (the exponential is libm's, numpy's may
    differ in the last bit). A header token is drawn right after a prefill, when numpy's dozen
    calls run cold (≈ 135 µs for two candidates). None when a logit is NaN or none is
    finite: `_staged` repairs those."""
    x = [float(logits[token]) for token in allowed]
    top = max(x)
    if not math.isfinite(top) or any(math.isnan(value) for value in x):
        return None
    weights = Running([math.exp((value - top) / temperature) for value in x])
    return int(allowed[weights.find(rng.random() * weights.mass)])


def _staged(
    logits: Floats, allowed: Sequence[int], params: SamplingParams, rng: np.random.Generator
) -> int:
    candidates = np.asarray(allowed, dtype=np.intp)
    x = logits[candidates].astype(np.float64)
    top = float(x.max())
    if not math.isfinite(top):  # NaN, +inf, or nothing finite: repaired on this copy
        top = repair(x)
        if not math.isfinite(top):  # +inf takes all the mass; with nothing finite, the first
            return int(candidates[int(np.argmax(x))])
    if is_greedy(params.temperature) or len(candidates) == 1:
        return int(candidates[int(np.argmax(x))])
    kept = np.arange(len(x))
    if 0 < params.top_k < len(kept):
        kept = np.argsort(-x, kind="stable")[: params.top_k]
    if params.top_p < 1.0:
        weights = np.exp(x[kept] - top)
        kept = nucleus(kept, weights, params.top_p * float(weights.sum()))
    if params.min_p > 0.0:  # p >= min_p * p_max, at temperature 1
        kept = kept[x[kept] >= top + math.log(params.min_p)]
    return int(candidates[kept[draw(tempered(x[kept], params.temperature), rng)]])


def repair(x: Doubles) -> float:
    """NaN to -inf in place; the largest value after that."""
    x[np.isnan(x)] = -math.inf
    return float(x.max()) if len(x) else -math.inf


def tempered(x: Doubles, temperature: float) -> Doubles:
    """The weights exp((x - max) / T) of candidate logits (NaN repaired to -inf in place).

    One-hot on the first largest logit when T acts as greedy or that logit is +inf; all zero
    when no logit is finite.
    """
    top = float(x.max()) if len(x) else -math.inf
    if not math.isfinite(top):
        top = repair(x)
    if top == math.inf or (is_greedy(temperature) and top > -math.inf):
        weights = np.zeros(len(x))
        weights[int(np.argmax(x))] = 1.0
        return weights
    if top == -math.inf:
        return np.zeros(len(x))
    return np.exp((x - top) / temperature)


def draw(weights: Doubles, rng: np.random.Generator) -> int:
    """An index drawn by `weights` (not all zero), with one uniform number."""
    cumsum = np.cumsum(weights)
    i = int(cumsum.searchsorted(rng.random() * cumsum[-1], side="right"))
    if i == len(weights):  # the draw rounded up to the total: the last index with weight
        i = int(np.flatnonzero(weights)[-1])
    return i


SORTED_NUCLEUS = 4096  # more candidates than this: the nucleus is cut by buckets first


def nucleus(kept: Indices, weights: Floats | Doubles, mass: float) -> Indices:
    """The most probable of `kept` whose `weights` (probabilities, any scale) add up to `mass`.

    As llama.cpp's top-p: sorted by probability, cut after the first token at which the running
    sum reaches the mass (p times the total), so at least one token is kept. Past
    SORTED_NUCLEUS candidates (a flat distribution: top-p 0.9 of random weights keeps most of
    the vocabulary, whose sort costs ≈ 11 ms), only the bucket the cut falls in is sorted
    (`_bucketed`).
    """
    if len(kept) > SORTED_NUCLEUS:
        return _bucketed(kept, weights, mass)
    return kept[_sorted_cut(weights, mass)]


def _sorted_cut(weights: Floats | Doubles, mass: float) -> Indices:
    """The positions of the nucleus of `weights`: sorted, cut where their sum reaches `mass`."""
    order = np.argsort(weights)[::-1]  # ties in any order, as llama.cpp's partial sort
    cumsum = np.cumsum(weights[order], dtype=np.float64)
    cut = int(cumsum.searchsorted(mass, side="left")) + 1
    return order[: min(cut, len(order))]


def _bucketed(kept: Indices, weights: Floats | Doubles, mass: float) -> Indices:
    """The nucleus by buckets of the weights: the float32 bit pattern of a weight (≥ 0) over
    2^16 orders its buckets as the weights (its exponent and 7 bits of mantissa). The buckets'
    masses, summed from the heaviest, tell which bucket the cut falls in: every weight of a
    heavier bucket is kept, and only that bucket's are sorted to cut it as `_sorted_cut`."""
    keys = np.asarray(weights, dtype=np.float32).view(np.int32) >> 16
    masses = np.bincount(keys, weights=np.asarray(weights, dtype=np.float64))
    from_top = np.cumsum(masses[::-1])
    last = min(int(from_top.searchsorted(mass, side="left")), len(masses) - 1)
    bucket = len(masses) - 1 - last  # the cut's bucket
    above = mass - (float(from_top[last - 1]) if last > 0 else 0.0)
    heavier = np.flatnonzero(keys > bucket)
    inside = np.flatnonzero(keys == bucket)
    cut = inside[_sorted_cut(weights[inside], above)]
    return kept[np.concatenate((heavier, cut))]
