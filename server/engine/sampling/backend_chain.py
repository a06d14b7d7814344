"""BackendChain: a sequence's tokens drawn by llama.cpp's sampler chain inside the model's graph.

llama.cpp's backend sampling (`llama_set_sampler`, experimental) evaluates a chain on the device
that holds the logits, so only the sampled token comes back, not the row of 201,088 floats. It
serves plain free text only (`eligible`): the banned tokens as a logit bias of -inf, then the
temperature and the seeded draw, or greedy. Everything else is drawn on the host from the
logits: an allowed set (a harmony header), a grammar, logprobs, top-k/top-p/min-p (the host
sampler's exact semantics), the batch-invariant mode.

Two facts of llama.cpp shape this:

- A chain is set up on the backend once (a second `llama_set_sampler` of the same chain fails
  an assertion): each time a sequence goes back to the backend a new chain is made, seeded from
  the generation's random stream, so the same seed gives the same tokens. Each set or clear
  makes llama.cpp reserve its graphs again at the next decode (the switch cost,
  `scripts/bench/backend_sampling.py --switches`).
- Its draw may be transactional (where a context keeps several outputs per sequence): the
  uniform number then comes from a copy of the stream at each decode, and the stream itself
  advances when a token is accepted. Every token read back is accepted (`accept`), as
  llama.cpp's own server does.

While a sequence has a chain, llama.cpp copies no logits for a batch whose every output row has
one: the host can read none of them; the engine clears the chain before a step whose pick needs
the logits.
"""

from __future__ import annotations

from typing import Any

import llama_cpp.llama_cpp as lc

from server.contracts.directives import Constrain
from server.engine.base import SamplingParams
from server.engine.sampling.llama_chain import constraint_stages, sampler_stages

MODES = ("auto", "on", "off")


def eligible_params(params: SamplingParams) -> bool:
    """Whether a request's settings leave its free text to the backend chain: no logprobs,
    plain temperature (top-k, top-p and min-p stay on the host)."""
    return (
        params.logprobs is None
        and not params.prompt_logprobs
        and params.top_k <= 0
        and params.top_p >= 1.0
        and params.min_p <= 0.0
    )


def eligible_directive(directive: object) -> bool:
    """Whether a pick under `directive` is free text: no steering, or banned tokens alone."""
    return directive is None or (isinstance(directive, Constrain) and directive.grammar is None)


def resolve(mode: str, *, output_on_gpu: bool, speculative: str) -> bool:
    """Whether the engine samples free text on the backend. `auto`: only where it measured
    faster: with the output layer on a GPU and speculation off (the decode loop of
    scripts/bench/backend_sampling.py, H200: 280.8 against 272.7 tok/s). On the CPU it measured
    slower (tiny model, 2 threads: 17.6 against 36.2 tok/s; devkit/notes/sampling-measurements.md):
    off. With speculation on, a sequence whose free text is drawn on the backend drafts nothing:
    unmeasured, off."""
    if mode not in MODES:
        raise ValueError(f"backend sampling mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "auto":
        return output_on_gpu and speculative == "off"
    return mode == "on"


class BackendChain:
    """One chain set on one sequence: made for a constraint's banned tokens and the request's
    temperature, its draws seeded with `seed` (sampling.llama_chain.chain_seed)."""

    def __init__(
        self, vocab: Any, params: SamplingParams, seed: int, banned: frozenset[int]
    ) -> None:
        self.banned = banned
        stages = constraint_stages(vocab, Constrain(banned)) + sampler_stages(params, seed)
        self.pointer = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        for stage in stages:
            lc.llama_sampler_chain_add(self.pointer, stage)  # the chain owns its stages

    def accept(self, token: int) -> None:
        """The token read back was taken: the draw's stream advances."""
        lc.llama_sampler_accept(self.pointer, token)

    def free(self) -> None:
        lc.llama_sampler_free(self.pointer)
