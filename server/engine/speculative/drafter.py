"""Speculator and SequenceDrafter: what each generation drafts, and the acceptance it has had.

The `Speculator` holds the engine's speculation settings (the verify cost of the loaded model,
whose length is the longest draft) and the acceptance the model's drafts have had over its recent
sequences, each new sequence's prior. A `SequenceDrafter` follows one generation: its n-gram
drafter over the prompt and every emitted token (ngram.py), its own acceptance, and the counters
the result reports; `propose` gives the draft to verify after the last emitted token, as long as
the engine's DraftController (controller.py) says it pays, and `settle` records how much of it
the verify confirmed. A draft the controller declines is scored all the same, against the
tokens the sequence emits next (a verify would have accepted exactly those that match), so the
acceptance follows the text whether it drafts or not, and a sequence whose text starts copying
drafts again as soon as its declined drafts start matching, with no verify paid to find out.

The prompt is indexed once the generation drafts, not when it starts (indexing an 8k-token
prompt takes ≈ 7 ms on a 2-core CPU, which would delay every turn's first token), nor at the
first chance to draft: that is the step after the first content token, whose consumer needs
the GIL then to send the client its first text. From the second chance on, each step indexes at
most `INDEX_SLICE` tokens, so a long prompt never stalls every stream of the batch for the whole
build; drafting starts once the index has caught up (the measurements:
devkit/notes/speculative-measurements.md).

An agent's next turn extends the last one's sequence (its prompt is the earlier prompt, the exact
tokens sampled and the tool's result): `follow` takes the index the sequence's slot last had, and
where the new prompt starts with that index's whole sequence, only the new tokens are indexed.
Either way the index is the one a build from scratch gives (the same tokens in the same order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from server.engine.speculative.controller import DraftController
from server.engine.speculative.draft_length import MODEL_DECAY, Acceptance, VerifyCost
from server.engine.speculative.ngram import NgramDrafter

INDEX_SLICE = 1024  # tokens a step indexes at most while the index catches up with the sequence


@dataclass
class Speculator:
    """The engine's speculation settings, the verify cost of its model and the acceptance its
    drafts have had (each new sequence's prior)."""

    measured: VerifyCost  # at start-up (verify_cost.py)
    acceptance: Acceptance = field(default_factory=lambda: Acceptance(decay=MODEL_DECAY))
    isolated: bool = False  # each sequence's acceptance starts from PRIOR, not the model's
    timed: bool = True  # weigh the steps' own times (auto); False: the costs as given (on)
    controller: DraftController = field(init=False)  # the draft lengths (controller.py)

    def __post_init__(self) -> None:
        self.controller = DraftController(self.measured, timed=self.timed)

    @property
    def draft_max(self) -> int:
        """The most drafted tokens verified in one step (the costs known)."""
        return self.measured.draft_max

    def step_took(self, drafted: int, seconds: float, sequences: int = 1, emitted: int = 0) -> None:
        """A step of `sequences` generating ones (no prefill in its batch) with `drafted`
        drafted tokens in all took `seconds`, its picks included, and emitted `emitted` tokens
        (Scheduler.step)."""
        if drafted == 0:
            self.controller.plain(seconds, sequences)
        else:
            self.controller.drafted(drafted, seconds, sequences, emitted)

    def follow(self, tokens: Sequence[int], earlier: NgramDrafter | None = None) -> SequenceDrafter:
        """A new generation's drafter; `earlier`: the index its slot's last generation left."""
        prior = None if self.isolated else self.acceptance
        return SequenceDrafter(self, tuple(tokens), Acceptance(prior), _earlier=earlier)


@dataclass
class SequenceDrafter:
    """One generation's n-gram drafter, acceptance and counters."""

    speculator: Speculator
    prompt: tuple[int, ...]  # indexed once the generation drafts (the module's docstring)
    acceptance: Acceptance
    drafted: int = 0  # draft tokens verified (llama-server's draft_n)
    accepted: int = 0  # of them accepted (draft_n_accepted)
    _order: int = 0
    _index: NgramDrafter | None = None  # the sequence's first tokens, the rest in `_behind`
    _behind: list[int] = field(default_factory=list)  # the tokens not indexed yet, in order
    _chances: int = 0  # calls of `propose`
    _earlier: NgramDrafter | None = None  # an earlier turn's index, extended where it fits
    _shadow: tuple[int, ...] = ()  # a declined draft, scored against the tokens emitted next
    _shadow_order: int = 0
    _shadow_matched: int = 0

    @property
    def ngram(self) -> NgramDrafter:
        """The n-gram index of the prompt and every emitted token, caught up at once."""
        self._catch_up(len(self.prompt) + len(self._behind))
        assert self._index is not None
        return self._index

    def index(self) -> NgramDrafter | None:
        """The index to hand to the slot's next generation (None: none was ever started); its
        tokens begin the sequence, whatever the generation ended before indexing."""
        return self._index if self._index is not None else self._earlier

    def append(self, token: int) -> None:
        """An emitted token (the n-gram drafter's sequence is the prompt and every emitted one)."""
        if self._shadow:
            self._score_shadow(token)
        if self._index is None or self._behind:
            self._behind.append(token)
        else:
            self._index.append(token)

    def _catch_up(self, budget: int) -> bool:
        """Index up to `budget` more tokens of the sequence; True once none is left out. The
        first call starts the index: the earlier turn's where the prompt begins with its
        sequence (the prompt's other tokens then wait), else an empty one (the whole prompt)."""
        index = self._index
        if index is None:
            earlier, self._earlier = self._earlier, None
            n = len(earlier.tokens) if earlier is not None else 0
            if (
                earlier is not None
                and n <= len(self.prompt)
                and earlier.tokens == list(self.prompt[:n])
            ):
                index = earlier
            else:
                index, n = NgramDrafter(()), 0
            self._index = index
            self._behind[:0] = self.prompt[n:]
        if self._behind:
            index.extend(self._behind[:budget])
            del self._behind[:budget]
        return not self._behind

    def propose(self, limit: int, banned: frozenset[int]) -> tuple[int, ...]:
        """The draft to verify after the last emitted token, at most `limit` tokens; none while
        the index catches up with the sequence (the module's docstring)."""
        self._chances += 1
        if self._chances == 1 or not self._catch_up(INDEX_SLICE):
            return ()
        assert self._index is not None
        found = self._index.draft(min(limit, self.speculator.draft_max))
        if found is None:
            return ()
        tokens = found.tokens
        for i, token in enumerate(tokens):
            if token in banned:  # the steering would refuse it
                tokens = tokens[:i]
                break
        if not tokens:
            return ()
        rate = self.acceptance.rate(found.order)
        evidence = self.acceptance.tried.get(found.order, 0.0)  # this sequence's own
        k = self.speculator.controller.length(rate, min(limit, len(tokens)), evidence)
        if k == 0:  # declined: what it would have had accepted is learnt all the same
            if not self._shadow:
                self._shadow, self._shadow_order, self._shadow_matched = tokens, found.order, 0
            return ()
        self._shadow = ()  # a verify counts from here
        self._order = found.order
        return tokens[:k]

    def _score_shadow(self, token: int) -> None:
        """The next emitted token after a declined draft: the draft's next token or its end.
        A verify accepts a draft's tokens exactly while they are those the sequence emits
        (speculation changes no output), so a declined draft scored against the tokens that
        follow counts as the verify it would have been, at no cost."""
        if token == self._shadow[self._shadow_matched]:
            self._shadow_matched += 1
            if self._shadow_matched < len(self._shadow):
                return
        drafted, matched = len(self._shadow), self._shadow_matched
        self._shadow = ()
        self.acceptance.record(self._shadow_order, drafted, matched)
        self.speculator.acceptance.record(self._shadow_order, drafted, matched)

    def settle(self, drafted: int, accepted: int) -> None:
        """The verify of the last proposed draft: `accepted` of its `drafted` tokens confirmed."""
        self.drafted += drafted
        self.accepted += accepted
        self.acceptance.record(self._order, drafted, accepted)
        self.speculator.acceptance.record(self._order, drafted, accepted)
