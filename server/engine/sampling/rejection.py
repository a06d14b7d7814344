"""RejectionDraw: an exact draw from softmax(logits / temperature) without touching every logit.

The numpy sampler's full draw (numpy_sampler.py) exponentiates and sums the whole vocabulary —
201,088 logits, ≈ 0.18 ms on a 2-core CPU, as much as a GPU spends on a tenth of a token. Most
tokens need far less. With `top` a bound of the allowed logits, every token's weight
a_i = exp((x_i - top) / T) is at most 1, and two exact schemes need only a few of them:

- flat distributions (many tokens of similar weight, as random weights give): propose a token
  uniformly and accept it with probability a_i. Proposals go in batches; the first accepted one
  is the draw. The batch size follows the acceptance rate of the generation's earlier tokens.
  The proposals are generated STREAM at a time (FIRST_STREAM in a generation's first, doubling),
  each a token and its acceptance threshold T·ln u, u uniform in (0, 1] (accepted when
  x_i - top exceeds it, that is u < a_i): a draw compares a window of the stream and moves past
  the pair it takes. The pairs after that one
  were compared but decided nothing (the batch sizes follow the pairs used), so the next draw
  uses them as new, and a draw costs four numpy calls (the measurements:
  devkit/notes/sampling-measurements.md).
- peaked distributions (a model that knows what comes next): every token within GAP nats of the
  top is a candidate, weighed exactly; all the others together get the envelope n·exp(-GAP),
  which bounds their mass. A draw picks a candidate by its weight, or proposes a uniform token
  that is accepted (if it is no candidate) with probability a_i / exp(-GAP). With GAP = ln n + 3
  the envelope is under 5 % of the top token's weight alone.

Either returns None when it gives up (too many rejections, too many candidates), and the caller
then makes the full draw. Each scheme, given that it returns a token, returns it with
probability exactly a_i / Σa, whatever came before; so trying one, then the other, then the full
draw is an exact draw too. Banned tokens are rejected proposals; NaN and infinite logits are left
to the full draw, which repairs them.

The candidates' weights are float32 and a draw among them goes by blocks (float32 block sums,
float64 running sums, one block's float64 cumulative sum), as the full draw does: a few thousand
candidates cost tens of microseconds, several times less than float64 weights and one
cumulative sum over all of them. Up to FEW candidates are weighed in Python floats instead
(`few_weights`), and more than MAX_CANDIDATES go to the full draw, which is cheaper then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.engine.sampling.banned import Banned
from server.engine.sampling.running_sums import Running, find_in_blocks

Floats = np.ndarray[Any, np.dtype[np.float32]]

MIN_TRIALS, MAX_TRIALS = 64, 16384  # uniform proposals in one batch
STREAM = MAX_TRIALS  # uniform proposals generated at once (tokens and thresholds),
FIRST_STREAM = 1024  # at first this many (a generation's first token waits for them), doubling
DECAY = 0.9  # the acceptance estimate's weight of the draws before the last
TRIALS_PER_ACCEPT = 6.0  # batches hold this many expected acceptances: e^-6 of them fail
PROBE_EVERY = 32  # uniform proposals that have not worked lately are still tried this often,
PROBE_TRIALS = 256  # in a batch this small (a full one cost 0.3 ms, spread: 10 µs a token)
MAX_CANDIDATES = 1 << 13  # more than this within GAP of the top: the full draw is cheaper
MAX_ROUNDS = 64  # draws between the candidates and the rest before giving up
BLOCK = 256  # candidates per block of the draw among them,
BLOCKED = 2048  # when there are more than this (fewer: one running sum is as fast)
FEW = 8  # at most this many candidates: weighed and drawn in Python floats (`few_weights`)


@dataclass
class Outcomes:
    """How a generation's draws went: by which scheme, or given up (the full draw made them)."""

    uniform: int = 0
    candidates: int = 0
    gave_up: int = 0


