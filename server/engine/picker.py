"""TokenPicker: decides each next token of one generation, following its Steering.

Forced tokens are emitted as they are; an allowed set is sampled from the logits in Python (only
ever a handful of header tokens); everything else goes through llama.cpp sampler chains, one per
distinct constraint, created on first use and kept for the generation (a grammar keeps its
state across the tokens sampled under it). A test hook may replace sampled tokens.
"""

from __future__ import annotations

import numpy as np

from server.contracts.directives import Allow, Constrain, Force, Steering
from server.engine.base import SamplingParams, TokenChooser
from server.engine.grammar_sampler import GrammarSampler, new_sampler
from server.engine.llama_context import LlamaContext, Sampler


class TokenPicker:
    """One generation's sampling state; lives on the engine thread."""

    def __init__(
        self,
        ctx: LlamaContext,
        params: SamplingParams,
        steering: Steering | None,
        chooser: TokenChooser | None,
    ) -> None:
        self._ctx = ctx
        self._params = params
        self._steering = steering
        self._chooser = chooser
        self._base = ctx.new_sampler(params)
        self._constrained: dict[Constrain, Sampler | GrammarSampler] = {}
        self._rng = np.random.default_rng(params.seed)

    def next_tokens(self, index: int) -> tuple[int, ...]:
        """The forced tokens, or one token picked from the logits at batch position `index`."""
        directive = self._steering.next() if self._steering is not None else None
        if isinstance(directive, Force):
            return directive.tokens
        if isinstance(directive, Allow):
            token = self._ctx.sample_among(index, directive.tokens, self._params, self._rng)
        elif isinstance(directive, Constrain):
            token = self._sampler_for(directive).sample(index)
        else:
            token = self._base.sample(index)
        if self._chooser is not None:
            token = self._chooser(token)
        return (token,)

    def accept(self, token: int) -> None:
        if self._steering is not None:
            self._steering.accept(token)

    def free(self) -> None:
        self._base.free()
        for sampler in self._constrained.values():
            sampler.free()

    def _sampler_for(self, constraint: Constrain) -> Sampler | GrammarSampler:
        sampler = self._constrained.get(constraint)
        if sampler is None:
            sampler = new_sampler(self._ctx, self._params, constraint)
            self._constrained[constraint] = sampler
        return sampler
