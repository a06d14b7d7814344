"""GrammarSampler: samples under a GBNF grammar, exactly from the grammar-masked distribution.

Applying a llama.cpp grammar to all 201k candidates costs far more than a decode step of a small
model. So the allowed set is found by walking the vocabulary's prefix tree (sampling/vocab_trie.py):
where the grammar is restrictive (JSON structure, numbers, enums) the walk ends after a few
hundred checks with every allowed token, and the token is drawn among them. Where it is
permissive (inside a string) the walk would check most of the vocabulary, so with plain
temperature sampling it stops at `WALK_LIMIT` checks and up to K = sum(DRAWS) tokens are drawn
i.i.d. from the unconstrained distribution and checked, a batch per grammar call: the first draw
the grammar accepts is the token (rejection sampling). Only when all of them are rejected does
the walk go on to the end and the token is drawn among the allowed ones.

Either way the result follows the masked distribution: a valid t is drawn with probability
(1 - (1 - Z)^K) p(t) / Z before the fallback and (1 - Z)^K p(t) / Z through it (Z the valid
mass), p(t) / Z in all. Whether draws are tried depends only on the grammar's state, never on
the token's random numbers, so choosing per token keeps that exact. Other settings (greedy,
top-k/top-p/min-p) draw one token with llama.cpp's chain and check it, like llama.cpp's common
sampler, and otherwise apply the chain to the allowed tokens.

Every random number comes from the generation's own stream (the generator its other tokens are
drawn with; llama.cpp's chains are seeded from it), so a constrained stretch goes on drawing
where the generation stands instead of replaying the numbers it started with. A token whose
logit is NaN is never taken.
"""

from __future__ import annotations

import codecs
import ctypes
import functools
import math
from collections.abc import Hashable
from typing import Any, Protocol

import llama_cpp.llama_cpp as lc
import numpy as np

from server.contracts.directives import Constrain
from server.engine.base import ModelInfo, SamplingParams
from server.engine.sampling.among import draw, tempered
from server.engine.sampling.banned import banned_of
from server.engine.sampling.block_draws import BlockDraws
from server.engine.sampling.llama_chain import LlamaSamplerChain, chain_seed
from server.engine.sampling.numpy_sampler import Workspace
from server.engine.sampling.temperature import is_greedy
from server.engine.sampling.vocab_trie import (
    Descent,
    Ids,
    Mask,
    VocabTrie,
    negates_non_ascii,
    vocab_trie,
)

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
DRAWS = (4, 28)  # tokens drawn and checked, batch by batch, before the walk goes on to the end
WALK_LIMIT = 3000  # checks the walk may spend before draws are tried (plain sampling)


class SamplingContext(Hashable, Protocol):
    """What a GrammarSampler uses of the loaded model and its context (a LlamaContext)."""

    @property
    def vocab(self) -> Any:
        """The llama_vocab pointer."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def workspace(self) -> Workspace:
        """The sampling buffers of the engine thread."""

    def logits(self, index: int) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The logits of batch position `index`, as a view."""

    def new_chain(
        self, params: SamplingParams, seed: int, constraint: Constrain | None = None
    ) -> LlamaSamplerChain:
        """llama.cpp's sampler chain for these settings, its draws seeded with `seed`."""


class _Candidates:
    """A reusable llama_token_data_array over a numpy buffer that grows as needed."""

    def __init__(self, capacity: int) -> None:
        assert _TOKEN_DATA.itemsize == ctypes.sizeof(lc.llama_token_data)
        self._reserve(capacity)

    def _reserve(self, capacity: int) -> None:
        self.data = np.zeros(capacity, dtype=_TOKEN_DATA)
        pointer = self.data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        self.array = lc.llama_token_data_array(pointer, capacity, -1, False)

    def load(self, ids: np.ndarray[Any, Any], logits: np.ndarray[Any, Any] | float) -> Any:
        n = len(ids)
        if n > len(self.data):
            self._reserve(max(n, 2 * len(self.data)))
        self.data["id"][:n] = ids
        self.data["logit"][:n] = logits
        self.data["p"][:n] = 0.0
        self.array.size = n
        self.array.selected = -1
        self.array.sorted = False
        return ctypes.byref(self.array)


