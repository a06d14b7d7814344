"""The server's resident memory: sampling it into a curve (server.bench.machine reads it), and
the curve's flatness check after warm-up.

Flat means: of the samples taken after the warm-up, the median of the last third is at most
`1 + tolerance` times the median of the first third. Medians, not single samples, so that an
allocator's momentary high-water mark (a burst's buffers) neither fails nor hides a trend. The
least-squares slope over the same samples is reported in MiB per hour.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIB = 2**20


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float  # since the soak began
    rss_bytes: int
    requests_done: int  # HTTP requests answered so far (tool rounds each count)
    active: float  # gpt_oss_active_sequences then
    queued: float  # gpt_oss_queue_depth then

    def row(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 1),
            "rss_mib": round(self.rss_bytes / MIB, 2),
            "requests_done": self.requests_done,
            "active": self.active,
            "queued": self.queued,
        }


def _median_mib(samples: Sequence[Sample]) -> float:
    return round(statistics.median(s.rss_bytes for s in samples) / MIB, 2)


def curve_report(samples: Sequence[Sample], warmup_s: float, tolerance: float) -> dict[str, Any]:
    """The curve's summary after `warmup_s`; `flat` is the check (None: too few samples)."""
    after = [s for s in samples if s.t_s >= warmup_s]
    third = len(after) // 3
    report: dict[str, Any] = {
        "samples": len(samples),
        "warmup_s": warmup_s,
        "samples_after_warmup": len(after),
        "tolerance": tolerance,
        "start_mib": _median_mib(samples[:1]) if samples else None,
        "min_mib": round(min(s.rss_bytes for s in samples) / MIB, 2) if samples else None,
        "max_mib": round(max(s.rss_bytes for s in samples) / MIB, 2) if samples else None,
    }
    if third < 1:
        return report | {"flat": None, "reason": "fewer than 3 samples after the warm-up"}
    first, last = _median_mib(after[:third]), _median_mib(after[-third:])
    slope = statistics.linear_regression(
        [s.t_s for s in after], [s.rss_bytes / MIB for s in after]
    ).slope
    return report | {
        "first_third_median_mib": first,
        "last_third_median_mib": last,
        "ratio": round(last / first, 4),
        "slope_mib_per_hour": round(slope * 3600, 2),
        "flat": last <= first * (1 + tolerance),
    }