class RejectionDraw:
    """One generation's rejection draws (its temperature and generator).

    It keeps an estimate of the uniform proposals' acceptance rate over the generation's
    tokens, to size their batches and to skip them when they would hardly ever succeed. The
    candidates are searched at every draw: a trained model's distributions change from token
    to token, and a draw with too many of them (a few in a hundred) does not tell the next.
    """

    def __init__(self, n_vocab: int, temperature: float, rng: np.random.Generator) -> None:
        self._n = n_vocab
        self._scale = 1.0 / temperature
        self._rng = rng
        self._gap = math.log(n_vocab) + 3.0
        self._accepts, self._tries = TRIALS_PER_ACCEPT, 256.0  # recent uniform proposals
        self._since_probe = 0
        self._proposals = np.zeros(0, dtype=np.intp)  # the stream: tokens,
        self._thresholds = np.zeros(0, dtype=np.float32)  # and T·ln u for each
        self._used = 0  # pairs of the stream used
        self._stream = FIRST_STREAM  # the next stream's size
        self.outcomes = Outcomes()
        # the last draw's largest allowed logit, when finite and exact (a scattered ban only
        # bounds it, by every logit's maximum)
        self.top: float | None = None

    def draw(self, logits: Floats, banned: Banned | None) -> int | None:
        """A token drawn exactly, or None: the caller makes the full draw."""
        probe = self._since_probe >= PROBE_EVERY
        self._since_probe = 0 if probe else self._since_probe + 1
        trials = int(min(max(TRIALS_PER_ACCEPT / self.rate, MIN_TRIALS), MAX_TRIALS))
        if self.rate * MAX_TRIALS < TRIALS_PER_ACCEPT / 2:  # they would hardly ever work
            trials = PROBE_TRIALS if probe else 0
        token = self._either(logits, banned, trials)
        if token is None:
            self.outcomes.gave_up += 1
        return token

    def _either(self, logits: Floats, banned: Banned | None, trials: int) -> int | None:
        top = banned.top(logits) if banned is not None else float(logits.max())
        if not math.isfinite(top):
            self.top = None
            return None
        self.top = top if banned is None or not banned.scattered else None
        token = self._uniform(logits, banned, top, trials) if trials else None
        if token is not None:
            self.outcomes.uniform += 1
            return token
        token = self._candidates(logits, banned, top)
        if token is not None:
            self.outcomes.candidates += 1
        return token

    def _uniform(
        self, logits: Floats, banned: Banned | None, top: float, n_trials: int
    ) -> int | None:
        """Up to `n_trials` uniform proposals of the stream, each accepted with probability
        a_i; the first accepted one is drawn."""
        if self._used + n_trials > len(self._proposals):
            self._refill(n_trials)
        used = self._used
        proposals = self._proposals[used : used + n_trials]
        excess = logits[proposals] - np.float32(top)  # ln a_i · T, float32 as the logits
        accepted = np.flatnonzero(excess > self._thresholds[used : used + n_trials])
        for position in accepted.tolist():
            token = int(proposals[position])
            if banned is None or token not in banned.tokens:
                self._used = used + position + 1
                self._accepts = DECAY * self._accepts + 1.0
                self._tries = DECAY * self._tries + position + 1
                return token
        self._used = used + n_trials
        # a batch that found nothing sets the estimate (a trained model's generation stops
        # trying within two batches, not after seventeen that grew to 16,384 proposals)
        self._accepts, self._tries = 0.5, float(n_trials)
        return None

    @property
    def rate(self) -> float:
        """Acceptances per uniform proposal, as estimated from the recent ones."""
        return self._accepts / self._tries

    def _refill(self, needed: int) -> None:
        """A new stream of at least `needed` proposals (what is left of the last one decided
        nothing). Streams start small and double up to STREAM, since making 16,384 costs
        ≈ 0.13 ms on the way to a generation's first token."""
        size = max(needed, self._stream)
        self._stream = min(2 * self._stream, STREAM)
        self._proposals = self._rng.integers(0, self._n, size)
        uniform = self._rng.random(size)  # [0, 1): ln(1 - u) is never ln 0
        self._thresholds = (np.log1p(-uniform) / self._scale).astype(np.float32)  # T·ln(1 - u)
        self._used = 0

    def _candidates(self, logits: Floats, banned: Banned | None, top: float) -> int | None:
        """The tokens within GAP nats of the top weighed exactly, the rest by rejection."""
        threshold = np.float32(top - self._gap / self._scale)
        above = logits >= threshold
        if np.count_nonzero(above) > MAX_CANDIDATES:
            return None
        candidates = np.flatnonzero(above)
        among = self._weighed(logits, candidates, banned, top)
        # every other token's weight is below this (its logit is below the float32 threshold)
        envelope = math.exp((float(threshold) - top) * self._scale)
        rest = self._n * envelope
        for _ in range(MAX_ROUNDS):
            target = self._rng.random() * (among.mass + rest)
            if target < among.mass:
                return int(candidates[among.find(target)])
            token = int(self._rng.integers(0, self._n))
            logit = logits[token]
            if logit >= threshold or (banned is not None and token in banned.tokens):
                continue  # a candidate (drawn by weight above) or banned: rejected
            if self._rng.random() * envelope < math.exp((float(logit) - top) * self._scale):
                return token
        return None

    def _weighed(
        self,
        logits: Floats,
        candidates: np.ndarray[Any, np.dtype[np.intp]],
        banned: Banned | None,
        top: float,
    ) -> Blocks | Running:
        """The candidates' weights exp((x - top) · scale), banned ones 0, ready to draw from."""
        if len(candidates) <= FEW:
            return few_weights(logits, candidates, banned, top, self._scale)
        if len(candidates) > BLOCKED:
            # a banned candidate far above the allowed top may overflow: it is cleared below
            with np.errstate(over="ignore"):
                excess = (logits[candidates] - np.float32(top)) * np.float32(self._scale)
                weights = np.exp(excess)
        else:
            weights = np.exp((logits[candidates].astype(np.float64) - top) * self._scale)
        if banned is not None:
            banned.clear(candidates, weights)
        return Blocks(weights)


