"""The burst phase of the load test: many simultaneous requests against a small bound.

B streaming requests are started together (every one waits at a barrier until all are ready,
then they go at once), each long enough that none finishes during the burst. Their streams stay
open until every request has its answer status; then the server's own gauges are read and the
streams are closed (the server cancels those generations). Admission reserves a place in one
atomic step, so exactly `slots + max_waiting` requests may be accepted and the rest must get a
429 with Retry-After, whatever the timing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from devkit.load_test.mix import PATHS


class _Barrier:
    """Every party waits until all have arrived (asyncio.Barrier is Python 3.11+)."""

    def __init__(self, parties: int) -> None:
        self._missing = parties
        self._open = asyncio.Event()

    async def wait(self) -> None:
        self._missing -= 1
        if self._missing <= 0:
            self._open.set()
        await self._open.wait()


@dataclass
class BurstOutcome:
    status: int | None = None
    retry_after: str | None = None
    error: str | None = None


def burst_body(max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": "Tell a very long story."}],
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 1.0,
    }


async def _one(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    ready: _Barrier,
    answered: _Barrier,
) -> BurstOutcome:
    outcome = BurstOutcome()
    await ready.wait()  # all requests leave together
    try:
        async with client.stream("POST", url, json=body) as response:
            outcome.status = response.status_code
            outcome.retry_after = response.headers.get("retry-after")
            if response.status_code != 200:
                await response.aread()
            await answered.wait()  # accepted streams stay open until every request has its answer
    except httpx.HTTPError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
        await answered.wait()
    return outcome


async def run_burst(
    client: httpx.AsyncClient,
    base: str,
    size: int,
    max_tokens: int,
    scrape: Callable[[], Awaitable[dict[str, float]]],
) -> tuple[list[BurstOutcome], dict[str, float]]:
    """Send `size` simultaneous streaming chat requests; the outcomes, and the server's metrics
    (`scrape`) while the accepted streams are still open."""
    url = f"{base}{PATHS['chat']}"
    body = burst_body(max_tokens)
    ready, answered = _Barrier(size), _Barrier(size + 1)
    tasks = [asyncio.create_task(_one(client, url, body, ready, answered)) for _ in range(size)]
    await answered.wait()  # every request has its status; the accepted ones are still open
    metrics = await scrape()
    outcomes = list(await asyncio.gather(*tasks))
    return outcomes, metrics


def burst_report(
    outcomes: list[BurstOutcome], metrics: dict[str, float], n_slots: int, max_waiting: int
) -> dict[str, Any]:
    statuses = Counter(str(o.status) for o in outcomes)
    refused = [o for o in outcomes if o.status == 429]
    return {
        "requests": len(outcomes),
        "bound": n_slots + max_waiting,
        "accepted": statuses.get("200", 0),
        "refused": len(refused),
        "refused_with_retry_after": sum(1 for o in refused if o.retry_after),
        "statuses": dict(statuses),
        "errors": [o.error for o in outcomes if o.error],
        "queue_depth_max": metrics.get("gpt_oss_queue_depth_max", 0.0),
        "refused_counted_by_server": metrics.get("gpt_oss_requests_refused_total", 0.0),
    }


def burst_invariants(report: dict[str, Any], max_waiting: int) -> dict[str, bool]:
    return {
        "burst_accepts_exactly_the_bound": report["accepted"] == report["bound"],
        "burst_refuses_the_rest_with_retry_after": report["refused"]
        == report["refused_with_retry_after"]
        == report["requests"] - report["bound"],
        "burst_queue_depth_within_bound": report["queue_depth_max"] <= max_waiting,
        "burst_no_errors": not report["errors"],
    }
