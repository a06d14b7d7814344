"""Speculator and SequenceDrafter: what each generation drafts, and the acceptance it has had.

The `Speculator` holds the engine's speculation settings (the verify cost of the loaded model,
whose length is the longest draft) and the acceptance the model's drafts have had over its recent
sequences, each new sequence's prior. A `SequenceDrafter` follows one generation: its n-gram
drafter over the prompt and every emitted token (ngram.py), its own acceptance, and the counters
the result reports; `propose` gives the draft to verify after the last emitted token, as long as
draft_length.py says pays, and `settle` records how much of it the verify confirmed.

The prompt is indexed at the first draft, not when the generation starts: indexing takes
0.7 to 1 µs a token (5.7 to 8.0 ms for an 8k-token prompt on a 2-core CPU), and done at the start it
delayed every turn's prefill, so its first token, by that much. An agent's next turn extends the
last one's sequence (its prompt is the earlier prompt, the exact tokens sampled and the tool's
result): `follow` takes the index the sequence's slot last had, and where the new prompt starts
with that index's whole sequence, only the new tokens are indexed (the index is then the one a
build from scratch would give: the same tokens in the same order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from server.engine.speculative.draft_length import (
    MODEL_DECAY,
    Acceptance,
    StepTimes,
    VerifyCost,
    draft_length,
)
from server.engine.speculative.ngram import NgramDrafter


@dataclass
class Speculator:
    """The engine's speculation settings, the verify cost of its model and the acceptance its
    drafts have had (each new sequence's prior)."""

    measured: VerifyCost  # at start-up (verify_cost.py)
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(decay=MODEL_DECAY))
    isolated: bool = False  # each sequence's acceptance starts from PRIOR, not the model's
    timed: bool = True  # weigh the steps' own times (auto); False: the costs as given (on)
    steps: StepTimes = field(default_factory=StepTimes)
    cost: VerifyCost = field(init=False)  # the measured costs, scaled by the steps' times

    def __post_init__(self) -> None:
        self.cost = self.measured

    @property
    def draft_max(self) -> int:
        """The most drafted tokens verified in one step (the costs known)."""
        return self.measured.draft_max

    def step_took(self, drafted: int, seconds: float) -> None:
        """A step of one sequence (nothing else in its batch) with `drafted` drafted tokens
        took `seconds`, its picks included (Scheduler.step)."""
        if not self.timed:
            return
        if drafted == 0:
            self.steps.plain(seconds)
        elif self.steps.drafting(seconds, self.measured.cost[min(drafted, self.draft_max)]):
            self.cost = self.measured.scaled(self.steps.factor)

    def follow(self, tokens: Sequence[int], earlier: NgramDrafter | None = None) -> SequenceDrafter:
        """A new generation's drafter; `earlier`: the index its slot's last generation left."""
        prior = None if self.isolated else self.acceptance
        return SequenceDrafter(self, tuple(tokens), Acceptance(prior), _earlier=earlier)


@dataclass
class SequenceDrafter:
    """One generation's n-gram drafter, acceptance and counters."""

    speculator: Speculator
    prompt: tuple[int, ...]  # indexed at the first draft (the module's docstring)
    acceptance: Acceptance
    drafted: int = 0  # draft tokens verified (llama-server's draft_n)
    accepted: int = 0  # of them accepted (draft_n_accepted)
    _order: int = 0
    _ngram: NgramDrafter | None = None
    _emitted: list[int] = field(default_factory=list)  # before the index was built
    _earlier: NgramDrafter | None = None  # an earlier turn's index, extended where it fits

    @property
    def ngram(self) -> NgramDrafter:
        """The n-gram index of the prompt and every emitted token, built on first use."""
        if self._ngram is None:
            earlier, self._earlier = self._earlier, None
            n = len(earlier.tokens) if earlier is not None else 0
            if (
                earlier is not None
                and n <= len(self.prompt)
                and earlier.tokens == list(self.prompt[:n])
            ):
                earlier.extend((*self.prompt[n:], *self._emitted))
                self._ngram = earlier
            else:
                self._ngram = NgramDrafter((*self.prompt, *self._emitted))
            self._emitted = []
        return self._ngram

    def index(self) -> NgramDrafter | None:
        """The index to hand to the slot's next generation (None: none was ever built)."""
        return self._ngram if self._ngram is not None else self._earlier

    def append(self, token: int) -> None:
        """An emitted token (the n-gram drafter's sequence is the prompt and every emitted one)."""
        if self._ngram is None:
            self._emitted.append(token)
        else:
            self._ngram.append(token)

    def propose(self, limit: int, banned: frozenset[int]) -> tuple[int, ...]:
        """The draft to verify after the last emitted token, at most `limit` tokens."""
        found = self.ngram.draft(min(limit, self.speculator.draft_max))
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
        """The verify of the last proposed draft: `accepted` of its `drafted` tokens confirmed."""
        self.drafted += drafted
        self.accepted += accepted
        self.acceptance.record(self._order, drafted, accepted)
        self.speculator.acceptance.record(self._order, drafted, accepted)
