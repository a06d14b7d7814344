"""The draft controller of `auto`: acceptance history and step times in, a draft length out.

Plain data only. The scenarios: text that copies nothing (nothing drafted after a few misses),
a copy-heavy stretch (long drafts), a verify cost that jumps (drafting stops at that very step,
is probed again after a pause that doubles while probes stay slow), a pause inside one plain
step, steps cheaper than measured, speculation "on" (never paused), declined drafts scored
against the tokens that follow; and a simulation of many steps where the controller's rate
never falls below the plain rate by more than its probes cost.
"""

from __future__ import annotations

import random

import pytest

from server.engine.speculative.controller import (
    PLAIN_WINDOW,
    PROBE_FIRST,
    PROBE_MAX,
    DraftController,
    group,
)
from server.engine.speculative.draft_length import Acceptance, VerifyCost, expected_tokens
from server.engine.speculative.drafter import SequenceDrafter, Speculator

PLAIN_S = 0.004
# a small CPU model with a Q8_0 output: 2 or 3 rows cost what one does, more cost more
CURVE = VerifyCost.interpolate({0: 1.0, 2: 1.0, 4: 1.5, 8: 2.3, 16: 4.1}, 16)
COSTLY = VerifyCost.interpolate({0: 1.0, 1: 1.1, 2: 1.2, 4: 1.6, 8: 2.4, 16: 4.2}, 16)


def warm(controller: DraftController, steps: int = PLAIN_WINDOW, seconds: float = PLAIN_S) -> None:
    for _ in range(steps):
        controller.plain(seconds)


def test_groups() -> None:
    assert [group(k) for k in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]


def test_text_that_copies_nothing_stops_drafting_after_a_few_misses() -> None:
    """On a curve where one drafted row costs a tenth of a step (a GPU, an F32 output), a
    sequence whose drafts miss stops drafting after a few; where two rows cost what one does,
    it goes on drafting only while a draft still pays (an acceptance over 5 %)."""
    controller = DraftController(COSTLY)
    warm(controller)
    acceptance = Acceptance()  # the fixed prior: every order drafts at first
    misses = {}
    for order in (1, 2, 3, 6):
        assert controller.length(acceptance.rate(order), 16) > 0
        misses[order] = 0
        while (k := controller.length(acceptance.rate(order), 16)) > 0 and misses[order] < 50:
            acceptance.record(order, drafted=k, accepted=0)
            misses[order] += 1
    # the long n-grams' prior (0.6, 0.8: a long match usually goes on) takes more misses
    assert misses[1] <= 4
    assert misses[2] <= 6
    assert misses[3] <= 10
    assert misses[6] <= 20
    free = DraftController(CURVE)
    warm(free)
    assert free.length(0.04, 16) == 0  # 1.04 tokens a step at best
    assert free.length(0.3, 16) == 2  # 1.39 tokens for a step's cost


def test_a_copy_heavy_stretch_drafts_long() -> None:
    controller = DraftController(COSTLY)
    warm(controller)
    acceptance = Acceptance()
    for _ in range(4):
        acceptance.record(1, drafted=4, accepted=0)
    assert controller.length(acceptance.rate(1), 16) == 0
    for _ in range(6):  # the text starts copying a block: whole drafts accepted
        acceptance.record(1, drafted=16, accepted=16)
    assert controller.length(acceptance.rate(1), 16) >= 8  # the best rate on this curve
    assert controller.length(acceptance.rate(1), 5) == 5  # never more than available


def test_a_verify_cost_that_jumps_stops_drafting_at_once() -> None:
    """Drafting steps that take what the curve says go on; the first one that takes 3 times
    its prediction stops every draft at once, even at an acceptance of 0.95, for PROBE_FIRST
    plain steps; a probe then drafts; a slow probe doubles the pause, one as predicted ends
    the back-off."""
    controller = DraftController(CURVE)
    warm(controller)
    for _ in range(5):
        k = controller.length(0.8, 16)
        assert k > 0
        controller.drafted(k, PLAIN_S * CURVE.cost[k])
    assert controller.backoffs == 0
    k = controller.length(0.95, 16)
    controller.drafted(k, 3 * PLAIN_S * controller.cost(k))
    assert controller.backoffs == 1
    assert controller.length(0.95, 16) == 0
    assert controller.cost(k) == pytest.approx(3 * CURVE.cost[k], rel=0.35)
    for _ in range(PROBE_FIRST - 1):
        controller.plain(PLAIN_S)
        assert controller.length(0.95, 16) == 0
    controller.plain(PLAIN_S)
    probe = controller.length(0.95, 16)
    assert probe > 0
    assert controller.probes == 1
    controller.drafted(probe, 3 * PLAIN_S * CURVE.cost[probe])  # still slow
    assert controller.length(0.95, 16) == 0
    assert controller.paused == 2 * PROBE_FIRST
    warm(controller, 2 * PROBE_FIRST)
    probe = controller.length(0.95, 16)
    controller.drafted(probe, PLAIN_S * CURVE.cost[probe])  # as predicted: drafting resumes
    assert controller.length(0.95, 16) > 0
    assert controller.gap == PROBE_FIRST


