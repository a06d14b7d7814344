"""LlamaSamplerChain: llama.cpp's own sampler chain, built from SamplingParams and a Constrain.

Banned tokens as a logit bias, a GBNF grammar, then top-k, top-p, min-p, temperature and the
seeded draw (or greedy), in llama.cpp's order. Used with EngineConfig.sampler "llama" (to compare
with the numpy sampler) and by the grammar sampler under settings other than plain temperature.
The chain reads the logits inside llama.cpp: `ctx` is the llama_context pointer.
"""

from __future__ import annotations

import math
from typing import Any

import llama_cpp.llama_cpp as lc

from server.contracts.directives import Constrain
from server.engine.base import SamplingParams


class LlamaSamplerChain:
    """A llama.cpp sampler chain; `sample()` picks from the logits of a batch position."""

    def __init__(
        self, ctx: Any, vocab: Any, params: SamplingParams, constraint: Constrain | None
    ) -> None:
        self._ctx = ctx
        stages = _constraint_stages(vocab, constraint) + _sampler_stages(params)
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


def _constraint_stages(vocab: Any, constraint: Constrain | None) -> list[Any]:
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


def _sampler_stages(params: SamplingParams) -> list[Any]:
    if params.temperature <= 0:
        return [lc.llama_sampler_init_greedy()]
    stages = []
    if params.top_k > 0:
        stages.append(lc.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        stages.append(lc.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        stages.append(lc.llama_sampler_init_min_p(params.min_p, 1))
    stages.append(lc.llama_sampler_init_temp(params.temperature))
    seed = lc.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
    stages.append(lc.llama_sampler_init_dist(seed))
    return stages
