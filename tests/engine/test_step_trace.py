"""The step trace (GPT_OSS_STEP_TRACE) on the tiny model, and the logits buffer reserved alike.

A greedy generation with speculation on, forced to copy its prompt so that drafts are verified
and some rejected: one JSON line per step with its parts, drafts, emitted tokens, the buffer's
rows and the sequence's span after the step; with LLAMA_KV_CACHE_DEBUG=1, llama.cpp's cell
counters (the cells attention reads never exceed the cells in use: rollbacks leave the cells
contiguous). And every mode reserves the same logits buffer at load.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.engine.base import EngineConfig, SamplingParams
from server.engine.llama import LlamaEngine
from server.engine.step_trace import ENV

pytestmark = pytest.mark.slow  # an engine, real decoding


def generate(engine: LlamaEngine, prompt: list[int], limit: int) -> list[int]:
    async def go() -> list[int]:
        stream = engine.submit(prompt, SamplingParams(max_tokens=limit, temperature=0.0))
        return [t async for chunk in stream for t in chunk]

    return asyncio.run(go())


def test_each_step_is_traced_with_its_counters(
    tiny_gguf: Path, encoding: HarmonyEncoding, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv(ENV, str(trace))
    monkeypatch.setenv("LLAMA_KV_CACHE_DEBUG", "1")
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu " * 3
    prompt = encoding.encode(
        f"<|start|>user<|message|>{text}<|end|><|start|>assistant", allowed_special="all"
    )
    # the reply copies the prompt's text, then leaves it: drafts confirmed, then rejected
    script = encoding.encode(f"{text[:120]} omega omega", allowed_special="all")
    hook = ForcedScript(encoding)
    hook.push_tokens(script)
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=2048, n_threads=2, speculative="on")
    engine = LlamaEngine(config, sampling_hook=hook)
    try:
        tokens = generate(engine, prompt, len(script))
    finally:
        engine.close()
    assert tokens == script
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert steps
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert sum(s["emitted"] for s in steps) == len(script)
    assert any(s["drafted"] > 0 for s in steps)
    assert sum(s["parts"][0][1] for s in steps) >= len(prompt) + len(script) - 1
    for step in steps:
        assert step["logits_rows"] == 1 + config.draft_max  # reserved at load
        low, high = step["seqs"]["0"]
        assert low == 0
        assert high + 1 >= step["parts"][0][1]
        for cache in step["kv"]:  # one line per cache (the full and the sliding-window layers)
            assert cache["n"] == cache["used"]  # contiguous: no cell read that is not in use


@pytest.mark.parametrize("mode", ["off", "on"])
def test_every_mode_reserves_the_same_logits_buffer(tiny_gguf: Path, mode: str) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2, speculative=mode)
    engine = LlamaEngine(config)
    try:
        assert engine._ctx is not None
        assert engine._ctx.outputs_reserved == 1 + config.draft_max
        assert engine._ctx.seq_span(0) == [-1, -1]  # the reservation left nothing behind
    finally:
        engine.close()