# The second byte a lead byte allows where it is not 0x80-0xBF (RFC 3629): E0 and F0 exclude
# overlong forms, ED the surrogates, F4 what lies past U+10FFFF.
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def completable(pending: bytes) -> bool:
    """Whether an unfinished character's bytes can still become a valid one. Python's
    incremental decoder holds `ED A0`..`ED BF` (a surrogate's start) without an error, and
    rejects every byte after it: a text that ends so would allow no next token."""
    if len(pending) < 2:
        return True
    low, high = _SECOND_BYTE.get(pending[0], (0x80, 0xBF))
    return low <= pending[1] <= high


class _Utf8:
    """The constrained text's bytes so far must stay valid UTF-8 across token boundaries.

    llama.cpp's grammar reads a byte after an unfinished character as its continuation without
    checking it, so without this a string could hold broken characters (each decoded as U+FFFD,
    which also breaks a `maxLength`). A token fits when the text stays valid and an unfinished
    character at its end can still be finished (`completable`): one that cannot would leave the
    grammar no token to go on with.
    """

    def __init__(self, ctx: SamplingContext) -> None:
        self._ctx = ctx
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._pieces: dict[int, bytes] = {}

    def fits(self, token: int) -> bool:
        state = self._decoder.getstate()
        try:
            self._decoder.decode(self._piece(token))
            return completable(self._decoder.getstate()[0])
        except UnicodeDecodeError:
            return False
        finally:
            self._decoder.setstate(state)

    def accept(self, token: int) -> None:
        try:
            self._decoder.decode(self._piece(token))
        except UnicodeDecodeError:  # only a forced token can get here: start afresh
            self._decoder.reset()

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            buffer = ctypes.create_string_buffer(256)
            size = lc.llama_token_to_piece(self._ctx.vocab, token, buffer, len(buffer), 0, False)
            piece = buffer.raw[: max(size, 0)]
            self._pieces[token] = piece
        return piece


@functools.lru_cache(maxsize=16)
def _first_level(trie: VocabTrie, banned: frozenset[int]) -> tuple[Ids, Ids]:
    """The walk's first level (the roots, and the tokens outside the tree that are not banned)
    and the banned tokens inside the tree, which the walk may find."""
    ids = np.fromiter(sorted(banned), dtype=np.int32, count=len(banned))
    extras = np.setdiff1d(trie.extras, ids).astype(np.int32)
    return np.concatenate((trie.roots, extras)), ids[~np.isin(ids, trie.extras)]


def _repaired(logits: np.ndarray[Any, np.dtype[np.float32]]) -> np.ndarray[Any, Any]:
    """A copy of candidates' logits that llama.cpp's stages handle: NaN to -inf, and when some
    are +inf, those at 0 and the others at -inf (the infinite ones take all the mass)."""
    repaired = np.where(np.isnan(logits), np.float32(-np.inf), logits)
    infinite = repaired == np.inf
    if infinite.any():
        repaired = np.where(infinite, np.float32(0.0), np.float32(-np.inf))
    return repaired


