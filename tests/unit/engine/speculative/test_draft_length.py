"""Draft length: tokens per unit of verify cost, acceptance estimates, break-even points."""

from __future__ import annotations

import random

import pytest

from server.engine.speculative.draft_length import (
    MODEL_DECAY,
    PRIOR,
    Acceptance,
    VerifyCost,
    expected_tokens,
)
from server.engine.speculative.drafter import INDEX_SLICE, Speculator
from server.engine.speculative.ngram import NgramDrafter

FLAT = VerifyCost.interpolate({0: 1.0, 16: 1.0}, 16)  # a verify costs what a step costs
# gpt-oss-20b-like: every drafted token routes to more experts
STEEP = VerifyCost.interpolate({0: 0.01, 1: 0.014, 2: 0.017, 4: 0.022, 8: 0.03, 16: 0.045}, 16)


def test_interpolation_is_relative_to_one_step() -> None:
    cost = VerifyCost.interpolate({0: 2.0, 2: 3.0, 4: 5.0}, 6)
    assert cost.cost == (1.0, 1.25, 1.5, 2.0, 2.5, 2.5, 2.5)
    assert cost.draft_max == 6
    noisy = VerifyCost.interpolate({0: 2.0, 1: 1.8}, 1)
    assert noisy.cost == (1.0, 1.0)  # never cheaper than a step


def test_expected_tokens() -> None:
    assert expected_tokens(0, 0.5) == 1.0
    assert expected_tokens(3, 0.5) == pytest.approx(1.875)
    assert expected_tokens(4, 1.0) == 5.0


def test_free_verifies_draft_everything_unless_nothing_is_accepted() -> None:
    assert FLAT.best(0.9, 16) == 16
    assert FLAT.best(0.5, 16) == 16
    assert FLAT.best(0.0, 16) == 0
    assert FLAT.best(0.9, 3) == 3


def test_costly_verifies_need_acceptance() -> None:
    assert STEEP.best(0.2, 16) == 0
    assert 0 < STEEP.best(0.7, 16) < STEEP.best(0.95, 16)
    assert STEEP.break_even(8) > STEEP.break_even(1)
    for k in (1, 4, 8, 16):
        a = STEEP.break_even(k)
        assert STEEP.gain(k, a) == pytest.approx(1.0, abs=1e-6)
    assert STEEP.pays()
    hopeless = VerifyCost.interpolate({0: 1.0, 1: 2.0, 2: 3.0}, 2)
    assert not hopeless.pays()
    assert hopeless.break_even(1) == 1.0


def test_acceptance_follows_recent_verifies_per_order() -> None:
    acceptance = Acceptance()
    assert acceptance.rate(3) == PRIOR[3]
    assert acceptance.rate(6) > acceptance.rate(1)
    for _ in range(20):
        acceptance.record(3, drafted=8, accepted=8)
        acceptance.record(1, drafted=4, accepted=0)
    assert acceptance.rate(3) > 0.9
    assert acceptance.rate(1) < 0.1
    assert STEEP.best(acceptance.rate(3), 16) > 0
    assert STEEP.best(acceptance.rate(1), 16) == 0


def test_a_new_sequence_starts_from_what_the_models_drafts_got() -> None:
    """The model-wide estimate (slow decay) is each sequence's prior, read live: after
    sequences whose drafts missed, a new one does not draft at first; after ones that copied,
    it drafts long."""
    missing = Acceptance(decay=MODEL_DECAY)
    copying = Acceptance(decay=MODEL_DECAY)
    assert STEEP.best(Acceptance(missing).rate(6), 16) > 0  # PRIOR: order 6 drafts
    for _ in range(12):
        missing.record(6, drafted=4, accepted=0)
        copying.record(6, drafted=8, accepted=8)
    sequence = Acceptance(missing)
    assert STEEP.best(sequence.rate(6), 16) == 0
    assert STEEP.best(Acceptance(copying).rate(6), 16) >= 8
    assert sequence.rate(3) == PRIOR[3]  # orders the model has not tried keep PRIOR


