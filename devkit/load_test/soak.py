"""Soak mode: mixed traffic for a fixed time instead of a fixed count.

`concurrency` workers draw requests from the seeded endless mix (all three APIs, streaming and
not, tool loops, cancelled streams) until the deadline. Every `burst_every_s` the workers pause
(each finishes what it has in flight), the engine drains, a burst beyond the queue runs (see
burst.py; alone, so that exactly the bound is accepted), and the workers go on. A sampler reads
the server's RSS and gauges every `rss_every_s` into the curve (memory.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from devkit.load_test.client import Outcome, send
from devkit.load_test.memory import MIB, Sample
from devkit.load_test.mix import endless_requests
from server.bench.machine import rss_bytes

log = logging.getLogger(__name__)

PROGRESS_S = 60.0  # a progress line this often


@dataclass(frozen=True, slots=True)
class SoakPlan:
    duration_s: float
    concurrency: int
    seed: int
    cancel_fraction: float
    max_tokens: int
    loop_share: float
    rss_every_s: float
    burst_every_s: float  # 0: no bursts
    first_index: int  # request indexes start here (after the warm-up's)


@dataclass
class SoakResult:
    outcomes: list[Outcome] = field(default_factory=list)
    bursts: list[dict[str, Any]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    elapsed_s: float = 0.0


class _Soak:
    """One soak run's state: the workers' gate and count in flight, and what came of it."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        base: str,
        pid: int,
        plan: SoakPlan,
        scrape: Callable[[], Awaitable[dict[str, float]]],
    ) -> None:
        self.client, self.base, self.pid, self.plan, self.scrape = client, base, pid, plan, scrape
        self.result = SoakResult()
        self.specs = endless_requests(
            plan.seed,
            plan.cancel_fraction,
            plan.max_tokens,
            start=plan.first_index,
            loop_share=plan.loop_share,
        )
        self.go = asyncio.Event()  # cleared while a burst runs
        self.go.set()
        self.in_flight = 0
        self.started = time.monotonic()
        self.deadline = self.started + plan.duration_s

    async def worker(self) -> None:
        while True:
            await self.go.wait()
            if time.monotonic() >= self.deadline:
                return
            self.in_flight += 1
            try:
                self.result.outcomes += await send(self.client, self.base, next(self.specs))
            finally:
                self.in_flight -= 1

    async def sampler(self) -> None:
        while True:
            try:
                metrics = await self.scrape()
            except httpx.HTTPError as exc:  # a missed gauge reading, not a failed soak
                log.warning("metrics scrape failed: %s", exc)
                metrics = {}
            self.result.samples.append(
                Sample(
                    time.monotonic() - self.started,
                    rss_bytes(self.pid),
                    len(self.result.outcomes),
                    metrics.get("gpt_oss_active_sequences", 0.0),
                    metrics.get("gpt_oss_queue_depth", 0.0),
                )
            )
            await asyncio.sleep(self.plan.rss_every_s)

    async def burster(
        self,
        burst: Callable[[], Awaitable[dict[str, Any]]],
        until_idle: Callable[[], Awaitable[dict[str, float]]],
    ) -> None:
        every = self.plan.burst_every_s
        next_at = self.started + every
        while every > 0 and next_at < self.deadline - every / 4:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            self.go.clear()  # workers finish what they have, then wait
            try:
                while self.in_flight:
                    await asyncio.sleep(0.1)
                await until_idle()
                self.result.bursts.append(await burst())
                await until_idle()
            finally:
                self.go.set()
            next_at += every

    def progress(self) -> None:
        samples = self.result.samples
        log.info(
            "soak %.0f / %.0f s: %d requests, %d bursts, RSS %.1f MiB",
            time.monotonic() - self.started,
            self.plan.duration_s,
            len(self.result.outcomes),
            len(self.result.bursts),
            samples[-1].rss_bytes / MIB if samples else 0.0,
        )


async def run_soak(
    client: httpx.AsyncClient,
    base: str,
    pid: int,
    plan: SoakPlan,
    *,
    scrape: Callable[[], Awaitable[dict[str, float]]],
    burst: Callable[[], Awaitable[dict[str, Any]]],
    until_idle: Callable[[], Awaitable[dict[str, float]]],
) -> SoakResult:
    """Run the soak; `burst` runs one burst phase, `until_idle` waits for an idle engine."""
    soak = _Soak(client, base, pid, plan, scrape)
    sampling = asyncio.create_task(soak.sampler())
    bursting = asyncio.create_task(soak.burster(burst, until_idle))
    workers = [asyncio.create_task(soak.worker()) for _ in range(plan.concurrency)]
    last_log = time.monotonic()
    while not all(w.done() for w in workers):
        await asyncio.sleep(1.0)
        if bursting.done() and not bursting.cancelled() and bursting.exception():
            raise RuntimeError("the burst phase failed") from bursting.exception()
        if time.monotonic() - last_log >= PROGRESS_S:
            last_log = time.monotonic()
            soak.progress()
    await asyncio.gather(*workers)
    bursting.cancel()
    sampling.cancel()
    soak.result.elapsed_s = time.monotonic() - soak.started
    return soak.result
