"""Start the server, warm it up, run the mix (a count, or for a time: soak.py), read /metrics and
the server's RSS, check the invariants."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devkit.load_test.burst import burst_invariants, burst_report, run_burst
from devkit.load_test.client import Outcome, send
from devkit.load_test.memory import MIB, curve_report
from devkit.load_test.mix import ENDPOINTS, LOOP_SHARE, PATHS, plan_requests, warmup_requests
from devkit.load_test.soak import SoakPlan, SoakResult, run_soak
from server.bench.http_path import free_port
from server.bench.machine import rss_bytes
from server.bench.procs import ServerProcess, serve_command

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 600.0
_REQUESTS = re.compile(
    r'gpt_oss_requests_total\{endpoint="(?P<endpoint>[^"]*)",status="(?P<status>[^"]*)"\}'
)
POLL_S = 0.2  # /metrics polling period for the queue and sequence gauges
IDLE_WAIT_S = 30.0  # after the run, how long the engine may take to drop cancelled requests


@dataclass(frozen=True, slots=True)
class LoadTestOptions:
    model: Path
    requests: int = 200
    concurrency: int = 8
    cancel_fraction: float = 0.2
    max_tokens: int = 64  # each request's limit is drawn between half of it and it
    seed: int = 0
    out: Path = Path("load-test")
    n_slots: int = 4
    max_waiting: int = 64
    n_ctx: int = 8192
    n_threads: int | None = None
    rss_tolerance: float = 0.05
    startup_timeout_s: float = 900.0
    burst: int | None = None  # simultaneous requests of the burst phase; None: 3 x the bound
    burst_max_tokens: int = 4000  # long enough that no burst request ends during the burst
    loop_share: float = LOOP_SHARE  # share of the requests that are tool loops
    duration_s: float | None = None  # soak mode: mixed traffic for this long instead of `requests`
    rss_every_s: float = 5.0  # soak: RSS sampling period
    warmup_s: float | None = None  # soak: the curve's warm-up; None: a fifth, at most 300 s
    burst_every_s: float = 300.0  # soak: a burst phase this often (0: none)

    @property
    def soak(self) -> bool:
        return self.duration_s is not None

    @property
    def rss_warmup_s(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        return min(300.0, (self.duration_s or 0.0) / 5)

    @property
    def burst_size(self) -> int:
        return 3 * (self.n_slots + self.max_waiting) if self.burst is None else self.burst


def server_command(options: LoadTestOptions, port: int) -> list[str]:
    command = serve_command(
        options.model, port,
        "--n-ctx", str(options.n_ctx),
        "--n-slots", str(options.n_slots),
        "--max-waiting", str(options.max_waiting),
        "--responses-store-path", str(options.out / "responses.sqlite"),
        "--prompt-cache-dir", str(options.out / "kv"),  # nothing of the machine's own cache
        "--log-level", "warning",
    )  # fmt: skip
    if options.n_threads is not None:
        command += ["--n-threads", str(options.n_threads)]
    return command


def parse_metrics(text: str) -> dict[str, float]:
    """The server's own samples as `name{label="value",...}` -> value (no buckets, no _created)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("gpt_oss_") or sample.name.endswith(
                ("_bucket", "_created")
            ):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def request_counts(metrics: dict[str, float]) -> dict[str, int]:
    """gpt_oss_requests_total of the generation endpoints, by `endpoint status`."""
    counts = {}
    for key, value in metrics.items():
        found = _REQUESTS.fullmatch(key)
        if found and found["endpoint"] in PATHS.values():
            counts[f"{found['endpoint']} {found['status']}"] = int(value)
    return counts