def test_the_pause_between_slow_probes_stops_doubling_at_its_bound() -> None:
    controller = DraftController(CURVE)
    warm(controller)
    pauses = []
    for _ in range(10):
        warm(controller, controller.paused)
        k = controller.length(0.95, 16)
        assert k > 0
        controller.drafted(k, 5 * PLAIN_S * CURVE.cost[k])
        pauses.append(controller.paused)
    assert pauses[:3] == [PROBE_FIRST, 2 * PROBE_FIRST, 4 * PROBE_FIRST]
    assert max(pauses) == pauses[-1] == PROBE_MAX


def test_a_pause_in_one_plain_step_changes_nothing() -> None:
    """Codex's loop: one plain step took 0.77 s among 5-ms ones (a grammar built at its first
    use). The plain time is a median: drafting steps that take what the curve says are weighed
    as such, and the draft lengths stay those of the curve."""
    controller = DraftController(CURVE)
    for i in range(12):
        controller.plain(0.77 if i == 5 else PLAIN_S)
    assert controller.plain_s == PLAIN_S
    for _ in range(10):
        controller.drafted(8, PLAIN_S * CURVE.cost[8])
    assert controller.backoffs == 0
    assert controller.cost(8) == pytest.approx(CURVE.cost[8], rel=0.01)
    assert controller.length(0.1, 16) == CURVE.best(0.1, 16) == 2  # cost(2) is 1 here


def test_steps_cheaper_than_measured_draft_more() -> None:
    controller = DraftController(VerifyCost.interpolate({0: 1.0, 16: 3.0}, 16))
    warm(controller)
    before = controller.length(0.6, 16)
    for _ in range(10):
        controller.drafted(8, PLAIN_S * 1.1)
    assert controller.cost(8) < 1.2
    assert controller.length(0.6, 16) > before


def test_drafting_steps_are_weighed_only_against_plain_ones() -> None:
    controller = DraftController(CURVE)
    assert controller.length(0.9, 16) == 0  # no plain rate to beat yet
    controller.drafted(8, 1.0)  # nothing to weigh it against
    assert controller.backoffs == 0
    assert not controller.factor
    warm(controller, 2)
    assert controller.length(0.9, 16) == 0
    controller.drafted(8, 1.0)
    assert controller.backoffs == 0
    warm(controller, 1)
    assert controller.length(0.9, 16) > 0


def test_speculation_on_is_never_paused() -> None:
    controller = DraftController(VerifyCost((1.0,) * 17), timed=False)
    warm(controller)
    controller.drafted(4, 100 * PLAIN_S)
    assert controller.backoffs == 0
    assert controller.length(0.5, 16) == 16


def follow_text(drafter: SequenceDrafter, text: list[int]) -> list[int]:
    """Generate `text` as the engine would: each step a proposal, verified against the text
    (what speculation changes nothing of); returns the drafted length of every step."""
    drafted = []
    i = 0
    while i < len(text):
        draft = drafter.propose(16, frozenset())
        matched = 0
        ahead = text[i : i + len(draft)]
        while matched < len(ahead) and draft[matched] == ahead[matched]:
            matched += 1
        if draft:
            drafter.settle(len(draft), matched)
        for token in text[i : i + matched + 1]:
            drafter.append(token)
        i += matched + 1
        drafted.append(len(draft))
    return drafted


def test_declined_drafts_are_scored_against_what_follows() -> None:
    """A sequence whose drafts are declined learns their acceptance from the tokens it then
    emits: text that copies nothing stops drafting after a few misses and stays stopped (no
    retry paid), and drafting comes back once the declined drafts match (a copied block)."""
    speculator = Speculator(COSTLY)
    warm(speculator.controller)
    rng = random.Random(3)
    block = list(range(100, 140))
    drafter = speculator.follow([*block, *(rng.randrange(20) for _ in range(200))])
    noise = follow_text(drafter, [rng.randrange(20) for _ in range(300)])
    assert sum(noise[:10]) <= 12  # a few misses at first (orders 1 and 2)
    # then a token now and then: a rare chance match of 3 or 6 tokens, tried at its prior
    assert sum(noise[10:]) <= 12
    assert sum(1 for k in noise[10:] if k) <= 8
    assert drafter.acceptance.rate(1) < 0.1
    copying = follow_text(drafter, block)
    assert drafter.drafted - sum(noise) >= len(block) // 2
    assert len(copying) < len(block) // 3  # several tokens a step


