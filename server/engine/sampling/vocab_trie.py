"""VocabTrie: the vocabulary as a tree of token texts, to find what a grammar allows in few checks.

A token's parent is the token whose text is the longest proper prefix of its text (the roots
are the one-byte tokens). llama.cpp's grammar checks a token's text character by character and
an unfinished UTF-8 character at its end against every character it could still become, so a
grammar that rejects a text rejects every text that extends it. Walking down from the roots,
level by level, and checking only the children of accepted tokens therefore finds exactly the
tokens the grammar accepts; where the grammar is restrictive (JSON structure, numbers, enums),
that is tens to hundreds of checks instead of 201k.

One exception: for a negated class with a non-ASCII member (`[^é]`), llama.cpp rejects an
unfinished character that might still become that member, although it might also become
another one. For such grammars a rejected token whose text ends inside a character does not
prune its children (`Descent(transparent=True)`); `negates_non_ascii` tells them apart.

Tokens outside the tree (control tokens, end-of-generation tokens, tokens without text) are
checked directly at the first level.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

Ids = np.ndarray[Any, np.dtype[np.int32]]
Mask = np.ndarray[Any, np.dtype[np.bool_]]
Check = Callable[[Ids], Mask]  # which of these tokens the grammar accepts now

_NEGATED_CLASS = re.compile(r"\[\^((?:\\.|[^\]\\])*)\]")
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")


@dataclass(frozen=True, eq=False)
class VocabTrie:
    """Children of each token in compressed rows: those of `t` are `order[start[t]:start[t+1]]`,
    the roots are the children of the virtual node `n_vocab`."""

    n_vocab: int
    order: Ids  # tree tokens sorted by parent
    start: np.ndarray[Any, np.dtype[np.int64]]  # n_vocab + 2 offsets into `order`
    incomplete: Mask  # the token's text ends inside a UTF-8 character (or is not UTF-8)
    extras: Ids  # tokens outside the tree: checked at the first level

    @classmethod
    def build(cls, vocab: Any, n_vocab: int) -> VocabTrie:
        """About 201k token lookups for gpt-oss: done once per model (`vocab_trie`)."""
        texts = _texts(vocab, n_vocab)
        inside = [
            bool(text) and not lc.llama_vocab_is_control(vocab, t) and not _eog(vocab, t)
            for t, text in enumerate(texts)
        ]
        index: dict[bytes, int] = {}
        for token, text in enumerate(texts):
            if inside[token]:
                index.setdefault(text, token)
        parent = np.full(n_vocab, n_vocab, dtype=np.int64)
        for token, text in enumerate(texts):
            if inside[token]:
                parent[token] = _parent(token, text, index, n_vocab)
        members = np.flatnonzero(inside).astype(np.int32)
        order = members[np.argsort(parent[members], kind="stable")]
        counts = np.bincount(parent[members], minlength=n_vocab + 1)
        start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        incomplete = np.fromiter((not _complete(text) for text in texts), dtype=bool)
        extras = np.flatnonzero(~np.asarray(inside, dtype=bool)).astype(np.int32)
        incomplete[extras] = False
        return cls(n_vocab, order, start, incomplete, extras)

    @functools.cached_property
    def roots(self) -> Ids:
        return self.children(np.array([self.n_vocab], dtype=np.int64))

    @functools.cached_property
    def _stop(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        return self.start[1:]

    @functools.cached_property
    def _positions(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        return np.arange(len(self.order), dtype=np.int64)

    def children(self, tokens: np.ndarray[Any, Any]) -> Ids:
        """The children of all of `tokens`, concatenated."""
        low = self.start[tokens]
        counts = self._stop[tokens] - low
        total = int(counts.sum())
        if not total:
            return np.empty(0, dtype=np.int32)
        if len(tokens) == 1:
            only: Ids = self.order[low[0] : low[0] + total]
            return only
        # each child's position in `order`: its parent's first one plus its rank among siblings
        first = np.repeat(low - (np.cumsum(counts) - counts), counts)
        first += self._positions[:total]
        found: Ids = self.order[first]
        return found


def _texts(vocab: Any, n_vocab: int) -> list[bytes]:
    buffer = ctypes.create_string_buffer(512)
    texts = []
    for token in range(n_vocab):
        size = lc.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)
        texts.append(buffer.raw[: max(size, 0)])
    return texts


def _eog(vocab: Any, token: int) -> bool:
    return bool(lc.llama_vocab_is_eog(vocab, token))


def _parent(token: int, text: bytes, index: dict[bytes, int], root: int) -> int:
    first = index[text]
    if first != token:  # the same text twice: the grammar treats both alike
        return first
    for length in range(len(text) - 1, 0, -1):
        parent = index.get(text[:length])
        if parent is not None:
            return parent
    return root


def _complete(text: bytes) -> bool:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@functools.lru_cache(maxsize=4)
def vocab_trie(context: Any) -> VocabTrie:
    """The trie of a loaded model's vocabulary (`context`: a LlamaContext), built on first use."""
    return VocabTrie.build(context.vocab, context.info.n_vocab)


def negates_non_ascii(grammar: str) -> bool:
    """Whether a GBNF grammar has a negated character class with a non-ASCII member (or might:
    the scan also looks inside string literals, which can only make it say yes more often)."""
    for match in _NEGATED_CLASS.finditer(grammar):
        body = match.group(1)
        if any(ord(char) > 0x7F for char in body):
            return True
        for escape in _ESCAPE.finditer(body):
            if int(next(g for g in escape.groups() if g), 16) > 0x7F:
                return True
    return False


class Descent:
    """One token's walk down the trie under one grammar state, a level per `step`."""

    def __init__(self, trie: VocabTrie, check: Check, transparent: bool, first: Ids) -> None:
        """`first`: the first level, the roots and whichever `extras` may be sampled."""
        self._trie = trie
        self._check = check
        self._transparent = transparent
        self._frontier = first
        self._accepted: list[Ids] = []
        self.checked = 0  # tokens checked so far

    @property
    def pending(self) -> int:
        """How many tokens the next level checks (0: the walk is over)."""
        return len(self._frontier)

    def step(self) -> None:
        frontier = self._frontier
        accepted = self._check(frontier)
        self._accepted.append(frontier[accepted])
        self.checked += len(frontier)
        if self._transparent:
            accepted = accepted | self._trie.incomplete[frontier]
        self._frontier = self._trie.children(frontier[accepted])

    def finish(self) -> Ids:
        """Every token the grammar accepts now."""
        while self.pending:
            self.step()
        return np.concatenate(self._accepted) if self._accepted else np.empty(0, np.int32)
