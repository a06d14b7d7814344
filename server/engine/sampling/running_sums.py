"""A draw by running sums over blocks of weights: the block where the running sum of the block
sums passes the target, then the position inside it by that block's own running sum. The full
draw over the vocabulary (numpy_sampler.py) and the draw among many candidates (rejection.py)
both go this way: float32 weights and block sums, float64 running sums. A few weights
(`Running`: a header token's candidates, a peaked draw's few) go by one running sum in Python
floats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Weights = np.ndarray[Any, np.dtype[np.floating[Any]]]
Doubles = np.ndarray[Any, np.dtype[np.float64]]


def find_in_blocks(
    target: float,
    sums: Weights,
    running: Doubles,
    row_of: Callable[[int], Weights],
    inner: Doubles | None = None,
) -> tuple[int, int]:
    """(block, position in it) where the running sum of the weights passes `target` (below the
    total), among the positions with weight. `sums`: each block's sum; `running`: their float64
    running sums; `row_of(b)`: block b's weights; `inner`: a buffer for a block's running sum."""
    # the first block whose running sum passes the draw (it has mass: a block without any
    # leaves the running sum unchanged, so an earlier block would pass first)
    b = int(running.searchsorted(target, side="right"))
    if b == len(sums):  # the draw rounded up to the total: the last block with weight
        b = int(np.flatnonzero(sums)[-1])
        target = float(running[b])
    row = row_of(b)
    cumulative = np.cumsum(row, dtype=np.float64, out=inner)
    below = float(running[b - 1]) if b else 0.0
    j = int(cumulative.searchsorted(target - below, side="right"))
    if j == len(row):  # the block's float32 sum was a little above its exact running sum
        j = int(np.flatnonzero(row)[-1])
    return b, j


class Running:
    """A few weights' running sum in Python floats, and the draw by it: for a handful of
    candidates, numpy's calls on cold caches cost more than the weights themselves."""

    def __init__(self, weights: list[float]) -> None:
        self.weights = weights
        self.running: list[float] = []
        total = 0.0
        for weight in weights:
            total += weight
            self.running.append(total)
        self.mass = total

    def find(self, target: float) -> int:
        """The position where the running sum passes `target` (< mass), among those with
        weight (the last of them when the draw rounded up to the total)."""
        for position, upto in enumerate(self.running):
            if upto > target:
                return position
        return max(i for i, weight in enumerate(self.weights) if weight > 0)
