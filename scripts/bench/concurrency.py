"""Concurrency benchmark: aggregate decode tokens/s of N concurrent streams vs one stream,
through this server (streaming chat, `--n-slots N`) and llama-server (`-np N`, streaming
/completion), on the same file, threads and context.

`python -m scripts.bench.concurrency --model PATH [--streams 4 --prompt-tokens 64
--gen-tokens 32 --repetitions 2 --n-threads T --out FILE]`

Sampling as in the main benchmark: temperature 1 over the whole vocabulary, no stop
(llama-server: `ignore_eos`), so every stream runs to its length. Every request has a prompt of
its own (no shared prefix beyond the chat headers). Decode speed is taken on the client's clock
from each stream's token events (llama-server: one event per token; this server: one chunk per
visible token, the hidden harmony header tokens send none):

- single stream: (events - 1) / (last event - first event);
- N streams: the events of all streams that arrive while every stream is decoding (after the
  last stream's first event, until the first stream's last event), over that window. Prefill
  (this server evaluates one prompt per step beside the running streams, llama-server all
  prompts in one batch) stays out of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from server.bench import http_path, llama_server, paired
from server.bench.machine import OtherLoad, machine_info, wait_for_memory
from server.bench.plan import CTX_MARGIN, BenchError, Plan
from server.bench.procs import ServerProcess
from server.bench.prompts import WordPrompts, random_tokens
from server.bench.runner import versions
from server.bench.sse import stream_events
from server.engine.base import default_threads
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.settings import default_cache_dir

log = logging.getLogger(__name__)


@dataclass
class Stream:
    """Arrival times of one request's token events, and what the server said it generated."""

    sent: float
    arrivals: list[float] = field(default_factory=list)
    generated: int = 0

    def rate(self) -> float:
        window = self.arrivals[-1] - self.arrivals[0] if len(self.arrivals) > 1 else 0.0
        return (len(self.arrivals) - 1) / window if window > 0 else 0.0


Request = Callable[[int], Stream]  # step index -> the finished stream


def visible(chunk: dict[str, Any]) -> bool:
    """Whether a chat chunk carries generated text (one per visible token)."""
    deltas = [choice.get("delta") or {} for choice in chunk.get("choices") or []]
    return any(d.get("content") or d.get("reasoning") or d.get("tool_calls") for d in deltas)


def aggregate(streams: Sequence[Stream]) -> dict[str, float]:
    """Tokens/s of all streams while every one of them is decoding (see the module doc)."""
    start = max(s.arrivals[0] for s in streams)
    end = min(s.arrivals[-1] for s in streams)
    events = sum(1 for s in streams for t in s.arrivals if start < t <= end)
    first_sent = min(s.sent for s in streams)
    wall = max(s.arrivals[-1] for s in streams) - first_sent
    return {
        "tokens_per_s": events / (end - start) if end > start else 0.0,
        "window_s": end - start,
        "window_events": events,
        "wall_tokens_per_s": sum(s.generated for s in streams) / wall,  # prefill included
        "generated_tokens": sum(s.generated for s in streams),
        "token_events": sum(len(s.arrivals) for s in streams),
    }


def concurrent(request: Request, indices: Sequence[int]) -> list[Stream]:
    """Send the requests at once (a thread each) and wait for all of them."""
    return paired.concurrent(lambda j: request(indices[j]), len(indices))


def measure(request: Request, plan: Plan, streams: int, pid: int) -> dict[str, Any]:
    """Warm-up, then per repetition one stream alone and `streams` streams at once."""
    index = iter(range(10**6))
    request(next(index))
    single: list[dict[str, float]] = []
    together: list[dict[str, float]] = []
    for _ in range(plan.repetitions):
        load = OtherLoad((pid,))
        alone = request(next(index))
        single.append({"tokens_per_s": alone.rate(), "generated_tokens": alone.generated,
                       "other_cpus": load.cores()})  # fmt: skip
        load = OtherLoad((pid,))
        batch = concurrent(request, [next(index) for _ in range(streams)])
        together.append(aggregate(batch) | {"other_cpus": load.cores()})
    single_median = statistics.median(m["tokens_per_s"] for m in single)
    together_median = statistics.median(m["tokens_per_s"] for m in together)
    return {
        "single": single,
        "concurrent": together,
        "single_tokens_per_s": round(single_median, 3),
        "aggregate_tokens_per_s": round(together_median, 3),
        "speedup": round(together_median / single_median, 3) if single_median else None,
    }


