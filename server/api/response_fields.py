"""Response fields: what every API stamps on what it sends beside the content.

Ids and creation times, and the generation's timings in llama-server's shape (and the
summaries' beside them), so existing benchmark tooling can read any of the APIs.
"""

from __future__ import annotations

import time
import uuid

from server.contracts.events import SummaryReport, Timings, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def timings_out(timings: Timings, usage: Usage) -> dict[str, float]:
    """llama-server style timings, so existing benchmark tooling can read them (with its
    `draft_n` and `draft_n_accepted` where speculative decoding drafted)."""
    out: dict[str, float] = {
        "cache_n": usage.cached_tokens,
        "prompt_n": timings.evaluated_tokens,
        "prompt_ms": round(timings.prefill_s * 1000, 3),
        "prompt_per_second": round(timings.prefill_tokens_per_s, 3),
        "predicted_n": timings.completion_tokens,
        "predicted_ms": round(timings.decode_s * 1000, 3),
        "predicted_per_second": round(timings.decode_tokens_per_s, 3),
        "ttft_ms": round(timings.ttft_s * 1000, 3),
        "queue_ms": round(timings.queue_s * 1000, 3),
    }
    if timings.draft_n:
        out["draft_n"] = timings.draft_n
        out["draft_n_accepted"] = timings.draft_n_accepted
    return out


def summary_timings_out(report: SummaryReport) -> dict[str, float]:
    """The summaries' own timings (summed over them), beside the generation's `timings_out`.

    `summary_wait_ms` is how long the response waited for them after its own generation ended.
    """
    timings = report.timings
    return {
        "summary_n": report.count,
        "summary_prompt_n": timings.evaluated_tokens,
        "summary_prompt_ms": round(timings.prefill_s * 1000, 3),
        "summary_predicted_n": timings.completion_tokens,
        "summary_predicted_ms": round(timings.decode_s * 1000, 3),
        "summary_wait_ms": round(report.wait_s * 1000, 3),
    }
