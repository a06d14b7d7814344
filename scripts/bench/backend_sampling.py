"""Sampling on llama.cpp's backend against sampling on the host, one decode loop each.

    python -m scripts.bench.backend_sampling [--model PATH] [--threads 2] [--n-gpu-layers 0]
        [--prompt 512] [--gen 128] [--rounds 3] [--temperature 1.0] [--out FILE]

The server samples on the host: each token, llama.cpp hands over the whole row of logits
(201,088 floats; from a GPU, a copy to host memory) and the server's own sampler draws from it
(server/engine/sampling/numpy_sampler.py). The llama.h that llama-cpp-python binds also has
llama.cpp's backend sampling (experimental: `llama_set_sampler`, `llama_get_sampled_token_ith`):
a sampler chain evaluated in the model's graph, on the device that holds the logits, so only the
token comes back. This measures both on one model file, in turns, round by round: a context
whose sequence has a backend chain (temperature, then the seeded draw) against a context that
keeps its logits for the server's sampler at the same temperature. Decode tokens/s of each
(medians of the rounds; and the median of each round's own ratio, since a shared machine's speed
moves whole rounds). At temperature 0 both are greedy and must agree token for token (reported
as `greedy_identical`; the check of the wiring). Prints JSON; no engine, no HTTP.

What a switch costs (`--switches N`, after the rounds): a generation's header tokens are picked
among a few allowed ones, from the logits, so an engine that samples content on the backend
would take the sequence's chain off for each header and put it back after. Each
`llama_set_sampler` makes llama.cpp reserve its scheduler's graphs again at the next decode, and
a chain is set up on the backend once (a second `llama_set_sampler` of the same chain fails an
assertion), so a new one goes back. The backend context's decode loop runs on with N switches:
the chain taken off for one token (drawn on the host from the raw logits), then a new one set;
`switch_ms` is the median of those two steps' time less two steady backend steps' (the step:
the decode and the token read back).

Each token read back is accepted by its chain, as the engine does (llama.cpp's backend draw may
be transactional: its stream then advances on accept; server/engine/sampling/backend_chain.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import llama_cpp as lc
import numpy as np

from devkit.models import cached_gguf
from server.engine.base import BatchPart, SamplingParams
from server.engine.batch import Batch
from server.engine.sampling.numpy_sampler import NumpySampler, Workspace
from server.engine.sampling.temperature import is_greedy

_QUIET = lc.llama_log_callback(lambda *_: None)  # kept alive: llama.cpp calls it until exit
STEADY_STEPS = 5  # backend steps timed before each switch


def new_chain(temperature: float, seed: int) -> Any:
    """A backend chain: greedy, or the temperature and the seeded draw."""
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    if is_greedy(temperature):
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
    else:
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(temperature))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
    return chain


class Loop:
    """One context of one sequence and its decode loop: backend sampling, or the host's."""

    def __init__(self, model: Any, args: argparse.Namespace, backend: bool) -> None:
        params = lc.llama_context_default_params()
        params.n_ctx = args.prompt + args.gen + args.switches * (STEADY_STEPS + 2) + 64
        params.n_batch = params.n_ubatch = max(args.prompt, 1)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = args.threads
        params.no_perf = True
        self.ctx = lc.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.backend = backend
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model)))
        self.chain = None
        if backend:
            self.chain = new_chain(args.temperature, args.seed)
            if not lc.llama_set_sampler(self.ctx, 0, self.chain):
                raise RuntimeError("this build cannot sample on the backend")
        self.batch = Batch(params.n_batch)
        self.workspace = Workspace(self.n_vocab)

    def _decode(self, tokens: list[int], start: int) -> None:
        self.batch.fill([BatchPart(0, tokens, start, True)])
        if lc.llama_decode(self.ctx, self.batch.struct) != 0:
            raise RuntimeError("llama_decode failed")

    def run(self, prompt: list[int], args: argparse.Namespace) -> tuple[float, list[int]]:
        """(decode tokens/s after the prompt, the tokens)."""
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        params = SamplingParams(max_tokens=args.gen, temperature=args.temperature)
        sampler = NumpySampler(self.workspace, params, np.random.default_rng(args.seed))
        self._decode(prompt, 0)
        out: list[int] = []
        started = time.perf_counter()
        for position in range(len(prompt), len(prompt) + args.gen):
            if self.backend:
                token = int(lc.llama_get_sampled_token_ith(self.ctx, -1))
                lc.llama_sampler_accept(self.chain, token)  # the draw's stream advances
            else:
                pointer = lc.llama_get_logits_ith(self.ctx, -1)
                logits = np.ctypeslib.as_array(pointer, (self.n_vocab,))
                token = sampler.sample(logits)
            out.append(token)
            self._decode([token], position)
        return (args.gen - 1) / (time.perf_counter() - started), out

    def switches(self, start: int, args: argparse.Namespace) -> list[float]:
        """After `run`: per switch, the two steps around it less two steady steps (ms)."""
        assert self.chain is not None
        params = SamplingParams(max_tokens=1, temperature=args.temperature)
        sampler = NumpySampler(self.workspace, params, np.random.default_rng(args.seed))
        position = start
        token = int(lc.llama_get_sampled_token_ith(self.ctx, -1))
        extra: list[float] = []
        for _ in range(args.switches):
            steady = []
            for _ in range(STEADY_STEPS):
                began = time.perf_counter()
                self._decode([token], position)
                token = int(lc.llama_get_sampled_token_ith(self.ctx, -1))
                lc.llama_sampler_accept(self.chain, token)
                steady.append(time.perf_counter() - began)
                position += 1
            began = time.perf_counter()
            lc.llama_set_sampler(self.ctx, 0, None)  # off: the next token from the raw logits
            self._decode([token], position)
            pointer = lc.llama_get_logits_ith(self.ctx, -1)
            token = sampler.sample(np.ctypeslib.as_array(pointer, (self.n_vocab,)))
            # a chain is set up on the backend once: a new one goes back (seeded anew)
            lc.llama_sampler_free(self.chain)
            self.chain = new_chain(args.temperature, args.seed + position)
            if not lc.llama_set_sampler(self.ctx, 0, self.chain):
                raise RuntimeError("the chain could not be put back")
            self._decode([token], position + 1)
            token = int(lc.llama_get_sampled_token_ith(self.ctx, -1))
            lc.llama_sampler_accept(self.chain, token)
            took = time.perf_counter() - began
            position += 2
            extra.append((took - 2 * statistics.median(steady)) * 1000)
        return extra

    def close(self) -> None:
        lc.llama_free(self.ctx)
        if self.chain is not None:
            lc.llama_sampler_free(self.chain)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-gpu-layers", type=int, default=0, help="-1: every layer")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--switches", type=int, default=8, help="chain off and on again: 0 none")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging.disable(logging.WARNING)
    lc.llama_log_set(_QUIET, ctypes.c_void_p(0))
    lc.llama_backend_init()
    path = args.model or cached_gguf("tiny")
    model_params = lc.llama_model_default_params()
    model_params.n_gpu_layers = args.n_gpu_layers if args.n_gpu_layers >= 0 else 10_000
    model = lc.llama_model_load_from_file(str(path).encode(), model_params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    loops = {"host": Loop(model, args, backend=False), "backend": Loop(model, args, backend=True)}
    rng = np.random.default_rng(0)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    outputs: dict[str, list[list[int]]] = {name: [] for name in loops}
    switch_ms: list[float] = []
    try:
        for r in range(args.rounds):
            prompt = [int(t) for t in rng.integers(100, 199_000, args.prompt)]
            order = list(loops) if r % 2 == 0 else list(loops)[::-1]
            for name in order:
                rate, out = loops[name].run(prompt, args)
                rates[name].append(rate)
                outputs[name].append(out)
        if args.switches > 0:
            switch_ms = loops["backend"].switches(args.prompt + args.gen, args)
    finally:
        for loop in loops.values():
            loop.close()
        lc.llama_model_free(model)
    ratios = [b / h for b, h in zip(rates["backend"], rates["host"], strict=True)]
    report: dict[str, Any] = {
        "model": str(path),
        "threads": args.threads,
        "n_gpu_layers": args.n_gpu_layers,
        "temperature": args.temperature,
        "test": f"tg{args.gen} after pp{args.prompt}",
        "tokens_per_s": {name: [round(x, 1) for x in v] for name, v in rates.items()},
        "median_tokens_per_s": {name: round(statistics.median(v), 1) for name, v in rates.items()},
        "backend_vs_host": round(statistics.median(ratios), 3),
    }
    if switch_ms:
        report["switch_ms"] = round(statistics.median(switch_ms), 3)
        report["switch_ms_each"] = [round(x, 3) for x in switch_ms]
    if is_greedy(args.temperature):
        report["greedy_identical"] = outputs["backend"] == outputs["host"]
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
