"""Running the real engine directly from tests: a prompt and sampling parameters in, the sampled
tokens and the result out; prompts no other test has cached; the stop tokens of harmony."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from openai_harmony import HarmonyEncoding

from server.contracts.directives import Steering
from server.contracts.transcript import Transcript, UserMessage
from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.llama import LlamaEngine
from server.harmony.render import render

T = TypeVar("T")

STOPS = frozenset({200002, 200012})
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, stop_tokens=STOPS)


def run(
    engine: LlamaEngine,
    prompt: Sequence[int],
    params: SamplingParams,
    steering: Steering | None = None,
) -> tuple[list[int], EngineResult]:
    async def collect() -> tuple[list[int], EngineResult]:
        stream = engine.submit(prompt, params, steering)
        tokens = [t async for chunk in stream for t in chunk]
        return tokens, stream.result

    return asyncio.run(collect())


def with_speculation_on_and_off(
    config: EngineConfig, work: Callable[[LlamaEngine], T]
) -> dict[str, T]:
    """`work` on an engine of `config` with speculation on, then on one with it off (each
    engine closed after its run): {"on": ..., "off": ...}."""
    done: dict[str, T] = {}
    for mode in ("on", "off"):
        engine = LlamaEngine(dataclasses.replace(config, speculative=mode))
        try:
            done[mode] = work(engine)
        finally:
            engine.close()
    return done


def unique_prompt(encoding: HarmonyEncoding, text: str) -> list[int]:
    """A prompt whose first token differs from anything cached by other tests."""
    nonce = random.Random(text).randrange(1000, 100000)
    transcript = Transcript(items=(UserMessage(f"{text}"),), instructions=f"Run {nonce}.")
    return [nonce, *render(encoding, transcript)]


# llama.cpp's kernels for a one-token step and for a batch of positions round differently (on
# the tiny model's random weights, logits differ by up to a few hundredths): the two paths agree
# to this many nats; the same path gives the same values exactly.
ACROSS_PATHS = 0.1
