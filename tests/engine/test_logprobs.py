"""Log-probabilities from the real engine on the tiny model: sampled tokens, prompt tokens
(echo), and the two paths agreeing on the same positions."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding

from server.contracts.events import TokenLogprob
from server.engine.base import EngineResult, SamplingParams, StopReason
from server.engine.llama import LlamaEngine
from server.engine.plan import PROMPT_LOGPROBS_CHUNK
from tests.support.engine_runs import ACROSS_PATHS, STOPS, unique_prompt


def run(
    engine: LlamaEngine, prompt: Sequence[int], params: SamplingParams
) -> tuple[list[int], list[TokenLogprob | None], EngineResult]:
    async def collect() -> tuple[list[int], list[TokenLogprob | None], EngineResult]:
        stream = engine.submit(prompt, params)
        tokens: list[int] = []
        scores: list[TokenLogprob | None] = []
        async for chunk in stream:
            tokens += chunk
            scores += chunk.logprobs
        return tokens, scores, stream.result

    return asyncio.run(collect())


def test_sampled_tokens_carry_their_logprob_and_alternatives(
    engine: LlamaEngine, encoding: HarmonyEncoding
) -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, stop_tokens=STOPS, logprobs=5)
    tokens, scores, _ = run(engine, unique_prompt(encoding, "greedy logprobs"), params)
    assert len(scores) == len(tokens) > 0
    for token, score in zip(tokens, scores, strict=True):
        assert score is not None
        assert score.token == token
        assert len(score.top) == 5
        values = [lp for _, lp in score.top]
        assert values == sorted(values, reverse=True)
        assert score.top[0][0] == token  # greedy: the argmax is what was drawn
        assert math.isclose(score.logprob, values[0])
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-9
        assert score.logprob <= 0.0


def test_no_logprobs_unless_asked(engine: LlamaEngine, encoding: HarmonyEncoding) -> None:
    params = SamplingParams(max_tokens=3, temperature=0.0, stop_tokens=STOPS)
    tokens, scores, result = run(engine, unique_prompt(encoding, "no logprobs"), params)
    assert tokens
    assert scores == []
    assert result.prompt_logprobs == ()


def test_prompt_logprobs_equal_the_sampled_tokens_logprobs(
    engine: LlamaEngine, encoding: HarmonyEncoding
) -> None:
    """Sample at temperature 1 with logprobs, then score prompt + sampled tokens as a prompt
    (max_tokens 0): the scoring path gives each sampled token the logprob it was reported
    with, and the prompt's tokens the same values whether its KV state was cached or not."""
    prompt = unique_prompt(encoding, "score me")
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7, stop_tokens=STOPS, logprobs=3)
    tokens, scores, _ = run(engine, prompt, params)
    whole = [*prompt, *tokens]
    echo = SamplingParams(max_tokens=0, logprobs=3, prompt_logprobs=True)
    generated, _, result = run(engine, whole, echo)
    assert generated == []
    assert result.stop_reason is StopReason.MAX_TOKENS
    assert len(result.prompt_logprobs) == len(whole)
    assert result.prompt_logprobs[0] is None
    for position, score in enumerate(result.prompt_logprobs[1:], start=1):
        assert score is not None
        assert score.token == whole[position]
    for sampled, scored in zip(scores, result.prompt_logprobs[len(prompt) :], strict=True):
        assert sampled is not None
        assert scored is not None
        assert abs(sampled.logprob - scored.logprob) < ACROSS_PATHS
    # the same prompt again: its KV state is cached now, and is not reused for scoring
    _, _, again = run(engine, whole, echo)
    assert again.usage.cached_tokens == 0
    assert again.prompt_logprobs == result.prompt_logprobs


def test_prompt_logprobs_span_several_chunks(
    engine: LlamaEngine, encoding: HarmonyEncoding
) -> None:
    prompt = (unique_prompt(encoding, "long ") * 4)[: PROMPT_LOGPROBS_CHUNK * 2 + 5]
    echo = SamplingParams(max_tokens=1, temperature=0.0, logprobs=1, prompt_logprobs=True)
    tokens, scores, result = run(engine, prompt, echo)
    assert len(tokens) == 1
    assert scores[0] is not None
    assert len(result.prompt_logprobs) == len(prompt)
    assert all(s is not None and len(s.top) == 1 for s in result.prompt_logprobs[1:])
