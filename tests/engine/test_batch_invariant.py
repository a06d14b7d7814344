"""The batch-invariant mode on the real tiny gpt-oss: a request's tokens depend on it alone.

Two greedy requests run together — one's prompt prefilled while the other generates and drafts —
give exactly the tokens each gives alone; on the trained model, sampled turns are the same with
speculation and without.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from devkit.models import cached_gguf
from devkit.trained.workloads import trained_cases
from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.llama import LlamaEngine

GREEDY = SamplingParams(max_tokens=120, temperature=0.0)
TURN_ENDS = frozenset({200012, 200002})  # <|call|>, <|return|>


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100000) for _ in range(n)]


async def generate_with(
    engine: LlamaEngine, prompt: Sequence[int], params: SamplingParams
) -> tuple[list[int], EngineResult]:
    stream = engine.submit(prompt, params)
    out = [token async for chunk in stream for token in chunk]
    return out, stream.result


async def generate(engine: LlamaEngine, prompt: Sequence[int]) -> tuple[list[int], EngineResult]:
    return await generate_with(engine, prompt, GREEDY)


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
    trained_gguf = cached_gguf("trained")
    prompts = trained_cases(4)["trained_codex_patch"]
    runs: dict[str, list[list[int]]] = {}
    drafted = 0
    for mode in ("off", "on"):
        config = EngineConfig(
            model_path=str(trained_gguf),
            n_ctx=16384,
            n_slots=1,
            n_threads=2,
            speculative=mode,
            batch_invariant=True,
        )
        engine = LlamaEngine(config)
        try:
            runs[mode] = []
            for seed, prompt in enumerate(prompts):
                params = SamplingParams(
                    max_tokens=120, temperature=1.0, seed=seed, stop_tokens=TURN_ENDS
                )
                out, result = asyncio.run(generate_with(engine, prompt, params))
                assert result.error is None
                runs[mode].append(out)
                drafted += result.timings.draft_n
        finally:
            engine.close()
    assert drafted > 0
    assert runs["on"] == runs["off"]
