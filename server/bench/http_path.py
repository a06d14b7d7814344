"""Path (a): this server as a child process, measured with streaming chat requests.

The prompt is a user message of random single-token words; the chat headers around it are
measured first (two short calibration requests), so the tokens the server evaluates per request
(`timings.prompt_n`: what follows the cached system/user headers) equal the prompt size. Every
request's first word differs from the previous one's, which forces a fresh prefill.

Per request: prefill tokens/s and time from the server's own timings; time to first token on the
client's clock (to the first content or reasoning delta, which comes after the hidden harmony
header tokens), the server's `ttft_ms`, and how long beyond the prefill's own time the first
visible token came (`ttft_overhead_ms`); decode tokens/s on the client's clock, from the first
token's arrival (the role chunk, sent once the engine began evaluating the prompt, plus the
server's time to first token; never later than the first visible token) to the arrival of the
finishing chunk.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from server.bench.machine import OtherLoad
from server.bench.plan import BenchError, Measurement, PathRun, Plan, Step, pp_label, tg_label
from server.bench.procs import measure_server, serve_command
from server.bench.prompts import WordPrompts
from server.bench.sse import stream_events
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.settings import default_cache_dir

log = logging.getLogger(__name__)

CALIBRATION_WORDS = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_command(plan: Plan, port: int) -> list[str]:
    return serve_command(
        plan.model_path, port,
        "--n-ctx", str(plan.n_ctx),
        "--n-slots", str(plan.n_slots),
        "--n-threads", str(plan.n_threads),
        "--n-threads-batch", str(plan.n_threads),
        "--n-gpu-layers", str(plan.n_gpu_layers),
        "--flash-attn", plan.flash_attn,
        "--use-mmap" if plan.use_mmap else "--no-use-mmap",
        "--no-prompt-cache",  # llama-server keeps no disk cache: compare like with like
        "--log-level", "warning",
    )  # fmt: skip


@dataclass
class ChatTrace:
    """Arrival times (perf_counter) and the usage chunk of one streaming chat request."""

    sent: float
    first_chunk: float = 0.0
    first_visible: float | None = None
    finished: float = 0.0
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    other_cpus: float = 0.0  # CPUs busy with other processes during the request

    def observe(self, arrived: float, event: dict[str, Any]) -> None:
        self.first_chunk = self.first_chunk or arrived
        if event.get("usage"):
            self.usage = event["usage"]
            self.timings = event.get("timings") or {}
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            visible = delta.get("content") or delta.get("reasoning") or delta.get("tool_calls")
            if visible and self.first_visible is None:
                self.first_visible = arrived
            if choice.get("finish_reason"):
                self.finished = arrived
                self.finish_reason = choice["finish_reason"]

    def prefill(self) -> Measurement:
        t = self.timings
        first_chunk_ms = (self.first_chunk - self.sent) * 1000
        measurement = {
            "tokens_per_s": t["prompt_per_second"],
            "prompt_tokens": t["prompt_n"],
            "prompt_tokens_total": self.usage["prompt_tokens"],
            "cached_tokens": t["cache_n"],
            "prefill_ms": t["prompt_ms"],
            "server_ttft_ms": t["ttft_ms"],
            "first_chunk_ms": first_chunk_ms,
            "ttft_overhead_ms": first_chunk_ms + t["ttft_ms"] - t["prompt_ms"],
            "other_cpus": self.other_cpus,
        }
        if self.first_visible is not None:
            measurement["ttft_ms"] = (self.first_visible - self.sent) * 1000
            # beyond the prefill: everything from the client's send to its first visible token
            # but the prompt's evaluation (the role chunk now leaves once the engine has begun)
            measurement["ttft_overhead_ms"] = measurement["ttft_ms"] - t["prompt_ms"]
        return measurement

    def decode(self) -> Measurement:
        n = int(self.usage["completion_tokens"])
        # the first token's arrival: the first chunk (the role, sent once the engine began)
        # plus the server's time to it; but the first chunk itself may leave late, and the
        # estimate then lands after tokens already arrived: never later than visible text
        first_token = self.first_chunk + self.timings["ttft_ms"] / 1000
        if self.first_visible is not None:
            first_token = min(first_token, self.first_visible)
        window = self.finished - first_token
        return {
            "tokens_per_s": (n - 1) / window if n > 1 and window > 0 else 0.0,
            "server_tokens_per_s": self.timings["predicted_per_second"],
            "generated_tokens": n,
            "other_cpus": self.other_cpus,
        }


def chat(
    client: httpx.Client,
    url: str,
    text: str,
    max_tokens: int,
    seed: int,
    *,
    sampling: tuple[float, float] = (1.0, 1.0),
) -> ChatTrace:
    """One streaming request; `sampling`: (temperature, top_p)."""
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": sampling[0],
        "top_p": sampling[1],
        "seed": seed,
    }
    trace = ChatTrace(sent=time.perf_counter())
    for arrived, event in stream_events(client, url, body):
        trace.observe(arrived, event)
    if not trace.usage or not trace.timings:
        raise BenchError("the stream ended without a usage chunk with timings")
    return trace


def tail_tokens(client: httpx.Client, url: str, prompts: WordPrompts, seed: int) -> int:
    """Evaluated tokens of a request beyond its user words (the headers after the cache hit).

    Two short requests whose first words differ: the second reuses the cached system and user
    headers, and evaluates its words plus the closing tokens (`<|end|><|start|>assistant`).
    """
    for index in (-2, -1):
        text = prompts.text(seed, index, CALIBRATION_WORDS)
        trace = chat(client, url, text, max_tokens=1, seed=seed)
    tail = int(trace.timings["prompt_n"]) - CALIBRATION_WORDS
    log.info(
        "chat prompt: %d header tokens cached, %d evaluated after the words",
        int(trace.timings["cache_n"]),
        tail,
    )
    if tail < 0:
        raise BenchError(f"calibration found {tail} tail tokens: the server cached user text")
    return tail


def run_steps(client: httpx.Client, url: str, plan: Plan, run: PathRun, pid: int) -> None:
    """Calibrate, then run the plan's steps; `pid`: the server's (its CPU time is ours)."""
    prompts = WordPrompts(
        load_encoding(default_cache_dir() / "vocab", partial(vocabulary_bytes, plan.model_path))
    )
    tail = tail_tokens(client, url, prompts, plan.seed)
    for step in plan.steps():
        if step.n_prompt <= tail:
            raise BenchError(f"a prompt of {step.n_prompt} tokens is too short for a chat")
        text = prompts.text(plan.seed, step.index, step.n_prompt - tail)
        load = OtherLoad((pid,))
        sampling = (plan.temperature, plan.top_p)
        trace = chat(client, url, text, step.n_gen, plan.seed + step.index, sampling=sampling)
        trace.other_cpus = load.cores()
        record(run, step, trace)


def record(run: PathRun, step: Step, trace: ChatTrace) -> None:
    prefill = trace.prefill()
    if prefill["prompt_tokens"] != step.n_prompt:
        run.notes.append(
            f"step {step.index}: evaluated {prefill['prompt_tokens']:.0f} tokens, "
            f"asked for {step.n_prompt}"
        )
    if not step.measured:
        return
    run.add(pp_label(step.n_prompt), prefill)
    if step.decode_test:
        decode = trace.decode()
        if decode["generated_tokens"] < step.n_gen:
            run.notes.append(
                f"step {step.index}: generation ended after "
                f"{decode['generated_tokens']:.0f} of {step.n_gen} tokens "
                f"({trace.finish_reason})"
            )
        run.add(tg_label(step.n_gen), decode)


def run_http(plan: Plan, workdir: Path) -> PathRun:
    """Start `gpt-oss-server serve` on the plan's settings, measure, stop it."""
    run = PathRun("http")
    port = free_port()

    def measure(client: httpx.Client, base: str, pid: int) -> None:
        run_steps(client, f"{base}/v1/chat/completions", plan, run, pid)

    log_path = workdir / "http-server.log"
    measure_server(
        run, server_command(plan, port), port, log_path, plan.startup_timeout_s, measure=measure
    )
    return run
