"""Many independent draws from one token distribution, on the sampling workspace's block sums.

The distribution is the logits at a temperature with banned tokens removed, as the numpy
sampler's (sampling/numpy_sampler.py) full draw: the weights are exponentiated in place in the
workspace, summed per block of the vocabulary, and each draw picks a block by the running block
sums and a token inside it by the cumulative sum of that block alone; the blocks that several
draws need are summed once, together.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.engine.sampling.banned import Banned
from server.engine.sampling.numpy_sampler import Workspace

Tokens = np.ndarray[Any, np.dtype[np.int64]]


class BlockDraws:
    """Draws for one generation (its temperature and generator); the buffers are borrowed."""

    def __init__(self, workspace: Workspace, temperature: float, rng: np.random.Generator):
        self._ws = workspace
        self._scale = np.float32(1.0 / temperature)
        self._rng = rng

    def prepare(self, logits: np.ndarray[Any, np.dtype[np.float32]], banned: Banned | None) -> bool:
        """Load the distribution of `logits`; False when no token has a finite logit."""
        return self._ws.exponentiate(logits, self._scale, banned)

    def draw(self, n: int) -> Tokens:
        """`n` tokens drawn independently from the prepared distribution, in the order drawn."""
        ws = self._ws
        targets = self._rng.random(n) * float(ws.block_cumsum[-1])
        blocks = ws.block_cumsum.searchsorted(targets, side="right")
        last = len(ws.block_sums)
        if (blocks == last).any():  # a draw rounded up to the total: the last block with mass
            top = int(np.flatnonzero(ws.block_sums)[-1])
            targets[blocks == last] = ws.block_cumsum[top]
            blocks[blocks == last] = top
        below = np.where(blocks > 0, ws.block_cumsum[blocks - 1], 0.0)
        needed, row_of = np.unique(blocks, return_inverse=True)
        sums = np.cumsum(ws.blocks[needed], axis=1, dtype=np.float64)
        inner = (sums[row_of] <= (targets - below)[:, None]).sum(axis=1)
        for i in np.flatnonzero(inner == ws.block):  # the float32 block sum ran a little high
            inner[i] = int(np.flatnonzero(ws.blocks[blocks[i]])[-1])
        return np.asarray(blocks * ws.block + inner, dtype=np.int64)
