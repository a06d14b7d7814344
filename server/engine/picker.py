"""TokenPicker: decides each next token of one generation, following its Steering.

Forced tokens are emitted as they are; an allowed set is sampled from the logits in Python (only
ever a handful of header tokens: sampling/among.py); a constraint with a grammar goes through a
GrammarSampler (sampling/grammar_sampler.py), one per distinct constraint, created on first use
and kept for the generation (a grammar keeps its state across the tokens sampled under it);
everything else, banned tokens included, is drawn by the numpy sampler
(sampling/numpy_sampler.py) straight from the logits buffer (or by llama.cpp's chain with
EngineConfig.sampler "llama", for comparisons). With backend sampling on, free text (no grammar,
banned tokens alone) is drawn inside the model's graph instead (sampling/backend_chain.py): the
plan decides per step whether the next pick is drawn there (`next_pick` tells it what the pick
needs), `sample_on_backend` sets or clears the sequence's chain before the decode, and the pick
reads the drawn token back. A test hook may replace sampled tokens.

A generation has one random stream, seeded with the request's seed: every sampler of the
generation draws from it, and llama.cpp's chains (its backend chains too) are seeded from it
(llama_chain.chain_seed), so
no stretch of a generation replays the numbers of another and the same seed gives the same
tokens.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.random import default_rng  # here: numpy loads it on first use (6 ms)

from server.contracts.directives import Allow, Constrain, Directive, Force, Steering
from server.engine.base import SamplingParams, TokenChooser
from server.engine.llama_context import LlamaContext
from server.engine.sampling.among import sample_among
from server.engine.sampling.backend_chain import BackendChain, eligible_directive, eligible_params
from server.engine.sampling.banned import banned_of
from server.engine.sampling.grammar_sampler import GrammarSampler
from server.engine.sampling.llama_chain import LlamaSamplerChain, chain_seed
from server.engine.sampling.numpy_sampler import NumpySampler


class _Unread:
    """No directive read ahead yet."""


_UNREAD = _Unread()


class TokenPicker:
    """One generation's sampling state; lives on the engine thread.

    `choices` counts the tokens sampled among an allowed set, `overrides` those of them where
    the model's most likely token (the argmax of the logits) was not allowed.
    """

    def __init__(
        self,
        ctx: LlamaContext,
        params: SamplingParams,
        steering: Steering | None,
        chooser: TokenChooser | None,
        *,
        seq_id: int = 0,
        backend: bool = False,
    ) -> None:
        self._ctx = ctx
        self._params = params
        self._steering = steering
        self._chooser = chooser
        self.choices = 0
        self.overrides = 0
        self.last: Directive = None  # the last pick's directive (drafts go only in content)
        self._ahead: Directive | _Unread = _UNREAD  # the steering's next directive, once read
        self._grammars: dict[Constrain, GrammarSampler] = {}
        self._rng = default_rng(params.seed)
        self._sampler = NumpySampler(ctx.workspace, params, self._rng)
        self._chains: dict[Constrain | None, LlamaSamplerChain] = {}
        self._seq_id = seq_id
        # free text may be drawn on the backend: the engine's mode and this request's settings
        self._backend = backend and not ctx.llama_sampling and eligible_params(params)
        self._backend_chain: BackendChain | None = None  # set on the sequence now
        self.switches = 0  # chains set on the sequence or taken off it

    @property
    def forced(self) -> bool:
        """The last tokens were forced by steering (nothing was sampled)."""
        return isinstance(self.last, Force)

    def forced_ahead(self) -> tuple[int, ...]:
        """The next tokens when the steering leaves no choice (a Force, or an Allow of one
        token), emitted without the logits of their position — so they go into the same step
        as the tokens before them; () when the next token is the model's to choose. The test
        hook sees an allowed token as it sees a sampled one."""
        directive = self._directive()
        if isinstance(directive, Allow) and len(directive.tokens) == 1:
            token = directive.tokens[0]
            tokens: tuple[int, ...] = (self._chooser(token) if self._chooser else token,)
        elif isinstance(directive, Force):
            tokens = directive.tokens
        else:
            return ()
        self._ahead = _UNREAD
        self.last = Force(tokens)
        return tokens

    def _directive(self) -> Directive:
        """The steering's directive for the next token, read once (reading may change the
        steering: a reasoning budget is spent when its Force is read)."""
        if isinstance(self._ahead, _Unread):
            self._ahead = self._steering.next() if self._steering is not None else None
        return self._ahead

    def next_pick(self) -> bool | None:
        """What the next pick needs (the plan reads it): None, no logits (the steering forces
        it); True, it may be drawn on the backend (free text, backend sampling on for this
        request); False, the host's logits."""
        directive = self._directive()
        forced = isinstance(directive, Allow) and len(directive.tokens) == 1
        if forced or isinstance(directive, Force):
            return None
        return self._backend and eligible_directive(directive)

    def sample_on_backend(self, on: bool | None) -> None:
        """Before the decode: set the sequence's chain for the next pick (True: one for its
        banned tokens, kept while it serves), take it off (False), or leave it (None). A chain
        set up once cannot be set again: a new one is made, seeded from the generation's
        stream. Where llama.cpp cannot sample it on the backend, the pick stays on the host."""
        if on is None:
            return
        if not on:
            self._clear_backend()
            return
        directive = self._directive()
        banned = directive.banned if isinstance(directive, Constrain) else frozenset()
        if self._backend_chain is not None and self._backend_chain.banned == banned:
            return
        self._clear_backend()
        chain = BackendChain(self._ctx.vocab, self._params, chain_seed(self._rng), banned)
        if not self._ctx.set_backend_chain(self._seq_id, chain.pointer):
            chain.free()
            self._backend = False  # this build cannot: the host draws from now on
            return
        self._backend_chain = chain
        self.switches += 1

    def _clear_backend(self) -> None:
        if self._backend_chain is not None:
            self._ctx.set_backend_chain(self._seq_id, None)
            self._backend_chain.free()
            self._backend_chain = None
            self.switches += 1

    def next_tokens(self, index: int) -> tuple[int, ...]:
        """The forced tokens, or one token picked from the logits at batch position `index`
        (or drawn there by the sequence's backend chain)."""
        directive = self._directive()
        self._ahead = _UNREAD
        self.last = directive
        if isinstance(directive, Force):
            return directive.tokens
        if isinstance(directive, Allow) and len(directive.tokens) == 1:  # no choice: forced
            self.last = Force(directive.tokens)  # (a guessed header verified: plan.py)
            token = directive.tokens[0]
            return (self._chooser(token) if self._chooser else token,)
        if self._backend_chain is not None:
            token = self._backend_sampled(directive, index)
        elif isinstance(directive, Allow):
            logits = self._ctx.logits(index)
            token = sample_among(logits, directive.tokens, self._params, self._rng)
            self._count_choice(index, directive.tokens)
        elif isinstance(directive, Constrain) and directive.grammar is not None:
            token = self._grammar_for(directive).sample(index)
        elif self._ctx.llama_sampling:
            token = self._chain_sample(directive, index)
        else:
            n_vocab = self._ctx.info.n_vocab
            banned = banned_of(directive.banned, n_vocab) if directive is not None else None
            token = self._sampler.sample(self._ctx.logits(index), banned)
        if self._chooser is not None:
            token = self._chooser(token)
        return (token,)

    def _backend_sampled(self, directive: Directive, index: int) -> int:
        """The token the sequence's chain drew at `index`, accepted by the chain (its draws'
        stream advances only then: sampling/backend_chain.py)."""
        chain = self._backend_chain
        assert chain is not None
        banned = directive.banned if isinstance(directive, Constrain) else frozenset()
        if not eligible_directive(directive) or banned != chain.banned:
            raise RuntimeError("a backend chain was set for a pick it does not serve")
        token = self._ctx.sampled_token(index)
        if token < 0:
            raise RuntimeError("llama.cpp drew no token on the backend")
        chain.accept(token)
        return token

    def accept(self, token: int) -> None:
        if self._steering is not None:
            self._steering.accept(token)

    def _count_choice(self, index: int, allowed: tuple[int, ...]) -> None:
        self.choices += 1
        if int(np.argmax(self._ctx.logits(index))) not in allowed:
            self.overrides += 1

    def free(self) -> None:
        self._clear_backend()
        for chain in self._chains.values():
            chain.free()
        for grammar in self._grammars.values():
            grammar.free()

    def _chain_sample(self, constraint: Constrain | None, index: int) -> int:
        """A token from llama.cpp's chain; never one whose logit is NaN (its greedy stage keeps
        a NaN that comes first): the NaN are then set to -inf in the buffer and it draws again."""
        chain = self._chain_for(constraint)
        token = chain.sample(index)
        logits = self._ctx.logits(index)
        if math.isnan(logits[token]):
            logits[np.isnan(logits)] = -np.inf
            token = chain.sample(index)
        return token

    def _chain_for(self, constraint: Constrain | None) -> LlamaSamplerChain:
        chain = self._chains.get(constraint)
        if chain is None:
            chain = self._ctx.new_chain(self._params, chain_seed(self._rng), constraint)
            self._chains[constraint] = chain
        return chain

    def _grammar_for(self, constraint: Constrain) -> GrammarSampler:
        sampler = self._grammars.get(constraint)
        if sampler is None:
            sampler = GrammarSampler(self._ctx, self._params, constraint, self._rng)
            self._grammars[constraint] = sampler
        return sampler
