"""Several conversations on one engine: kept caches, shared prefixes, batching, eviction."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from server.engine.base import EngineConfig, EngineResult, SamplingParams, StopReason
from server.engine.llama import LlamaEngine
from tests.support.engine_runs import GREEDY, run

FREE = frozenset[int]()


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100000) for _ in range(n)]


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Iterator[LlamaEngine]:
    engine = LlamaEngine(EngineConfig(model_path=str(tiny_gguf), n_ctx=4096, n_threads=2))
    yield engine
    engine.close()


def test_interleaved_conversations_keep_their_caches(engine: LlamaEngine) -> None:
    system = tokens(1, 60)
    a1, b1 = system + tokens(2, 40), system + tokens(3, 40)
    out_a1, res_a1 = run(engine, a1, GREEDY)
    out_b1, res_b1 = run(engine, b1, GREEDY)
    # B shares the system prompt with A: that prefix is shared, not evaluated again
    assert res_b1.usage.cached_tokens == len(system)
    new_a, new_b = tokens(4, 30), tokens(5, 30)
    _, res_a2 = run(engine, a1 + out_a1 + new_a, GREEDY)
    _, res_b2 = run(engine, b1 + out_b1 + new_b, GREEDY)
    for first, second, new in ((res_a1, res_a2, new_a), (res_b1, res_b2, new_b)):
        assert second.usage.cached_tokens == first.usage.prompt_tokens + len(out_a1) - 1
        assert second.usage.evaluated_tokens == len(new) + 1


def collect_all(
    engine: LlamaEngine, jobs: Sequence[tuple[list[int], SamplingParams]]
) -> list[tuple[list[int], EngineResult]]:
    async def one(prompt: list[int], params: SamplingParams) -> tuple[list[int], EngineResult]:
        stream = engine.submit(prompt, params)
        out = [t async for chunk in stream for t in chunk]
        return out, stream.result

    async def together() -> list[tuple[list[int], EngineResult]]:
        return list(await asyncio.gather(*(one(p, s) for p, s in jobs)))

    return asyncio.run(together())


def test_concurrent_requests_all_finish(engine: LlamaEngine) -> None:
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1, stop_tokens=FREE)
    results = collect_all(engine, [(tokens(10 + i, 50 + 10 * i), params) for i in range(6)])
    for out, result in results:
        assert result.stop_reason is StopReason.MAX_TOKENS
        assert len(out) == 24 == result.usage.completion_tokens


def test_batched_greedy_output_matches_sequential(engine: LlamaEngine) -> None:
    prompts = [tokens(20 + i, 80) for i in range(3)]
    sequential = [run(engine, [*p, 5], GREEDY)[0] for p in prompts]
    together = [out for out, _ in collect_all(engine, [([*p, 6], GREEDY) for p in prompts])]
    again = [run(engine, [*p, 6], GREEDY)[0] for p in prompts]
    assert together == again
    assert all(len(out) == GREEDY.max_tokens for out in sequential)


def test_a_running_stream_keeps_flowing_while_another_prompt_prefills(tiny_gguf: Path) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=4096, n_threads=2, prefill_chunk=64)
    engine = LlamaEngine(config)
    long_run = SamplingParams(max_tokens=400, temperature=1.0, seed=2, stop_tokens=FREE)

    async def scenario() -> tuple[int, int]:
        streaming = engine.submit(tokens(30, 20), long_run)
        received = 0
        async for chunk in streaming:
            received += len(chunk)
            if received >= 3:
                break
        newcomer = engine.submit(tokens(31, 1500), GREEDY)
        first_chunk = await anext(aiter(newcomer))
        during_prefill = 0
        async for chunk in streaming:
            during_prefill += len(chunk)
            break
        async for _ in newcomer:
            pass
        streaming.cancel()
        async for _ in streaming:
            pass
        return during_prefill, len(first_chunk)

    try:
        during_prefill, _ = asyncio.run(scenario())
    finally:
        engine.close()
    # 1500 prompt tokens in chunks of 64: ~24 steps, each also advancing the running stream
    assert during_prefill >= 20


def test_one_cancelled_request_does_not_disturb_another(engine: LlamaEngine) -> None:
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=3, stop_tokens=FREE)

    async def scenario() -> tuple[EngineResult, EngineResult]:
        doomed = engine.submit(tokens(40, 30), params)
        survivor = engine.submit(tokens(41, 30), params)
        async for _ in doomed:
            doomed.cancel()
        async for _ in survivor:
            pass
        return doomed.result, survivor.result

    doomed, survivor = asyncio.run(scenario())
    assert doomed.stop_reason is StopReason.CANCELLED
    assert survivor.stop_reason is StopReason.MAX_TOKENS
    assert survivor.usage.completion_tokens == 60


def test_requests_wait_for_a_free_slot(tiny_gguf: Path) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2, n_slots=1)
    engine = LlamaEngine(config)
    params = SamplingParams(max_tokens=20, temperature=0.0, stop_tokens=FREE)
    try:
        results = collect_all(engine, [(tokens(50, 40), params), (tokens(51, 40), params)])
    finally:
        engine.close()
    first, second = (result for _, result in results)
    assert first.stop_reason is second.stop_reason is StopReason.MAX_TOKENS
    assert second.timings.queue_s >= first.timings.prefill_s


def test_full_cache_drops_the_least_recent_idle_conversation(tiny_gguf: Path) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=512, n_threads=2, n_slots=2)
    engine = LlamaEngine(config)
    try:
        a = tokens(60, 300)
        run(engine, a, GREEDY)
        _, b = run(engine, tokens(61, 300), GREEDY)  # needs A's cells
        _, a_again = run(engine, a, GREEDY)
    finally:
        engine.close()
    assert b.stop_reason is StopReason.MAX_TOKENS
    assert a_again.usage.cached_tokens == 0


def test_a_request_that_fails_to_start_does_not_stop_the_engine(tiny_gguf: Path) -> None:
    def hook(prompt: Sequence[int]) -> None:
        if prompt[0] == 13:
            raise ValueError("cannot start this one")

    engine = LlamaEngine(EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2), hook)
    try:
        _, failed = run(engine, [13, *tokens(70, 20)], GREEDY)
        out, ok = run(engine, tokens(71, 20), GREEDY)
    finally:
        engine.close()
    assert failed.stop_reason is StopReason.ERROR
    assert "cannot start this one" in (failed.error or "")
    assert ok.stop_reason is StopReason.MAX_TOKENS
    assert len(out) == GREEDY.max_tokens
