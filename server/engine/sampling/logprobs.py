"""Log-probabilities: a token's log-probability under the model and the most likely alternatives.

Computed from the raw logits (the model's own distribution: log-softmax at temperature 1, before
temperature, top-k/top-p, steering and grammars), in float64, only for requests that ask.

Logits that are not finite get the probabilities the samplers give them (sampling/among.py,
numpy_sampler.py): a NaN or -inf logit is a token that is never drawn (log-probability -inf),
the rest normalised over the finite logits; +inf logits, where there are any, share the whole
mass (the limit of the softmax), every other token -inf. No value is ever NaN.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from server.contracts.events import TokenLogprob

MAX_TOP = 20  # alternatives per token, as OpenAI allows

Logits = np.ndarray[Any, np.dtype[np.float32]]


def log_normalizer(logits: Logits) -> float:
    """log Σ exp(logits) over the finite logits, computed stably in float64 (-inf if none is
    finite)."""
    finite = logits[np.isfinite(logits)]
    if finite.size == 0:
        return -math.inf
    top = float(finite.max())
    return top + float(np.log(np.exp(finite.astype(np.float64) - top).sum()))


def log_probabilities(logits: Logits, tokens: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The log-probabilities of `tokens` under `logits` (float64, never NaN)."""
    values = logits[tokens].astype(np.float64)
    n_infinite = int(np.isposinf(logits).sum())
    if n_infinite:  # the +inf tokens share the mass
        shared: np.ndarray[Any, Any] = np.where(
            np.isposinf(values), -math.log(n_infinite), -math.inf
        )
        return shared
    with np.errstate(invalid="ignore"):
        out: np.ndarray[Any, Any] = values - log_normalizer(logits)
    out[~np.isfinite(values)] = -math.inf
    return out


def token_logprob(logits: Logits, token: int, n_top: int) -> TokenLogprob:
    """`token`'s log-probability under `logits` and the `n_top` most likely tokens' (sorted)."""
    n_top = min(n_top, MAX_TOP, len(logits))
    best = np.zeros(0, dtype=np.int64)
    if n_top > 0:
        ranked = np.where(np.isnan(logits), -np.inf, logits)  # a NaN ranks last
        best = np.argpartition(ranked, -n_top)[-n_top:]
        best = best[np.argsort(-ranked[best], kind="stable")]
    values = log_probabilities(logits, np.array([token, *best.tolist()], dtype=np.int64))
    top = tuple((int(t), float(v)) for t, v in zip(best, values[1:], strict=True))
    return TokenLogprob(token, float(values[0]), top)