def few_weights(
    logits: Floats,
    candidates: np.ndarray[Any, np.dtype[np.intp]],
    banned: Banned | None,
    top: float,
    scale: float,
) -> Running:
    """A few candidates' weights exp((x - top) · scale) in Python floats, banned ones 0, to
    draw from as `Blocks` does (a model sure of its next token: a quarter of the trained tiny
    model's positions)."""
    ids = candidates.tolist()
    values = logits[candidates].tolist()
    return Running(
        [
            0.0 if banned is not None and token in banned.tokens else math.exp((x - top) * scale)
            for token, x in zip(ids, values, strict=True)
        ]
    )


class Blocks:
    """Weights to draw from by their running sum: a float64 running sum of the weights where
    they are few (at most BLOCKED, float64 then), else float32 sums of BLOCK weights (float32),
    float64 running sums of those, and one block's float64 running sum at a draw
    (running_sums.py, as the full draw)."""

    def __init__(self, weights: np.ndarray[Any, np.dtype[np.floating[Any]]]) -> None:
        self.weights = weights
        self.block = BLOCK if len(weights) > BLOCKED else 1
        if self.block == 1:
            self.sums = weights
        else:
            self.sums = np.add.reduceat(weights, np.arange(0, len(weights), BLOCK))
        self.running = np.cumsum(self.sums, dtype=np.float64)
        self.mass = float(self.running[-1]) if len(self.running) else 0.0

    def find(self, target: float) -> int:
        """The position where the running sum of the weights passes `target` (< mass), among
        those with weight."""
        if self.block == 1:  # a block per weight: the running sum is the weights'
            b = int(self.running.searchsorted(target, side="right"))
            return b if b < len(self.sums) else int(np.flatnonzero(self.sums)[-1])
        b, j = find_in_blocks(target, self.sums, self.running, self._row)
        return b * BLOCK + j

    def _row(self, b: int) -> np.ndarray[Any, np.dtype[np.floating[Any]]]:
        return self.weights[b * BLOCK : (b + 1) * BLOCK]
