"""Paired statistics: the median of paired ratios (or differences) with a bootstrap 95 % interval.

Two paths measured request by request, alternately, see the same phases of a shared machine;
the ratio of each pair cancels what the machine did to both, and the interval of the median
of the ratios says how far one run pins it down.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

BOOTSTRAP = 2000  # resamples


def median_interval(values: Sequence[float], seed: int = 0, digits: int = 3) -> list[float]:
    """The bootstrap 95 % interval of the median of `values`."""
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(BOOTSTRAP))
    low, high = medians[int(0.025 * BOOTSTRAP)], medians[int(0.975 * BOOTSTRAP)]
    return [round(low, digits), round(high, digits)]


def paired_ratio(mine: Sequence[float], theirs: Sequence[float]) -> dict[str, Any] | None:
    """Median of mine[i] / theirs[i] over the pairs with both positive, its 95 % interval and
    the pairs it rests on; None without such a pair."""
    ratios = [a / b for a, b in zip(mine, theirs, strict=True) if a > 0 and b > 0]
    if not ratios:
        return None
    return {
        "median": round(statistics.median(ratios), 4),
        "interval_95": median_interval(ratios, digits=4),
        "pairs": len(ratios),
        "values": [round(r, 4) for r in ratios],
    }
