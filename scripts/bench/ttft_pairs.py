"""Time to the first visible token of two versions of the server, measured by pairs.

`python -m scripts.bench.ttft_pairs --a DIR --b DIR [--pairs 200] [--threads 1]
[--prompt-tokens 512] [--gen-tokens 8] [--model PATH] [--out FILE]`

Starts `gpt-oss-server serve` from each source tree (`.`, or a git worktree of another commit:
`python -m server` runs the `server` package found there) on the same model and settings as
`gpt-oss-server bench`'s HTTP path (one slot, no disk cache, no mmap), then sends them streamed chat
requests of a prompt of `--prompt-tokens` evaluated tokens (the bench's words, calibrated the
same way), alternately, the order flipped every pair: the two requests of a pair run within a
tenth of a second. For each version: the median time to the first visible delta at the client,
and that time less the server's own prefill timing (what the server adds beyond the prefill);
and the paired differences B - A of both, with a bootstrap 95 % interval of their median. The
same for the decode, by the server's own timing of it (ms a token from its first to its last
sampled token; `--gen-tokens 256` makes it a measure of the decode loop).

Why pairs: on the development VM, medians of 40 requests of the same code moved by ±0.5 ms
from run to run, more than the changes to measure; the paired difference of 200 pairs resolves
about 0.2 ms. Prints JSON.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from devkit.models import cached_gguf
from server.bench.http_path import chat, free_port, tail_tokens
from server.bench.procs import ServerProcess, serve_command
from server.bench.prompts import WordPrompts
from server.bench.report import print_json
from server.bench.stats import median_interval
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.settings import default_cache_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--a", type=Path, required=True, help="the first source tree")
    parser.add_argument("--b", type=Path, required=True, help="the second source tree")
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=8)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = args.model or cached_gguf("tiny")
    n_ctx = args.prompt_tokens + args.gen_tokens + 256
    options = [
        "--n-ctx", str(n_ctx), "--n-slots", "1",
        "--n-threads", str(args.threads), "--n-threads-batch", str(args.threads),
        "--no-prompt-cache", "--no-use-mmap", "--log-level", "warning",
    ]  # fmt: skip
    prompts = WordPrompts(
        load_encoding(default_cache_dir() / "vocab", partial(vocabulary_bytes, model))
    )
    trees = {"a": args.a.resolve(), "b": args.b.resolve()}
    beyond: dict[str, list[float]] = {"a": [], "b": []}
    ttft: dict[str, list[float]] = {"a": [], "b": []}
    decode: dict[str, list[float | None]] = {"a": [], "b": []}  # ms a token, the server's
    with ExitStack() as stack:
        logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ttft-pairs-")))
        urls, clients, tails = {}, {}, {}
        for name, tree in trees.items():
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            command = serve_command(model, port, *options)
            server = ServerProcess(command, logs / f"{name}.log", f"{base}/health", 900.0, tree)
            stack.enter_context(server)
            clients[name] = stack.enter_context(httpx.Client(timeout=120.0))
            urls[name] = f"{base}/v1/chat/completions"
            tails[name] = tail_tokens(clients[name], urls[name], prompts, 0)
        for i in range(args.pairs):
            for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
                text = prompts.text(0, i, args.prompt_tokens - tails[name])
                trace = chat(clients[name], urls[name], text, args.gen_tokens, i)
                if trace.first_visible is None:
                    raise SystemExit(f"request {i} to {name} showed nothing")
                first = (trace.first_visible - trace.sent) * 1000
                ttft[name].append(first)
                beyond[name].append(first - float(trace.timings["prompt_ms"]))
                per_s = float(trace.timings["predicted_per_second"])
                decode[name].append(1000 / per_s if per_s > 0 else None)  # None: one token
                time.sleep(0.02)
    diff_beyond = [b - a for a, b in zip(beyond["a"], beyond["b"], strict=True)]
    diff_ttft = [b - a for a, b in zip(ttft["a"], ttft["b"], strict=True)]
    decoded = [(a, b) for a, b in zip(decode["a"], decode["b"], strict=True) if a and b]
    diff_decode = [b - a for a, b in decoded]
    decode_b_minus_a = (
        {
            "decode_ms_per_token": round(statistics.median(diff_decode), 4),
            "decode_interval_95": median_interval(diff_decode, digits=4),
        }
        if decoded
        else {}
    )
    report: dict[str, Any] = {
        "model": str(model),
        "trees": {name: str(tree) for name, tree in trees.items()},
        "pairs": args.pairs,
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "ttft_ms": {name: round(statistics.median(v), 3) for name, v in ttft.items()},
        "beyond_prefill_ms": {name: round(statistics.median(v), 3) for name, v in beyond.items()},
        "decode_ms_per_token": {
            name: round(statistics.median(pair[i] for pair in decoded), 4) if decoded else None
            for i, name in enumerate(("a", "b"))
        },
        "b_minus_a": {
            "beyond_prefill_ms": round(statistics.median(diff_beyond), 3),
            "beyond_prefill_interval_95": median_interval(diff_beyond),
            "ttft_ms": round(statistics.median(diff_ttft), 3),
            "ttft_interval_95": median_interval(diff_ttft),
            **decode_b_minus_a,
        },
    }
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