def test_declined_draft_scoring_is_exact() -> None:
    speculator = Speculator(VerifyCost.interpolate({0: 1.0, 1: 50.0, 16: 50.0}, 16), timed=False)
    drafter = speculator.follow([5, 6, 7, 8, 9])
    drafter.append(1)
    drafter.propose(8, frozenset())
    drafter.append(5)
    drafter.append(6)
    assert drafter.propose(8, frozenset()) == ()  # drafting never pays at that cost
    assert drafter._shadow == (7, 8, 9, 1, 5, 6)
    for token in (7, 8, 4):  # two of the six would have been accepted
        drafter.append(token)
    assert not drafter._shadow
    assert drafter.acceptance.accepted == speculator.acceptance.accepted == {2: 2.0}
    assert drafter.acceptance.tried == {2: 3.0}  # the two and the miss
    assert drafter.drafted == drafter.accepted == 0  # nothing was verified


def simulate(
    true_cost: VerifyCost, acceptance: float, steps: int, seed: int, measured: VerifyCost
) -> float:
    """Tokens per second with the controller over tokens per second of plain steps: `steps`
    steps of a sequence whose drafts (16 tokens at hand) are accepted per token at
    `acceptance`, whose steps really cost `true_cost` while the controller started from
    `measured` (a plain step's time with ±10 % noise)."""
    rng = random.Random(seed)
    controller = DraftController(measured)
    estimate = Acceptance()
    tokens = seconds = 0.0

    def matched(k: int) -> int:
        n = 0
        while n < k and rng.random() < acceptance:
            n += 1
        return n

    for _ in range(steps):
        noise = rng.uniform(0.9, 1.1)
        k = controller.length(estimate.rate(1), 16)
        n = matched(16 if k == 0 else k)
        estimate.record(1, 16 if k == 0 else k, n)  # a verify, or the declined draft scored
        took = PLAIN_S * true_cost.cost[k] * noise
        if k == 0:
            controller.plain(took)
            tokens += 1
        else:
            controller.drafted(k, took)
            tokens += 1 + n
        seconds += took
    return (tokens / seconds) * PLAIN_S


@pytest.mark.parametrize("acceptance", [0.0, 0.2, 0.4, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("scale", [1.0, 1.5, 3.0])
def test_the_controller_never_loses_to_plain_steps(acceptance: float, scale: float) -> None:
    """Whatever the acceptance, and whether verifies cost what the start-up curve says or 1.5
    or 3 times more: the rate is at least 0.97 of plain decoding's (the noise and the probes);
    where drafts pay (high acceptance, as measured), well above it."""
    measured = CURVE
    true_cost = VerifyCost((1.0, *(c * scale for c in CURVE.cost[1:])))
    rates = [simulate(true_cost, acceptance, 1500, seed, measured) for seed in range(2)]
    assert min(rates) >= 0.97
    if scale == 1.0 and acceptance >= 0.8:
        expected = max(expected_tokens(k, acceptance) / CURVE.cost[k] for k in range(17))
        assert min(rates) > 0.8 * expected


def test_a_batch_of_sequences_backs_off_when_its_drafts_slow_it() -> None:
    """Four sequences in one batch: weighed against plain batches of four (tokens a second),
    never against one sequence's steps; a batch with drafts that emits fewer tokens a second
    than a plain one backs off, one that emits more does not."""
    controller = DraftController(CURVE)
    warm(controller, seconds=PLAIN_S)  # one sequence alone
    controller.drafted(8, 2 * PLAIN_S, sequences=4, emitted=4)  # no plain batch of 4 timed yet
    assert controller.backoffs == 0
    for _ in range(PLAIN_WINDOW):
        controller.plain(2 * PLAIN_S, sequences=4)  # 4 tokens in 8 ms
    controller.drafted(8, 3 * PLAIN_S, sequences=4, emitted=9)  # 9 tokens in 12 ms: faster
    assert controller.backoffs == 0
    assert controller.length(0.9, 16) > 0
    controller.drafted(8, 3 * PLAIN_S, sequences=4, emitted=5)  # 5 tokens in 12 ms: slower
    assert controller.backoffs == 1
    assert controller.length(0.9, 16) == 0
