"""NgramDrafter: prompt lookup over one sequence's own tokens (prompt and generated ones).

For each order n (6, 3, 2, 1), a dictionary maps every n-gram of the sequence to the position
that followed its latest occurrence. A draft continues the longest n-gram that ends the sequence
from that position: what the context said next the last time it said this. An agent's turn
copies its context (a patch repeats the lines it changes, a call repeats paths, an answer quotes
a tool result), so the drafts of copying text are long and right, those of other text rare and
short; the long orders tell apart the places where repetitive text (similar lines) goes on.

Keys are a 64-bit polynomial hash of the n-gram's ids: a collision only makes a wrong draft,
which the verify rejects like any other. The prompt is indexed with numpy in a few passes, each
later token with one hash and one dictionary write per order; a lookup is one dictionary read
per order: microseconds, beside a model step of milliseconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ORDERS = (6, 3, 2, 1)  # n-gram lengths, tried longest first
_MULTIPLIER = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class Draft:
    tokens: tuple[int, ...]
    order: int  # the length of the n-gram it continues (its acceptance is tracked per order)


def ngram_key(tokens: Sequence[int]) -> int:
    """The hash of an n-gram (numpy's uint64 arithmetic gives the same, in bulk)."""
    key = 0
    for token in tokens:
        key = (key * _MULTIPLIER + token + 1) & _MASK
    return key


class NgramDrafter:
    """The n-gram index of one sequence; append each token the sequence gets."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens: list[int] = []
        self._index: dict[int, dict[int, int]] = {n: {} for n in ORDERS}
        self._suffix = [0] * max(ORDERS)  # [n - 1]: the key of the last n tokens
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        if len(tokens) < 64:
            for token in tokens:
                self.append(token)
            return
        # numpy for long prompts: every n-gram's key, and the position that followed it
        start = len(self.tokens)
        self.tokens.extend(tokens)
        ids = np.asarray(self.tokens, dtype=np.uint64) + np.uint64(1)
        multiplier = np.uint64(_MULTIPLIER)
        for n in ORDERS:
            first = max(start - n, 0)  # n-grams ending at start-1 and later (their next is new)
            window = ids[first:]
            if len(window) < n:
                continue
            count = len(window) - n + 1
            keys = np.zeros(count, dtype=np.uint64)
            for j in range(n):
                keys = keys * multiplier + window[j : j + count]
            follows = range(first + n, first + n + count - 1)
            # later occurrences overwrite earlier ones; the last n-gram has no follower yet
            self._index[n].update(zip(keys[:-1].tolist(), follows, strict=True))
        self._rekey()

    def append(self, token: int) -> None:
        """Add a token: each n-gram ending before it now has it as its follower."""
        position = len(self.tokens)
        suffix = self._suffix
        for n in ORDERS:
            if position >= n:
                self._index[n][suffix[n - 1]] = position
        self.tokens.append(token)
        # the n-gram ending here is the (n-1)-gram that ended before, then this token
        value = token + 1
        self._suffix = [value, *((key * _MULTIPLIER + value) & _MASK for key in suffix[:-1])]

    def _rekey(self) -> None:
        tail = self.tokens[-max(ORDERS) :]
        self._suffix = [ngram_key(tail[-n:]) for n in range(1, max(ORDERS) + 1)]

    def draft(self, limit: int) -> Draft | None:
        """Up to `limit` tokens continuing the longest n-gram ending the sequence, or None."""
        if limit <= 0:
            return None
        length = len(self.tokens)
        for n in ORDERS:  # longest first
            if length >= n:
                follow = self._index[n].get(self._suffix[n - 1])
                if follow is not None:
                    return Draft(tuple(self.tokens[follow : follow + limit]), n)
        return None