class GrammarSampler:
    """The sampler of one grammar-constrained stretch of a generation (engine thread only);
    `rng` is the generation's random stream, shared with its other samplers."""

    def __init__(
        self,
        ctx: SamplingContext,
        params: SamplingParams,
        constraint: Constrain,
        rng: np.random.Generator,
    ) -> None:
        assert constraint.grammar is not None
        self._ctx = ctx
        self._params = params
        self._grammar = lc.llama_sampler_init_grammar(
            ctx.vocab, constraint.grammar.encode(), b"root"
        )
        if not self._grammar:
            raise ValueError("llama.cpp rejected the grammar")
        self._constraint = constraint
        self._trie = vocab_trie(ctx)
        self._transparent = negates_non_ascii(constraint.grammar)
        self._first, self._tree_banned = _first_level(self._trie, constraint.banned)
        self._banned = banned_of(constraint.banned, ctx.info.n_vocab)
        self._plain = not is_greedy(params.temperature) and params.top_k <= 0
        self._plain = self._plain and params.top_p >= 1.0 and params.min_p <= 0.0
        self._rng = rng
        self._draws = (
            BlockDraws(ctx.workspace, params.temperature, self._rng) if self._plain else None
        )
        # llama.cpp's chains, for settings other than plain temperature
        self._chains: tuple[LlamaSamplerChain, LlamaSamplerChain] | None = None
        self._checks = _Candidates(1024)
        self._text = _Utf8(ctx)
        self.drawn = 0  # tokens taken from the draws
        self.masked = 0  # tokens drawn among the whole allowed set
        self.checked = 0  # tokens checked against the grammar

    def sample(self, index: int) -> int:
        """Sample (and accept) a token from the logits of batch position `index`."""
        if self._draws is not None:
            token = self.choose(self._ctx.logits(index))
        else:
            token = self._choose_with_chain(index)
        lc.llama_sampler_accept(self._grammar, token)
        self._text.accept(token)
        return token

    def choose(self, logits: np.ndarray[Any, np.dtype[np.float32]]) -> int:
        """A token from the grammar-masked distribution of `logits` at the temperature (plain
        sampling only), not yet accepted: the grammar's state stays as it is."""
        assert self._draws is not None
        walk = self._walk()
        while walk.pending and walk.checked + walk.pending <= WALK_LIMIT:
            walk.step()
        if walk.pending:  # a permissive state: one of the draws will most likely do
            token = self._draw(logits, self._draws)
            if token is not None:
                self.drawn += 1
                return token
        self.masked += 1
        return self._among(self._allowed(walk), logits)

    def _walk(self) -> Descent:
        return Descent(self._trie, self._check, self._transparent, self._first)

    def _check(self, ids: Ids) -> Mask:
        lc.llama_sampler_apply(self._grammar, self._checks.load(ids, 0.0))
        self.checked += len(ids)
        accepted: Mask = np.isfinite(self._checks.data["logit"][: len(ids)])
        return accepted

    def _allowed(self, walk: Descent) -> Ids:
        allowed = walk.finish()
        banned = self._tree_banned  # usually a handful: harmony's specials written as text
        if 0 < len(banned) <= 16:
            allowed = allowed[(allowed[:, None] != banned).all(axis=1)]
        elif len(banned):
            allowed = allowed[~np.isin(allowed, banned)]
        return allowed

    def _draw(self, logits: np.ndarray[Any, np.dtype[np.float32]], draws: BlockDraws) -> int | None:
        if not draws.prepare(logits, self._banned):
            return None
        for batch in DRAWS:
            unique, first = np.unique(draws.draw(batch), return_index=True)
            accepted = self._check(unique.astype(np.int32))
            for position in np.argsort(first[accepted], kind="stable"):  # in the order drawn
                token = int(unique[accepted][position])
                if self._text.fits(token):
                    return token
        return None

    def _among(self, allowed: Ids, logits: np.ndarray[Any, np.dtype[np.float32]]) -> int:
        """A token drawn among `allowed` by its probability at the temperature (NaN never; a
        +inf logit takes all the mass)."""
        x = logits[allowed].astype(np.float64)
        weights = tempered(x, self._params.temperature)
        while True:  # a token that would break the text's UTF-8 is masked too, and drawn again
            if not weights.any():  # a +inf token masked: the others, by their weights
                weights = tempered(x, self._params.temperature)
                if not weights.any():
                    raise RuntimeError("the grammar allows no token here")
            i = draw(weights, self._rng)
            token = int(allowed[i])
            if self._text.fits(token):
                return token
            weights[i] = 0.0
            x[i] = -math.inf

    def _choose_with_chain(self, index: int) -> int:
        free, resample = self._llama_chains()
        token = free.sample(index)
        fine = not math.isnan(self._ctx.logits(index)[token])  # llama.cpp's greedy may keep NaN
        if fine and self._check(np.array([token], dtype=np.int32))[0] and self._text.fits(token):
            return token
        self.masked += 1
        allowed = self._allowed(self._walk())
        if not len(allowed):
            raise RuntimeError("the grammar allows no token here")
        candidates = _Candidates(len(allowed))
        logits = _repaired(self._ctx.logits(index)[allowed])
        while True:  # a token that would break the text's UTF-8 is masked too, and drawn again
            resample.apply(candidates.load(allowed, logits))
            chosen = candidates.data[candidates.array.selected]
            if not np.isfinite(chosen["logit"]):
                raise RuntimeError("the grammar allows no token here")
            token = int(chosen["id"])
            if self._text.fits(token):
                return token
            logits[allowed == token] = -np.inf

    def _llama_chains(self) -> tuple[LlamaSamplerChain, LlamaSamplerChain]:
        if self._chains is None:
            params, banned = self._params, Constrain(banned=self._constraint.banned)
            free = self._ctx.new_chain(params, chain_seed(self._rng), banned)
            self._chains = (free, self._ctx.new_chain(params, chain_seed(self._rng)))
        return self._chains

    def free(self) -> None:
        lc.llama_sampler_free(self._grammar)
        if self._chains is not None:
            for chain in self._chains:
                chain.free()
