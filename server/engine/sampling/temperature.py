"""Temperature: which temperatures act as greedy, the one rule every sampling path follows.

Sampling at temperature T draws from softmax(x / T), which tends to the argmax as T goes to 0,
and long before T reaches 0 the arithmetic breaks: 1/T overflows float32 below 2.9e-39 (float64
below 5.6e-309), x / T of ordinary logits overflows float32 (llama.cpp's chain divides in
float32) far above that, and inf - inf is NaN. So below GREEDY_BELOW every path takes the
argmax instead of computing a distribution. That changes nothing a caller could see: two
different float32 logits of magnitude m differ by at least 6e-8·m, so at T < 1e-30 the weaker
one's weight, exp(-6e-8·m / T), is 0 in float64 for any m above 1e-20. Above GREEDY_BELOW, 1/T
is at most 1e30 and x / T stays finite in float32 for logits up to 3.4e8; the numpy paths
subtract the largest logit before they scale, so nothing overflows there for any logit.
"""

from __future__ import annotations

GREEDY_BELOW = 1e-30


def is_greedy(temperature: float) -> bool:
    """Whether sampling at `temperature` is the argmax: at or below zero, below GREEDY_BELOW,
    or NaN."""
    return not temperature >= GREEDY_BELOW
