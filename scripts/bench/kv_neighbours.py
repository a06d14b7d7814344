"""What an idle conversation in the KV cache costs the others: prefill and decode beside it.

    python -m scripts.bench.kv_neighbours [--model PATH] [--threads N] [--n-gpu-layers 0]
        [--prompt 3000] [--neighbour 7000] [--gen 64] [--rounds 2] [--out FILE]

`serve` keeps up to `--n-slots` conversations in one KV cache, so an agent's next round (or
another client's) reuses what it evaluated. On one context configured as `serve` configures it
(LlamaContext from the same settings), each round measures, for a sequence of `--prompt`
tokens and `--gen` one-token decodes after it:

- `alone`: nothing else in the cache;
- `beside`: another sequence of `--neighbour` tokens kept in the cache, idle.

Both on the unified cache `serve` uses (every sequence may grow to the whole context) and on
per-sequence caches (`kv_unified` off, what `--batch-invariant` sets: each sequence holds at
most n_ctx / n_slots cells). Prints JSON: medians over the rounds of the prefill's milliseconds
and the decode's milliseconds a token, and the ratios beside / alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from devkit.models import cached_gguf
from server.bench.report import print_json
from server.engine.base import BatchPart, EngineConfig, default_threads
from server.engine.llama_context import LlamaContext
from server.ops.settings import Settings
from server.ops.startup import engine_config

CACHES = {"unified": False, "per_sequence": True}  # name: EngineConfig.batch_invariant
MEASURED, NEIGHBOUR = 1, 0  # sequence ids
TIMES = ("prefill_ms", "decode_ms_per_token")


class Neighbours:
    """One context and its random prompts."""

    def __init__(self, config: EngineConfig, args: argparse.Namespace) -> None:
        self.ctx = LlamaContext(config)
        self.args = args
        self.rng = np.random.default_rng(0)
        self.chunk = config.n_batch  # a batch a decode (llama.cpp splits it in ubatches)

    def close(self) -> None:
        self.ctx.close()

    def prefill(self, seq: int, n: int) -> float:
        """Seconds to evaluate `n` random tokens into sequence `seq` (from position 0)."""
        tokens = self.rng.integers(100, 199_000, n).tolist()
        started = time.perf_counter()
        for start in range(0, n, self.chunk):
            part = tokens[start : start + self.chunk]
            self.ctx.decode([BatchPart(seq, part, start, start + len(part) >= n)])
        self.ctx.synchronize()
        return time.perf_counter() - started

    def decode(self, seq: int, position: int) -> float:
        """Seconds a token of `--gen` one-token decodes (each waited for)."""
        n = self.args.gen
        feed = self.rng.integers(100, 199_000, n).tolist()
        started = time.perf_counter()
        for i, token in enumerate(feed):
            self.ctx.decode([BatchPart(seq, [token], position + i, True)])
            self.ctx.synchronize()
        return float((time.perf_counter() - started) / n)

    def case(self, beside: bool) -> dict[str, float]:
        """The measured sequence's prefill and decode, with or without an idle neighbour."""
        for seq in (MEASURED, NEIGHBOUR):
            self.ctx.truncate(seq, 0)
        if beside:
            self.prefill(NEIGHBOUR, self.args.neighbour)
        prefill_s = self.prefill(MEASURED, self.args.prompt)
        decode_s = self.decode(MEASURED, self.args.prompt)
        return {
            "prefill_ms": prefill_s * 1e3,
            "decode_ms_per_token": decode_s * 1e3,
            "neighbour_cells": self.ctx.seq_end(NEIGHBOUR),  # what sat beside, to check
            "measured_cells": self.ctx.seq_end(MEASURED),
        }


def measure(args: argparse.Namespace, config: EngineConfig) -> dict[str, Any]:
    """Every round: alone, then beside (each cache in a context of its own)."""
    rounds: list[dict[str, dict[str, float]]] = []
    neighbours = Neighbours(config, args)
    try:
        neighbours.case(beside=False)  # warm-up: every weight touched
        for number in range(args.rounds):
            order = (False, True) if number % 2 == 0 else (True, False)
            rounds.append({("beside" if b else "alone"): neighbours.case(b) for b in order})
    finally:
        neighbours.close()
    medians = {
        case: {key: round(statistics.median(r[case][key] for r in rounds), 3)
               for key in rounds[0][case]}
        for case in ("alone", "beside")
    }  # fmt: skip
    ratios = {key: round(medians["beside"][key] / medians["alone"][key], 3) for key in TIMES}
    return {"medians": medians, "beside_over_alone": ratios, "rounds": rounds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--threads", type=int, default=None, help="default: serve's")
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--prompt", type=int, default=3000)
    parser.add_argument("--neighbour", type=int, default=7000)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--caches", nargs="*", choices=list(CACHES), default=list(CACHES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = args.model or cached_gguf("tiny")
    threads = args.threads or default_threads()
    settings = Settings(model=str(model), n_threads=threads, n_threads_batch=threads)
    base = dataclasses.replace(
        engine_config(settings, model), n_gpu_layers=args.n_gpu_layers, prompt_cache_dir=None
    )
    report: dict[str, Any] = {
        "model": str(model),
        "threads": threads,
        "n_ctx": base.n_ctx,
        "n_slots": base.n_slots,
        "prompt": args.prompt,
        "neighbour": args.neighbour,
    }
    for name in args.caches:
        config = dataclasses.replace(base, batch_invariant=CACHES[name])
        report[name] = measure(args, config)
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
