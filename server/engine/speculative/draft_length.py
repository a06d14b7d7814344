"""The verify-cost curve and the acceptance estimates that the draft controller weighs.

A verify step evaluates the pending token and k drafted ones in one batch. `VerifyCost` holds
what that costs against a plain step, measured for the loaded model when the engine starts
(verify_cost.py): cost[k] = time(1 + k tokens) / time(1 token). With a per-token acceptance a
(a drafted token is accepted when the ones before it were, with probability a), a step with k
drafts emits 1 + a + ... + a^k tokens (`expected_tokens`). `Acceptance` estimates a from a
sequence's recent verifies and scored declined drafts (older ones decay), one estimate per
n-gram order, pulled towards a prior: what the model's drafts have been accepted at over its
recent sequences (a model-wide `Acceptance` on PRIOR, read live), so on a model whose drafts
miss a new sequence starts with drafting off instead of paying for its first misses. Which k to
draft, from these and the steps' measured times, is the controller's (controller.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR = {6: 0.8, 3: 0.6, 2: 0.5, 1: 0.3}  # acceptance assumed by n-gram order, before any verify
PRIOR_WEIGHT = 2.0  # how many drafted tokens the prior counts for
DECAY = 0.9  # the weight left to a sequence's past verifies at each new one
MODEL_DECAY = 0.99  # the same for the model's, over all its sequences
MIN_GAIN = 1.02  # `best`: a draft must promise this many tokens per unit of cost


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

    def pays(self) -> bool:
        """Whether drafting can pay at all on this model (some k breaks even below 0.9)."""
        return any(self.break_even(k) < 0.9 for k in range(1, self.draft_max + 1))


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
