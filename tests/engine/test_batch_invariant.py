"""The batch-invariant mode on the real tiny gpt-oss: a request's tokens depend on it alone.

Two greedy requests run together — one's prompt prefilled while the other generates and drafts —
give exactly the tokens each gives alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.llama import LlamaEngine

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
