"""The draft controller of `auto`: acceptance history and step times in, a draft length out.

Plain data only. The scenarios: text that copies nothing (nothing drafted after a few misses),
a copy-heavy stretch (long drafts), a verify cost that jumps (drafting stops at that very step,
is probed again after a pause that doubles while probes stay slow), a pause inside one plain
step, steps cheaper than measured, speculation "on" (never paused), declined drafts scored
against the tokens that follow; and a simulation of many steps where the controller's rate
never falls below the plain rate by more than its probes cost. A start-up curve 9 times too
steep: a probe on strong evidence corrects it within START_WITHIN steps (without probes it
never drafts); where drafting steps really are that costly, the probes lose at most their
bound, and their pauses double.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from server.engine.speculative import controller as controller_module
from server.engine.speculative.controller import (
    PLAIN_WINDOW,
    PROBE_DOUBT,
    PROBE_EVIDENCE,
    PROBE_FIRST,
    PROBE_LOSS,
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


@dataclass
class Run:
    rate: float  # tokens per second over plain decoding's
    first_draft: int  # the first step that drafted (-1: none)
    lost: float  # seconds the drafting steps took over plain steps emitting as many tokens
    plain_seconds: float  # seconds of the plain steps
    controller: DraftController


def simulate(
    true_cost: VerifyCost, acceptance: float, steps: int, seed: int, measured: VerifyCost
) -> Run:
    """`steps` steps of a sequence whose drafts (16 tokens at hand) are accepted per token at
    `acceptance`, whose steps really cost `true_cost` while the controller started from
    `measured` (a plain step's time with ±10 % noise); a declined draft is scored against the
    tokens that follow, as the drafter does."""
    rng = random.Random(seed)
    controller = DraftController(measured)
    estimate = Acceptance()
    tokens = seconds = lost = plain_seconds = 0.0
    first = -1

    def matched(k: int) -> int:
        n = 0
        while n < k and rng.random() < acceptance:
            n += 1
        return n

    for step in range(steps):
        noise = rng.uniform(0.9, 1.1)
        k = controller.length(estimate.rate(1), 16, estimate.tried.get(1, 0.0))
        n = matched(16 if k == 0 else k)
        estimate.record(1, 16 if k == 0 else k, n)  # a verify, or the declined draft scored
        took = PLAIN_S * true_cost.cost[k] * noise
        if k == 0:
            controller.plain(took)
            tokens += 1
            plain_seconds += took
        else:
            controller.drafted(k, took, emitted=1 + n)
            tokens += 1 + n
            lost += max(0.0, took - (1 + n) * PLAIN_S * noise)
            first = step if first < 0 else first
        seconds += took
    return Run((tokens / seconds) * PLAIN_S, first, lost, plain_seconds, controller)


@pytest.mark.parametrize("acceptance", [0.0, 0.2, 0.4, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("scale", [1.0, 1.5, 3.0])
def test_the_controller_never_loses_to_plain_steps(acceptance: float, scale: float) -> None:
    """Whatever the acceptance, and whether verifies cost what the start-up curve says or 1.5
    or 3 times more: the rate is at least 0.97 of plain decoding's (the noise and the probes);
    where drafts pay (high acceptance, as measured), well above it."""
    measured = CURVE
    true_cost = VerifyCost((1.0, *(c * scale for c in CURVE.cost[1:])))
    rates = [simulate(true_cost, acceptance, 1500, seed, measured).rate for seed in range(2)]
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


def steeper(curve: VerifyCost, scale: float) -> VerifyCost:
    """The curve with every drafting step `scale` times as costly (a plain step's unchanged)."""
    return VerifyCost((1.0, *(c * scale for c in curve.cost[1:])))


# the start-up timing of a loaded machine: one drafted row 9 plain steps (8.94 was seen)
TOO_STEEP = steeper(CURVE, 9.0)
START_WITHIN = 40  # steps before a copying sequence drafts on a curve 9 times too steep


def test_a_curve_far_too_steep_is_corrected_by_a_probe() -> None:
    """The start-up curve says no draft ever pays (9 times too steep) while drafting steps
    really cost what CURVE says and the text copies (acceptance 0.9): the declined drafts'
    scores make the evidence strong, a probe measures the real cost, and the sequence drafts
    within START_WITHIN steps, at nearly the rate the true curve allows."""
    assert TOO_STEEP.best(0.95, 16) == 0  # never, on the start-up curve alone
    best = max(expected_tokens(k, 0.9) / CURVE.cost[k] for k in range(17))
    for seed in range(3):
        run = simulate(CURVE, 0.9, 1500, seed, TOO_STEEP)
        assert 0 <= run.first_draft <= START_WITHIN
        assert run.rate > 0.85 * best
        assert run.controller.probed <= 3


def test_without_probes_a_curve_far_too_steep_never_drafts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fault the probes fix: with them disabled (no acceptance is evidence enough), the
    same run as above never drafts, for ever at the plain rate."""
    monkeypatch.setattr(controller_module, "PROBE_RATE", 2.0)
    run = simulate(CURVE, 0.9, 1500, 0, TOO_STEEP)
    assert run.first_draft == -1
    assert run.rate < 1.1


@pytest.mark.parametrize("acceptance", [0.5, 0.9, 1.0])
def test_probes_on_a_truly_steep_machine_cost_at_most_their_bound(acceptance: float) -> None:
    """Where drafting steps really cost what the steep curve says, no draft pays: the probes
    that strong acceptance evidence asks for (one drafted token each: the first lost) lose at
    most PROBE_LOSS of the plain steps' time plus one probe's loss (the module's bound), and
    far fewer than one step in a hundred drafts."""
    steps = 5000
    for seed in range(2):
        run = simulate(TOO_STEEP, acceptance, steps, seed, TOO_STEEP)
        one_probe = TOO_STEEP.cost[1] * 1.1 * PLAIN_S  # its time, the noise at its worst
        assert run.lost <= PROBE_LOSS * run.plain_seconds + one_probe
        assert run.controller.probed >= 1  # it did look
        assert run.controller.probed <= steps // 500
        assert run.rate >= 1 - PROBE_LOSS - one_probe / (steps * PLAIN_S) - 0.01


def wait_for_probe(controller: DraftController, acceptance: float) -> tuple[int, int]:
    """Plain steps until a draft of strong evidence is verified (a probe), and its length."""
    for waited in range(100_000):
        k = controller.length(acceptance, 16, 100.0)
        if k:
            assert controller.probing
            return waited, k
        controller.plain(PLAIN_S)
    raise AssertionError("no probe")


def test_a_probe_waits_for_strong_evidence_and_for_its_credit() -> None:
    """No probe on a prior or on weak evidence; with strong evidence one probe a step; a
    probe that lost L plain steps allows the next one after L / PROBE_LOSS plain steps, the
    next loss counts twice; one that paid allows the next at once, and the doubt is 1 again."""
    controller = DraftController(TOO_STEEP)
    warm(controller)
    assert controller.length(0.95, 16) == 0  # a prior: no evidence
    assert controller.length(0.95, 16, PROBE_EVIDENCE - 1) == 0
    assert controller.length(0.3, 16, 100.0) == 0  # evidence of a low acceptance
    assert controller.length(0.95, 16, PROBE_EVIDENCE) == 1  # group 1: none measured yet
    assert controller.length(0.95, 16, PROBE_EVIDENCE) == 0  # one a step
    credit = controller.credit  # what the plain steps so far put by
    controller.drafted(1, 5 * PLAIN_S, emitted=1)  # lost 4 plain steps
    assert controller.credit == pytest.approx(credit - 4.0)
    assert controller.doubt == 2
    waited, k = wait_for_probe(controller, 0.95)
    assert waited == pytest.approx((4.0 - credit) / PROBE_LOSS, abs=2)
    assert k == 1  # after a probe that lost: the shortest
    controller.drafted(1, 3 * PLAIN_S, emitted=2)  # its cost: 5 (1 - LEARN) + 3 LEARN
    assert controller.cost(1) == pytest.approx(4.0)
    assert controller.credit == pytest.approx(-2 * 1.0, abs=0.05)  # its loss of 1, doubled
    assert controller.doubt == 4
    controller.credit = 0.0
    assert controller.length(0.95, 16, 100.0) == 1
    controller.drafted(1, 1.0 * PLAIN_S, emitted=2)  # paid: the doubt is 1 again
    assert controller.doubt == 1
    assert controller.credit == 0.0


def test_probes_that_pay_measure_one_group_after_another() -> None:
    """A start-up curve wrong in its shape: each probe that pays measures the shortest group
    no step measured yet, the next chance at once (nothing spent)."""
    controller = DraftController(VerifyCost((1.0, *(20.0 for _ in range(16)))))
    warm(controller)
    lengths = []
    for _ in range(3):
        k = controller.length(0.6, 16, 100.0)
        lengths.append(k)
        controller.drafted(k, 18.0 * PLAIN_S, emitted=1)  # 18 steps: none pays at 0.6
        controller.doubt = 1  # as if each had paid: the next group
        controller.credit = 0.0
    assert lengths == [1, 2, 4]


def test_losing_probes_wait_twice_as_long_each_up_to_their_bound() -> None:
    controller = DraftController(TOO_STEEP)
    warm(controller)
    waits = []
    for _ in range(7):
        waited, k = wait_for_probe(controller, 0.8)  # at 3 plain steps for 1, none pays
        assert k == 1
        waits.append(waited)
        controller.drafted(k, 3 * PLAIN_S, emitted=1)  # lost 2 steps
    assert waits[0] == 0
    doubled = [2, 4, 8, 16, 2 * PROBE_DOUBT, 2 * PROBE_DOUBT]  # 2 steps lost, x 1, 2, ... 16
    assert [round(w * PROBE_LOSS) for w in waits[1:]] == doubled


def test_a_probe_that_runs_as_a_plain_step_spends_nothing() -> None:
    controller = DraftController(TOO_STEEP)
    warm(controller)
    assert controller.length(0.95, 16, 100.0) == 1
    controller.plain(PLAIN_S)  # the cache had no room for its drafts
    assert not controller.probing
    assert controller.credit > 0
    assert controller.length(0.95, 16, 100.0) == 1


def test_one_measured_group_scales_the_curve_of_the_others() -> None:
    """A group's measured factor stands for the groups no step measured yet (the nearest
    below, else above): one cheap probe of 2 rescales the whole curve; a group measured on
    its own keeps its own."""
    controller = DraftController(TOO_STEEP)
    warm(controller)
    controller.drafted(2, PLAIN_S * CURVE.cost[2])
    assert controller.cost(2) == pytest.approx(CURVE.cost[2])
    assert controller.cost(1) == pytest.approx(CURVE.cost[1])  # from the group above
    assert controller.cost(8) == pytest.approx(CURVE.cost[8], rel=0.01)  # from below
    controller.drafted(8, PLAIN_S * 2 * CURVE.cost[8])  # not slow: 2 < 1.25 x 9
    assert controller.cost(16) == pytest.approx(2 * CURVE.cost[16], rel=0.01)
    assert controller.cost(4) == pytest.approx(CURVE.cost[4], rel=0.01)


def test_a_probe_in_a_batch_is_charged_against_plain_batches_of_as_many() -> None:
    """In a batch of 4, a probe is weighed against plain batches of 4: with none timed yet it
    is charged its predicted cost on the start-up curve; with them, what it lost."""
    controller = DraftController(TOO_STEEP)
    warm(controller)  # one sequence alone
    credit = controller.credit
    assert controller.length(0.95, 16, 100.0) == 1
    controller.drafted(1, 2 * PLAIN_S, sequences=4, emitted=6)
    assert not controller.probing
    assert controller.credit == pytest.approx(credit - (TOO_STEEP.cost[1] - 1))
    for _ in range(PLAIN_WINDOW):
        controller.plain(2 * PLAIN_S, sequences=4)
    controller.credit = 0.0
    controller.doubt = 1
    assert controller.length(0.95, 16, 100.0) == 1
    controller.drafted(1, 3 * PLAIN_S, sequences=4, emitted=5)  # 1.5 steps for 1.25
    assert controller.credit == pytest.approx(-0.25)
    assert controller.backoffs == 1  # fewer tokens a second than plain batches: a back-off
    assert controller.slow == 0
