"""Speculation: exact speculative decoding of one sequence from its own context.

Each step, a generating sequence may put drafted tokens (speculative/ngram.py) after its pending
token in the continuous batch, every one with its logits. The verify (Scheduler._verify) then
picks tokens exactly as a plain step would — the TokenPicker, with its steering, grammars, seeded
sampler and test hook — at the first position, and at each next one only while every token so
far equals the draft: the logits there are those of the true prefix. So the output is the
non-speculative output, token for token for a given seed (greedy and sampled alike); a sampled
token is drawn from the target distribution at every position, and a draft is accepted exactly
when the draw equals it (probability p(draft), no bias). Forced tokens, header choices and
grammar-constrained tokens go through the same picker: a drafted token the steering refuses is
never picked, so it ends the draft, and a grammar's state only ever sees picked tokens.

The KV cells of the rejected positions are removed (llama_memory_seq_rm on the tail); with the
full-size sliding-window cache (EngineConfig.swa_full, the default) that restores the state as if
they had never been decoded; with a window-sized one the tail cannot be removed safely, and
speculation stays off. How many tokens to draft is chosen per sequence (draft_length.py) from its
recent acceptance, the model's over its recent sequences and the verify cost measured here when
the engine starts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from server.engine.base import EngineConfig
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.speculative.draft_length import (
    MODEL_DECAY,
    Acceptance,
    VerifyCost,
    draft_length,
)
from server.engine.speculative.ngram import NgramDrafter

log = logging.getLogger(__name__)

MEASURED_K = (0, 1, 2, 4, 8, 16)  # draft lengths timed; the others are interpolated
_PREFIX = 64  # context the timed verifies attend to


def measure_verify_cost(
    ctx: LlamaContext,
    seq_id: int,
    draft_max: int,
    rounds: int = 2,
    ks: Iterable[int] = MEASURED_K,
) -> tuple[VerifyCost, dict[int, float]]:
    """Time a step of 1 + k tokens (all with logits) against one of 1 token, for the draft
    lengths `ks` (the others interpolated), on an empty sequence; the sequence is empty again
    afterwards. Returns the costs and the fastest seconds of each measured k (the fastest of
    the rounds: what the model costs, with the least of what else ran on the machine)."""
    ks = sorted({k for k in ks if k <= draft_max} | {0, draft_max})
    prefix = [1000 + (i * 7919) % 90000 for i in range(_PREFIX)]
    ctx.decode([BatchPart(seq_id, prefix, 0, True)])
    times: dict[int, list[float]] = {k: [] for k in ks}

    def step(k: int) -> None:
        start = time.perf_counter()
        ctx.decode([BatchPart(seq_id, prefix[: k + 1], _PREFIX, True, k + 1)])
        times[k].append(time.perf_counter() - start)
        ctx.truncate(seq_id, _PREFIX)

    try:
        for _ in range(rounds + 1):  # the first round warms up and is not kept
            for k in ks:
                if k > 0:  # a plain step just before each: both see the machine as it is then
                    step(0)
                step(k)
    finally:
        ctx.truncate(seq_id, 0)
    warm = len(ks)  # the first round's steps (plain ones included) are not kept
    fastest = {k: min(t[1:] if k else t[warm:]) for k, t in times.items()}
    return VerifyCost.interpolate(fastest, draft_max), fastest


@dataclass
class Speculator:
    """The engine's speculation settings, the verify cost of its model and the acceptance its
    drafts have had (each new sequence's prior)."""

    cost: VerifyCost
    draft_max: int
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(decay=MODEL_DECAY))

    @classmethod
    def start(cls, ctx: LlamaContext, config: EngineConfig) -> Speculator | None:
        """Measure the verify cost (auto); None where speculation is off (by the settings,
        because rejected cells cannot be removed, or because drafts cannot pay on this model).
        With "on" every verify counts as one step: each sequence drafts whatever the context
        offers (up to draft_max) while any of its drafts are accepted."""
        if config.speculative == "off" or config.draft_max <= 0:
            return None
        if ctx.n_swa > 0 and not config.swa_full:
            log.info("speculative decoding off: the sliding-window cache is not full-size")
            return None
        if config.speculative == "on":  # drafts as long as the context offers, cost unweighed
            log.info("speculative decoding on, up to %d drafted tokens a step", config.draft_max)
            return cls(VerifyCost((1.0,) * (config.draft_max + 1)), config.draft_max)
        cost, _ = measure_verify_cost(ctx, 0, config.draft_max)
        shown = ", ".join(f"{k}:{c:.2f}" for k, c in enumerate(cost.cost))
        if not cost.pays():
            log.info("speculative decoding off: a verify costs too much here (%s)", shown)
            return None
        log.info("speculative decoding on, verify cost by draft length %s", shown)
        return cls(cost, config.draft_max)

    def follow(self, tokens: Sequence[int]) -> SequenceDrafts:
        return SequenceDrafts(self, NgramDrafter(tokens), Acceptance(self.acceptance))


@dataclass
class SequenceDrafts:
    """One generation's drafter, acceptance and counters."""

    speculator: Speculator
    drafter: NgramDrafter
    acceptance: Acceptance
    drafted: int = 0  # draft tokens verified (llama-server's draft_n)
    accepted: int = 0  # of them accepted (draft_n_accepted)
    _order: int = 0

    def append(self, token: int) -> None:
        """An emitted token (the drafter's sequence is the prompt and every emitted token)."""
        self.drafter.append(token)

    def propose(self, limit: int, banned: frozenset[int]) -> tuple[int, ...]:
        """The draft to verify after the last emitted token, at most `limit` tokens."""
        found = self.drafter.draft(min(limit, self.speculator.draft_max))
        if found is None:
            return ()
        tokens = found.tokens
        for i, token in enumerate(tokens):
            if token in banned:  # the steering would refuse it
                tokens = tokens[:i]
                break
        k = draft_length(self.speculator.cost, self.acceptance, found.order, tokens, limit)
        if k == 0:
            self.acceptance.drift(found.order)
            self.speculator.acceptance.drift(found.order)
            return ()
        self._order = found.order
        return tokens[:k]

    def settle(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.acceptance.record(self._order, drafted, accepted)
        self.speculator.acceptance.record(self._order, drafted, accepted)


def accepted_prefix(emitted: Sequence[int], draft: Sequence[int]) -> int:
    """How many drafted tokens the emitted ones confirm (they match from the first)."""
    n = 0
    for made, drafted in zip(emitted, draft, strict=False):
        if made != drafted:
            break
        n += 1
    return n
