"""Prefill speed and compute memory by llama.cpp's physical batch size (`n_ubatch`).

    python -m scripts.bench.ubatch [--model PATH] [--n-gpu-layers 0] [--threads N]
        [--prompts 512,2048,4096] [--ubatches 512,1024,2048] [--repetitions 3] [--out FILE]

`serve` evaluates a prompt in ubatches of 512 tokens (`--n-ubatch`, llama.cpp's default). A
larger one makes fewer, larger matrix products, which a GPU may run faster (llama.cpp's own
guide to gpt-oss runs `-ub 2048`), for a larger compute buffer; on this project's CPU VM the
tiny model's pp2048 fell from 53k to 32k tokens/s at 1,024 (its attention). For each ubatch
size, one llama-bench run (serve's other settings: `n_batch` 2048 or the ubatch if larger,
flash attention `auto`, no mmap) measures the prefill at each prompt size, and its verbose log
gives the compute buffers llama.cpp reserved on each device; so a GPU run says whether `serve`
should take a larger one there. llama.cpp caps the ubatch at the context, which llama-bench
sizes to the prompt: a prompt shorter than the ubatch runs as with a ubatch of its size.
An odd size tells what a ubatch a few tokens larger costs: `serve` evaluates the forced
`<|channel|>` and the guessed header (three tokens) with a prompt's last chunk, so a prompt of
510-512 tokens past a multiple of 512 takes one more ubatch (a decode step's time) than llama.cpp
evaluating the bare prompt; a ubatch of 515 would hold them, if its products cost no more per
token than 512's (the GPU check's run measures 515 last). On this project's CPU VM it does not:
the tiny model's pp2048 took 24.5-33.2k tokens/s at 515 against 30.5-37.3k at 512 (four runs
each, alternating; pp512 alike). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from devkit.models import cached_gguf
from server.bench.llama_bench import llama_binary
from server.bench.report import print_json
from server.engine.base import default_threads
from server.ops.settings import Settings

BUFFER = re.compile(r"(\S+) compute buffer size\s*=\s*([0-9.]+) MiB")


def compute_buffers(log: str) -> dict[str, float]:
    """The largest compute buffer llama.cpp reserved on each device (MiB), from a verbose log."""
    sizes: dict[str, float] = {}
    for device, mib in BUFFER.findall(log):
        sizes[device] = max(sizes.get(device, 0.0), float(mib))
    return sizes


def prefill_rates(tests: list[dict[str, Any]]) -> dict[str, float]:
    """llama-bench's JSON tests -> the mean prefill tokens/s of each prompt size."""
    return {f"pp{int(t['n_prompt'])}": round(float(t["avg_ts"]), 1) for t in tests}


def command(args: argparse.Namespace, model: Path, ubatch: int) -> list[str]:
    n_batch = max(ubatch, Settings.model_fields["n_batch"].default)
    return [
        str(llama_binary("llama-bench")), "-m", str(model), "-o", "json", "-v",
        "-p", args.prompts, "-n", "0", "-r", str(args.repetitions),
        "-b", str(n_batch), "-ub", str(ubatch), "-t", str(args.threads),
        "-ngl", str(args.n_gpu_layers), "-fa", "auto", "-lm", "none",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--prompts", default="512,2048,4096")
    parser.add_argument("--ubatches", default="512,1024,2048")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    model = args.model or cached_gguf("tiny")
    by_ubatch: dict[str, Any] = {}
    for ubatch in (int(u) for u in args.ubatches.split(",")):
        bench = command(args, model, ubatch)
        run = subprocess.run(bench, check=False, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr[-4000:], file=sys.stderr)
            return run.returncode
        by_ubatch[str(ubatch)] = {
            "tokens_per_s": prefill_rates(json.loads(run.stdout)),
            "compute_buffer_mib": compute_buffers(run.stderr),
        }
    report = {
        "model": str(model),
        "n_gpu_layers": args.n_gpu_layers,
        "threads": args.threads,
        "by_ubatch": by_ubatch,
    }
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
