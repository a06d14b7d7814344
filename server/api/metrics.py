"""Prometheus metrics: requests by endpoint and status, token counts, rates, latency, load,
how often steering overrode the model, and speculative decoding's drafted and accepted tokens.

One registry per app (on app.state): the HTTP middleware counts requests, the generation core
reports every finished generation, and gauges read the engine's load when scraped. With several
models served, everything about a model (tokens, times, generations, load, queue, prompt cache,
residency) carries a `model` label (its id); with one, the series are as they always were.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.contracts.events import Finished
from server.core.admission import Admission
from server.engine.base import Engine
from server.ops.runtime import Runtime

router = APIRouter()

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class Metrics:
    """The server's metrics, registered in their own registry."""

    def __init__(self, engines: Engine | Mapping[str, Engine]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        named = engines if isinstance(engines, Mapping) else {"": engines}
        self.labelled = len(named) > 1  # several models: a `model` label on their series
        m = ["model"] if self.labelled else []
        self.requests = Counter(
            "gpt_oss_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "gpt_oss_request_seconds",
            "HTTP request duration (until the response started).",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "gpt_oss_tokens",
            "Tokens by kind: prompt, cached, evaluated, generated, reasoning.",
            [*m, "kind"],
            registry=r,
        )
        self.seconds = Counter(
            "gpt_oss_engine_seconds",
            "Engine time by phase: queue (waiting for a sequence), prefill, decode.",
            [*m, "phase"],
            registry=r,
        )
        self.generations = Counter(
            "gpt_oss_generations",
            "Finished generations by finish reason.",
            [*m, "reason"],
            registry=r,
        )
        self.malformed = Counter(
            "gpt_oss_malformed_outputs",
            "Generations whose output left the harmony grammar (each ended with what parsed).",
            m,
            registry=r,
        )
        self.steering_choices = Counter(
            "gpt_oss_steering_choices",
            "Tokens sampled among the few a message header allows (steering's choices).",
            m,
            registry=r,
        )
        self.steering_overrides = Counter(
            "gpt_oss_steering_overrides",
            "Steering choices where the model's most likely token was not allowed (with real "
            "weights, a high share of the choices means the header grammar refuses what the "
            "model writes).",
            m,
            registry=r,
        )
        self.drafted = Counter(
            "gpt_oss_draft_tokens",
            "Drafted tokens verified by speculative decoding (llama-server's draft_n).",
            m,
            registry=r,
        )
        self.draft_accepted = Counter(
            "gpt_oss_draft_tokens_accepted",
            "Drafted tokens the verify accepted (each saved a model step).",
            m,
            registry=r,
        )
        self.ttft = Histogram(
            "gpt_oss_time_to_first_token_seconds",
            "From submission to the first sampled token.",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill_rate = Histogram(
            "gpt_oss_prefill_tokens_per_second",
            "Prompt evaluation rate per request.",
            m,
            buckets=_RATE_BUCKETS,
            registry=r,
        )
        self.decode_rate = Histogram(
            "gpt_oss_decode_tokens_per_second",
            "Generation rate per request.",
            m,
            buckets=_RATE_BUCKETS,
            registry=r,
        )
        running = Gauge("gpt_oss_active_sequences", "Requests being generated.", m, registry=r)
        slots = Gauge("gpt_oss_sequences", "Sequences in the context.", m, registry=r)
        self.refused = Counter(
            "gpt_oss_requests_refused",
            "Requests refused with 429 because slots + max waiting were taken.",
            m,
            registry=r,
        )
        self._depth = Gauge(
            "gpt_oss_queue_depth", "Admitted requests waiting for a sequence.", m, registry=r
        )
        self._highest = Gauge(
            "gpt_oss_queue_depth_max", "The deepest the queue has been since start.", m,
            registry=r,
        )  # fmt: skip
        caching = {name: e for name, e in named.items() if e.prompt_cache is not None}
        if caching:  # prompt cache on disk
            r.register(PromptCacheCollector(caching, self.labelled))
        for name, engine in named.items():
            self._of(running, name).set_function(lambda e=engine: e.load.running)
            self._of(slots, name).set_function(lambda e=engine: e.load.slots)

    def _of(self, metric: Any, model: str, *values: str) -> Any:
        """The metric's child for a model (and the other labels' values)."""
        labels = (model, *values) if self.labelled else values
        return metric.labels(*labels) if labels else metric

    def watch(self, admission: Admission, model: str = "") -> None:
        """Gauges of the admission gate: the queue's depth now and the deepest it has been."""
        self._of(self._depth, model).set_function(lambda: admission.waiting)
        self._of(self._highest, model).set_function(lambda: admission.highest_waiting)
        admission.on_refused = self._of(self.refused, model).inc

    def watch_model(self, runtime: Runtime) -> None:
        """Whether the model is in memory, and its reloads (--idle-unload)."""
        self.registry.register(ResidencyCollector([runtime]))

    def watch_models(self, runtimes: list[Runtime]) -> None:
        """Each model's residency, labelled by model (several models)."""
        self.registry.register(ResidencyCollector(runtimes, labelled=True))

    def observe(self, finished: Finished, model: str = "") -> None:
        usage, timings = finished.usage, finished.timings
        of = self._of
        for kind, value in (
            ("prompt", usage.prompt_tokens),
            ("cached", usage.cached_tokens),
            ("evaluated", usage.evaluated_tokens),
            ("generated", usage.completion_tokens),
            ("reasoning", usage.reasoning_tokens),
        ):
            of(self.tokens, model, kind).inc(value)
        for phase, seconds in (
            ("queue", timings.queue_s),
            ("prefill", timings.prefill_s),
            ("decode", timings.decode_s),
        ):
            of(self.seconds, model, phase).inc(seconds)
        of(self.generations, model, finished.reason.value).inc()
        if finished.malformed:
            of(self.malformed, model).inc()
        of(self.steering_choices, model).inc(finished.steering.choices)
        of(self.steering_overrides, model).inc(finished.steering.overrides)
        of(self.drafted, model).inc(timings.draft_n)
        of(self.draft_accepted, model).inc(timings.draft_n_accepted)
        if usage.completion_tokens:
            of(self.ttft, model).observe(timings.ttft_s)
        if timings.prefill_tokens_per_s:
            of(self.prefill_rate, model).observe(timings.prefill_tokens_per_s)
        if timings.decode_tokens_per_s:
            of(self.decode_rate, model).observe(timings.decode_tokens_per_s)


class PromptCacheCollector(Collector):
    """The disk prompt cache's counters, read from the engine when scraped."""

    _COUNTERS = (
        ("hits", "Prompts that started from a prefix restored from disk."),
        ("misses", "Prompts for which the disk held no longer prefix than the memory."),
        ("read_bytes", "Bytes read from prompt cache files."),
        ("written_bytes", "Bytes written to prompt cache files."),
        ("saves", "Prompt cache files written."),
        ("skipped_saves", "Saves dropped (writes falling behind, or a full disk)."),
        ("corrupt", "Prompt cache files deleted because they failed their checks."),
        ("evicted", "Prompt cache files deleted to stay within the budget."),
        ("copy_seconds", "Engine-thread time spent copying states out of llama.cpp."),
        ("load_seconds", "Engine-thread time spent restoring states read from disk."),
    )

    def __init__(self, engines: Mapping[str, Engine], labelled: bool = False) -> None:
        self._engines = engines
        self._labelled = labelled  # a `model` label (several models)

    def collect(self) -> Iterator[Metric]:
        labels = ["model"] if self._labelled else []
        families = {
            name: CounterMetricFamily(f"gpt_oss_prompt_cache_disk_{name}", help_text, labels=labels)
            for name, help_text in self._COUNTERS
        }
        for model, engine in self._engines.items():
            stats = engine.prompt_cache
            if stats is None:
                continue
            values = {
                "hits": stats.hits,
                "misses": stats.misses,
                "read_bytes": stats.bytes_read,
                "written_bytes": stats.bytes_written,
                "saves": stats.saves,
                "skipped_saves": stats.skipped_saves,
                "corrupt": stats.corrupt,
                "evicted": stats.evicted,
                "copy_seconds": stats.copy_seconds,
                "load_seconds": stats.load_seconds,
            }
            for name, family in families.items():
                family.add_metric([model] if self._labelled else [], values[name])
        yield from families.values()


class ResidencyCollector(Collector):
    """The model's residency (loaded, unloading, unloaded, loading) and its reloads."""

    STATES = ("loaded", "unloading", "unloaded", "loading")

    def __init__(self, runtimes: list[Runtime], labelled: bool = False) -> None:
        self._runtimes = runtimes
        self._labelled = labelled  # a `model` label (several models)

    def collect(self) -> Iterator[Metric]:
        m = ["model"] if self._labelled else []
        state = GaugeMetricFamily(
            "gpt_oss_model_state",
            "1 for the state the model is in: loaded, unloading, unloaded (--idle-unload, or "
            "to make room for another model) or loading again.",
            labels=[*m, "state"],
        )
        unloads = CounterMetricFamily(
            "gpt_oss_model_unloads",
            "Unloads after --idle-unload without a request, to make room for another model, or "
            "after its engine failed (an RPC host dropped).",
            labels=m,
        )
        reloads = CounterMetricFamily(
            "gpt_oss_model_reloads", "Loads after an unload, for a request.", labels=m
        )
        failures = CounterMetricFamily(
            "gpt_oss_model_reload_failures", "Loads after an unload that failed.", labels=m
        )
        failed = GaugeMetricFamily(
            "gpt_oss_model_reload_failed",
            "1 while the last load after an unload failed (until one succeeds).",
            labels=m,
        )
        last = GaugeMetricFamily(
            "gpt_oss_model_last_reload_seconds",
            "How long the last load after an unload took.",
            labels=m,
        )
        timed = False
        for runtime in self._runtimes:
            report = runtime.residency_report
            model = [runtime.model_name] if self._labelled else []
            for name in self.STATES:
                state.add_metric([*model, name], 1.0 if report.state.value == name else 0.0)
            unloads.add_metric(model, report.unloads)
            reloads.add_metric(model, report.loads)
            failures.add_metric(model, report.load_failures)
            failed.add_metric(model, 1.0 if report.load_error is not None else 0.0)
            if report.last_load_s is not None:
                last.add_metric(model, report.last_load_s)
                timed = True
        yield from (state, unloads, reloads, failures, failed)
        if timed:
            yield last


class RequestMetricsMiddleware:
    """Pure ASGI middleware (streams and disconnects pass through untouched): counts each
    request by route template and status, and times it until its response starts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self._record(scope, status, time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, send_and_record)

    @staticmethod
    def _record(scope: Scope, status: int, seconds: float) -> None:
        app = scope.get("app")
        metrics: Metrics | None = getattr(getattr(app, "state", None), "metrics", None)
        if metrics is None:
            return
        endpoint = getattr(scope.get("route"), "path", "unmatched")
        metrics.requests.labels(endpoint, str(status)).inc()
        metrics.request_seconds.labels(endpoint).observe(seconds)


@router.get("/metrics", include_in_schema=False)
async def metrics_endpoint(request: Request) -> Response:
    metrics: Metrics = request.app.state.metrics
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
