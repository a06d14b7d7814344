"""The batch-invariant mode on the real tiny gpt-oss: a request's tokens depend on it alone.

Two greedy requests run together — one's prompt prefilled while the other generates and drafts —
give exactly the tokens each gives alone; on the trained model, sampled turns are the same with
speculation and without.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from devkit.models import cached_gguf
from devkit.trained.workloads import trained_cases
from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.llama import LlamaEngine
from tests.support.engine_runs import STOPS, run, with_speculation_on_and_off

GREEDY = SamplingParams(max_tokens=120, temperature=0.0)


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100000) for _ in range(n)]


async def generate(engine: LlamaEngine, prompt: Sequence[int]) -> tuple[list[int], EngineResult]:
    stream = engine.submit(prompt, GREEDY)
    out = [token async for chunk in stream for token in chunk]
    return out, stream.result


async def together(
    engine: LlamaEngine, first: Sequence[int], second: Sequence[int]
) -> list[tuple[list[int], EngineResult]]:
    """`second` submitted once `first` generates: its prefill shares `first`'s steps."""
    running = asyncio.create_task(generate(engine, first))
    await asyncio.sleep(0.2)
    return [await running, await generate(engine, second)]


def test_concurrent_greedy_requests_give_what_each_gives_alone(tiny_gguf: Path) -> None:
    config = EngineConfig(
        model_path=str(tiny_gguf),
        n_ctx=8192,
        n_slots=2,
        n_threads=1,
        speculative="on",
        batch_invariant=True,
    )
    engine = LlamaEngine(config)
    try:
        body = tokens(1, 80)
        copying = [41, *body, *body, *body[:5]]  # its continuation copies: drafts, some rejected
        long = [42, *tokens(2, 1500)]
        alone = [asyncio.run(generate(engine, prompt)) for prompt in (copying, long)]
        both = asyncio.run(together(engine, copying, long))
        for (solo, _), (shared, result) in zip(alone, both, strict=True):
            assert result.error is None
            assert shared == solo
        assert both[0][1].timings.draft_n > 0
        assert both[1][1].usage.evaluated_tokens == len(long)  # no prefix reused
    finally:
        engine.close()


@pytest.mark.slow  # the trained GGUF and its ≈8k-token Codex prompts
def test_speculation_gives_the_tokens_of_no_speculation_on_the_trained_model() -> None:
    """The trained tiny model's attention weights are F32: llama.cpp computes a step of one row
    another way than a verify of several (its logits up to 0.15 apart), and its Codex patch
    turns, sampled, parted between speculation on and off at tokens 38 and 43. In this mode
    every step keeps two rows at least (Scheduler._guess), and the turns are the same."""
    prompts = trained_cases(4)["trained_codex_patch"]
    config = EngineConfig(
        model_path=str(cached_gguf("trained")),
        n_ctx=16384,
        n_slots=1,
        n_threads=2,
        batch_invariant=True,
    )

    def turns(engine: LlamaEngine) -> list[tuple[list[int], EngineResult]]:
        sampled = SamplingParams(max_tokens=120, temperature=1.0, stop_tokens=STOPS)
        return [
            run(engine, prompt, dataclasses.replace(sampled, seed=seed))
            for seed, prompt in enumerate(prompts)
        ]

    runs = with_speculation_on_and_off(config, turns)
    assert all(result.error is None for mode in runs.values() for _, result in mode)
    assert sum(result.timings.draft_n for _, result in runs["on"]) > 0
    assert [out for out, _ in runs["on"]] == [out for out, _ in runs["off"]]
