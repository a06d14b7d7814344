"""What a layer split over llama.cpp RPC costs: decode speed local vs loopback RPC, bytes per token.

    python -m scripts.bench.rpc_cost --model /tmp/s20b.gguf [--rpc-layers 13] [--threads 2]

Runs the same generation three times, each in its own process (RPC devices belong to the process
that registers them): all layers on this CPU; the same without llama.cpp's CPU weight repacking
(an RPC server keeps weights in plain CPU buffers, so a CPU host computes with those kernels);
then the last `--rpc-layers` layers (the output counting as one) on a `gpt-oss-server
rpc-worker` on 127.0.0.1 with the same thread count. The engine
reports prefill and decode times; the worker's TCP connection counters (`ss -ti`: bytes sent and
received) give the traffic of the prefill and per decoded token.
Over a real network the same bytes cross a slower link. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from devkit.models import cached_gguf
from server.bench.procs import start_rpc_worker
from server.engine.base import SamplingParams
from server.engine.llama import LlamaEngine
from server.ops.settings import Settings
from server.ops.startup import engine_config, start_engine


def worker_bytes(port: int) -> int:
    """Bytes the worker's open connections have moved so far, both ways (iproute2's `ss`)."""
    if not port:
        return 0
    command = ["ss", "-tinH", "state", "established", f"( sport = :{port} )"]
    text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    counts = re.findall(r"\bbytes_(?:sent|received):(\d+)", text)
    return sum(int(count) for count in counts)


async def generate(engine: LlamaEngine, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    """A fresh prompt (nothing cached), then greedy decoding; the worker's traffic of each."""
    port = args.port
    prompt = np.random.default_rng(round_).integers(1000, 100000, args.prompt).tolist()
    params = SamplingParams(max_tokens=args.gen, temperature=0.0)
    before = worker_bytes(port)
    after_prefill = None
    stream = engine.submit(prompt, params)
    async for _ in stream:
        if after_prefill is None:
            after_prefill = worker_bytes(port)
    end = worker_bytes(port)
    result = stream.result
    decoded = result.usage.completion_tokens - 1  # the first token comes with the prefill
    assert after_prefill is not None
    return {
        "prefill_tokens_per_s": args.prompt / result.timings.prefill_s,
        "decode_tokens_per_s": decoded / result.timings.decode_s,
        "prefill_bytes": after_prefill - before,
        "bytes_per_token": (end - after_prefill) / decoded,
    }


def one_run(args: argparse.Namespace) -> None:
    """One configuration in this process; prints its JSON line."""
    logging.disable(logging.WARNING)
    rpc = f"127.0.0.1:{args.port}" if args.port else ""
    layers = str(args.rpc_layers) if rpc else "0"
    settings = Settings(model=str(args.model), n_gpu_layers=layers, rpc=rpc, n_slots=1)
    config = replace(
        engine_config(settings, args.model),
        n_ctx=args.prompt + args.gen + 64,
        n_threads=args.threads,
        cpu_repack=not args.no_repack,
    )
    engine, placement = start_engine(settings, config)
    try:
        runs = [asyncio.run(generate(engine, args, i)) for i in range(args.rounds)]
    finally:
        engine.close()
    best = max(runs, key=lambda run: run["decode_tokens_per_s"])
    print(json.dumps({"placement": placement.summary, "runs": runs, "best": best}), flush=True)


def child(args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "scripts.bench.rpc_cost", "--one", *extra,
               "--model", str(args.model), "--threads", str(args.threads),
               "--prompt", str(args.prompt), "--gen", str(args.gen), "--rounds", str(args.rounds),
               "--rpc-layers", str(args.rpc_layers)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--rpc-layers", type=int, default=-1, help="layers on the worker (-1 all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-repack", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.model = args.model or cached_gguf("tiny")
    if args.one:
        one_run(args)
        return 0
    local = child(args)
    # llama.cpp's RPC server keeps weights in plain CPU buffers (no repacked MXFP4 kernels): the
    # same local run without repacking tells that cost apart from the transport's.
    plain = child(args, "--no-repack")
    with socket.socket() as probe:  # a free port for the worker
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    log_path = Path(tempfile.gettempdir()) / f"rpc-worker-{port}.log"
    worker = start_rpc_worker(port, args.threads, log_path)
    try:
        remote = child(args, "--port", str(port))
    finally:
        worker.kill()
        worker.wait()

    def ratio(run: dict[str, Any]) -> float:
        rate = remote["best"]["decode_tokens_per_s"] / run["best"]["decode_tokens_per_s"]
        return round(float(rate), 3)

    report = {
        "model": str(args.model),
        "threads": args.threads,
        "prompt_tokens": args.prompt,
        "gen_tokens": args.gen,
        "local": local,
        "local_without_repacking": plain,
        "loopback_rpc": remote,
        "decode_ratio_rpc_vs_local": ratio(local),
        "decode_ratio_rpc_vs_local_without_repacking": ratio(plain),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