class GaugeWatch:
    """Polls /metrics while the load runs; keeps the highest queue depth and active count."""

    def __init__(self, client: httpx.AsyncClient, base: str) -> None:
        self._client, self._base = client, base
        self.max_queue_depth = 0.0
        self.max_active = 0.0
        self.polls = 0

    async def scrape(self) -> dict[str, float]:
        metrics = parse_metrics((await self._client.get(f"{self._base}/metrics")).text)
        self.polls += 1
        self.max_queue_depth = max(self.max_queue_depth, metrics.get("gpt_oss_queue_depth", 0))
        self.max_active = max(self.max_active, metrics.get("gpt_oss_active_sequences", 0))
        return metrics

    async def run(self) -> None:
        while True:
            await self.scrape()
            await asyncio.sleep(POLL_S)

    async def until_idle(self, timeout_s: float) -> dict[str, float]:
        """The metrics once no request waits or runs (or at the timeout)."""
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = await self.scrape()
            idle = not metrics.get("gpt_oss_queue_depth") and not metrics.get(
                "gpt_oss_active_sequences"
            )
            if idle or time.monotonic() > deadline:
                return metrics
            await asyncio.sleep(POLL_S)


async def run_all(
    client: httpx.AsyncClient, base: str, specs: Sequence[Any], concurrency: int
) -> list[Outcome]:
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: Any) -> list[Outcome]:
        async with gate:
            return await send(client, base, spec)

    rounds = await asyncio.gather(*(one(spec) for spec in specs))
    return [outcome for outcomes in rounds for outcome in outcomes]


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 4)

    return {
        "n": len(ordered),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(ordered[-1], 4),
        "mean": round(statistics.fmean(ordered), 4),
    }


def loops_summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Tool loops by API: how many, how deep they went, the tool calls answered with."""
    report: dict[str, Any] = {}
    for endpoint in ENDPOINTS:
        rounds = [o for o in outcomes if o.spec.loop and o.spec.endpoint == endpoint]
        depth = Counter[int]()
        for o in rounds:
            depth[o.spec.index] = max(depth[o.spec.index], o.round + 1)
        report[endpoint] = {
            "loops": len(depth),
            "rounds": len(rounds),
            "loops_by_rounds": {str(k): v for k, v in sorted(Counter(depth.values()).items())},
            "rounds_with_tool_calls": sum(1 for o in rounds if o.tool_calls),
            "forced_rounds_without_tool_call": sum(
                1
                for o in rounds
                if o.status == 200 and o.round < o.spec.rounds - 1 and not o.tool_calls
            ),
        }
    return report


def summarize(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """`outcomes`: one per HTTP request (each round of a tool loop is one)."""
    by_kind: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_kind.setdefault(o.spec.kind, Counter())[str(o.status)] += 1
    streams = [o for o in outcomes if o.spec.stream and o.status == 200]
    done = [o for o in outcomes if not o.cancelled and o.status == 200]
    queue = [o.queue_ms for o in outcomes if o.queue_ms is not None]
    return {
        "requests": len(outcomes),
        "by_kind_and_status": {k: dict(v) for k, v in sorted(by_kind.items())},
        "with_tools": sum(o.spec.tools for o in outcomes),
        "with_tool_calls": sum(1 for o in outcomes if o.tool_calls),
        "tool_loops": loops_summary(outcomes),
        "status_5xx": sum(1 for o in outcomes if o.status is not None and o.status >= 500),
        "status_429": sum(1 for o in outcomes if o.status == 429),
        "transport_errors": [f"{o.label}: {o.error}" for o in outcomes if o.error],
        "streams": len(streams),
        "streams_cancelled": sum(o.cancelled for o in streams),
        "cancel_planned_but_ended_first": sum(
            1 for o in streams if o.spec.cancel_after is not None and not o.cancelled
        ),
        "streams_with_terminal_event": sum(1 for o in streams if o.terminal_ok),
        "streams_ended_with_failure_event": sum(1 for o in streams if o.failed_terminal),
        "streams_without_terminal_event": [
            f"{o.label} ({o.events} events)"
            for o in streams
            if not o.cancelled and not o.terminal_ok
        ],
        "json_answers_incomplete": [
            o.label for o in outcomes if not o.spec.stream and o.status == 200 and not o.terminal_ok
        ],
        "latency_s": percentiles([o.latency_s for o in done]),
        "latency_s_by_kind": {
            kind: percentiles([o.latency_s for o in done if o.spec.kind == kind])
            for kind in sorted({o.spec.kind for o in done})
        },
        "first_event_s_streams": percentiles(
            [o.first_event_s for o in done if o.first_event_s is not None]
        ),
        "queue_ms_chat": percentiles(queue),
    }


def check(
    options: LoadTestOptions,
    result: dict[str, Any],
    counted: dict[str, int],
    exit_status: int | None,
) -> dict[str, bool]:
    """The invariants; `result`: what `drive` found, `counted`: the server's request counts."""
    summary, admission, rss = result["summary"], result["admission"], result["rss"]
    statuses = {s for kind in summary["by_kind_and_status"].values() for s in kind}
    overload_possible = options.concurrency > options.n_slots + options.max_waiting
    bursts = result["bursts"] if options.soak else [b for b in [result["burst"]] if b]
    burst_checks = [burst_invariants(b, options.max_waiting) for b in bursts]
    rss_ok = rss["flat"] is True if options.soak else rss["ratio"] <= 1 + options.rss_tolerance
    return {
        "no_5xx": summary["status_5xx"] == 0
        and not any(key.split()[1].startswith("5") for key in counted),
        "no_transport_errors": not summary["transport_errors"],
        "only_200_or_expected_429": statuses <= ({"200", "429"} if overload_possible else {"200"}),
        "all_accounted_for": (options.soak or result["planned"] == options.requests)
        and sum(counted.values()) == result["expected_total"],
        "streams_end_with_terminal_event": not summary["streams_without_terminal_event"],
        "json_answers_complete": not summary["json_answers_incomplete"],
        "queue_within_bound": admission["max_queue_depth_seen"] <= options.max_waiting,
        "engine_idle_after": admission["idle_after"],
        "rss_flat_after_warmup" if options.soak else "rss_within_tolerance": rss_ok,
        "warmup_all_200_and_complete": result["warmup"]["complete"],
        "server_exit_clean": exit_status == 0,
        **{name: all(c[name] for c in burst_checks) for name in (burst_checks or [{}])[0]},
    }


