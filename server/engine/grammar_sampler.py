"""GrammarSampler: samples under a GBNF grammar without masking the whole vocabulary each token.

Applying a llama.cpp grammar to all 201k candidates costs far more than a decode step of a small
model. So tokens are drawn first and checked: with plain temperature sampling, K tokens are
drawn i.i.d. from the unconstrained distribution and checked in one grammar call; the first
draw the grammar accepts is the token (rejection sampling: exactly the grammar-masked
distribution). Other settings (greedy, top-k/top-p/min-p) draw one token with llama.cpp's chain
and check it, like llama.cpp's common sampler. Only when every draw is rejected is the whole
vocabulary masked and the token sampled from what the grammar allows. Either way the result
follows the masked distribution: a valid t is drawn with probability (1 - (1 - Z)^K) p(t) / Z
before the fallback and (1 - Z)^K p(t) / Z through it (Z the valid mass), p(t) / Z in all.
"""

from __future__ import annotations

import codecs
import ctypes
import dataclasses
import functools
import math
from dataclasses import dataclass

import llama_cpp.llama_cpp as lc
import numpy as np

from server.contracts.directives import Constrain
from server.engine.base import SamplingParams
from server.engine.llama_context import LlamaContext

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
DRAWS = 256  # tokens drawn and checked before the whole vocabulary is masked


@dataclass(frozen=True)
class FirstBytes:
    """The vocabulary grouped by the first byte of each token's text.

    A grammar accepts a token only if it accepts the token's first byte alone (it checks
    partial UTF-8 too), so masking the 256 one-byte tokens first rules out whole groups.
    """

    probes: np.ndarray  # the one-byte token of each byte value (-1: none)
    groups: tuple[np.ndarray, ...]  # token ids by first byte
    other: np.ndarray  # tokens with no text (special or empty): always checked


@functools.lru_cache(maxsize=4)
def first_bytes(ctx: LlamaContext) -> FirstBytes:
    """Computed once per loaded model (about 201k token lookups)."""
    buffer = ctypes.create_string_buffer(256)
    probes = np.full(256, -1, dtype=np.int64)
    by_byte: list[list[int]] = [[] for _ in range(256)]
    other = []
    for token in range(ctx.info.n_vocab):
        size = lc.llama_token_to_piece(ctx.vocab, token, buffer, len(buffer), 0, False)
        if size <= 0 or lc.llama_vocab_is_control(ctx.vocab, token):
            other.append(token)
            continue
        first = buffer.raw[0]
        by_byte[first].append(token)
        if size == 1 and probes[first] < 0:
            probes[first] = token
    groups = tuple(np.asarray(ids, dtype=np.int32) for ids in by_byte)
    return FirstBytes(probes, groups, np.asarray(other, dtype=np.int32))


class _Candidates:
    """A reusable llama_token_data_array over a numpy buffer."""

    def __init__(self, capacity: int) -> None:
        assert _TOKEN_DATA.itemsize == ctypes.sizeof(lc.llama_token_data)
        self.data = np.zeros(capacity, dtype=_TOKEN_DATA)
        pointer = self.data.ctypes.data_as(ctypes.POINTER(lc.llama_token_data))
        self.array = lc.llama_token_data_array(pointer, capacity, -1, False)

    def load(self, ids: np.ndarray, logits: np.ndarray | float) -> ctypes._CArgObject:  # type: ignore[type-arg]
        n = len(ids)
        self.data["id"][:n] = ids
        self.data["logit"][:n] = logits
        self.data["p"][:n] = 0.0
        self.array.size = n
        self.array.selected = -1
        self.array.sorted = False
        return ctypes.byref(self.array)


class _Utf8:
    """The constrained text's bytes so far must stay valid UTF-8 across token boundaries.

    llama.cpp's grammar reads a byte after an unfinished character as its continuation without
    checking it, so without this a string could hold broken characters (each decoded as U+FFFD,
    which also breaks a `maxLength`).
    """

    def __init__(self, ctx: LlamaContext) -> None:
        self._ctx = ctx
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self._pieces: dict[int, bytes] = {}

    def fits(self, token: int) -> bool:
        state = self._decoder.getstate()
        try:
            self._decoder.decode(self._piece(token))
        except UnicodeDecodeError:
            return False
        finally:
            self._decoder.setstate(state)
        return True

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


