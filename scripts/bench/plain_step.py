"""What a plain decode step costs beside what `--speculative auto` leaves behind, paired.

`python -m scripts.bench.plain_step [--preset trained] [--depth 7900] [--rounds 6] [--steps 40]
[--threads 2] [--out FILE]`

Two llama.cpp contexts of one model on one thread (one OpenMP team), each holding the same
`--depth` tokens: `small`, as `--speculative off` leaves a context (its output buffer of logits
the sequences' rows), and `grown`, as the start-up timing of the verify cost leaves it under
`auto` before this change (the buffer grown to 17 rows by a 1 + 16-token verify). Each round
times `--steps` one-token decodes (with the logits read, as a pick does) on each, alternating
which goes first, and rolls them back. Then, with no model: the Python a plain step of `auto`
adds (the drafter's proposal declined and the emitted token appended, under an index of the
`--depth` prompt tokens). Prints JSON: the medians, the paired ratio per round, the load.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from devkit.models import cached_gguf
from server.bench.machine import load_average
from server.bench.report import print_json
from server.engine.base import BatchPart, EngineConfig
from server.engine.llama_context import LlamaContext
from server.engine.speculative.draft_length import VerifyCost
from server.engine.speculative.drafter import Speculator

GROWN_ROWS = 17  # 1 + draft_max: the start-up verify timing's largest decode


def fill(ctx: LlamaContext, tokens: list[int]) -> None:
    for start in range(0, len(tokens), ctx.n_batch):
        chunk = tokens[start : start + ctx.n_batch]
        last = start + len(chunk) == len(tokens)
        ctx.decode([BatchPart(0, chunk, start, last)])


def plain_steps(ctx: LlamaContext, depth: int, steps: int, token: int) -> list[float]:
    times = []
    for i in range(steps):
        started = time.perf_counter()
        index = ctx.decode([BatchPart(0, [token + i], depth + i, True)])[0]
        float(ctx.logits(index)[0])  # waits for the decode, as a pick's read does
        times.append(time.perf_counter() - started)
    ctx.truncate(0, depth)
    return times


def drafter_overhead(prompt: list[int], steps: int) -> list[float]:
    """Seconds of Python `auto` adds to a plain step: a proposal the controller declines (its
    acceptance low) and the emitted token appended."""
    speculator = Speculator(VerifyCost.interpolate({0: 1.0, 1: 1.3, 16: 4.0}, 16))
    for _ in range(16):
        speculator.controller.plain(0.004)
    drafter = speculator.follow(prompt)
    rng = random.Random(1)
    emitted = [rng.choice(prompt) for _ in range(steps + 40)]
    times = []
    for i, token in enumerate(emitted):
        started = time.perf_counter()
        drafter.propose(16, frozenset())
        drafter.append(token)
        if i >= 40:  # after the index caught up and the acceptance settled
            times.append(time.perf_counter() - started)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="trained")
    parser.add_argument("--model")
    parser.add_argument("--depth", type=int, default=7900)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    model = args.model or str(cached_gguf(args.preset))
    report: dict[str, Any] = {"model": model, "depth": args.depth, "loadavg_before": load_average()}
    config = EngineConfig(model_path=model, n_ctx=16384, n_threads=args.threads)
    contexts = {"small": LlamaContext(config), "grown": LlamaContext(config)}
    rng = random.Random(0)
    prompt = [rng.randrange(1000, 100000) for _ in range(args.depth)]
    try:
        grown = contexts["grown"]
        grown.decode([BatchPart(0, prompt[:GROWN_ROWS], 0, True, GROWN_ROWS)])
        grown.truncate(0, 0)
        for ctx in contexts.values():
            fill(ctx, prompt)
        times: dict[str, list[float]] = {name: [] for name in contexts}
        ratios = []
        for r in range(args.rounds):
            order = list(contexts) if r % 2 == 0 else list(reversed(contexts))
            medians = {}
            for name in order:
                run = plain_steps(contexts[name], args.depth, args.steps, 500 + r)
                times[name].extend(run)
                medians[name] = statistics.median(run)
            ratios.append(medians["grown"] / medians["small"])
        report["logits_rows"] = {n: c.outputs_reserved for n, c in contexts.items()}
        report["plain_ms_median"] = {
            n: round(1000 * statistics.median(t), 3) for n, t in times.items()
        }
        report["grown_vs_small_paired"] = [round(x, 3) for x in ratios]
        report["grown_vs_small_median"] = round(statistics.median(ratios), 3)
    finally:
        for ctx in contexts.values():
            ctx.close()
    overhead = drafter_overhead(prompt, 400)
    report["auto_python_per_plain_step_us"] = {
        "median": round(1e6 * statistics.median(overhead), 1),
        "p90": round(1e6 * sorted(overhead)[int(0.9 * len(overhead))], 1),
    }
    report["loadavg_after"] = load_average()
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
