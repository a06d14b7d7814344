"""`python -m scripts.idle_unload --model PATH`: what --idle-unload costs the request after it.

A real `gpt-oss-server serve --idle-unload` process, with the prompt cache on disk and without
it (`--modes cache,no-cache`): one Codex-shaped first request (scripts.agent_loop.conversation,
`--brief` for the ≈1.4k-token start; `max_output_tokens` 1), then the server is left idle until it
has unloaded the model, then the same request again: it waits for the reload, then evaluates what
the disk cache did not give back. Reports the start-up, unload and reload times (the server's
own, from /v1/server), the process's RSS loaded and unloaded, and for both requests the wall
time, time to first token (the server's, which counts the reload) and cached tokens, with the
machine's load average. Prints JSON and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from scripts.agent_loop.conversation import first_request
from server.bench.http_path import free_port
from server.bench.procs import ServerProcess, serve_command

log = logging.getLogger("idle_unload")
TTFT = "gpt_oss_time_to_first_token_seconds_sum"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.idle_unload")
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--brief", action="store_true", help="the ≈1.4k-token Codex start")
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--idle", default="5s", help="--idle-unload of the server")
    parser.add_argument("--modes", default="cache,no-cache")
    parser.add_argument(
        "--skip-cold-repeat",
        action="store_true",
        help="without the prompt cache, send no request before the unload (it would cost what "
        "the first request with the cache cost: a cold prompt); the server unloads its model "
        "after --idle from its start",
    )
    parser.add_argument("--out", type=Path, default=Path("idle-unload.json"))
    return parser.parse_args(argv)


def ttft_sum(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(TTFT + " "):
            return float(line.split()[-1])
    return 0.0


def request(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    before = ttft_sum(client)
    started = time.perf_counter()
    response = client.post("/v1/responses", json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    usage = response.json()["usage"]
    return {
        "prompt_tokens": usage["input_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "ttft_s": round(ttft_sum(client) - before, 3),
        "client_s": round(elapsed, 3),
    }


def wait_unloaded(client: httpx.Client) -> None:
    while client.get("/health").json()["model_state"] != "unloaded":
        time.sleep(0.2)


def measure(args: argparse.Namespace, work: Path, cache: bool) -> dict[str, Any]:
    port = free_port()
    cache_flags = ("--prompt-cache-dir", str(work / "kv")) if cache else ("--no-prompt-cache",)
    command = serve_command(
        args.model,
        port,
        *("--idle-unload", args.idle, "--n-ctx", str(args.n_ctx)),
        *("--n-threads", str(args.threads), "--cache-dir", str(work / "cache"), *cache_flags),
        *("--responses-store-path", str(work / "responses.sqlite3")),
    )
    health = f"http://127.0.0.1:{port}/health"
    body = first_request("A", brief=args.brief)
    body.update(stream=False, store=False, max_output_tokens=1)
    load_before = os.getloadavg()
    with (
        ServerProcess(command, work / f"server-{port}.log", health, timeout_s=1800) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=None) as client,
    ):
        first = None if args.skip_cold_repeat and not cache else request(client, body)
        rss_loaded = psutil.Process(proc.pid).memory_info().rss
        wait_unloaded(client)
        rss_unloaded = psutil.Process(proc.pid).memory_info().rss
        after = request(client, body)
        facts = client.get("/v1/server").json()
    return {
        "prompt_cache": cache,
        "startup_s": round(proc.load_s, 1),
        "unload_s": round(facts["last_unload_s"], 2),
        "reload_s": round(facts["last_reload_s"], 2),
        "rss_loaded_gib": round(rss_loaded / 1024**3, 2),
        "rss_unloaded_gib": round(rss_unloaded / 1024**3, 2),
        "first_request": first,
        "request_after_reload": after,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse(argv)
    results = {"model": str(args.model), "brief": args.brief, "n_ctx": args.n_ctx,
               "threads": args.threads, "cpus": os.cpu_count(), "runs": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="idle-unload-") as tmp:
        for mode in args.modes.split(","):
            work = Path(tmp) / mode
            work.mkdir()
            run = measure(args, work, cache=mode == "cache")
            log.info("%s", json.dumps(run))
            results["runs"].append(run)  # type: ignore[attr-defined]
    text = json.dumps(results, indent=2)
    args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