def test_the_prompt_is_indexed_from_the_second_chance_to_draft() -> None:
    """Following a generation indexes nothing (its prefill starts at once: indexing an 8k-token
    prompt took 5.7 ms), nor does the first chance to draft (the step after the first content
    token, whose consumer needs the GIL then); the second chance's draft sees the prompt and
    every emitted token, as an index built at the start and appended to would."""
    prompt = [7, 8, 9, 1, 2, 3, 4, 5, 6] * 20
    speculator = Speculator(FLAT, timed=False)
    drafter = speculator.follow(prompt)
    eager = NgramDrafter(prompt)
    for token in (7, 8, 9, 1):
        drafter.append(token)
        eager.append(token)
    assert drafter._index is None
    assert drafter.propose(4, frozenset()) == ()
    assert drafter._index is None
    drafter.append(2)
    eager.append(2)
    expected = eager.draft(4)
    assert expected is not None
    assert drafter.propose(4, frozenset()) == expected.tokens == (3, 4, 5, 6)
    drafter.append(3)
    eager.append(3)
    assert drafter.ngram.tokens == eager.tokens
    assert drafter.ngram.draft(16) == eager.draft(16)


def test_a_long_prompt_is_indexed_a_slice_a_step() -> None:
    """No step indexes more than INDEX_SLICE tokens; drafts start once the index has caught up,
    with the tokens emitted meanwhile in their place, and the index is a from-scratch build's."""
    rng = random.Random(5)
    prompt = [rng.randrange(50) for _ in range(3 * INDEX_SLICE + 100)]
    drafter = Speculator(FLAT, timed=False).follow(prompt)
    emitted: list[int] = []
    sizes = []
    for step in range(8):
        before = len(drafter._index.tokens) if drafter._index is not None else 0
        draft = drafter.propose(4, frozenset())
        after = len(drafter._index.tokens) if drafter._index is not None else 0
        sizes.append(after - before)
        caught_up = after == len(prompt) + len(emitted)
        assert (draft != ()) <= caught_up
        token = prompt[step]
        drafter.append(token)
        emitted.append(token)
    assert sizes == [0, INDEX_SLICE, INDEX_SLICE, INDEX_SLICE, 100 + 4, 0, 0, 0]
    fresh = NgramDrafter([*prompt, *emitted])
    assert drafter._index is not None
    assert drafter._index.tokens == fresh.tokens
    assert drafter._index._index == fresh._index
    assert drafter._index.draft(8) == fresh.draft(8)


def test_a_turn_that_extends_the_last_ones_sequence_extends_its_index() -> None:
    """An agent's next turn: its prompt is the last turn's sequence and more. The first draft
    extends the index the slot's last generation left (only the new tokens indexed) into the
    index a build from scratch gives; a prompt that does not start with that sequence gets an
    index of its own and leaves the earlier one as it was."""
    speculator = Speculator(FLAT, timed=False)
    first = speculator.follow([5, 6, 7, 8, 9] * 30)
    for token in (5, 6, 7):
        first.append(token)
    earlier = first.ngram
    assert first.index() is earlier
    turn = [*earlier.tokens, 1, 2, 5, 6]
    second = speculator.follow(turn, earlier)
    second.append(7)
    assert second.ngram is earlier  # extended, not rebuilt
    fresh = NgramDrafter([*turn, 7])
    assert earlier.tokens == fresh.tokens
    assert earlier._index == fresh._index
    assert earlier.draft(8) == fresh.draft(8)
    before = list(earlier.tokens)
    other = speculator.follow([9, *turn], earlier)
    assert other.ngram is not earlier
    assert earlier.tokens == before
    assert other.index() is other.ngram
    unbuilt = speculator.follow(turn, earlier)
    assert unbuilt.index() is earlier  # never drafted: the slot keeps the earlier index
