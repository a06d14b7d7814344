"""LlamaSamplerChain: llama.cpp's own sampler chain, built from SamplingParams and a Constrain.

Banned tokens as a logit bias, a GBNF grammar, then top-k, top-p, min-p, temperature and the
seeded draw (or greedy), in llama.cpp's order. Used with EngineConfig.sampler "llama" (to compare
with the numpy sampler) and by the grammar sampler under settings other than plain temperature.
The chain reads the logits inside llama.cpp: `ctx` is the llama_context pointer.

A chain's draws are seeded from the generation's random stream (`chain_seed`), never with the
request seed itself: each chain of a generation draws its own numbers, seeds that differ only
above their low 32 bits still differ, and no seed becomes LLAMA_DEFAULT_SEED (0xFFFFFFFF), which
llama.cpp reads as "random". Temperatures that act as greedy (sampling/temperature.py) get the
greedy stage: llama.cpp divides the logits by the temperature in float32.
"""

from __future__ import annotations

import math
from typing import Any

import llama_cpp.llama_cpp as lc
import numpy as np

from server.contracts.directives import Constrain
from server.engine.base import SamplingParams
from server.engine.sampling.temperature import is_greedy


class LlamaSamplerChain:
    """A llama.cpp sampler chain; `sample()` picks from the logits of a batch position."""

    def __init__(
        self, ctx: Any, vocab: Any, params: SamplingParams, seed: int, constraint: Constrain | None
    ) -> None:
        self._ctx = ctx
        _check_seed(seed)  # before any stage is made: none leaks
        stages = constraint_stages(vocab, constraint) + sampler_stages(params, seed)
        self._chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        for stage in stages:
            lc.llama_sampler_chain_add(self._chain, stage)  # the chain owns its stages

    def sample(self, index: int) -> int:
        """Sample (and accept) a token from the logits of batch position `index`."""
        return int(lc.llama_sampler_sample(self._chain, self._ctx, index))

    def apply(self, candidates: Any) -> None:
        """Run the chain on a llama_token_data_array pointer (sets its `selected`)."""
        lc.llama_sampler_apply(self._chain, candidates)

    def free(self) -> None:
        lc.llama_sampler_free(self._chain)


def constraint_stages(vocab: Any, constraint: Constrain | None) -> list[Any]:
    if constraint is None:
        return []
    stages: list[Any] = []
    if constraint.banned:
        n_vocab = int(lc.llama_vocab_n_tokens(vocab))
        banned = sorted(constraint.banned)
        biases = (lc.llama_logit_bias * len(banned))(
            *(lc.llama_logit_bias(token, -math.inf) for token in banned)
        )
        stages.append(lc.llama_sampler_init_logit_bias(n_vocab, len(banned), biases))
    if constraint.grammar is not None:
        grammar = lc.llama_sampler_init_grammar(vocab, constraint.grammar.encode(), b"root")
        if not grammar:
            for stage in stages:
                lc.llama_sampler_free(stage)
            raise ValueError("llama.cpp rejected the grammar")
        stages.append(grammar)
    return stages


def chain_seed(rng: np.random.Generator) -> int:
    """A seed for a chain's draws, from the generation's random stream: never
    LLAMA_DEFAULT_SEED."""
    return int(rng.integers(0, lc.LLAMA_DEFAULT_SEED))  # the upper bound is excluded


def sampler_stages(params: SamplingParams, seed: int) -> list[Any]:
    """The stages after the constraints: top-k, top-p, min-p, temperature and the draw seeded
    with `seed` (a 32-bit seed other than LLAMA_DEFAULT_SEED), or greedy."""
    _check_seed(seed)
    if is_greedy(params.temperature):
        return [lc.llama_sampler_init_greedy()]
    stages = []
    if params.top_k > 0:
        stages.append(lc.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        stages.append(lc.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        stages.append(lc.llama_sampler_init_min_p(params.min_p, 1))
    stages.append(lc.llama_sampler_init_temp(params.temperature))
    stages.append(lc.llama_sampler_init_dist(seed))
    return stages


def _check_seed(seed: int) -> None:
    if not 0 <= seed < lc.LLAMA_DEFAULT_SEED:
        raise ValueError(f"chain seed {seed} is not a 32-bit seed llama.cpp keeps")
