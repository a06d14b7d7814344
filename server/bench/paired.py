"""Paired runs: decode at depth beside llama-bench, aggregate decode of N streams beside
llama-server; every server up at once, the paths alternating request by request.

Depth: `gpt-oss-server serve` (one slot, the context the deepest prompt needs) gets a chat prompt
of about D tokens once (its only prefill); every measured request sends the same prompt again,
so the server's exact-token prefix reuse evaluates one token and the request measures decode
at depth D. Its pair is one `llama-bench -d D -n G -r 1` run, which fills D tokens untimed
(llama-bench keeps that state and restores it per repetition) and times the decode.

Streams: for each N, this server with `--n-slots N` and llama-server with `-np N`, the context
N times (prompt + decode + margin) on both, both up; a pair is N concurrent requests (each a
prompt of its own, the first prompt size) to one, then N to the other. Aggregate decode counts
the tokens while every stream decodes: each stream's tokens spread evenly over its own first
to last token, summed over the window from the last stream's first token to the first stream's
last token (prefill, which this server runs beside the decode and llama-server before it,
stays out).

The order within a pair flips from one pair to the next. Each pair's ratio (this server over
the reference) counts; the report has their median with a bootstrap 95 % interval.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import httpx

from server.bench import http_path, llama_bench, llama_server
from server.bench.machine import OtherLoad, wait_for_memory
from server.bench.options import PathName
from server.bench.plan import CTX_MARGIN, BenchError, Measurement, Plan
from server.bench.procs import ServerProcess, run_to_end
from server.bench.prompts import WordPrompts, random_tokens
from server.bench.report import summarize
from server.bench.stats import paired_ratio
from server.engine.loading.gguf_header import vocabulary_bytes
from server.harmony.encoding import load_encoding
from server.ops.settings import default_cache_dir

log = logging.getLogger(__name__)

# prompt indices, apart from the steps': a token-id prompt starts with token 100 + index, which
# must stay an ordinary token (prompts.py)
DEPTH_INDEX = 40_000
STREAM_INDEX = 50_000  # + 100 a pair (at most 64 streams) + the stream
HEADER_WORDS = 16  # words of the request that counts the chat's tokens around the words

T = TypeVar("T")
Sample = Callable[[int], Measurement]  # pair index -> one measurement


def depth_context(plan: Plan) -> int:
    return max(plan.depths) + plan.gen_tokens + CTX_MARGIN


def streams_context(plan: Plan, n: int) -> int:
    return n * (plan.prompt_sizes[0] + plan.gen_tokens + CTX_MARGIN)


def word_prompts(plan: Plan) -> WordPrompts:
    return WordPrompts(
        load_encoding(default_cache_dir() / "vocab", partial(vocabulary_bytes, plan.model_path))
    )


class Servers:
    """The servers of one paired run, all up until the `ExitStack` closes."""

    def __init__(self, stack: ExitStack, plan: Plan, workdir: Path, tag: str) -> None:
        self.stack, self.plan, self.workdir, self.tag = stack, plan, workdir, tag
        self.commands: list[list[str]] = []
        self.load_s: dict[str, float] = {}

    def start(self, name: str, command: list[str], port: int) -> tuple[str, int]:
        """Start a server; (base URL, pid)."""
        wait_for_memory(self.plan.model_path, self.plan.memory_wait_s)
        base = f"http://127.0.0.1:{port}"
        log_path = self.workdir / f"pairs-{self.tag}-{name}.log"
        server = ServerProcess(command, log_path, f"{base}/health", self.plan.startup_timeout_s)
        self.stack.enter_context(server)
        self.commands.append(command)
        self.load_s[name] = round(server.load_s, 2)
        return base, server.pid

    def http(self) -> tuple[str, int]:
        port = http_path.free_port()
        base, pid = self.start("http", http_path.server_command(self.plan, port), port)
        return f"{base}/v1/chat/completions", pid

    def llama_server(self) -> tuple[str, int]:
        port = http_path.free_port()
        base, pid = self.start("llama-server", llama_server.server_command(self.plan, port), port)
        return f"{base}/completion", pid


def alternate(
    pairs: int, mine: Sample, theirs: Sample | None
) -> tuple[list[Measurement], list[Measurement]]:
    """`pairs` measurements of each, one of each per pair, the order flipped every pair."""
    ours: list[Measurement] = []
    refs: list[Measurement] = []
    for i in range(pairs):
        if theirs is not None and i % 2 == 1:
            refs.append(theirs(i))
        ours.append(mine(i))
        if theirs is not None and i % 2 == 0:
            refs.append(theirs(i))
    return ours, refs


def row(
    key: str, value: int, ours: list[Measurement], refs: list[Measurement], ref: str
) -> dict[str, Any]:
    """One depth or stream count: summaries, the samples and the paired ratio."""
    mine = [m["tokens_per_s"] for m in ours]
    theirs = [m["tokens_per_s"] for m in refs]
    return {
        key: value,
        "http": summarize(ours) if ours else None,
        ref: summarize(refs) if refs else None,
        "ratio": paired_ratio(mine, theirs) if refs else None,
        "samples": {"http": ours, ref: refs},
    }


def reference_available(name: str, paths: Sequence[PathName]) -> str | None:
    """None when the reference path runs here, else why not."""
    if name not in paths:
        return f"{name} is not among the paths"
    try:
        llama_bench.llama_binary(name)
    except BenchError as exc:
        return str(exc)
    return None


# --- depth -------------------------------------------------------------------------------


def llama_bench_decode(plan: Plan, depth: int, log_path: Path, commands: list[list[str]]) -> Sample:
    command = llama_bench.depth_command(plan, depth)
    if command not in commands:
        commands.append(command)

    def sample(_: int) -> Measurement:
        result = run_to_end(command, log_path)
        if result.ended.returncode != 0:
            raise BenchError(f"llama-bench exited with {result.ended.returncode}")
        (test,) = [t for t in json.loads(result.stdout) if int(t["n_gen"]) > 0]
        return {
            "tokens_per_s": float(test["samples_ts"][0]),
            "generated_tokens": int(test["n_gen"]),
            "depth": int(test.get("n_depth", depth)),
            "other_cpus": result.other_cpus,
        }

    return sample


def http_decode(client: httpx.Client, url: str, text: str, plan: Plan, pid: int) -> Sample:
    def sample(i: int) -> Measurement:
        load = OtherLoad((pid,))
        sampling = (plan.temperature, plan.top_p)
        trace = http_path.chat(client, url, text, plan.gen_tokens, plan.seed + i, sampling=sampling)
        prefill = trace.prefill()
        return trace.decode() | {
            "evaluated_tokens": prefill["prompt_tokens"],
            "cached_tokens": prefill["cached_tokens"],
            "other_cpus": load.cores(),
        }

    return sample


def run_depths(plan: Plan, paths: Sequence[PathName], workdir: Path) -> dict[str, Any]:
    """Decode after each depth through HTTP, paired with llama-bench -d."""
    missing = reference_available("llama-bench", paths)
    section: dict[str, Any] = {
        "reference": "llama-bench",
        "depths": list(plan.depths),
        "gen_tokens": plan.gen_tokens,
        "pairs": plan.pairs,
        "rows": [],
        "notes": [] if missing is None else [f"no ratios: {missing}"],
        "commands": [],
        "error": None,
    }
    dplan = dataclasses.replace(plan, n_ctx=depth_context(plan), n_slots=1)
    with ExitStack() as stack, httpx.Client() as client:
        servers = Servers(stack, dplan, workdir, "depth")
        url, pid = servers.http()
        prompts = word_prompts(plan)
        tail = http_path.tail_tokens(client, url, prompts, plan.seed)
        text = prompts.text(plan.seed, DEPTH_INDEX - 1, HEADER_WORDS)
        around = int(http_path.chat(client, url, text, 1, plan.seed).usage["prompt_tokens"])
        around -= HEADER_WORDS  # the chat's tokens around the words (headers, tail)
        log.info("depth: %d chat tokens around the words (%d after them)", around, tail)
        commands = section["commands"]
        for k, depth in enumerate(plan.depths):
            text = prompts.text(plan.seed, DEPTH_INDEX + k, max(1, depth - around))
            fill = http_path.chat(client, url, text, 1, plan.seed)  # the depth's only prefill
            log.info("depth %d: %d prompt tokens filled in %.0f ms", depth,
                     fill.usage["prompt_tokens"], fill.timings["prompt_ms"])  # fmt: skip
            mine = http_decode(client, url, text, plan, pid)
            theirs = None
            if missing is None:
                log_path = workdir / "pairs-depth-llama-bench.log"
                theirs = llama_bench_decode(plan, depth, log_path, commands)
            ours, refs = alternate(plan.pairs, mine, theirs)
            entry = row("depth", depth, ours, refs, "llama-bench")
            entry["http_prompt_tokens"] = int(fill.usage["prompt_tokens"])
            entry["http_fill_ms"] = round(float(fill.timings["prompt_ms"]), 1)
            section["rows"].append(entry)
            log.info("depth %d: %s", depth, ratio_text(entry["ratio"]))
        section["commands"] = [shlex.join(c) for c in (*servers.commands, *commands)]
        section["load_s"] = servers.load_s
    return section


# --- streams -----------------------------------------------------------------------------


def concurrent(work: Callable[[int], T], n: int) -> list[T]:
    """work(0..n-1) at once, a thread each; the first failure is raised here."""
    results: dict[int, T] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def worker(j: int) -> None:
        barrier.wait()
        try:
            results[j] = work(j)
        except BaseException as exc:  # raised below, on the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(j,)) for j in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [results[j] for j in range(n)]


def aggregate(spans: Sequence[tuple[float, float, int]], sent: float) -> Measurement:
    """Tokens/s of all streams while every one decodes; `spans`: (first token, last token,
    tokens) of each stream; `sent`: when the requests left (for the rate with prefill)."""
    start = max(first for first, _, _ in spans)
    end = min(last for _, last, _ in spans)
    tokens = 0.0
    for first, last, n in spans:
        if last > first:
            overlap = max(0.0, min(last, end) - max(first, start))
            tokens += (n - 1) * overlap / (last - first)
    generated = sum(n for _, _, n in spans)
    span = max(last for _, last, _ in spans) - min(first for first, _, _ in spans)
    return {
        "tokens_per_s": tokens / (end - start) if end > start else 0.0,
        "window_s": max(0.0, end - start),
        "span_tokens_per_s": sum(n - 1 for _, _, n in spans) / span if span > 0 else 0.0,
        "wall_tokens_per_s": generated / (max(last for _, last, _ in spans) - sent),
        "generated_tokens": generated,
    }


STREAM_TRIES = 3  # takes of a streams sample whose streams never all decoded at once


def overlapping(sample: Sample) -> Sample:
    """The streams sample, taken again while its streams never all decoded at once: one ended
    before another's first token (a request sent late on a busy machine, or a reply shorter
    than the others' prefill), so it measured no aggregate. STREAM_TRIES takes at most; `tries`
    says how many it took (a last empty take stays 0, and its pair counts no ratio)."""

    def again(i: int) -> Measurement:
        measured, tries = sample(i), 1
        while measured["window_s"] <= 0 and tries < STREAM_TRIES:
            measured, tries = sample(i), tries + 1
        return measured | {"tries": tries}

    return again


def http_streams(
    url: str, prompts: WordPrompts, tail: int, plan: Plan, *, n: int, pid: int
) -> Sample:
    def sample(i: int) -> Measurement:
        def one(j: int) -> tuple[float, float, int]:
            index = STREAM_INDEX + 100 * i + j
            text = prompts.text(plan.seed, index, plan.prompt_sizes[0] - tail)
            sampling = (plan.temperature, plan.top_p)
            with httpx.Client() as client:
                trace = http_path.chat(client, url, text, plan.gen_tokens, plan.seed + index,
                                       sampling=sampling)  # fmt: skip
            first = trace.first_chunk + trace.timings["ttft_ms"] / 1000
            if trace.first_visible is not None:
                first = min(first, trace.first_visible)
            return first, trace.finished, int(trace.usage["completion_tokens"])

        load, sent = OtherLoad((pid,)), time.perf_counter()
        return aggregate(concurrent(one, n), sent) | {"other_cpus": load.cores()}

    return sample


def llama_server_streams(url: str, plan: Plan, n: int, pid: int) -> Sample:
    def sample(i: int) -> Measurement:
        def one(j: int) -> tuple[float, float, int]:
            index = STREAM_INDEX + 100 * i + j
            prompt = random_tokens(plan.seed, index, plan.prompt_sizes[0])
            sampling = (plan.temperature, plan.top_p)
            with httpx.Client() as client:
                trace = llama_server.complete(client, url, prompt, plan.gen_tokens,
                                              plan.seed + index, sampling=sampling)  # fmt: skip
            return trace.first_token, trace.last, int(trace.final["timings"]["predicted_n"])

        load, sent = OtherLoad((pid,)), time.perf_counter()
        return aggregate(concurrent(one, n), sent) | {"other_cpus": load.cores()}

    return sample


def run_streams(plan: Plan, paths: Sequence[PathName], workdir: Path) -> dict[str, Any]:
    """Aggregate decode of N streams through HTTP, paired with llama-server -np N."""
    missing = reference_available("llama-server", paths)
    section: dict[str, Any] = {
        "reference": "llama-server",
        "streams": list(plan.streams),
        "prompt_tokens": plan.prompt_sizes[0],
        "gen_tokens": plan.gen_tokens,
        "pairs": plan.pairs,
        "rows": [],
        "notes": [] if missing is None else [f"no ratios: {missing}"],
        "commands": [],
        "load_s": {},
        "error": None,
    }
    prompts = word_prompts(plan)
    for n in plan.streams:
        splan = dataclasses.replace(plan, n_ctx=streams_context(plan, n), n_slots=n)
        with ExitStack() as stack, httpx.Client() as client:
            servers = Servers(stack, splan, workdir, f"streams{n}")
            url, pid = servers.http()
            tail = http_path.tail_tokens(client, url, prompts, plan.seed)
            mine = overlapping(http_streams(url, prompts, tail, plan, n=n, pid=pid))
            theirs = None
            if missing is None:
                ref_url, ref_pid = servers.llama_server()
                theirs = overlapping(llama_server_streams(ref_url, plan, n, ref_pid))
            for w in range(plan.warmup):  # unmeasured, both servers
                mine(-1 - w)
                if theirs is not None:
                    theirs(-1 - w)
            ours, refs = alternate(plan.pairs, mine, theirs)
            section["rows"].append(row("streams", n, ours, refs, "llama-server"))
            section["commands"] += [shlex.join(c) for c in servers.commands]
            section["load_s"][str(n)] = servers.load_s
            log.info("%d streams: %s", n, ratio_text(section["rows"][-1]["ratio"]))
    return section


def ratio_text(ratio: dict[str, Any] | None) -> str:
    if ratio is None:
        return "no ratio"
    low, high = ratio["interval_95"]
    return f"{ratio['median']:.3f} × (95 % interval {low:.3f}–{high:.3f}, {ratio['pairs']} pairs)"


def run_pairs(plan: Plan, paths: Sequence[PathName], workdir: Path) -> dict[str, Any]:
    """The depth and streams sections (each None when not asked for or when http is not among
    the paths; a section that failed holds its error)."""
    found: dict[str, Any] = {"depth": None, "streams": None}
    if "http" not in paths:
        return found
    for key, wanted, runner in (("depth", plan.depths, run_depths),
                                ("streams", plan.streams, run_streams)):  # fmt: skip
        if not wanted:
            continue
        log.info("paired %s: %s", key, ", ".join(str(v) for v in wanted))
        try:
            found[key] = runner(plan, paths, workdir)
        except (BenchError, OSError, ValueError, KeyError, httpx.HTTPError) as exc:
            log.error("paired %s failed: %s", key, exc)
            found[key] = {"error": f"{type(exc).__name__}: {exc}", "rows": []}
    return found
