"""NumpySampler: exact token sampling in numpy, straight from llama.cpp's logits buffer.

llama.cpp's sampler chain (temperature, then the random draw) builds and normalises a candidate
array of the whole vocabulary (201,088 entries for gpt-oss) on every token. This draws from the
same distribution, most often without reading more than a few hundred logits: a rejection draw
(sampling/rejection.py) proposes tokens and accepts them by their weight. When it gives up, the
full draw takes a few vectorised passes over preallocated buffers and no sort: the logits are
scaled into a work buffer, banned tokens set to -inf, the maximum subtracted and the exponential
taken in place; one uniform draw then picks a block of the vocabulary by its block sums, and
the token inside that block by a cumulative sum of that block only.

The other stages of llama.cpp's chain keep their order and meaning (top-k, then top-p and min-p
on the probabilities at temperature 1, then temperature): top-k and top-p select candidates by
partial selection (`np.argpartition`), never a full sort, and the draw among the few candidates
left is the same cumulative-sum search (sampling/among.py). Greedy decoding (temperature 0, and
the temperatures that act as greedy: sampling/temperature.py) is an argmax that never takes a
NaN; so is a full draw whose scaled logits are not finite (a +inf logit, or a temperature so small
that logits / T overflows float32: the distribution is the argmax there anyway).

A sampler belongs to one generation (its parameters and seeded generator: the same seed gives
the same tokens); the `Workspace` buffers are shared by every generation of the engine thread.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from server.engine.base import SamplingParams
from server.engine.sampling.among import draw, nucleus, tempered
from server.engine.sampling.banned import Banned
from server.engine.sampling.rejection import Outcomes, RejectionDraw
from server.engine.sampling.running_sums import find_in_blocks
from server.engine.sampling.temperature import is_greedy

Floats = np.ndarray[Any, np.dtype[np.float32]]
Doubles = np.ndarray[Any, np.dtype[np.float64]]
Indices = np.ndarray[Any, np.dtype[np.intp]]

BLOCK = 1024  # vocabulary entries per block of the two-level draw
NUCLEUS_GAPS = (2.0, 4.0, 8.0, 16.0, 32.0)  # top-p candidates: logits within this of the top
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Workspace:
    """Preallocated buffers for sampling over a vocabulary; used by one thread at a time."""

    def __init__(self, n_vocab: int, block: int = BLOCK) -> None:
        self.n_vocab = n_vocab
        self.block = block
        n_blocks = -(-n_vocab // block)
        self._work = np.zeros(n_blocks * block, dtype=np.float32)  # the padding stays 0
        self.values: Floats = self._work[:n_vocab]
        self.blocks: Floats = self._work.reshape(n_blocks, block)
        self.weights: Floats = np.zeros(n_vocab, dtype=np.float32)
        self.block_sums: Floats = np.zeros(n_blocks, dtype=np.float32)
        self.block_cumsum: Doubles = np.zeros(n_blocks, dtype=np.float64)
        self.inner_cumsum: Doubles = np.zeros(block, dtype=np.float64)

    def masked(self, logits: Floats, banned: Banned | None, scale: np.float32 | None) -> Floats:
        """The logits (times `scale`) in the work buffer, banned tokens at -inf."""
        values = self.values
        if scale is None or scale == 1.0:
            np.copyto(values, logits)
        else:
            np.multiply(logits, scale, out=values)
        if banned is not None:
            banned.apply(values, -math.inf)
        return values

    def exponentiate(
        self, logits: Floats, scale: np.float32, banned: Banned | None, top: float | None = None
    ) -> bool:
        """Load the weights exp(scale * logits - max), banned tokens at 0, into the work buffer,
        with their block sums and the running sums of those (NaN logits weigh 0). False when
        the largest scaled logit is not finite (+inf, or no logit finite): the distribution is
        then the argmax of the logits, which the caller takes.

        `top`, when the caller knows it (finite: the largest logit that is not banned, so none
        of those is NaN or +inf), saves the pass for the maximum and one more: the weights are
        then exp((logits - top) · scale), the subtraction made on the way into the buffer."""
        if top is not None:
            values = self.values
            np.subtract(logits, np.float32(top), out=values)
            if scale != 1.0:
                np.multiply(values, scale, out=values)
            if banned is not None:
                banned.apply(values, -math.inf)
            self._sum_exponentials(values)
            return True
        values = self.masked(logits, banned, scale)
        top = float(values.max())
        if not math.isfinite(top):  # NaN, +inf (a logit, or one scaled past float32) or none
            np.nan_to_num(values, copy=False, nan=-np.inf, posinf=np.inf, neginf=-np.inf)
            top = float(values.max())
            if not math.isfinite(top):
                return False
        np.subtract(values, top, out=values)
        self._sum_exponentials(values)
        return True

    def _sum_exponentials(self, values: Floats) -> None:
        np.exp(values, out=values)
        np.add.reduce(self.blocks, axis=1, out=self.block_sums)
        np.cumsum(self.block_sums, dtype=np.float64, out=self.block_cumsum)


class NumpySampler:
    """One generation's sampling from logits: params and a seeded generator, buffers borrowed."""

    def __init__(
        self,
        workspace: Workspace,
        params: SamplingParams,
        rng: np.random.Generator,
        rejection: bool = True,
    ) -> None:
        self._ws = workspace
        self._rng = rng
        self._temperature = params.temperature
        self._greedy = is_greedy(params.temperature)
        self._scale = np.float32(1.0 if self._greedy else 1.0 / params.temperature)
        self._top_k = params.top_k if 0 < params.top_k < workspace.n_vocab else 0
        self._top_p = params.top_p
        self._min_p = params.min_p
        self._full = self._top_k == 0 and self._top_p >= 1.0 and self._min_p <= 0.0
        self._rejection = (
            RejectionDraw(workspace.n_vocab, params.temperature, rng)
            if rejection and self._full and not self._greedy
            else None
        )

    @property
    def rejection_outcomes(self) -> Outcomes | None:
        """How the rejection draws went (None when this sampler makes none)."""
        return self._rejection.outcomes if self._rejection is not None else None

    def sample(self, logits: Floats, banned: Banned | None = None) -> int:
        """A token drawn from `logits`; never a banned one while any other has a finite logit."""
        if self._greedy:
            return self._argmax(logits, banned)
        if self._full:
            if self._rejection is None:
                return self._draw_full(logits, banned)
            token = self._rejection.draw(logits, banned)
            return (
                token if token is not None else self._draw_full(logits, banned, self._rejection.top)
            )
        kept, kept_logits = self._candidates(logits, banned)
        return self._draw_among(kept, kept_logits)

    def _argmax(self, logits: Floats, banned: Banned | None) -> int:
        """Greedy: the first largest logit (as llama.cpp's greedy sampler), banned ones and NaN
        aside (numpy's argmax returns the first NaN: only then are the logits repaired)."""
        token = int(np.argmax(logits))
        if (banned is None or token not in banned.tokens) and not math.isnan(logits[token]):
            return token
        values = self._ws.masked(logits, banned, None)
        np.nan_to_num(values, copy=False, nan=-np.inf, posinf=np.inf, neginf=-np.inf)
        return int(np.argmax(values))

    def _draw_full(self, logits: Floats, banned: Banned | None, top: float | None = None) -> int:
        """Temperature and the random draw over the whole vocabulary (`top`: the largest allowed
        logit, when the rejection draw found it finite)."""
        ws = self._ws
        if not ws.exponentiate(logits, self._scale, banned, top):
            return self._argmax(logits, banned)
        target = self._rng.random() * float(ws.block_cumsum[-1])
        b, j = find_in_blocks(
            target, ws.block_sums, ws.block_cumsum, ws.blocks.__getitem__, ws.inner_cumsum
        )
        return b * ws.block + j

    def _candidates(self, logits: Floats, banned: Banned | None) -> tuple[Indices, Doubles]:
        """What top-k, then top-p, then min-p keep (llama.cpp's order), with their logits."""
        values = self._ws.masked(logits, banned, None)
        top = _finite_max(values)
        if top is None:
            token = np.array([int(np.argmax(values))], dtype=np.intp)
            return token, np.zeros(1)
        if self._top_k:
            kept = self._top_k_of(values)
            if self._top_p < 1.0:
                weights = np.exp(values[kept].astype(np.float64) - top)
                kept = nucleus(kept, weights, self._top_p * float(weights.sum()))
        elif self._top_p < 1.0:
            kept = self._nucleus_of_all(values, top)
        else:
            kept = np.flatnonzero(values >= top + math.log(self._min_p))
        kept_logits = values[kept].astype(np.float64)
        if self._min_p > 0.0:  # p >= min_p * p_max, on the logits at temperature 1
            keep = kept_logits >= top + math.log(self._min_p)
            kept, kept_logits = kept[keep], kept_logits[keep]
        finite = kept_logits > -math.inf  # top-k may reach banned tokens
        return kept[finite], kept_logits[finite]

    def _top_k_of(self, values: Floats) -> Indices:
        """The indices of the k largest values, by partial selection among a few candidates.

        The k-th largest of k blocks' maxima is at most the k-th largest value: every value at
        or above it is a candidate (at least k of them, usually few more).
        """
        k, block = self._top_k, self._ws.block
        n_full = len(values) // block
        if n_full >= k:
            maxima = values[: n_full * block].reshape(n_full, block).max(axis=1)
            threshold = np.partition(maxima, n_full - k)[n_full - k]
            candidates = np.flatnonzero(values >= threshold)
        else:
            candidates = np.arange(len(values))
        m = len(candidates)
        return candidates[np.argpartition(values[candidates], m - k)[m - k :]]

    def _nucleus_of_all(self, values: Floats, top: float) -> Indices:
        """Top-p over the whole vocabulary: candidates within a growing gap of the top logit
        until they hold p of the mass; only those are sorted."""
        weights = self._ws.weights
        np.subtract(values, top, out=weights)
        np.exp(weights, out=weights)  # the probabilities at temperature 1, times their sum
        mass = self._top_p * float(np.sum(weights, dtype=np.float64))
        for gap in NUCLEUS_GAPS:
            kept = np.flatnonzero(weights >= math.exp(-gap))
            kept_weights = weights[kept]
            if float(np.sum(kept_weights, dtype=np.float64)) >= mass:
                return nucleus(kept, kept_weights, mass)
        kept = np.flatnonzero(weights > 0.0)
        return nucleus(kept, weights[kept], mass)

    def _draw_among(self, kept: Indices, kept_logits: Doubles) -> int:
        """Temperature and the random draw over a few candidates."""
        if len(kept) == 1:
            return int(kept[0])
        return int(kept[draw(tempered(kept_logits, self._temperature), self._rng)])


def _finite_max(values: Floats) -> float | None:
    """The largest value, after repairing NaN (to -inf) and +inf (to float32's max) in place.

    None when no value is finite (every token banned): the caller then takes the argmax.
    """
    top = float(values.max())
    if math.isfinite(top):
        return top
    np.nan_to_num(values, copy=False, nan=-np.inf, posinf=_FLOAT32_MAX, neginf=-np.inf)
    top = float(values.max())
    return top if math.isfinite(top) else None
