"""Sampler benchmark: milliseconds per token of llama.cpp's sampler chain vs the numpy sampler.

`python -m scripts.bench.sampler [--model PATH | --trained] [--calls 300] [--repetitions 5]
[--decode-tokens 128] [--out FILE]`

Part 1 (`sampler`): on real logits (the model's output after a short prompt; `--trained`: the
trained tiny model's, inside its own turn on a held-out prompt: peaked, as a trained model's
are), each sampler
picks a token `--calls` times per repetition, taking turns in every repetition; the median over
repetitions of the mean ms per call: llama.cpp's chain, the numpy sampler's full draw alone
(`full_draw_ms`), and the numpy sampler as the engine runs it, rejection draws first
(`numpy_ms`, with how its draws went). Cases: temperature 1 over the whole vocabulary,
the same with the harmony specials banned (every content token of a chat), greedy, top-k 40,
top-p 0.9.

Part 2 (`engine`): the whole in-process decode path, tg N after a fresh prompt, with the engine
sampling through llama.cpp's chain (`EngineConfig.sampler = "llama"`) and through the numpy
sampler, alternating request by request on two engines of the same model. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from devkit.models import TRAINED, cached_gguf
from devkit.trained.workloads import trained_cases
from server.bench.report import print_json
from server.contracts.directives import Constrain
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama import LlamaEngine
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.sampling.banned import Banned
from server.engine.sampling.llama_chain import chain_seed
from server.engine.sampling.numpy_sampler import NumpySampler
from server.harmony.tokens import RETURN, SPECIALS

log = logging.getLogger(__name__)

CASES = {
    "temperature 1": (SamplingParams(max_tokens=1, seed=1), None),
    "temperature 1, specials banned": (
        SamplingParams(max_tokens=1, seed=1),
        Constrain(banned=SPECIALS - {RETURN}),
    ),
    "greedy": (SamplingParams(max_tokens=1, temperature=0.0), None),
    "top-k 40": (SamplingParams(max_tokens=1, top_k=40, seed=1), None),
    "top-p 0.9": (SamplingParams(max_tokens=1, top_p=0.9, seed=1), None),
}


def per_call_ms(pick: Callable[[], int], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        pick()
    return (time.perf_counter() - started) * 1000 / calls


def trained_position(ctx: LlamaContext, steps: int = 5) -> tuple[int, int]:
    """For the trained model: a held-out call prompt (its corpus's kind), then the model's own
    greedy turn for `steps` tokens — into the analysis it writes, inside the tool name it copies
    there (`Call up|_azan.`, the next token 4 nats above the runner-up), so the logits are those
    of a trained model at work on content; returns (their batch index, the greedy token)."""
    prompt = trained_cases(1)["trained_call"][0]
    index = ctx.decode([BatchPart(0, prompt, 0, True)])[-1]
    for step in range(steps):
        token = int(np.argmax(ctx.logits(index)))
        index = ctx.decode([BatchPart(0, [token], len(prompt) + step, True)])[-1]
    return index, int(np.argmax(ctx.logits(index)))


def sampler_part(
    model: Path, threads: int, calls: int, repetitions: int, trained: bool = False
) -> dict[str, Any]:
    ctx = LlamaContext(EngineConfig(model_path=str(model), n_ctx=4096, n_threads=threads))
    try:
        if trained:
            index, token = trained_position(ctx)
            log.info("trained model: logits before token %d", token)
        else:
            prompt = [random.Random(0).randrange(1000, 100_000) for _ in range(16)]
            index = ctx.decode([BatchPart(0, prompt, 0, True)])[-1]
        results = {}
        for name, (params, constraint) in CASES.items():
            rng = np.random.default_rng(params.seed)
            chain = ctx.new_chain(params, chain_seed(rng), constraint)
            banned = Banned.of(constraint.banned, ctx.info.n_vocab) if constraint else None
            ours = NumpySampler(ctx.workspace, params, rng)
            full = NumpySampler(ctx.workspace, params, rng, rejection=False)
            times: dict[str, list[float]] = {"chain": [], "full": [], "ours": []}
            for _ in range(repetitions):
                times["chain"].append(per_call_ms(lambda: chain.sample(index), calls))  # noqa: B023
                for kind, sampler in (("full", full), ("ours", ours)):
                    pick = lambda: sampler.sample(ctx.logits(index), banned)  # noqa: B023, E731
                    times[kind].append(per_call_ms(pick, calls))
            chain.free()
            median = {kind: statistics.median(values) for kind, values in times.items()}
            outcomes = ours.rejection_outcomes
            results[name] = {
                "llama_chain_ms": round(median["chain"], 4),
                "full_draw_ms": round(median["full"], 4),
                "numpy_ms": round(median["ours"], 4),
                "speedup": round(median["chain"] / median["ours"], 2),
                "rejection_outcomes": dataclasses.asdict(outcomes) if outcomes else None,
                "all_ms": {kind: [round(x, 4) for x in values] for kind, values in times.items()},
            }
        return results
    finally:
        ctx.close()


async def decode_tps(engine: LlamaEngine, prompt: list[int], n_gen: int, seed: int) -> float:
    params = SamplingParams(max_tokens=n_gen, temperature=1.0, seed=seed)
    first = last = 0.0
    async for _ in engine.submit(prompt, params):
        last = time.perf_counter()
        first = first or last
    return (n_gen - 1) / (last - first)


def engine_part(
    model: Path, threads: int, n_prompt: int, n_gen: int, repetitions: int
) -> dict[str, Any]:
    config = EngineConfig(
        model_path=str(model), n_ctx=n_prompt + n_gen + 64, n_threads=threads, n_slots=1
    )
    engines = {"llama": LlamaEngine(dataclasses.replace(config, sampler="llama"))}
    engines["numpy"] = LlamaEngine(config)
    rng = random.Random(0)
    speeds: dict[str, list[float]] = {name: [] for name in engines}
    try:
        for rep in range(repetitions + 1):  # the first round warms up
            for name, engine in engines.items():
                prompt = [rng.randrange(1000, 100_000) for _ in range(n_prompt)]
                tps = asyncio.run(decode_tps(engine, prompt, n_gen, seed=rep))
                if rep:
                    speeds[name].append(tps)
    finally:
        for engine in engines.values():
            engine.close()
    out: dict[str, Any] = {"test": f"tg{n_gen} after pp{n_prompt}, {threads} threads"}
    for name, values in speeds.items():
        median = statistics.median(values)
        out[name] = {
            "tokens_per_s": round(median, 1),
            "ms_per_token": round(1000 / median, 3),
            "all": [round(v, 1) for v in values],
        }
    out["saved_ms_per_token"] = round(
        out["llama"]["ms_per_token"] - out["numpy"]["ms_per_token"], 3
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: tiny synthetic)")
    parser.add_argument(
        "--trained",
        action="store_true",
        help="the trained tiny model, its logits inside its own turn on a held-out prompt",
    )
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--skip-engine", action="store_true", help="only the sampler part")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = args.model or cached_gguf(TRAINED if args.trained else "tiny")
    report: dict[str, Any] = {"model": str(model), "threads": args.n_threads}
    report["sampler"] = sampler_part(
        model, args.n_threads, args.calls, args.repetitions, args.trained
    )
    if not args.skip_engine:
        report["engine"] = engine_part(
            model, args.n_threads, args.prompt_tokens, args.decode_tokens, args.repetitions
        )
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
