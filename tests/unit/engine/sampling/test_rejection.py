"""The rejection draw (sampling/rejection.py) draws from exactly the softmax at the temperature.

Each scheme is driven on logits it takes (flat ones: uniform proposals; peaked ones: candidates
within the gap of the top plus the rest by rejection) and its draws are tested by chi-square
against the exact distribution, with fixed seeds and a significance of 1e-4, as the sampler's
own tests (test_sampler.py). Each test also shows that it can fail.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from server.engine.base import SamplingParams
from server.engine.sampling.banned import Banned
from server.engine.sampling.numpy_sampler import NumpySampler, Workspace
from server.engine.sampling.rejection import (
    BLOCKED,
    FEW,
    FIRST_STREAM,
    MAX_TRIALS,
    STREAM,
    RejectionDraw,
)
from tests.support.chi_square import exact_distribution, goodness_of_fit

Floats = np.ndarray[Any, np.dtype[np.float32]]
VOCAB = 5000
PEAKED_VOCAB = 50_000
RUNS = frozenset(range(4900, VOCAB)) | {7, 8, 9, 300}
SCATTERED = frozenset(range(1, VOCAB, 61))  # more than MAX_RUNS runs
BANS, BAN_IDS = [frozenset(), RUNS, SCATTERED], ["open", "runs", "scattered"]


def flat_logits(seed: int = 3) -> Floats:
    """As random weights give: every token about as likely as any other."""
    logits = np.random.default_rng(seed).normal(0.0, 1.0, VOCAB)
    logits[[7, 300]] = 5.0  # above every other (banned in RUNS)
    return logits.astype(np.float32)


def peaked_logits(
    temperature: float, banned: frozenset[int], seed: int = 4, likely: int = 12
) -> Floats:
    """As a trained model gives: a few likely tokens over a vocabulary too large for uniform
    proposals, and a tail just below the candidates' threshold that still holds some mass."""
    rng = np.random.default_rng(seed)
    logits = np.zeros(PEAKED_VOCAB)
    logits[rng.choice(PEAKED_VOCAB, likely, replace=False)] = rng.normal(8.0, 1.5, likely)
    logits[8] = 14.0  # a token the model likes most (banned in RUNS)
    top = max(logits[t] for t in np.flatnonzero(logits) if t not in banned)
    threshold = top - (math.log(PEAKED_VOCAB) + 3.0) * temperature
    tail = logits == 0.0
    logits[tail] = rng.uniform(threshold - 2.0 * temperature, threshold, int(tail.sum()))
    return logits.astype(np.float32)


def tail_threshold(logits: Floats, temperature: float, banned: frozenset[int]) -> float:
    top = max(float(logits[t]) for t in range(len(logits)) if t not in banned)
    return top - (math.log(len(logits)) + 3.0) * temperature


def draws(
    logits: Floats, temperature: float, banned: frozenset[int], n: int, seed: int = 1
) -> tuple[list[int], RejectionDraw]:
    """`n` tokens from the rejection draw alone (a draw it gives up on is not counted)."""
    rejection = RejectionDraw(len(logits), temperature, np.random.default_rng(seed))
    mask = Banned.of(banned, len(logits)) if banned else None
    out: list[int] = []
    while len(out) < n:
        token = rejection.draw(logits, mask)
        if token is not None:
            out.append(token)
    return out, rejection


def check(logits: Floats, temperature: float, banned: frozenset[int], drawn: list[int]) -> None:
    params = SamplingParams(max_tokens=1, temperature=temperature)
    probs = exact_distribution(logits, params, banned)
    assert not banned & set(drawn)
    stat, critical = goodness_of_fit(drawn, probs)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    hotter = SamplingParams(max_tokens=1, temperature=temperature * 1.1)
    assert goodness_of_fit(drawn, exact_distribution(logits, hotter, banned))[0] > critical


@pytest.mark.parametrize("banned", BANS, ids=BAN_IDS)
@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_uniform_proposals_on_flat_logits(banned: frozenset[int], temperature: float) -> None:
    logits = flat_logits()
    drawn, rejection = draws(logits, temperature, banned, 30_000)
    assert rejection.outcomes.uniform >= 0.99 * len(drawn)
    check(logits, temperature, banned, drawn)