async def drive(options: LoadTestOptions, base: str, pid: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=max(options.concurrency, options.burst_size) + 4)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        watch = GaugeWatch(client, base)
        warm = warmup_requests(options.requests, loops=options.loop_share > 0)
        warm_outcomes = await run_all(client, base, warm, options.n_slots)
        await watch.until_idle(IDLE_WAIT_S)
        rss_before = rss_bytes(pid)
        log.info("warm-up done (%d requests); RSS %.1f MiB", len(warm), rss_before / MIB)
        poller = asyncio.create_task(watch.run())
        soak: SoakResult | None = None
        burst: dict[str, Any] | None = None
        if options.soak:
            first = options.requests + len(warm)
            soak = await _soak(options, client, base, pid, watch, first_index=first)
            outcomes, elapsed, planned = soak.outcomes, soak.elapsed_s, 0
        else:
            specs = plan_requests(
                options.requests,
                options.seed,
                options.cancel_fraction,
                options.max_tokens,
                loop_share=options.loop_share,
            )
            started = time.perf_counter()
            outcomes = await run_all(client, base, specs, options.concurrency)
            elapsed, planned = time.perf_counter() - started, len(specs)
        poller.cancel()
        metrics = await watch.until_idle(IDLE_WAIT_S)
        rss_after = rss_bytes(pid)
        if soak is None:
            burst = await _burst_phase(options, client, base, watch)
            if burst is not None:
                metrics = await watch.until_idle(IDLE_WAIT_S)
    idle = not metrics.get("gpt_oss_queue_depth") and not metrics.get("gpt_oss_active_sequences")
    queue_s = metrics.get('gpt_oss_engine_seconds_total{phase="queue"}', 0.0)
    generations = sum(v for k, v in metrics.items() if k.startswith("gpt_oss_generations_total"))
    summary = summarize(outcomes)
    bursts = soak.bursts if soak is not None else [b for b in [burst] if b]
    rss: dict[str, Any] = {
        "before_bytes": rss_before,
        "after_bytes": rss_after,
        "before_mib": round(rss_before / MIB, 1),
        "after_mib": round(rss_after / MIB, 1),
        "ratio": round(rss_after / rss_before, 4),
    }
    mode: dict[str, Any] = {"burst": burst}
    if soak is not None:
        rss |= curve_report(soak.samples, options.rss_warmup_s, options.rss_tolerance)
        rss["curve"] = [s.row() for s in soak.samples]
        mode = {"bursts": soak.bursts}
    return {
        "mode": "soak" if soak is not None else "count",
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(outcomes) / elapsed, 3) if elapsed else None,
        "warmup": {
            "requests": len(warm_outcomes),
            "statuses": dict(Counter(str(o.status) for o in warm_outcomes)),
            "complete": all(
                o.status == 200 and o.terminal_ok for o in warm_outcomes if not o.cancelled
            ),
            "tool_loops": loops_summary(warm_outcomes),
        },
        "summary": summary,
        "admission": {
            "max_queue_ms_chat": (summary["queue_ms_chat"] or {}).get("max"),
            "mean_queue_ms_all": round(1000 * queue_s / generations, 3) if generations else None,
            "max_queue_depth_seen": watch.max_queue_depth,
            "max_active_sequences_seen": watch.max_active,
            "max_waiting": options.max_waiting,
            "n_slots": options.n_slots,
            "metrics_polls": watch.polls,
            "idle_after": idle,
            "active_sequences_at_end": metrics.get("gpt_oss_active_sequences"),
            "queue_depth_at_end": metrics.get("gpt_oss_queue_depth"),
        },
        "rss": rss,
        **mode,
        "metrics": metrics,
        "planned": planned,
        "expected_total": len(warm_outcomes) + len(outcomes) + sum(b["requests"] for b in bursts),
    }