def ours(plan: Plan, workdir: Path, streams: int) -> dict[str, Any]:
    port = http_path.free_port()
    command = http_path.server_command(plan, port)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/v1/chat/completions"
    server = ServerProcess(command, workdir / "http-server.log", f"{base}/health",
                           plan.startup_timeout_s)  # fmt: skip
    encoding = load_encoding(default_cache_dir() / "vocab",
                             partial(vocabulary_bytes, plan.model_path))  # fmt: skip
    prompts = WordPrompts(encoding)
    with server, httpx.Client() as client:
        tail = http_path.tail_tokens(client, url, prompts, plan.seed)

        def request(index: int) -> Stream:
            text = prompts.text(plan.seed, index, plan.prompt_sizes[0] - tail)
            body = {
                "model": "bench",
                "messages": [{"role": "user", "content": text}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": plan.gen_tokens,
                "temperature": 1.0,
                "top_p": 1.0,
                "seed": plan.seed + index,
            }
            stream = Stream(sent=time.perf_counter())
            with httpx.Client() as own:
                for arrived, event in stream_events(own, url, body):
                    if visible(event):
                        stream.arrivals.append(arrived)
                    if event.get("usage"):
                        stream.generated = int(event["usage"]["completion_tokens"])
            return stream

        result = measure(request, plan, streams, server.pid)
    return result | {"command": command, "load_s": round(server.load_s, 2)}


def theirs(plan: Plan, workdir: Path, streams: int) -> dict[str, Any]:
    port = http_path.free_port()
    command = llama_server.server_command(plan, port)
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/completion"
    server = ServerProcess(command, workdir / "llama-server.log", f"{base}/health",
                           plan.startup_timeout_s)  # fmt: skip
    with server:

        def request(index: int) -> Stream:
            prompt = random_tokens(plan.seed, index, plan.prompt_sizes[0])
            stream = Stream(sent=time.perf_counter())
            with httpx.Client() as own:
                trace = llama_server.complete(own, url, prompt, plan.gen_tokens, plan.seed + index)
            stream.arrivals = trace.arrivals
            stream.generated = int(trace.final["timings"]["predicted_n"])
            return stream

        result = measure(request, plan, streams, server.pid)
    return result | {"command": command, "load_s": round(server.load_s, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    n_threads = args.n_threads or default_threads()
    plan = Plan(
        model_path=args.model,
        prompt_sizes=(args.prompt_tokens,),
        gen_tokens=args.gen_tokens,
        repetitions=args.repetitions,
        warmup=1,
        rounds=1,
        n_threads=n_threads,
        n_gpu_layers=args.n_gpu_layers,
        n_ctx=args.streams * (args.prompt_tokens + args.gen_tokens + CTX_MARGIN),
        n_slots=args.streams,
        use_mmap=False,
        flash_attn="auto",
        seed=args.seed,
    )
    workdir = args.out.parent / f"{args.out.stem}-logs"
    workdir.mkdir(parents=True, exist_ok=True)
    machine = machine_info(n_threads)
    machine["started_at"] = datetime.datetime.now(datetime.UTC).isoformat()
    paths: dict[str, Any] = {}
    for name, runner in (("http", ours), ("llama-server", theirs)):
        if name not in args.paths:
            continue
        wait_for_memory(plan.model_path, plan.memory_wait_s)
        log.info("%s: %d streams vs 1", name, args.streams)
        paths[name] = runner(plan, workdir, args.streams)
    return {
        "model": {"path": str(plan.model_path), "size_bytes": plan.model_path.stat().st_size},
        "machine": machine,
        "settings": plan.to_json() | {"streams": args.streams},
        "versions": versions(),
        "paths": paths,
        "ratios": ratios(paths),
    }


def ratios(paths: dict[str, Any]) -> dict[str, float]:
    """The measured ratios: N streams over one stream on each server, and ours over llama-server's.

    `speedup_*`: the N-stream aggregate over one stream; `*_http_vs_llama_server`: this server's
    tokens/s over llama-server's, with N streams (`aggregate`) and with one (`single`).
    """
    found: dict[str, float] = {}
    mine = paths.get("http", {})
    ref = paths.get("llama-server", {})
    if mine.get("speedup") is not None:
        found["speedup_http"] = mine["speedup"]
    if ref.get("speedup") is not None:
        found["speedup_llama_server"] = ref["speedup"]
    if mine and ref and ref["aggregate_tokens_per_s"]:
        found["aggregate_http_vs_llama_server"] = round(
            mine["aggregate_tokens_per_s"] / ref["aggregate_tokens_per_s"], 4
        )
    if mine and ref and ref["single_tokens_per_s"]:
        found["single_http_vs_llama_server"] = round(
            mine["single_tokens_per_s"] / ref["single_tokens_per_s"], 4
        )
    return found


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.concurrency",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--model", type=Path, required=True, help="a .gguf file")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--n-threads", type=int, default=None)
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--paths", nargs="+", default=["http", "llama-server"],
                        choices=["http", "llama-server"])  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("bench-results/concurrency.json"))
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        report = run(args)
    except BenchError as exc:
        log.error("%s", exc)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
