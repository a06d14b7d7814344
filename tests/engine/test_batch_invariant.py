"""The batch-invariant mode on the real tiny gpt-oss: a request's tokens depend on it alone.

Two greedy requests run together — one's prompt prefilled while the other generates and drafts,
the engine's decodes of the two interleaved (recorded) — give exactly the tokens each gives
alone; with the mode off (the negative control) the same pair shares llama_decode batches and
parts from its solo runs. On the trained model, sampled turns are the same with speculation and
without.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from devkit.models import cached_gguf
from devkit.trained.workloads import trained_cases
from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.llama import LlamaEngine
from server.engine.llama_context import BatchPart, LlamaContext
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
    """`second` submitted once `first` has sent its first tokens: its prefill shares `first`'s
    steps (`decoded_together` checks that it did)."""
    stream = engine.submit(first, GREEDY)
    out: list[int] = []
    later: asyncio.Task[tuple[list[int], EngineResult]] | None = None
    async for chunk in stream:
        out.extend(chunk)
        if later is None:
            later = asyncio.create_task(generate(engine, second))
    assert later is not None
    return [(out, stream.result), await later]


def record_decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The sequence ids of each llama_decode's batch, in order, from now on (the real decode
    runs: the wrapper only reads its parts)."""
    decodes: list[tuple[int, ...]] = []
    decode = LlamaContext.decode

    def recorded(self: LlamaContext, parts: Sequence[BatchPart], *args: Any) -> list[int]:
        decodes.append(tuple(part.seq_id for part in parts))
        return decode(self, parts, *args)

    monkeypatch.setattr(LlamaContext, "decode", recorded)
    return decodes


def decoded_together(decodes: list[tuple[int, ...]]) -> bool:
    """Whether two sequences were evaluated in overlapping spans of the engine's steps: each
    one's decodes began before the other's ended."""
    spans: dict[int, list[int]] = {}
    for index, batch in enumerate(decodes):
        for seq_id in batch:
            spans.setdefault(seq_id, []).append(index)
    if len(spans) != 2:
        return False
    a, b = spans.values()
    return a[0] < b[-1] and b[0] < a[-1]


def engine_config(tiny_gguf: Path, *, batch_invariant: bool) -> EngineConfig:
    return EngineConfig(
        model_path=str(tiny_gguf),
        n_ctx=8192,
        n_slots=2,
        n_threads=1,
        speculative="on",
        batch_invariant=batch_invariant,
    )


BODY = tokens(1, 80)
COPYING = [41, *BODY, *BODY, *BODY[:5]]  # its continuation copies: drafts, some rejected
LONG = [42, *tokens(2, 1500)]


def test_concurrent_greedy_requests_give_what_each_gives_alone(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = LlamaEngine(engine_config(tiny_gguf, batch_invariant=True))
    try:
        alone = [asyncio.run(generate(engine, prompt)) for prompt in (COPYING, LONG)]
        decodes = record_decodes(monkeypatch)
        both = asyncio.run(together(engine, COPYING, LONG))
        assert decoded_together(decodes), decodes
        assert all(len(batch) == 1 for batch in decodes)  # each sequence decoded on its own
        for (solo, _), (shared, result) in zip(alone, both, strict=True):
            assert result.error is None
            assert shared == solo
        assert both[0][1].timings.draft_n > 0
        assert both[1][1].usage.evaluated_tokens == len(LONG)  # no prefix reused
    finally:
        engine.close()


def test_without_the_mode_the_same_pair_differs_from_its_solo_runs(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: with the batch-invariant mode off, the same pair run together
    shares llama_decode batches, and the greedy tokens of each part from those it gives alone
    (each run on an engine of its own, so that no cached prefix changes a batch's shape; alone,
    it gives the same tokens every time: the difference is the batching's)."""
    config = engine_config(tiny_gguf, batch_invariant=False)

    def solo(prompt: Sequence[int]) -> list[int]:
        engine = LlamaEngine(config)
        try:
            return asyncio.run(generate(engine, prompt))[0]
        finally:
            engine.close()

    alone = [solo(prompt) for prompt in (COPYING, LONG)]
    assert [solo(prompt) for prompt in (COPYING, LONG)] == alone  # alone, the same every time
    engine = LlamaEngine(config)
    try:
        decodes = record_decodes(monkeypatch)
        both = asyncio.run(together(engine, COPYING, LONG))
    finally:
        engine.close()
    assert any(len(set(batch)) == 2 for batch in decodes)  # one llama_decode held both
    assert all(result.error is None for _, result in both)
    assert all(out != solo_out for (out, _), solo_out in zip(both, alone, strict=True))


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
