"""DraftController: `auto` drafts only where the measured rates say that drafting is faster.

Pure: step times and acceptance in, a draft length out. The engine hands it the wall time of
every step that ran one sequence alone (scheduler.py): a plain step (one row) or a drafting one
(1 + k rows, the picks and the rollback included). From them it keeps

- the plain step's time: the median of the last PLAIN_WINDOW plain steps (blind to a pause
  inside one step: a grammar built at its first use took 0.8 s among 5-ms steps), so at the
  depth the sequences are at now;
- the cost of a step with k drafts, in plain steps: the curve timed when the engine started
  (cost(k), verify_cost.py) times a factor per group of draft lengths (1, 2, 3-4, 5-8, 9-16),
  learned from the drafting steps' own times against the plain time of the moment (so at the
  depth the sequences are at now); a group no step has measured yet takes the factor of the
  nearest measured one below it (else above): the curve's shape, its scale as measured.

A sequence with per-token acceptance a (its own verifies and the drafts it declined, scored
against what it then emitted: drafter.py) emits 1 + a + … + a^k tokens in a step with k drafts.
The controller drafts the k whose expected rate, E(k, a) / (cost(k) · plain time), beats the
plain rate, 1 / plain time, by MIN_GAIN, and nothing where no k does.

It backs off at once: a drafting step that took more than SLOW times what it predicted sets its
group's factor to what that step measured (no averaging) and stops all drafting for `gap` plain
steps. After the pause that group's factor is dropped (its cost is the start-up curve's again,
scaled as the other groups measured) and a draft that pays on it is a probe; a probe that is
slow again doubles the gap (up to PROBE_MAX), one as predicted resets it. So a wrong cost costs
one slow step, then one probe per gap: the loss is bounded by construction (with the defaults,
a probe's extra time over 32, 64, … 1,024 plain steps), and an OS pause in a drafting step
costs a pause in drafting, never a draft that loses.

A curve that is too steep (timed at start-up on a loaded machine: 9 plain steps for one drafted
row) would keep every draft declined for good, and nothing would ever correct it: only drafting
steps measure a draft's cost. So where no draft pays on the costs known, a sequence whose
acceptance evidence is strong (PROBE_RATE over PROBE_EVIDENCE tokens tried, verified or declined
and scored) may still verify a draft: a probe, whose time then teaches the cost. A probe drafts
the shortest group's bound (1, 2, 4, 8, 16) that no step has measured yet, so probes that cost
nothing go on until every group is measured (a curve timed under load is wrong in its shape too:
one came out 15.6 plain steps at k = 1 and 1.23 at k = 2). Probes are paid from a credit that
every plain step adds PROBE_LOSS of a plain step to (up to PROBE_CREDIT), and each probe spends
what it lost (its time over that of plain steps emitting as many tokens) times a doubt that
doubles with each probe that lost (its length does not pay at its acceptance on the time it
took; up to PROBE_DOUBT) and is 1 again after one that paid; after a probe that lost, probes
draft the shortest group's bound. A probe needs the credit at or above zero, so the next probe
waits for its loss * doubt / PROBE_LOSS plain steps (a probe that lost 8 steps: 800, then 1,600,
… 12,800): all probes together cost at most PROBE_LOSS (1 %) of the plain steps' time plus one
probe, and on a machine where drafts never pay, a share that halves with each probe down to
PROBE_LOSS / PROBE_DOUBT.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from server.engine.speculative.draft_length import VerifyCost, expected_tokens

PLAIN_WINDOW = 16  # the plain steps whose median is a plain step's time
PLAIN_MIN = 3  # plain steps timed before a drafting step can be weighed (or drafted on time)
MIN_GAIN = 1.05  # drafting must promise this rate over a plain step's
SLOW = 1.25  # a drafting step over this many times its predicted time: back off at once
LEARN = 0.5  # the weight of a drafting step's time in its group's factor (as predicted or less)
PROBE_FIRST = 32  # plain steps without drafts after the first back-off
PROBE_MAX = 1024  # the longest pause between probes
GROUPS = (1, 2, 4, 8, 16)  # a draft length's group: the first bound at or above it
PROBE_RATE = 0.4  # the acceptance a probe needs ...
PROBE_EVIDENCE = 12.0  # ... over at least this many (decayed) drafted tokens tried
PROBE_LOSS = 0.01  # the share of the plain steps' time all probes together may lose
PROBE_CREDIT = 1.0  # the most credit kept, in plain steps (no burst of probes after a quiet spell)
PROBE_DOUBT = 16  # the most a probe's loss is multiplied by (losing probes in a row)


def group(k: int) -> int:
    """The group of draft length k (k >= 1): the first of GROUPS at or above it."""
    return next((g for g in GROUPS if k <= g), GROUPS[-1])


@dataclass
class DraftController:
    """The engine's plain step time, the drafting steps' costs and the back-off state."""

    measured: VerifyCost  # at start-up: cost[k], a step of 1 + k rows in one-row steps
    timed: bool = True  # False ("on"): the costs as given, never a pause
    factor: dict[int, float] = field(default_factory=dict)  # per group: learned / measured
    recent: dict[int, deque[float]] = field(default_factory=dict)  # plain times by sequences
    paused: int = 0  # plain steps left before drafting resumes (a back-off)
    slow: int = 0  # the group whose slow step paused drafting (0: a batch's)
    gap: int = PROBE_FIRST  # the next back-off's pause
    backoffs: int = 0  # counters, for the step trace and the tests
    probes: int = 0
    credit: float = 0.0  # what probes may still lose, in plain steps (module docstring)
    doubt: int = 1  # what the next probe's loss counts for
    probing: bool = False  # a probe was proposed and its step has not been timed yet
    probed: int = 0  # probes proposed where no draft paid on the costs known
    probe_loss: float = 0.0  # what they lost in all, in plain steps
    probe_acceptance: float = 0.0  # the acceptance the last probe was drafted at

    @property
    def draft_max(self) -> int:
        return self.measured.draft_max

    @property
    def plain_s(self) -> float:
        """A plain step's time now, of one sequence alone (0: too few timed yet)."""
        return self.plain_time(1)

    def plain_time(self, sequences: int) -> float:
        """A plain step's time now, for a batch of `sequences` generating ones: the median of
        the recent ones (0: fewer than PLAIN_MIN timed)."""
        recent = self.recent.get(sequences)
        if recent is None or len(recent) < PLAIN_MIN:
            return 0.0
        return sorted(recent)[len(recent) // 2]

    def cost(self, k: int) -> float:
        """A step with k drafts, in plain steps, as the controller predicts it now (>= 1)."""
        if k <= 0:
            return 1.0
        return max(1.0, self.measured.cost[min(k, self.draft_max)] * self._factor(group(k)))

    def _factor(self, g: int) -> float:
        """Group g's factor; unmeasured: the nearest measured group's below, else above."""
        if g in self.factor:
            return self.factor[g]
        below = [h for h in self.factor if h < g]
        if below:
            return self.factor[max(below)]
        above = [h for h in self.factor if h > g]
        return self.factor[min(above)] if above else 1.0

    def length(self, acceptance: float, available: int, evidence: float = 0.0) -> int:
        """How many of `available` drafted tokens to verify at per-token `acceptance` (seen
        over `evidence` drafted tokens tried): the k with the best expected rate, if it beats
        a plain step's by MIN_GAIN; else a probe, where the evidence is strong and the credit
        allows one (module docstring); 0 while paused, and while no plain step's time is known
        to weigh a draft against."""
        if self.paused > 0 or (self.timed and not self._weighable()):
            return 0
        best_k, best_gain = 0, MIN_GAIN
        for k in range(1, min(available, self.draft_max) + 1):
            gain = expected_tokens(k, acceptance) / self.cost(k)
            if gain > best_gain:
                best_k, best_gain = k, gain
        if best_k == 0 and self._may_probe(acceptance, evidence):
            self.probing = True
            self.probed += 1
            return self._probe_length(acceptance, min(available, self.draft_max))
        return best_k

    def _probe_length(self, acceptance: float, limit: int) -> int:
        """A probe's draft length, up to `limit`: after a probe that lost, the shortest group's
        bound; else the shortest one no step has measured (a start-up curve can be wrong in
        its shape, not only its scale); all measured, the one with the best expected rate."""
        self.probe_acceptance = acceptance
        bounds = [g for g in GROUPS if g <= limit] or [limit]
        unmeasured = [g for g in bounds if g not in self.factor]
        if self.doubt > 1 or not unmeasured:
            return bounds[0] if self.doubt > 1 else max(bounds, key=self._rate(acceptance))
        return unmeasured[0]

    def _rate(self, acceptance: float) -> Callable[[int], float]:
        return lambda k: expected_tokens(k, acceptance) / self.cost(k)

    def _may_probe(self, acceptance: float, evidence: float) -> bool:
        return (
            self.timed
            and not self.probing  # one probe a step
            and self.credit >= 0.0
            and acceptance >= PROBE_RATE
            and evidence >= PROBE_EVIDENCE
        )

    def _weighable(self) -> bool:
        return any(len(recent) >= PLAIN_MIN for recent in self.recent.values())

    def plain(self, seconds: float, sequences: int = 1) -> None:
        """A plain step of `sequences` generating ones (and no prefill) took `seconds`."""
        if not self.timed:
            return
        recent = self.recent.setdefault(sequences, deque(maxlen=PLAIN_WINDOW))
        recent.append(seconds)
        self.probing = False  # a probe proposed but not run (no room for its drafts)
        self.credit = min(PROBE_CREDIT, self.credit + PROBE_LOSS)
        if self.paused > 0:
            self.paused -= 1
            if self.paused == 0:  # the slow group's cost is the curve's again, scaled as the
                self.factor.pop(self.slow, None)  # others measured: a draft that pays probes
                self.probes += 1

    def drafted(self, k: int, seconds: float, sequences: int = 1, emitted: int = 0) -> None:
        """A step of `sequences` generating ones carrying k drafts in all took `seconds` and
        emitted `emitted` tokens: learn the cost, or back off. One sequence alone: its time
        against the predicted cost(k). Several: the batch's rate against plain batches of as
        many (its cost is shared, so the curve of one says little); a batch that emitted
        tokens more slowly than plain ones backs off the same way."""
        plain_s = self.plain_time(sequences)
        probe, self.probing = self.probing, False
        if not self.timed or k <= 0:
            return
        if plain_s <= 0.0:  # nothing to weigh it against: a probe costs what it was predicted to
            if probe:
                self._spend(self.cost(k) - 1.0, True)
            return
        taken = seconds / plain_s  # in plain steps
        if probe:  # its time over that of the plain steps emitting as many tokens
            lost = expected_tokens(k if sequences == 1 else 0, self.probe_acceptance) < taken
            self._spend(max(0.0, taken - max(emitted, sequences) / sequences), lost)
        if sequences > 1:
            if emitted * plain_s < sequences * seconds:  # fewer tokens a second than plain
                self._back_off(0)
            return
        predicted = self.cost(k)
        g = group(k)
        measured = self.measured.cost[min(k, self.draft_max)]
        if taken > SLOW * predicted:  # slower than predicted: its cost at once, and a pause
            self.factor[g] = taken / measured
            self._back_off(g)
            return
        old = self.factor.get(g)  # a group's first measure is its factor
        learnt = taken / measured
        self.factor[g] = learnt if old is None else (1 - LEARN) * old + LEARN * learnt
        self.gap = PROBE_FIRST

    def _spend(self, loss: float, lost: bool) -> None:
        """A probe lost `loss` plain steps (`lost`: its draft length does not pay at the
        acceptance it was drafted at, on the time it took): its charge on the credit, and the
        doubt's."""
        self.credit -= loss * self.doubt
        self.doubt = min(2 * self.doubt, PROBE_DOUBT) if lost else 1
        self.probe_loss += loss

    def _back_off(self, slow: int) -> None:
        """Pause drafting; `slow`: the group whose step was slow (0: a batch's)."""
        self.slow = slow
        self.paused = self.gap
        self.gap = min(2 * self.gap, PROBE_MAX)
        self.backoffs += 1
