"""Measure the in-process engine on a GGUF: prefill and decode tokens/s, time to first token.

Prints one JSON object. Seeded random prompt tokens, one warm-up run, N measured runs, the KV
cache cleared between runs (each run's prompt starts with a different token).

    python scripts/bench_engine.py --model PATH [--prompt-tokens 512] [--gen-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.llama import LlamaEngine


def run_once(engine: LlamaEngine, prompt: list[int], gen_tokens: int) -> EngineResult:
    params = SamplingParams(max_tokens=gen_tokens, temperature=0.0)

    async def consume() -> EngineResult:
        stream = engine.submit(prompt, params)
        async for _ in stream:
            pass
        return stream.result

    return asyncio.run(consume())


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = EngineConfig(
        model_path=str(args.model),
        n_ctx=args.prompt_tokens + args.gen_tokens + 16,
        n_threads=args.threads,
        n_gpu_layers=args.n_gpu_layers,
    )
    engine = LlamaEngine(config)
    rng = random.Random(args.seed)
    try:
        results = []
        for run in range(args.repetitions + 1):  # the first run warms up
            prompt = [rng.randrange(1000, 190000) for _ in range(args.prompt_tokens)]
            result = run_once(engine, prompt, args.gen_tokens)
            if run > 0:
                results.append(result)
    finally:
        engine.close()
    report = {
        "model": str(args.model),
        "description": engine.info.description,
        "threads": args.threads,
        "n_gpu_layers": args.n_gpu_layers,
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "repetitions": args.repetitions,
        "prefill_tokens_per_s": summary([r.timings.prefill_tokens_per_s for r in results]),
        "decode_tokens_per_s": summary([r.timings.decode_tokens_per_s for r in results]),
        "ttft_ms": summary([r.timings.ttft_s * 1000 for r in results]),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
