"""`--speculative auto` against `off` in one process: what auto's steps cost, without HTTP.

`python -m scripts.bench.auto_inprocess [--model tiny] [--prompt 300] [--gen 256]
[--rounds 12] [--instances 2] [--control] [--threads 2] [--out FILE]`

`--instances` engines a setting (LlamaEngine as `serve` builds it, no disk cache), created in
the order auto, off, off, auto, ..., all in this process; round r gives each setting's engine
r mod `--instances` the same request in turn (a random `--prompt`-token prompt, `--gen` tokens
at temperature 1, a seed per round), which goes first alternating by round. Each generation's
decode rate is the engine's own (its timings), and its one-token steps are split from inside
(token_floor.StepTimers: the whole step, the decode waited for, the picks). `--control` runs
`off` on both sides: what two engines of the same settings differ by.

Where the served comparison (scripts/bench/auto_off.py) sees processes that differ by several
per cent, this one shares the process, the Python and the allocator between the settings, so
what is left between them is what auto does each step: the plan's proposal declined, the
index kept, the controller's timing. Prints JSON: per setting the medians of the split, per
round the ratio auto / off, their geometric mean and its bootstrap 95 % interval.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from devkit.models import cached_gguf
from scripts.bench.auto_off import MODES, bootstrap, geomean, interval
from scripts.bench.token_floor import StepTimers
from server.bench.inprocess import PACE_S
from server.bench.machine import load_average
from server.bench.report import print_json
from server.engine.base import SamplingParams
from server.engine.llama import LlamaEngine
from server.ops.settings import Settings
from server.ops.startup import engine_config


def engines(args: argparse.Namespace, model: Path) -> dict[tuple[str, int], LlamaEngine]:
    settings = Settings(model=str(model), n_threads=args.threads, n_threads_batch=args.threads)
    made: dict[tuple[str, int], LlamaEngine] = {}
    for i in range(args.instances):
        for mode in MODES if i % 2 == 0 else MODES[::-1]:  # who is made first, in turn
            setting = "off" if args.control else mode
            config = dataclasses.replace(
                engine_config(settings, model), speculative=setting, prompt_cache_dir=None
            )
            made[mode, i] = LlamaEngine(config)
    return made


def generate(engine: LlamaEngine, prompt: list[int], params: SamplingParams) -> Any:
    async def run() -> Any:
        stream = engine.submit(prompt, params)
        async for _ in stream.paced(PACE_S):  # taken as `serve` takes them
            pass
        return stream.result

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default="tiny", help="a preset (tiny, trained) or a path")
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--gen", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--control", action="store_true", help="off on both sides (A/A)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    path = Path(args.model)
    model = path if path.suffix == ".gguf" else cached_gguf(args.model)
    report: dict[str, Any] = {
        "model": str(model),
        "loadavg_before": load_average(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "control": args.control,
        "instances": args.instances,
    }
    timers = StepTimers()
    made = engines(args, model)
    rng = np.random.default_rng(0)
    splits: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    ratios: list[float] = []
    try:
        for r in range(-1, args.rounds):  # round -1: every engine warmed up, not counted
            prompt = [int(t) for t in rng.integers(100, 199_000, args.prompt)]
            params = SamplingParams(max_tokens=args.gen, temperature=1.0, seed=1000 + r)
            pairs = [(m, i) for m, i in made if r < 0 or i == r % args.instances]
            rate: dict[str, float] = {}
            for mode, i in pairs if r % 2 == 0 else pairs[::-1]:
                with timers.measuring() as split:
                    result = generate(made[mode, i], prompt, params)
                rate[mode] = result.timings.decode_tokens_per_s
                if r >= 0:
                    splits[mode].append(split)
            if r >= 0:
                ratios.append(rate["auto"] / rate["off"])
                print(f"round {r}: auto {rate['auto']:.1f} off {rate['off']:.1f} tok/s",
                      file=sys.stderr)  # fmt: skip
    finally:
        for engine in made.values():
            engine.close()
    means = bootstrap(ratios, args.resamples, random.Random(0))
    report |= {
        "steps_ms": {
            mode: {
                name: round(statistics.median(s[name] for s in rows) * 1e3, 4)
                for name in ("step", "decode", "pick")
            }
            for mode, rows in splits.items()
        },
        "ratios": [round(x, 3) for x in ratios],
        "geomean": geomean(ratios),
        "ci95": interval(means),
        "loadavg_after": load_average(),
    }
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
