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
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

Ids = np.ndarray[Any, np.dtype[np.int32]]
Mask = np.ndarray[Any, np.dtype[np.bool_]]
Check = Callable[[Ids], Mask]  # which of these tokens the grammar accepts now

_NEGATED_CLASS = re.compile(r"\[\^((?:\\.|[^\]\\])*)\]")
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")
SLICE = 512  # tokens a step of the build reads (≈ 0.6 ms on a 2-core VM)


@dataclass(frozen=True, eq=False)
class VocabTrie:
    """Children of each token in compressed rows: those of `t` are `order[start[t]:start[t+1]]`,
    the roots are the children of the virtual node `n_vocab`."""

    n_vocab: int
    order: Ids  # tree tokens sorted by parent
    start: np.ndarray[Any, np.dtype[np.int64]]  # n_vocab + 2 offsets into `order`
    incomplete: Mask  # the token's text ends inside a UTF-8 character (or is not UTF-8)
    extras: Ids  # tokens outside the tree: checked at the first level

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


class TrieBuild:
    """A vocabulary's trie, built `size` tokens at a time (`advance`) or at once (`trie`).

    The whole build reads every token's text and looks up its prefixes: ≈ 0.6 s for gpt-oss's
    201k tokens on a 2-core VM. The engine thread advances it a slice at a time while it has
    nothing to run (server/engine/llama.py), so the first grammar-constrained token does not
    stall every stream of the batch for the whole build; where it comes first, `trie` makes
    the rest. Used by one thread at a time.
    """

    def __init__(self, vocab: Any, n_vocab: int, size: int = SLICE) -> None:
        self._steps = _build(vocab, n_vocab, size)
        self._trie: VocabTrie | None = None
        self.slices = 0  # advances made

    @property
    def done(self) -> bool:
        return self._trie is not None

    def advance(self) -> bool:
        """One slice of the build; True once the trie is built."""
        if self._trie is None:
            self.slices += 1
            try:
                next(self._steps)
            except StopIteration as finished:
                self._trie = finished.value
        return self._trie is not None

    def trie(self) -> VocabTrie:
        """The trie, after the rest of the build."""
        while self._trie is None:
            self.advance()
        return self._trie


def _build(vocab: Any, n_vocab: int, size: int) -> Generator[None, None, VocabTrie]:
    """The build's steps: each reads or places at most `size` tokens; returns the trie."""
    assert n_vocab < 1 << 32  # the parents' two 16-bit halves below
    buffer = ctypes.create_string_buffer(512)
    texts: list[bytes] = []
    inside = np.zeros(n_vocab, dtype=bool)  # in the tree: a text, no control or end token
    incomplete = np.zeros(n_vocab, dtype=bool)
    for first in range(0, n_vocab, size):
        for token in range(first, min(first + size, n_vocab)):
            length = lc.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, False)
            text = buffer.raw[: max(length, 0)]
            texts.append(text)
            if text and not lc.llama_vocab_is_control(vocab, token) and not _eog(vocab, token):
                inside[token] = True
                incomplete[token] = not _complete(text)
        yield
    members = np.flatnonzero(inside)
    index: dict[bytes, int] = {}
    for first in range(0, len(members), size):
        for token in members[first : first + size].tolist():
            index.setdefault(texts[token], token)
        yield
    parent = np.full(n_vocab, n_vocab, dtype=np.int64)
    for first in range(0, len(members), size):
        for token in members[first : first + size].tolist():
            parent[token] = _parent(token, texts[token], index, n_vocab)
        yield
    # members by parent, in token order among siblings: two stable sorts by 16-bit halves of
    # the parent (numpy's radix sort; one stable sort of the whole keys takes 6 x longer)
    keys = parent[members]
    by_low = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    yield
    by_parent = by_low[np.argsort((keys[by_low] >> 16).astype(np.uint16), kind="stable")]
    order = members[by_parent].astype(np.int32)
    counts = np.bincount(keys, minlength=n_vocab + 1)
    start = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    extras = np.flatnonzero(~inside).astype(np.int32)
    return VocabTrie(n_vocab, order, start, incomplete, extras)


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


_BUILDS: weakref.WeakKeyDictionary[Any, TrieBuild] = weakref.WeakKeyDictionary()


def trie_build(context: Any) -> TrieBuild:
    """The build of a loaded model's trie (`context`: a LlamaContext), kept while the context
    lives; the first call begins it."""
    build = _BUILDS.get(context)
    if build is None:
        build = _BUILDS[context] = TrieBuild(context.vocab, context.info.n_vocab)
    return build


def vocab_trie(context: Any) -> VocabTrie:
    """The trie of a loaded model's vocabulary, after what is left of its build."""
    return trie_build(context).trie()


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
