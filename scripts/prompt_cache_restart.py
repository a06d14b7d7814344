"""`python -m scripts.prompt_cache_restart --model PATH`: the prompt cache on disk across a restart.

Real `gpt-oss-server serve` processes on one temporary cache directory, Codex-shaped first
requests (scripts.agent_loop.conversation; `--brief` for the ≈1.4k-token start), one request at
a time, each with `max_output_tokens` 1 so its time is its time to first token:

1. server 1: conversation A (cold), then B (a new conversation: warm in memory); SIGTERM.
2. server 2 on the same directory: C (a new conversation: warm from disk), then D (in memory).
3. `--budget-conversations N`: server 3 with a small `--prompt-cache-gb`, N conversations whose
   instructions differ (each saves new entries); the directory's size after each one.
4. `--save-cost`: the inter-token gaps of a streaming answer while another request's prefill
   reaches its save points, with the prompt cache on and off, in turns (`--save-cost-rounds`).

Each server first answers one short unrelated request (first-use costs are not measured).

Time to first token is the server's own (submission to first sampled token, from /metrics);
"new tokens" of C is what B evaluated (the same shape, warm in memory: the token-level common
prefix is shared there). Prints JSON and writes it to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from scripts.agent_loop.conversation import first_request
from server.bench.http_path import free_port
from server.bench.procs import ServerProcess, serve_command
from server.engine.base import default_threads

log = logging.getLogger("prompt_cache_restart")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.prompt_cache_restart")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--brief", action="store_true", help="the ≈1.4k-token Codex start")
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--budget-conversations", type=int, default=0)
    parser.add_argument("--budget-gb", type=float, default=0.01)
    parser.add_argument("--save-cost", action="store_true")
    parser.add_argument("--save-cost-rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("prompt-cache-restart.json"))
    return parser.parse_args(argv)


@contextmanager
def server(args: argparse.Namespace, work: Path, kv: Path, *extra: str) -> Iterator[httpx.Client]:
    port = free_port()
    command = serve_command(
        args.model,
        port,
        *("--n-ctx", str(args.n_ctx), "--n-threads", str(args.threads)),
        *("--cache-dir", str(work / "cache"), "--prompt-cache-dir", str(kv)),
        *("--responses-store-path", str(work / "responses.sqlite3"), *extra),
    )
    health = f"http://127.0.0.1:{port}/health"
    with (
        ServerProcess(command, work / "server.log", health, timeout_s=1800) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=None) as client,
    ):
        warm_up(client)
        yield client
    assert proc.ended is not None
    log.info("server exited with %d", proc.ended.returncode)


def warm_up(client: httpx.Client) -> None:
    """One short unrelated request, so no measured one pays a fresh server's first-use costs."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1}
    client.post("/v1/chat/completions", json=chat).raise_for_status()


def metrics(client: httpx.Client) -> dict[str, float]:
    values = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("gpt_oss_") and " " in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


TTFT = "gpt_oss_time_to_first_token_seconds_sum"


def request(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    before = metrics(client)[TTFT]
    started = time.perf_counter()
    response = client.post("/v1/responses", json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    usage = response.json()["usage"]
    prompt, cached = usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "evaluated_tokens": prompt - cached,
        "ttft_s": round(metrics(client)[TTFT] - before, 4),
        "client_s": round(elapsed, 4),
    }


def body(name: str, brief: bool, instructions_tag: str = "") -> dict[str, Any]:
    request = first_request(name, brief=brief)
    request.update(stream=False, store=False, max_output_tokens=1)
    if instructions_tag:
        part = request["input"][0]["content"][0]
        part["text"] = f"{instructions_tag}\n{part['text']}"
    return request


def disk(kv: Path) -> dict[str, int]:
    files = list(kv.glob("*.kv"))
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


def restart(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    kv = work / "kv"
    with server(args, work, kv) as client:
        cold = request(client, body("A", args.brief))
        memory = request(client, body("B", args.brief))
        first = disk_counters(client)
    after_first = disk(kv)
    with server(args, work, kv) as client:
        from_disk = request(client, body("C", args.brief))
        memory_2 = request(client, body("D", args.brief))
        second = disk_counters(client)
    new = memory["evaluated_tokens"]
    return {
        "cold": cold,
        "warm_in_memory": memory,
        "warm_from_disk": from_disk,
        "warm_in_memory_after_restart": memory_2,
        "new_tokens": new,
        "evaluated_over_new": round(from_disk["evaluated_tokens"] / new, 4),
        "ttft_cold_over_disk": round(cold["ttft_s"] / from_disk["ttft_s"], 2),
        "disk_after_server_1": after_first,
        "counters_server_1": first,
        "counters_server_2": second,
    }


def disk_counters(client: httpx.Client) -> dict[str, float]:
    prefix = "gpt_oss_prompt_cache_disk_"
    return {k.removeprefix(prefix): v for k, v in metrics(client).items() if k.startswith(prefix)}


def budget(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    kv = work / "kv-budget"
    limit = int(args.budget_gb * 1024**3)
    sizes = []
    with server(args, work, kv, "--prompt-cache-gb", str(args.budget_gb)) as client:
        for i in range(args.budget_conversations):
            request(client, body(f"N{i}", args.brief, instructions_tag=f"Session {i}."))
            time.sleep(0.2)  # the writer finishes (the directory is what is measured)
            sizes.append(disk(kv)["bytes"])
        counters = disk_counters(client)
    return {
        "budget_bytes": limit,
        "conversations": args.budget_conversations,
        "max_bytes": max(sizes, default=0),
        "final": disk(kv),
        "within_budget": all(size <= limit for size in sizes),
        "counters": counters,
    }


def gaps_during_prefill(client: httpx.Client, brief: bool, tag: str) -> dict[str, Any]:
    """A streaming answer's inter-token gaps while a Codex-shaped prompt is prefilled."""
    stamps: list[float] = []
    chat = {
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "stream": True,
        "max_tokens": 400,
        "model": "m",
    }

    def stream() -> None:
        with client.stream("POST", "/v1/chat/completions", json=chat) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.perf_counter())

    thread = threading.Thread(target=stream)
    thread.start()
    while len(stamps) < 5:
        time.sleep(0.01)
    started = time.perf_counter()
    result = request(client, body("S", brief, instructions_tag=tag))
    ended = time.perf_counter()
    thread.join()
    during = [b - a for a, b in itertools.pairwise(stamps) if started <= a <= ended]
    return {
        "prefill_request": result,
        "gaps_during": len(during),
        "gap_median_ms": round(1000 * statistics.median(during), 2) if during else None,
        "gap_max_ms": round(1000 * max(during), 2) if during else None,
        "counters": disk_counters(client),
    }


def save_cost(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Cache on and off in turns (a busy machine's phases fall on both)."""
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for i in range(args.save_cost_rounds):
        for mode, extra in (("on", ()), ("off", ("--no-prompt-cache",))):
            with server(args, work, work / f"kv-cost-{mode}", *extra) as client:
                tag = f"Cost {mode} {i}."
                results[mode].append(gaps_during_prefill(client, args.brief, tag=tag))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    report: dict[str, Any] = {
        "model": str(args.model),
        "brief": args.brief,
        "threads": args.threads,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        report["restart"] = restart(args, work)
        if args.budget_conversations:
            report["budget"] = budget(args, work)
        if args.save_cost:
            report["save_cost"] = save_cost(args, work)
    text = json.dumps(report, indent=2)
    print(text)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
