"""How many tokens to draft: a sequence's recent acceptance against the model's verify cost.

A verify step evaluates the pending token and k drafted ones in one batch. `VerifyCost` holds
what that costs against a plain step, measured for the loaded model (verify_cost.py):
cost[k] = time(1 + k tokens) / time(1 token). With a per-token acceptance a (a drafted token is
accepted when the ones before it were, with probability a), a step with k drafts emits
1 + a + ... + a^k tokens; the draft length is the k that maximises tokens per unit of cost, and
0 — no draft — when no k beats a plain step. `Acceptance` estimates a from the sequence's recent
verifies (older ones decay), one estimate per n-gram order; while it says not to draft, it drifts
back towards the prior, so a sequence that starts copying later is tried again. The prior is
what the model's drafts have been accepted at over its recent sequences (a model-wide
`Acceptance` on PRIOR, read live): where drafts are rarely accepted (a model that does not
copy), a new sequence starts with drafting off instead of paying for its first misses. The
model's estimate drifts back towards PRIOR as well while drafts are declined, so drafting is
tried again now and then, and comes back when the work starts copying.

The cost measured at start-up is a verify's llama_decode (and the copy of its logits) alone.
What a step costs besides — picking at each position, the copy of 201,088 logits a position to
the host, Python — is small beside a CPU decode and can be most of a GPU one. `StepTimes` keeps
the steps' own wall times (steps of one sequence: a plain one, and one with k drafts against
cost[k] of a plain one) and scales the measured costs by what the drafting steps took against
what the costs predicted: where verifies cost more than measured, drafting needs more acceptance
to pay, and stops where it does not. A plain step's time is the median of the last PLAIN_WINDOW,
and a drafting step weighs at most OUTLIER times its predicted cost: a pause inside a step (a
grammar built at its first use, the OS) says nothing of what steps cost. With a decayed mean
instead, one 0.8-s step among 5-ms ones made every draft look free for dozens of steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

PRIOR = {6: 0.8, 3: 0.6, 2: 0.5, 1: 0.3}  # acceptance assumed by n-gram order, before any verify
PRIOR_WEIGHT = 2.0  # how many drafted tokens the prior counts for
DECAY = 0.9  # the weight left to a sequence's past verifies at each new one
MODEL_DECAY = 0.99  # the same for the model's, over all its sequences
DRIFT = 0.97  # the weight left at each step that drafted nothing while a draft was at hand
MIN_GAIN = 1.02  # a draft must promise this many tokens per unit of cost over a plain step
PLAIN_WINDOW = 16  # the plain steps whose median is a plain step's time
PLAIN_MIN = 3  # plain steps timed before a drafting step's time is weighed
STEP_DECAY = 0.8  # the weight left to the drafting steps' sums at each new one
STEP_PRIOR = 1.0  # drafting steps (in plain steps' time) the measured costs count for
OUTLIER = 3.0  # a drafting step weighs at most this many times its predicted cost


@dataclass(frozen=True)
class VerifyCost:
    """cost[k]: a step with k drafted tokens, in plain steps (cost[0] == 1)."""

    cost: tuple[float, ...]

    @property
    def draft_max(self) -> int:
        return len(self.cost) - 1

    @classmethod
    def interpolate(cls, measured: dict[int, float], draft_max: int) -> VerifyCost:
        """Costs at every k from some measured ones (k = 0 among them), linearly between them."""
        points = sorted(measured.items())
        out = []
        for k in range(draft_max + 1):
            lower = max((p for p in points if p[0] <= k), default=points[0])
            upper = min((p for p in points if p[0] >= k), default=points[-1])
            if upper[0] == lower[0]:
                value = lower[1]
            else:
                share = (k - lower[0]) / (upper[0] - lower[0])
                value = lower[1] + share * (upper[1] - lower[1])
            out.append(value / points[0][1])
        return cls(tuple(max(c, 1.0) for c in out))

    def gain(self, k: int, acceptance: float) -> float:
        """Expected tokens per unit of cost with k drafts, against 1 for a plain step."""
        return expected_tokens(k, acceptance) / self.cost[k]

    def best(self, acceptance: float, limit: int) -> int:
        """The draft length with the most tokens per unit of cost (0: do not draft)."""
        best_k, best_gain = 0, MIN_GAIN
        for k in range(1, min(limit, self.draft_max) + 1):
            gain = self.gain(k, acceptance)
            if gain > best_gain:
                best_k, best_gain = k, gain
        return best_k

    def break_even(self, k: int) -> float:
        """The acceptance at which k drafts emit as many tokens per unit of cost as no draft."""
        low, high = 0.0, 1.0
        if self.gain(k, high) < 1.0:
            return 1.0
        for _ in range(40):
            mid = (low + high) / 2
            if self.gain(k, mid) < 1.0:
                low = mid
            else:
                high = mid
        return high

    def scaled(self, factor: float) -> VerifyCost:
        """The costs of drafting times `factor` (a plain step stays 1; none below 1)."""
        return VerifyCost((1.0, *(max(c * factor, 1.0) for c in self.cost[1:])))

    def pays(self) -> bool:
        """Whether drafting can pay at all on this model (some k breaks even below 0.9)."""
        return any(self.break_even(k) < 0.9 for k in range(1, self.draft_max + 1))


@dataclass
class StepTimes:
    """Wall times of steps of one sequence: the recent plain ones, and, over drafting ones, the
    time taken (in plain steps) against the time the verify cost predicted. `factor` scales the
    measured costs of drafting (1 until steps say otherwise)."""

    taken: float = 0.0  # decayed sum of drafting steps' times, in plain steps
    predicted: float = 0.0  # decayed sum of what the measured costs said they would take
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=PLAIN_WINDOW))

    def plain(self, seconds: float) -> None:
        self.recent.append(seconds)

    @property
    def plain_s(self) -> float:
        """A plain step's time: the median of the recent ones (blind to a pause in one)."""
        if not self.recent:
            return 0.0
        return sorted(self.recent)[len(self.recent) // 2]

    def drafting(self, seconds: float, predicted: float) -> bool:
        """A step with drafts took `seconds` where the costs said `predicted` plain steps;
        False where there is no plain time to weigh it against yet."""
        plain_s = self.plain_s
        if len(self.recent) < PLAIN_MIN or plain_s <= 0.0:
            return False
        taken = min(seconds / plain_s, OUTLIER * predicted)
        self.taken = self.taken * STEP_DECAY + taken
        self.predicted = self.predicted * STEP_DECAY + predicted
        return True

    @property
    def factor(self) -> float:
        return (self.taken + STEP_PRIOR) / (self.predicted + STEP_PRIOR)


def expected_tokens(k: int, acceptance: float) -> float:
    """1 + a + ... + a^k: the tokens a step with k drafts emits on average."""
    return sum(acceptance**i for i in range(k + 1))


@dataclass
class Acceptance:
    """Recent acceptance of drafts, per n-gram order (decayed counts), pulled towards a prior
    as if it had been seen on PRIOR_WEIGHT drafted tokens: `base`'s estimate, live, or PRIOR.
    One per model (MODEL_DECAY, on PRIOR), and one per sequence (DECAY) on the model's."""

    base: Acceptance | None = None
    decay: float = DECAY
    accepted: dict[int, float] = field(default_factory=dict)
    tried: dict[int, float] = field(default_factory=dict)

    def rate(self, order: int) -> float:
        accepted = self.accepted.get(order, 0.0)
        tried = self.tried.get(order, 0.0)
        prior = self.base.rate(order) if self.base is not None else PRIOR.get(order, 0.5)
        return (accepted + prior * PRIOR_WEIGHT) / (tried + PRIOR_WEIGHT)

    def record(self, order: int, drafted: int, accepted: int) -> None:
        """A verify of `drafted` tokens accepted the first `accepted` of them."""
        tries = min(accepted + 1, drafted)  # the tokens tried: the accepted ones and the first miss
        self.accepted[order] = self.accepted.get(order, 0.0) * self.decay + accepted
        self.tried[order] = self.tried.get(order, 0.0) * self.decay + tries

    def drift(self, order: int) -> None:
        """A step that did not draft: the estimate moves back towards the prior."""
        if order in self.tried:
            self.accepted[order] *= DRIFT
            self.tried[order] *= DRIFT


def draft_length(
    cost: VerifyCost, acceptance: Acceptance, order: int, available: Sequence[int], limit: int
) -> int:
    """How many of the `available` drafted tokens to verify (at most `limit`)."""
    return cost.best(acceptance.rate(order), min(limit, len(available)))
