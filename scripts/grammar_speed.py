"""Decode speed with and without a tool-call grammar on the tiny synthetic model (JSON output).

`--trained`: on the trained tiny model instead, writing the arguments of a call a user asked for
(its prompt rendered as the server renders it), where its distributions are peaked.

Each round generates `--tokens` tokens one at a time on one sequence: unconstrained (only the
harmony specials banned, as for any content) and under a strict JSON-schema grammar (a call is
restarted with a fresh grammar whenever it ends with <|call|>). The rounds alternate so machine
noise hits both alike; the report gives tokens/s of each and their ratio (medians of the rounds),
the same per second of the process's CPU time (steadier on a busy machine), how often the
grammar sampler drew the token among the whole allowed set (found by walking the vocabulary's
prefix tree) rather than taking one of its rejection draws, and how many grammar checks a token
took.

    python -m scripts.grammar_speed --rounds 3 --tokens 300 > grammar_speed.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from typing import Any

import numpy as np

from devkit.models import TRAINED, cached_gguf
from devkit.train_tiny.corpus import encoding as corpus_encoding
from server.contracts.directives import Constrain
from server.contracts.transcript import ToolSpec, Transcript, UserMessage
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.sampling.banned import Banned
from server.engine.sampling.grammar_sampler import GrammarSampler
from server.engine.sampling.numpy_sampler import NumpySampler
from server.grammars.tools import call_grammar
from server.harmony.render import render
from server.harmony.tokens import CALL, SPECIALS

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
PROMPT = [200006, 17360, 200008, 12194, 200007, 200006, 173781]  # any few tokens will do


def trained_prompt() -> list[int]:
    """For the trained model: a user asking for the call, its analysis and the call's header,
    rendered as the server renders them, so its arguments come from a model at work."""
    encoding = corpus_encoding()  # the trained model's corpus renders with this one
    tool = ToolSpec("plan_trip", description="Plan a trip.", parameters=SCHEMA)
    ask = "Call plan_trip with city=lisbon, unit=celsius, days=3."
    prompt = render(encoding, Transcript(items=(UserMessage(ask),), tools=(tool,)))
    head = (
        "<|channel|>analysis<|message|>Call plan_trip.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.plan_trip <|constrain|>json<|message|>"
    )
    return [*prompt, *encoding.encode(head, allowed_special="all")]


class _Unconstrained:
    """What the server samples content with when there is no grammar: the numpy sampler with
    the structural specials banned (engine/picker.py)."""

    def __init__(self, ctx: LlamaContext, params: SamplingParams, constraint: Constrain) -> None:
        self._ctx = ctx
        self._sampler = NumpySampler(ctx.workspace, params, np.random.default_rng(params.seed))
        self._banned = Banned.of(constraint.banned, ctx.info.n_vocab) if constraint.banned else None

    def sample(self, index: int) -> int:
        return self._sampler.sample(self._ctx.logits(index), self._banned)

    def free(self) -> None:
        pass


def _generate(
    ctx: LlamaContext, constraint: Constrain, tokens: int, seed: int, prompt: list[int]
) -> dict[str, Any]:
    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed)
    produced = masked = drawn = checked = calls = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    while produced < tokens:
        sampler: GrammarSampler | _Unconstrained = (
            GrammarSampler(ctx, params, constraint, np.random.default_rng(params.seed))
            if constraint.grammar is not None
            else _Unconstrained(ctx, params, constraint)
        )
        ctx.truncate(0, 0)
        index = ctx.decode([BatchPart(0, prompt, 0, True)])[-1]
        position = len(prompt)
        try:
            while produced < tokens:
                token = sampler.sample(index)
                produced += 1
                if token == CALL:
                    calls += 1
                    break
                index = ctx.decode([BatchPart(0, [token], position, True)])[0]
                position += 1
        finally:
            if isinstance(sampler, GrammarSampler):
                masked += sampler.masked
                drawn += getattr(sampler, "drawn", 0)  # (older samplers, for comparisons)
                checked += getattr(sampler, "checked", 0)
            sampler.free()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return {
        "tokens_per_s": produced / elapsed,
        "tokens_per_cpu_s": produced / cpu,
        "masked": masked,
        "drawn": drawn,
        "grammar_checks": checked,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--trained",
        action="store_true",
        help="the trained tiny model, writing a call it was asked for",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("llama_cpp").setLevel(logging.ERROR)
    grammar = call_grammar(ToolSpec("plan_trip", parameters=SCHEMA, strict=True))
    assert grammar is not None
    preset = TRAINED if args.trained else "tiny"
    prompt = trained_prompt() if args.trained else PROMPT
    config = EngineConfig(model_path=str(cached_gguf(preset)), n_ctx=4096, n_threads=args.threads)
    ctx = LlamaContext(config)
    banned = SPECIALS - {CALL}
    free, constrained = Constrain(banned=banned), Constrain(banned=banned, grammar=grammar)
    _generate(ctx, constrained, 20, seed=0, prompt=prompt)  # warm-up (the vocabulary's prefix tree)
    runs: dict[str, list[dict[str, Any]]] = {"unconstrained": [], "grammar": []}
    for round_ in range(args.rounds):
        runs["unconstrained"].append(_generate(ctx, free, args.tokens, round_, prompt))
        runs["grammar"].append(_generate(ctx, constrained, args.tokens, round_, prompt))
    ctx.close()
    median = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    cpu = {k: statistics.median(r["tokens_per_cpu_s"] for r in v) for k, v in runs.items()}
    report = {
        "model": "trained tiny gpt-oss" if args.trained else "tiny synthetic gpt-oss (random)",
        "tokens_per_round": args.tokens,
        "rounds": args.rounds,
        "threads": args.threads,
        "unconstrained_tokens_per_s": round(median["unconstrained"], 2),
        "grammar_tokens_per_s": round(median["grammar"], 2),
        "ratio": round(median["grammar"] / median["unconstrained"], 3),
        "unconstrained_tokens_per_cpu_s": round(cpu["unconstrained"], 2),
        "grammar_tokens_per_cpu_s": round(cpu["grammar"], 2),
        "cpu_ratio": round(cpu["grammar"] / cpu["unconstrained"], 3),
        "grammar_calls_completed": sum(r["calls"] for r in runs["grammar"]),
        "grammar_tokens_among_allowed": sum(r["masked"] for r in runs["grammar"]),
        "grammar_tokens_drawn": sum(r["drawn"] for r in runs["grammar"]),
        "grammar_checks_per_token": round(
            sum(r["grammar_checks"] for r in runs["grammar"]) / (args.rounds * args.tokens), 1
        ),
        "runs": runs,
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
