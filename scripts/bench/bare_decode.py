"""The library's own decode speed: a bare loop over llama-cpp-python's `llama_decode`.

    python -m scripts.bench.bare_decode [--model PATH] [--threads 2] [--prompt 512] [--gen 256]

No engine, no steering, no HTTP: a random prompt, then one token at a time chosen by an argmax
over the logits. Set beside `gpt-oss-server bench`, it tells the server's own per-token cost
apart from the llama.cpp build's (llama-bench comes from another build). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

import numpy as np

from devkit.models import cached_gguf
from server.engine.base import EngineConfig
from server.engine.llama_context import BatchPart, LlamaContext


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=256)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    model = args.model or cached_gguf("tiny")
    n_ctx = args.prompt + args.gen + 64
    config = EngineConfig(model_path=str(model), n_ctx=n_ctx, n_slots=1, n_threads=args.threads)
    ctx = LlamaContext(config)
    rng = np.random.default_rng(0)
    rates = []
    try:
        for _ in range(args.repetitions):
            ctx.truncate(0, 0)
            prompt = [int(t) for t in rng.integers(100, 199_000, args.prompt)]
            index = ctx.decode([BatchPart(0, prompt, 0, True)])[0]
            started = time.perf_counter()
            for position in range(args.prompt, args.prompt + args.gen):
                token = int(np.argmax(ctx.logits(index)))
                index = ctx.decode([BatchPart(0, [token], position, True)])[0]
            rates.append(args.gen / (time.perf_counter() - started))
    finally:
        ctx.close()
    report = {
        "model": str(model),
        "threads": args.threads,
        "test": f"tg{args.gen} after pp{args.prompt}",
        "tokens_per_s": [round(rate, 1) for rate in rates],
        "median_tokens_per_s": round(statistics.median(rates), 1),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
