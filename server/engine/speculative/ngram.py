"""NgramDrafter: prompt lookup over one sequence's own tokens (prompt and generated ones).

For each order n (3, 2, 1), a dictionary maps every n-gram of the sequence to the position that
followed its latest occurrence. A draft continues the longest n-gram that ends the sequence from
that position: what the context said next the last time it said this. An agent's turn copies its
context (a patch repeats the lines it changes, a call repeats paths, an answer quotes a tool
result), so the drafts of copying text are long and right, those of other text rare and short.

Keys pack the tokens' ids (below 2**18) into one integer; the prompt is indexed with numpy in a
few passes, each generated token with one dictionary write per order. A lookup is one dictionary
read per order: microseconds, beside a model step of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ORDERS = (3, 2, 1)  # n-gram lengths, tried longest first
_BITS = 18  # o200k_harmony's 201,088 ids fit in 18 bits
_MASK = (1 << (_BITS * (max(ORDERS) - 1))) - 1


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: tuple[int, ...]
    order: int  # the length of the n-gram it continues (its acceptance is tracked per order)


class NgramDrafter:
    """The n-gram index of one sequence; append each token the sequence gets."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self._index: dict[int, dict[int, int]] = {n: {} for n in ORDERS}
        self._key = 0  # the last max(ORDERS) tokens, packed
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        if len(tokens) < 64:
            for token in tokens:
                self.append(token)
            return
        # numpy for long prompts: every n-gram's key, and the position that followed it
        start = len(self.tokens)
        self.tokens.extend(tokens)
        ids = np.asarray(self.tokens, dtype=np.int64)
        for n in ORDERS:
            first = max(start - n, 0)  # n-grams ending at start-1 and later (their next is new)
            window = ids[first:]
            if len(window) <= n:
                continue
            keys = np.zeros(len(window) - n + 1, dtype=np.int64)
            for j in range(n):
                keys = (keys << _BITS) | window[j : len(window) - n + 1 + j]
            follows = np.arange(first + n, first + n + len(keys), dtype=np.int64)
            index = self._index[n]
            # later occurrences overwrite earlier ones; the last n-gram has no follower yet
            index.update(zip(keys[:-1].tolist(), follows[:-1].tolist(), strict=True))
        key = 0
        for token in self.tokens[-max(ORDERS) :]:
            key = ((key & _MASK) << _BITS) | token
        self._key = key

    def append(self, token: int) -> None:
        """Add a token: each n-gram ending before it now has it as its follower."""
        position = len(self.tokens)
        key = self._key
        for n in ORDERS:
            if position >= n:
                self._index[n][key & ((1 << (_BITS * n)) - 1)] = position
        self.tokens.append(token)
        self._key = ((key & _MASK) << _BITS) | token

    def draft(self, limit: int) -> Draft | None:
        """Up to `limit` tokens continuing the longest n-gram ending the sequence, or None."""
        if limit <= 0:
            return None
        length = len(self.tokens)
        key = self._key
        for n in ORDERS:
            if length < n:
                continue
            follow = self._index[n].get(key & ((1 << (_BITS * n)) - 1))
            if follow is not None:
                return Draft(tuple(self.tokens[follow : follow + limit]), n)
        return None
