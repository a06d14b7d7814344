"""Speculative decoding benchmark: the verify-cost curve, and decode tokens/s with and without.

`python -m scripts.bench.speculative [--model PATH | --preset tiny|trained|20b] [--threads N]
[--rounds 3] [--tokens 200] [--cost-rounds 5] [--temperature 1.0] [--mode auto|on]
[--out FILE]`

Part 1 (`verify_cost`): on an empty sequence after a 64-token context, the time of one step of
1 + k tokens (every one with its logits, as a verify asks) against a one-token step, for
k = 0 … 16 (the fastest of `--cost-rounds`), and the break-even acceptance each k implies: the
per-token acceptance at which a step with k drafts emits as many tokens per unit of time as a
plain step (server/engine/speculative/draft_length.py).

Part 2 (`workloads`): decode tokens/s of agent output that copies its context, on two engines of
the same model (speculation `--mode`, auto by default, and off), taking turns request by request
(which goes first alternates every round): an apply_patch edit of a file shown in the prompt, a
call repeating long strings of the prompt, an answer quoting a tool result, and text that copies
nothing (the model sampling freely: the overhead of looking for drafts). The copying outputs are
forced scripts: the model's logits are computed and sampled from at every position as always,
then the script's token replaces the sampled one, so every draft that copies the script is
confirmed: an upper bound of what a model that copies that much gets (the step costs are real,
the acceptance is the script's). Prints JSON with the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from server.engine.base import EngineConfig, SamplingParams, default_threads
from server.engine.llama import LlamaEngine
from server.engine.llama_context import LlamaContext
from server.engine.speculation import measure_verify_cost
from server.harmony.encoding import load_encoding
from server.testing.synthetic_gguf import cached_gguf

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


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def verify_cost(model: str, threads: int, rounds: int) -> dict[str, Any]:
    config = EngineConfig(model_path=model, n_ctx=1024, n_slots=1, n_threads=threads)
    ctx = LlamaContext(config)
    try:
        cost, medians = measure_verify_cost(ctx, 0, 16, rounds, ks=range(17))
    finally:
        ctx.close()
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


def workloads(model: str, args: argparse.Namespace) -> dict[str, Any]:
    threads, rounds, n_tokens = args.threads, args.rounds, args.tokens
    temperature, mode_on = args.temperature, args.mode
    encoding = load_encoding(Path.home() / ".cache" / "gpt-oss-server" / "vocab")
    hooks = {mode: Scripts() for mode in ("off", "on")}
    engines = {
        mode: LlamaEngine(
            EngineConfig(
                model_path=model,
                n_ctx=4096,
                n_threads=threads,
                speculative=mode_on if mode == "on" else "off",
            ),
            sampling_hook=hooks[mode],
        )
        for mode in ("off", "on")
    }
    cases: dict[str, tuple[list[int], list[int]]] = {}
    for name, build in WORKLOADS.items():
        prompt_text, output = build()
        prompt = encoding.encode(prompt_text + "<|start|>assistant", allowed_special="all")
        cases[name] = (prompt, encoding.encode(output, allowed_special="all"))
    free_prompt = encoding.encode(
        "<|start|>user<|message|>Write a poem.<|end|><|start|>assistant", allowed_special="all"
    )
    cases["no_copy"] = (free_prompt, [])
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {n: {"off": [], "on": []} for n in cases}
    try:
        for r in range(rounds):
            for i, (name, (prompt, script)) in enumerate(cases.items()):
                order = ("off", "on") if (r + i) % 2 == 0 else ("on", "off")
                for mode in order:
                    if script:
                        hooks[mode].queue.append(script)
                    limit = len(script) if script else n_tokens
                    params = SamplingParams(
                        max_tokens=limit, temperature=temperature, seed=1000 * r + i
                    )
                    nonce = [1000 + r]  # every round evaluates its prompt afresh
                    samples[name][mode].append(generate(engines[mode], nonce + prompt, params))
    finally:
        for engine in engines.values():
            engine.close()
    out: dict[str, Any] = {}
    for name, by_mode in samples.items():
        off = [s["tokens_per_s"] for s in by_mode["off"]]
        on = [s["tokens_per_s"] for s in by_mode["on"]]
        pairs = zip(by_mode["off"], by_mode["on"], strict=True)
        same = all(a["tokens"] == b["tokens"] for a, b in pairs)
        drafted = sum(s["draft_n"] for s in by_mode["on"])
        accepted = sum(s["draft_n_accepted"] for s in by_mode["on"])
        out[name] = {
            "generated_tokens": len(by_mode["on"][0]["tokens"]),
            "forced_script": name != "no_copy",
            "tokens_per_s_off": [round(x, 1) for x in off],
            "tokens_per_s_on": [round(x, 1) for x in on],
            "median_off": round(statistics.median(off), 1),
            "median_on": round(statistics.median(on), 1),
            "speedup": round(statistics.median(on) / statistics.median(off), 3),
            "draft_n": drafted,
            "draft_n_accepted": accepted,
            "identical_output": same,
        }
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
        "--mode", default="auto", choices=("auto", "on"), help="the speculative engine's setting"
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
        "loadavg_before": loadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.skip_cost:
        report["verify_cost"] = verify_cost(model, args.threads, args.cost_rounds)
    report["workloads"] = workloads(model, args)
    report["loadavg_after"] = loadavg()
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