async def _soak(
    options: LoadTestOptions,
    client: httpx.AsyncClient,
    base: str,
    pid: int,
    watch: GaugeWatch,
    *,
    first_index: int,
) -> SoakResult:
    plan = SoakPlan(
        duration_s=options.duration_s or 0.0,
        concurrency=options.concurrency,
        seed=options.seed,
        cancel_fraction=options.cancel_fraction,
        max_tokens=options.max_tokens,
        loop_share=options.loop_share,
        rss_every_s=options.rss_every_s,
        burst_every_s=options.burst_every_s if options.burst_size > 0 else 0.0,
        first_index=first_index,
    )

    async def burst() -> dict[str, Any]:
        report = await _burst_phase(options, client, base, watch)
        assert report is not None  # burst_every_s is 0 without a burst size
        return report

    async def until_idle() -> dict[str, float]:
        return await watch.until_idle(IDLE_WAIT_S)

    return await run_soak(
        client, base, pid, plan, scrape=watch.scrape, burst=burst, until_idle=until_idle
    )


async def _burst_phase(
    options: LoadTestOptions, client: httpx.AsyncClient, base: str, watch: GaugeWatch
) -> dict[str, Any] | None:
    """Many requests at once against the bound (see burst.py); None when --burst 0."""
    if options.burst_size <= 0:
        return None
    outcomes, metrics = await run_burst(
        client, base, options.burst_size, options.burst_max_tokens, watch.scrape
    )
    report = burst_report(outcomes, metrics, options.n_slots, options.max_waiting)
    log.info(
        "burst of %d: %d accepted, %d refused (bound %d), deepest queue %d",
        report["requests"],
        report["accepted"],
        report["refused"],
        report["bound"],
        report["queue_depth_max"],
    )
    return report


def run_load_test(options: LoadTestOptions) -> tuple[dict[str, Any], int]:
    """Run it; the report (also written to `options.out/load-test.json`) and the exit status."""
    options.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = server_command(options, port)
    base = f"http://127.0.0.1:{port}"
    server = ServerProcess(
        command, options.out / "server.log", f"{base}/health", options.startup_timeout_s
    )
    with server:
        result = asyncio.run(drive(options, base, server.pid))
    exit_status = server.ended.returncode if server.ended is not None else None
    counted = request_counts(result["metrics"])
    invariants = check(options, result, counted, exit_status)
    del result["expected_total"], result["planned"]
    report = {
        "settings": json.loads(json.dumps(dataclasses.asdict(options), default=str)),
        "server_command": command,
        "server_load_s": round(server.load_s, 2),
        "server_exit_status": exit_status,
        **result,
        "requests_counted_by_server": counted,
        "invariants": invariants,
        "ok": all(invariants.values()),
    }
    (options.out / "load-test.json").write_text(json.dumps(report, indent=2) + "\n")
    return report, 0 if report["ok"] else 1
