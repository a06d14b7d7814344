"""Path (b): the engine in-process, in a child process of its own (so its peak RSS is its own).

The child (`python -m server.bench.inprocess PLAN.json`) builds the engine exactly as `serve`
does (same Settings -> EngineConfig), submits random token-id prompts with no stop tokens (so
every generation runs to its token limit), and prints its measurements as JSON. Prefill speed
and time to first token come from the engine's own timings; decode speed and the consumer's time
to first token are measured where the tokens are consumed, in the asyncio loop, paced as `serve`
paces its streams (`--stream-interval-ms`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from server.bench.machine import OtherLoad
from server.bench.plan import BenchError, Measurement, PathRun, Plan, Step, pp_label, tg_label
from server.bench.procs import run_counted
from server.bench.prompts import random_tokens
from server.engine.base import EngineResult, SamplingParams, StopReason
from server.engine.llama import LlamaEngine
from server.ops.settings import Settings
from server.ops.startup import engine_config

log = logging.getLogger(__name__)
PACE_S = Settings.model_fields["stream_interval_ms"].default / 1000  # as `serve` takes tokens


def build_engine(plan: Plan) -> LlamaEngine:
    """The engine `serve` would build on these settings (its other settings at their defaults)."""
    settings = Settings(
        model=str(plan.model_path),
        n_ctx=plan.n_ctx,
        n_slots=plan.n_slots,
        n_threads=plan.n_threads,
        n_threads_batch=plan.n_threads,
        use_mmap=plan.use_mmap,
        flash_attn=plan.flash_attn,
    )
    config = engine_config(settings, plan.model_path)
    return LlamaEngine(dataclasses.replace(config, n_gpu_layers=plan.n_gpu_layers))


async def measure(engine: LlamaEngine, plan: Plan, step: Step) -> tuple[Measurement, Measurement]:
    """One request: (prefill measurement, decode measurement)."""
    prompt = random_tokens(plan.seed, step.index, step.n_prompt)
    params = SamplingParams(
        max_tokens=step.n_gen,
        temperature=plan.temperature,
        top_p=plan.top_p,
        seed=plan.seed + step.index,
    )
    load = OtherLoad()
    sent = time.perf_counter()
    first = last = 0.0
    stream = engine.submit(prompt, params)
    async for _ in stream.paced(PACE_S):
        last = time.perf_counter()
        first = first or last
    result: EngineResult = stream.result
    other_cpus = load.cores()
    if result.stop_reason in (StopReason.ERROR, StopReason.UNAVAILABLE):
        raise BenchError(f"generation failed: {result.error}")
    t = result.timings
    prefill = {
        "tokens_per_s": t.prefill_tokens_per_s,
        "prompt_tokens": t.evaluated_tokens,
        "prefill_ms": t.prefill_s * 1000,
        "ttft_ms": (first - sent) * 1000,
        "engine_ttft_ms": t.ttft_s * 1000,
        "ttft_overhead_ms": (t.ttft_s - t.prefill_s) * 1000,
        "other_cpus": other_cpus,
    }
    n = t.completion_tokens
    decode = {
        "tokens_per_s": (n - 1) / (last - first) if n > 1 and last > first else 0.0,
        "engine_tokens_per_s": t.decode_tokens_per_s,
        "generated_tokens": n,
        "other_cpus": other_cpus,
    }
    return prefill, decode


async def measure_all(engine: LlamaEngine, plan: Plan) -> dict[str, list[Measurement]]:
    tests: dict[str, list[Measurement]] = {}
    for step in plan.steps():
        prefill, decode = await measure(engine, plan, step)
        if not step.measured:
            continue
        tests.setdefault(pp_label(step.n_prompt), []).append(prefill)
        if step.decode_test:
            tests.setdefault(tg_label(step.n_gen), []).append(decode)
    return tests


def child_main(plan_path: str) -> int:
    """Entry point of the child process: measure, print the JSON result."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    plan = Plan.from_json(json.loads(Path(plan_path).read_text()))
    started = time.perf_counter()
    engine = build_engine(plan)
    load_s = time.perf_counter() - started
    try:
        tests = asyncio.run(measure_all(engine, plan))
    finally:
        engine.close()
    print("\n" + json.dumps({"load_s": load_s, "tests": tests}))  # the last line is the result
    return 0


def run_inprocess(plan: Plan, workdir: Path) -> PathRun:
    """Run the child on the plan; its stdout is the measurements."""
    run = PathRun("inprocess")
    plan_path = workdir / "plan.json"
    plan_path.write_text(json.dumps(plan.to_json()))
    command = [sys.executable, "-m", "server.bench.inprocess", str(plan_path)]
    result = run_counted(run, command, workdir / "inprocess.log", "the in-process child")
    output = json.loads(result.stdout.strip().splitlines()[-1])
    run.load_s = output["load_s"]
    run.tests = output["tests"]
    return run


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