@pytest.mark.parametrize("banned", BANS, ids=BAN_IDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_candidates_and_the_rest_on_peaked_logits(
    banned: frozenset[int], temperature: float
) -> None:
    logits = peaked_logits(temperature, banned)
    drawn, rejection = draws(logits, temperature, banned, 30_000)
    assert rejection.outcomes.candidates >= 0.9 * len(drawn)  # the rest: uniform proposals
    threshold = tail_threshold(logits, temperature, banned)
    assert sum(logits[t] < threshold for t in drawn) > 30  # the rest is drawn, by rejection
    check(logits, temperature, banned, drawn)


@pytest.mark.parametrize("banned", BANS, ids=BAN_IDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_few_candidates_are_weighed_in_python_exactly(
    banned: frozenset[int], temperature: float
) -> None:
    """At most FEW candidates (a banned one among them, for the runs) are weighed and drawn in
    Python floats; the rest by rejection, as with more."""
    logits = peaked_logits(temperature, banned, seed=6, likely=5)
    threshold = tail_threshold(logits, temperature, banned)
    assert np.count_nonzero(logits >= threshold) <= FEW
    drawn, rejection = draws(logits, temperature, banned, 30_000)
    assert rejection.outcomes.candidates >= 0.9 * len(drawn)
    assert sum(logits[t] < threshold for t in drawn) > 30  # the rest is drawn, by rejection
    check(logits, temperature, banned, drawn)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_sampler_with_both_schemes_and_the_full_draw_stays_exact(temperature: float) -> None:
    """Logits that change from flat to peaked and back, the full vocabulary's size: every
    scheme is used, the full draw included (with the top the rejection draw found), and the
    draws of each logits vector are exact."""
    n_vocab, first_special = 201_088, 199_998
    rng = np.random.default_rng(5)
    flat = rng.normal(0.0, 1.0, n_vocab).astype(np.float32)
    peaked = rng.normal(-12.0, 2.0, n_vocab).astype(np.float32)
    peaked[rng.choice(first_special, 30, replace=False)] = 10.0
    wide = rng.normal(0.0, 0.3, n_vocab).astype(np.float32)  # neither scheme takes these:
    wide[123] = 14.0  # proposals are hardly ever accepted, and everything is a candidate
    banned = frozenset(range(first_special, n_vocab)) - {200_002}
    mask = Banned.of(banned, n_vocab)
    params = SamplingParams(max_tokens=1, temperature=temperature, seed=9)
    sampler = NumpySampler(Workspace(n_vocab), params, np.random.default_rng(9))
    # logits scaled by the temperature: the same distributions (and schemes) at every one
    vectors = [(v * np.float32(temperature)).astype(np.float32) for v in (flat, peaked, wide)]
    drawn: list[list[int]] = [[], [], []]
    for i in range(9_000):
        which = (i // 100) % 3  # runs of one kind, as a generation's tokens come
        drawn[which].append(sampler.sample(vectors[which], mask))
    outcomes = sampler.rejection_outcomes
    assert outcomes is not None
    assert min(outcomes.uniform, outcomes.candidates, outcomes.gave_up) > 100
    for logits, tokens in zip(vectors, drawn, strict=True):
        stat, critical = goodness_of_fit(tokens, exact_distribution(logits, params, banned))
        assert stat < critical


@pytest.mark.parametrize("banned", BANS, ids=BAN_IDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_full_draw_with_a_known_top_weighs_as_without(
    banned: frozenset[int], temperature: float
) -> None:
    """The full draw after a rejection draw gave up takes the top that draw found: the same
    weights as finding it again, and no top where a scattered ban only bounded it (a banned
    logit far above the others would have underflowed every weight)."""
    logits = flat_logits()
    logits[sorted(banned)[:1] or [0]] = 200.0  # above every other: banned, but for "open"
    mask = Banned.of(banned, VOCAB) if banned else None
    rejection = RejectionDraw(VOCAB, temperature, np.random.default_rng(0))
    rejection.draw(logits, mask)
    if banned == SCATTERED:
        assert rejection.top is None
        return
    assert rejection.top is not None
    scale = np.float32(1.0 / temperature)
    found, known = Workspace(VOCAB), Workspace(VOCAB)
    assert found.exponentiate(logits, scale, mask)
    assert known.exponentiate(logits, scale, mask, rejection.top)
    np.testing.assert_allclose(known.values, found.values, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(known.block_cumsum, found.block_cumsum, rtol=1e-5)


def test_a_seed_gives_the_same_tokens() -> None:
    for logits in (flat_logits(), peaked_logits(1.0, RUNS)):
        first, _ = draws(logits, 1.0, RUNS, 300, seed=4)
        assert draws(logits, 1.0, RUNS, 300, seed=4)[0] == first
        assert draws(logits, 1.0, RUNS, 300, seed=5)[0] != first


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_logits_are_left_to_the_full_draw(bad: float) -> None:
    logits = flat_logits()
    logits[42] = bad
    rejection = RejectionDraw(VOCAB, 1.0, np.random.default_rng(0))
    assert rejection.draw(logits, None) is None
    everything = Banned.of(range(VOCAB), VOCAB)
    assert rejection.draw(flat_logits(), everything) is None  # nothing may be drawn
    assert rejection.outcomes.gave_up == 2


def many_candidates_logits(temperature: float, seed: int = 6) -> Floats:
    """Thousands of tokens within the gap of the top (more than BLOCKED: the draw among them goes
    by blocks), alternately likely and unlikely in id order, so that a draw landing on a
    neighbour of the right candidate shows; the others just below the threshold."""
    rng = np.random.default_rng(seed)
    logits = np.zeros(PEAKED_VOCAB)
    chosen = np.sort(rng.choice(PEAKED_VOCAB, 3 * BLOCKED, replace=False))
    logits[chosen] = (
        10.0 - np.where(np.arange(len(chosen)) % 2, 3.0, 0.0) + rng.normal(0, 1.0, len(chosen))
    )
    threshold = float(logits.max()) - (math.log(PEAKED_VOCAB) + 3.0) * temperature
    tail = logits == 0.0
    logits[tail] = rng.uniform(threshold - 2.0 * temperature, threshold - 0.5, int(tail.sum()))
    return logits.astype(np.float32)


@pytest.mark.parametrize("banned", BANS, ids=BAN_IDS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_thousands_of_candidates_are_drawn_by_blocks_exactly(
    banned: frozenset[int], temperature: float
) -> None:
    """The candidates scheme alone (uniform proposals would take these: a tenth of the
    vocabulary is likely), its draws by blocks over 6,144 candidates."""
    logits = many_candidates_logits(temperature)
    threshold = tail_threshold(logits, temperature, banned)
    assert np.count_nonzero(logits >= threshold) > 2 * BLOCKED
    rejection = RejectionDraw(len(logits), temperature, np.random.default_rng(3))
    mask = Banned.of(banned, len(logits)) if banned else None
    top = mask.top(logits) if mask is not None else float(logits.max())
    drawn: list[int] = []
    while len(drawn) < 40_000:
        token = rejection._candidates(logits, mask, top)
        if token is not None:
            drawn.append(token)
    check(logits, temperature, banned, drawn)


def test_a_generation_without_uniform_acceptances_stops_proposing_within_two_batches() -> None:
    """A trained model's distribution: uniform proposals find nothing; the first batch that
    finds nothing sets the acceptance estimate, so the next batch is the last one tried (they
    used to grow by a third for seventeen tokens, to 16,384 proposals)."""
    logits = peaked_logits(1.0, frozenset())
    rejection = RejectionDraw(len(logits), 1.0, np.random.default_rng(2))
    tried = []
    for _ in range(6):
        before = rejection.rate
        assert rejection.draw(logits, None) is not None
        tried.append(rejection.rate != before)
    assert tried == [True, True, False, False, False, False]


def test_the_first_stream_is_small_and_the_next_ones_double() -> None:
    """A generation's first token waits for its first stream of proposals (16,384 of them took
    0.13 ms): it holds FIRST_STREAM, each next one twice the last, up to STREAM; a batch larger
    than the stream's size gets a stream of its size."""
    logits = flat_logits()
    rejection = RejectionDraw(VOCAB, 1.0, np.random.default_rng(5))
    sizes: list[int] = []
    for _ in range(3000):
        stream = rejection._proposals
        rejection._uniform(logits, None, float(logits.max()), 64)
        if rejection._proposals is not stream:
            sizes.append(len(rejection._proposals))
    expected = [FIRST_STREAM]
    while expected[-1] < STREAM:
        expected.append(min(2 * expected[-1], STREAM))
    assert sizes[: len(expected)] == expected
    assert set(sizes[len(expected) :]) == {STREAM}
    rejection = RejectionDraw(VOCAB, 1.0, np.random.default_rng(5))
    rejection._uniform(logits, None, float(logits.max()), MAX_TRIALS)
    assert len(rejection._proposals) == MAX_TRIALS


@pytest.mark.parametrize("banned", BANS, ids=BAN_IDS)
def test_clearing_banned_candidates_matches_their_membership(banned: frozenset[int]) -> None:
    mask = Banned.of(banned, VOCAB)
    ids = np.sort(np.random.default_rng(7).choice(VOCAB, 1500, replace=False))
    values = np.ones(len(ids))
    mask.clear(ids, values)
    assert [bool(v == 0) for v in values] == [int(i) in banned for i in ids]
