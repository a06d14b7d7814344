"""llama-server on the same file: the same token prompts through /completion, cache on or off."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from server.bench.http_path import free_port
from server.bench.llama_bench import llama_binary
from server.bench.procs import ServerProcess


@dataclass
class Replay:
    prompt_tokens: int
    evaluated_tokens: int
    cached_tokens: int
    prefill_ms: float
    ttft_ms: float


@dataclass(frozen=True)
class LlamaServer:
    """How to start llama-server: same file, context and threads as this server."""

    model: Path
    n_ctx: int
    threads: int
    slots: int
    workdir: Path

    def command(self, port: int) -> list[str]:
        return [
            str(llama_binary("llama-server")), "-m", str(self.model), "--host", "127.0.0.1",
            "--port", str(port), "-c", str(self.n_ctx), "-t", str(self.threads),
            "-tb", str(self.threads), "-np", str(self.slots), "--no-webui",
        ]  # fmt: skip


def replay(
    server_setup: LlamaServer,
    prompts: list[list[int]],
    outputs: list[list[int]],
    *,
    cache_prompt: bool,
) -> tuple[list[Replay], list[str]]:
    """Send every prompt (one token generated each) to a fresh llama-server; its accounting.

    With the cache on, each prompt is followed by an unmeasured request for prompt + the
    output this server's model wrote, so llama-server's cache holds what its model would have
    generated (its own model samples other tokens) — the fair starting point for the next round.
    """
    port = free_port()
    command = server_setup.command(port)
    base = f"http://127.0.0.1:{port}"
    log_name = "llama-server-cached.log" if cache_prompt else "llama-server-cold.log"
    server = ServerProcess(command, server_setup.workdir / log_name, f"{base}/health", 600.0)
    results: list[Replay] = []
    with server, httpx.Client(base_url=base, timeout=None) as client:
        for prompt, output in zip(prompts, outputs, strict=True):
            results.append(_complete(client, prompt, cache_prompt))
            if cache_prompt:
                client.post("/completion", json=_body(prompt + output[:-1], cache_prompt=True))
    return results, command


def _body(prompt: list[int], *, cache_prompt: bool) -> dict[str, object]:
    return {"prompt": prompt, "n_predict": 1, "cache_prompt": cache_prompt, "temperature": 0.0}


def _complete(client: httpx.Client, prompt: list[int], cache_prompt: bool) -> Replay:
    sent = time.perf_counter()
    answer = client.post("/completion", json=_body(prompt, cache_prompt=cache_prompt)).json()
    elapsed = (time.perf_counter() - sent) * 1000
    timings = answer["timings"]
    return Replay(
        prompt_tokens=len(prompt),
        evaluated_tokens=int(timings["prompt_n"]),
        cached_tokens=int(timings.get("cache_n", 0)),
        prefill_ms=float(timings["prompt_ms"]),
        ttft_ms=elapsed,
    )