class GrammarSampler:
    """The sampler of one grammar-constrained stretch of a generation (engine thread only)."""

    def __init__(self, ctx: LlamaContext, params: SamplingParams, constraint: Constrain) -> None:
        assert constraint.grammar is not None
        self._ctx = ctx
        self._params = params
        self._grammar = lc.llama_sampler_init_grammar(
            ctx.vocab, constraint.grammar.encode(), b"root"
        )
        if not self._grammar:
            raise ValueError("llama.cpp rejected the grammar")
        self._free = ctx.new_sampler(params, Constrain(banned=constraint.banned))
        seed = None if params.seed is None else params.seed + 1
        self._resample = ctx.new_sampler(dataclasses.replace(params, seed=seed))
        self._banned = np.fromiter(sorted(constraint.banned), dtype=np.int64)
        self._plain = params.temperature > 0 and params.top_k <= 0 and params.top_p >= 1.0
        self._plain = self._plain and params.min_p <= 0.0
        self._rng = np.random.default_rng(params.seed)
        self._checks = _Candidates(DRAWS)
        self._all = _Candidates(ctx.info.n_vocab)
        self._index = first_bytes(ctx)
        self._text = _Utf8(ctx)
        self.masked = 0  # tokens that needed the whole vocabulary masked

    def sample(self, index: int) -> int:
        """Sample (and accept) a token from the logits of batch position `index`."""
        token = self._draw(index) if self._plain else self._draw_with_chain(index)
        if token is None:
            self.masked += 1
            token = self._sample_masked(index)
        lc.llama_sampler_accept(self._grammar, token)
        self._text.accept(token)
        return token

    def _draw(self, index: int) -> int | None:
        logits = self._ctx.logits(index).astype(np.float64) / self._params.temperature
        logits[self._banned] = -np.inf
        cdf = np.cumsum(np.exp(logits - logits.max()))
        draws = np.searchsorted(cdf, self._rng.random(DRAWS) * cdf[-1], side="right")
        unique, first = np.unique(np.minimum(draws, len(cdf) - 1), return_index=True)
        lc.llama_sampler_apply(self._grammar, self._checks.load(unique, 0.0))
        valid = np.isfinite(self._checks.data["logit"][: len(unique)])
        for position in np.argsort(first[valid], kind="stable"):  # in the order drawn
            token = int(unique[valid][position])
            if self._text.fits(token):
                return token
        return None

    def _draw_with_chain(self, index: int) -> int | None:
        token = self._free.sample(index)
        lc.llama_sampler_apply(self._grammar, self._checks.load(np.array([token]), 0.0))
        accepted = self._checks.data["logit"][0] != -math.inf
        return token if accepted and self._text.fits(token) else None

    def _viable(self) -> np.ndarray:
        """The tokens whose first byte the grammar accepts (a superset of the valid ones)."""
        index = self._index
        known = index.probes >= 0
        lc.llama_sampler_apply(self._grammar, self._checks.load(index.probes[known], 0.0))
        accepted = np.isfinite(self._checks.data["logit"][: int(known.sum())])
        groups = [g for g, ok in zip(np.flatnonzero(known), accepted, strict=True) if ok]
        unknown = np.flatnonzero(~known)
        parts = [index.groups[b] for b in [*groups, *unknown]]
        return np.concatenate([*parts, index.other])

    def _sample_masked(self, index: int) -> int:
        ids = self._viable()
        logits = self._ctx.logits(index)[ids]
        logits[np.isin(ids, self._banned)] = -np.inf
        lc.llama_sampler_apply(self._grammar, self._all.load(ids, logits))
        allowed = self._all.data["logit"][: len(ids)].copy()
        while True:  # a token that would break the text's UTF-8 is masked too, and drawn again
            self._resample.apply(self._all.load(ids, allowed))
            chosen = self._all.data[self._all.array.selected]
            if not np.isfinite(chosen["logit"]):
                raise RuntimeError("the grammar allows no token here")
            token = int(chosen["id"])
            if self._text.fits(token):
                return token
            allowed[ids == token] = -np.inf

    def free(self) -> None:
        lc.llama_sampler_free(self._grammar)
        self._free.free()
        self._resample.free()
