"""The verify cost of the loaded model, timed when the engine starts, and whether to speculate.

A verify step evaluates a sequence's pending token and k drafted ones, every one with its logits.
`measure_verify_cost` times such steps against plain ones on an empty sequence of the context
(through `VerifyTarget`, which a LlamaContext is) and `start_speculation` decides from the
settings (and, batch-invariant, that cost) whether the engine speculates at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from server.engine.base import BatchPart, EngineConfig
from server.engine.speculative.draft_length import VerifyCost
from server.engine.speculative.drafter import Speculator

log = logging.getLogger(__name__)

MEASURED_K = (0, 1, 2, 4, 8, 16)  # draft lengths timed; the others are interpolated
_PREFIX = 64  # context the timed verifies attend to


class VerifyTarget(Protocol):
    """What timing a verify uses of a llama.cpp context (a LlamaContext)."""

    @property
    def n_swa(self) -> int:
        """The sliding window of the model's windowed layers (0: none)."""

    def decode(self, parts: Sequence[BatchPart]) -> list[int]: ...

    def logits(self, index: int) -> Any: ...

    def truncate(self, seq_id: int, n_keep: int) -> int: ...


def measure_verify_cost(
    ctx: VerifyTarget,
    seq_id: int,
    draft_max: int,
    rounds: int = 2,
    ks: Iterable[int] = MEASURED_K,
) -> tuple[VerifyCost, dict[int, float]]:
    """Time a step of 1 + k tokens (all with logits, copied to the host) against one of 1 token,
    for the draft lengths `ks` (the others interpolated), on an empty sequence; the sequence is
    empty again afterwards. Returns the costs and the fastest seconds of each measured k (the
    fastest of the rounds: what the model costs, with the least of what else ran on the
    machine)."""
    ks = sorted({k for k in ks if k <= draft_max} | {0, draft_max})
    prefix = [1000 + (i * 7919) % 90000 for i in range(_PREFIX)]
    step_tokens = [1000 + (i * 104729) % 90000 for i in range(ks[-1] + 1)]  # pending + draft
    ctx.decode([BatchPart(seq_id, prefix, 0, True)])
    times: dict[int, list[float]] = {k: [] for k in ks}

    def step(k: int) -> None:
        start = time.perf_counter()
        index = ctx.decode([BatchPart(seq_id, step_tokens[: k + 1], _PREFIX, True, k + 1)])[0]
        ctx.logits(index)  # waits for the decode: on a GPU, llama_decode returns before its end
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


def start_speculation(ctx: VerifyTarget, config: EngineConfig) -> Speculator | None:
    """The engine's Speculator, its verify cost measured (auto); None where speculation is off
    (by the settings, because rejected cells cannot be removed, or, batch-invariant, because
    drafts cannot pay on the start-up curve). Otherwise a curve on which no draft pays keeps
    speculation on: a timing on a loaded machine can be far too steep, and the controller
    probes (controller.py). With "on" every verify counts as one step: each sequence drafts
    whatever the context offers (up to draft_max) while any of its drafts are accepted."""
    if config.speculative == "off" or config.draft_max <= 0:
        return None
    isolated = config.batch_invariant  # a sequence's drafts weighed by its own acceptance only
    if ctx.n_swa > 0 and not config.swa_full:
        log.info("speculative decoding off: the sliding-window cache is not full-size")
        return None
    if config.speculative == "on":  # drafts as long as the context offers, cost unweighed
        log.info("speculative decoding on, up to %d drafted tokens a step", config.draft_max)
        return Speculator(
            VerifyCost((1.0,) * (config.draft_max + 1)), isolated=isolated, timed=False
        )
    cost, _ = measure_verify_cost(ctx, 0, config.draft_max)
    shown = ", ".join(f"{k}:{c:.2f}" for k, c in enumerate(cost.cost))
    if cost.pays():
        log.info("speculative decoding on, verify cost by draft length %s", shown)
    elif isolated:  # drafts weighed on this curve alone: none would ever be verified
        log.info("speculative decoding off: a verify costs too much here (%s)", shown)
        return None
    else:  # a timing on a loaded machine can be far too steep: the steps' own times decide
        log.info("speculative decoding on, drafting only where measured steps pay (%s)", shown)
    # the batch-invariant mode drafts by acceptance alone: its steps' times would make which
    # drafts it verifies depend on the machine's load
    return Speculator(cost, isolated=isolated, timed=not isolated)
