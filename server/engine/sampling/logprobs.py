"""Log-probabilities: a token's log-probability under the model and the most likely alternatives.

Computed from the raw logits (the model's own distribution: log-softmax at temperature 1, before
temperature, top-k/top-p, steering and grammars), in float64, only for requests that ask.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.contracts.events import TokenLogprob

MAX_TOP = 20  # alternatives per token, as OpenAI allows


def log_normalizer(logits: np.ndarray[Any, np.dtype[np.float32]]) -> float:
    """log Σ exp(logits), computed stably in float64."""
    top = float(logits.max())
    return top + float(np.log(np.exp(logits.astype(np.float64) - top).sum()))


def token_logprob(
    logits: np.ndarray[Any, np.dtype[np.float32]], token: int, n_top: int
) -> TokenLogprob:
    """`token`'s log-probability under `logits` and the `n_top` most likely tokens' (sorted)."""
    norm = log_normalizer(logits)
    top: tuple[tuple[int, float], ...] = ()
    n_top = min(n_top, MAX_TOP, len(logits))
    if n_top > 0:
        best = np.argpartition(logits, -n_top)[-n_top:]
        best = best[np.argsort(-logits[best], kind="stable")]
        top = tuple((int(t), float(logits[t]) - norm) for t in best)
    return TokenLogprob(token, float(logits[token]) - norm, top)
