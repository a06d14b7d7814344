"""LlamaEngine on the real tiny gpt-oss GGUF: stops, limits, cancellation, KV reuse, timings."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp.llama_cpp as lc
import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.contracts.directives import Allow, Directive, SteeringStats
from server.contracts.errors import EngineUnavailable
from server.contracts.transcript import ToolChoice
from server.engine.base import EngineConfig, EngineResult, SamplingParams, StopReason
from server.engine.batch import Batch
from server.engine.channel import TokenChannel
from server.engine.llama import LlamaEngine
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.sampling.vocab_trie import trie_build
from server.engine.scheduler import Scheduler
from server.harmony.steering import plan_steering
from tests.support.engine_runs import GREEDY, STOPS, run, unique_prompt
from tests.support.polling import wait_until


def test_stops_on_return(
    engine: LlamaEngine, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    script = forced.push("<|channel|>final<|message|>Done.<|return|><|start|>assistant")
    tokens, result = run(engine, unique_prompt(encoding, "stop"), GREEDY)
    assert tokens == script[: script.index(200002) + 1]
    assert result.stop_reason is StopReason.STOP_TOKEN
    assert result.stop_token == 200002
    assert result.usage.completion_tokens == len(tokens)


def test_stops_on_call_not_on_end(
    engine: LlamaEngine, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    script = forced.push(
        "<|channel|>analysis<|message|>Need ls.<|end|><|start|>assistant<|channel|>commentary"
        ' to=functions.ls <|constrain|>json<|message|>{"dir":"."}<|call|>'
    )
    params = SamplingParams(max_tokens=100, temperature=0.0, stop_tokens=STOPS)
    tokens, result = run(engine, unique_prompt(encoding, "call"), params)
    assert tokens == script
    assert 200007 in tokens  # <|end|> did not stop generation
    assert result.stop_token == 200012


def test_max_tokens(engine: LlamaEngine, encoding: HarmonyEncoding) -> None:
    params = SamplingParams(max_tokens=5, temperature=0.0, stop_tokens=frozenset())
    tokens, result = run(engine, unique_prompt(encoding, "limit"), params)
    assert len(tokens) == 5
    assert result.stop_reason is StopReason.MAX_TOKENS


def test_cancellation_mid_generation(engine: LlamaEngine, encoding: HarmonyEncoding) -> None:
    params = SamplingParams(max_tokens=3000, temperature=1.0, seed=3, stop_tokens=frozenset())

    async def cancel_after_some() -> tuple[int, EngineResult]:
        stream = engine.submit(unique_prompt(encoding, "cancel"), params)
        received = 0
        async for chunk in stream:
            received += len(chunk)
            if received >= 5:
                stream.cancel()
        return received, stream.result

    received, result = asyncio.run(cancel_after_some())
    assert result.stop_reason is StopReason.CANCELLED
    assert 5 <= result.usage.completion_tokens < 3000
    assert received == result.usage.completion_tokens
    tokens, after = run(engine, unique_prompt(encoding, "after cancel"), GREEDY)
    assert after.stop_reason is StopReason.MAX_TOKENS
    assert len(tokens) == GREEDY.max_tokens


def test_extension_evaluates_only_new_tokens(
    engine: LlamaEngine, forced: ForcedScript, encoding: HarmonyEncoding
) -> None:
    prompt = unique_prompt(encoding, "What is in this directory?")
    generated = forced.push(
        '<|channel|>commentary to=functions.ls <|constrain|>json<|message|>{"dir":"."}<|call|>'
    )
    tokens, first = run(engine, prompt, GREEDY.__class__(50, 0.0, stop_tokens=STOPS))
    assert tokens == generated
    assert first.usage.cached_tokens == 0
    assert first.usage.evaluated_tokens == len(prompt)
    new = encoding.encode(
        "<|start|>functions.ls to=assistant<|channel|>commentary<|message|>a.txt b.txt<|end|>"
        "<|start|>assistant",
        allowed_special="all",
    )
    _, second = run(engine, prompt + tokens + new, GREEDY)
    # the last sampled token was never evaluated, so it is evaluated with the new ones
    assert second.usage.cached_tokens == len(prompt) + len(tokens) - 1
    assert second.usage.evaluated_tokens == len(new) + 1
    assert second.usage.prompt_tokens == len(prompt) + len(tokens) + len(new)


def test_identical_prompt_reevaluates_one_token(
    engine: LlamaEngine, encoding: HarmonyEncoding
) -> None:
    prompt = unique_prompt(encoding, "same again")
    run(engine, prompt, GREEDY)
    _, again = run(engine, prompt, GREEDY)
    assert again.usage.cached_tokens == len(prompt) - 1
    assert again.usage.evaluated_tokens == 1


def test_greedy_output_same_with_and_without_reused_cache(
    tiny_gguf: Path, encoding: HarmonyEncoding
) -> None:
    # engines of their own: other conversations' cells in a shared cache change the order in
    # which attention sums (masked cells add exact zeros), which can flip a random-weight argmax
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2)
    prompt = unique_prompt(encoding, "Tell me a story about caches.")
    warm_engine = LlamaEngine(config)
    try:
        first, _ = run(warm_engine, prompt, GREEDY)
        extended = prompt + first + encoding.encode(" More, please.")
        warm, warm_result = run(warm_engine, extended, GREEDY)
    finally:
        warm_engine.close()
    assert warm_result.usage.cached_tokens == len(prompt) + len(first) - 1
    cold_engine = LlamaEngine(config)
    try:
        cold, cold_result = run(cold_engine, extended, GREEDY)
    finally:
        cold_engine.close()
    assert cold_result.usage.cached_tokens == 0
    assert warm == cold


def test_prompt_longer_than_context_is_an_error(engine: LlamaEngine) -> None:
    tokens, result = run(engine, [1000] * (engine.info.n_ctx + 1), GREEDY)
    assert tokens == []
    assert result.stop_reason is StopReason.ERROR
    assert "does not fit" in (result.error or "")


def test_generation_stops_when_context_is_full(tiny_gguf: Path, encoding: HarmonyEncoding) -> None:
    small = LlamaEngine(EngineConfig(model_path=str(tiny_gguf), n_ctx=256, n_threads=2))
    try:
        prompt = unique_prompt(encoding, "fill")
        params = SamplingParams(max_tokens=10_000, temperature=0.0, stop_tokens=frozenset())
        tokens, result = run(small, prompt, params)
    finally:
        small.close()
    assert result.stop_reason is StopReason.CONTEXT_FULL
    assert len(prompt) + len(tokens) == small.info.n_ctx


@pytest.mark.parametrize("swa_full", [True, False])
def test_far_rollback_respects_the_sliding_window(
    tiny_gguf: Path, encoding: HarmonyEncoding, swa_full: bool
) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=2048, n_threads=2, swa_full=swa_full)
    engine = LlamaEngine(config)
    rng = random.Random(7)
    shared = [rng.randrange(1000, 100000) for _ in range(50)]
    # long enough that the windowed cache (n_swa + n_ubatch cells, padded) has to evict
    long_tail = [rng.randrange(1000, 100000) for _ in range(1500)]
    other_tail = [rng.randrange(1000, 100000) for _ in range(20)]
    try:
        run(engine, shared + long_tail, GREEDY)
        rolled_back, result = run(engine, shared + other_tail, GREEDY)
    finally:
        engine.close()
    # a full-size SWA cache keeps every position; a windowed one has lost the shared prefix
    assert result.usage.cached_tokens == (len(shared) if swa_full else 0)
    fresh = LlamaEngine(config)
    try:
        expected, _ = run(fresh, shared + other_tail, GREEDY)
    finally:
        fresh.close()
    # a lost window would change the output at once; later tokens may drift apart numerically
    # (the prefix was evaluated in other batch shapes than the fresh run's)
    assert rolled_back[:4] == expected[:4]


def test_timings_are_measured(engine: LlamaEngine, encoding: HarmonyEncoding) -> None:
    _, result = run(engine, unique_prompt(encoding, "timings"), GREEDY)
    timings = result.timings
    assert timings.evaluated_tokens == result.usage.evaluated_tokens > 0
    assert timings.prefill_s > 0
    assert timings.prefill_tokens_per_s > 0
    assert timings.decode_tokens_per_s > 0
    assert timings.ttft_s >= timings.prefill_s
    assert timings.completion_tokens == GREEDY.max_tokens


class AllowFirst:
    """A steering that allows only `allowed` for the first token and leaves the rest alone."""

    def __init__(self, allowed: tuple[int, ...]) -> None:
        self.allowed = allowed
        self.accepted: list[int] = []

    def next(self) -> Directive:
        return None if self.accepted else Allow(self.allowed)

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def likely(self) -> tuple[int, ...]:
        return ()


def test_counts_where_steering_overrode_the_model(
    engine: LlamaEngine, encoding: HarmonyEncoding
) -> None:
    prompt = unique_prompt(encoding, "overrides")
    one = SamplingParams(max_tokens=1, temperature=0.0, stop_tokens=STOPS)
    (top,), free = run(engine, prompt, one)  # greedy: the model's most likely token
    assert free.steering == SteeringStats()
    other = top + 1 if top < 1000 else top - 1
    tokens, agreed = run(engine, prompt, one, AllowFirst((other, top)))
    assert tokens == [top]
    assert agreed.steering == SteeringStats(choices=1, overrides=0)
    others = (other, other + 1 if other + 1 != top else other + 2)
    tokens, overruled = run(engine, prompt, one, AllowFirst(others))
    assert tokens[0] in others
    assert overruled.steering == SteeringStats(choices=1, overrides=1)
    # one token allowed leaves the model no choice: emitted without its logits, not counted
    tokens, forced = run(engine, prompt, one, AllowFirst((other,)))
    assert tokens == [other]
    assert forced.steering == SteeringStats()


def test_a_closed_engine_refuses_work_with_a_clear_error(tiny_gguf: Path) -> None:
    """After close(): submit raises (it used to queue a job no thread would ever take, and the
    stream waited forever), and so do reads of the vocabulary (freed with the model)."""
    engine = LlamaEngine(EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=2))
    assert engine.token_text(200002) == "<|return|>"
    engine.close()

    async def submit() -> list[int]:
        stream = engine.submit([200006, 1000], GREEDY)
        return await asyncio.wait_for(_tokens(stream), 10)

    with pytest.raises(EngineUnavailable, match="closed"):
        asyncio.run(submit())
    with pytest.raises(EngineUnavailable, match="closed"):
        engine.token_text(200002)
    with pytest.raises(EngineUnavailable, match="closed"):
        engine.validate_grammar('root ::= "a"')


async def _tokens(stream: AsyncIterable[Sequence[int]]) -> list[int]:
    return [t async for chunk in stream for t in chunk]


@dataclass
class CountedEngine:
    """A scripted engine (speculation off) whose llama_decode calls are recorded: per step, the
    tokens of each part of its batch."""

    engine: LlamaEngine
    script: ForcedScript
    config: EngineConfig
    steps: list[list[int]]


@contextmanager
def counted_engine(
    model: Path, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> Iterator[CountedEngine]:
    steps: list[list[int]] = []
    decode = LlamaContext.decode

    def counted(self: LlamaContext, parts: Sequence[BatchPart], *args: Any) -> list[int]:
        steps.append([len(part.tokens) for part in parts])
        return decode(self, parts, *args)

    monkeypatch.setattr(LlamaContext, "decode", counted)
    script = ForcedScript(encoding)
    config = EngineConfig(model_path=str(model), n_ctx=2048, n_threads=1, speculative="off")
    engine = LlamaEngine(config, sampling_hook=script)
    try:
        yield CountedEngine(engine, script, config, steps)
    finally:
        engine.close()


def assert_continues_as_fresh(counted: CountedEngine, turn: list[int]) -> None:
    """The conversation continues from the cache: a greedy token after the whole turn (its
    stop token as `<|end|>`, then `<|start|>`) is the one a fresh evaluation of the same tokens
    gives."""
    after = [*turn[:-1], 200007, 200006]
    free = SamplingParams(max_tokens=1, temperature=0.0, stop_tokens=STOPS)
    (continued,), _ = run(counted.engine, after, free)
    fresh = LlamaEngine(counted.config)
    try:
        (expected,), _ = run(fresh, after, free)
    finally:
        fresh.close()
    assert continued == expected


def test_tokens_the_steering_forces_share_the_step_of_the_token_before(
    tiny_gguf: Path, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under harmony's steering the header tokens that follow from the one before (`<|message|>`
    after a channel; `<|start|>assistant<|channel|>` after `<|end|>`) are emitted with it and
    evaluated in its step, and the first `<|channel|>` with the prompt's last chunk, followed by
    the header the model most likely picks (`analysis<|message|>`, verified like a draft): a
    reasoning-then-answer turn takes seven steps fewer than its tokens, and gives the same
    tokens, the same way, as one step per token would."""
    with counted_engine(tiny_gguf, encoding, monkeypatch) as counted:
        turn = counted.script.push(
            "<|channel|>analysis<|message|>Plain.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Done.<|return|>"
        )
        prompt = unique_prompt(encoding, "forced ahead")
        plan = plan_steering(encoding, [], ToolChoice())
        params = SamplingParams(max_tokens=64, temperature=0.0, stop_tokens=STOPS)
        tokens, result = run(counted.engine, prompt, params, plan.start())
        assert tokens == turn
        assert result.steering.choices == 2  # analysis, final: the model's picks
        steps = [sum(step) for step in counted.steps]
        assert steps[0] == len(prompt) + 3  # the prompt, <|channel|> and the guess
        generated = steps[1:]  # after the prompt's one step
        assert sum(generated) == len(turn) - 4  # every other token but <|return|>, once
        assert len(generated) == len(turn) - 4 - 4
        assert max(generated) == 4  # <|end|><|start|>assistant<|channel|> in one step


def test_a_first_header_other_than_the_guess_is_picked_as_always(
    tiny_gguf: Path, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guessed `analysis<|message|>` evaluated with the prompt is only a draft: a turn that
    starts with the final channel gets its own tokens, the guess's two cells are dropped (the
    next step evaluates `final<|message|>` where they were), and the KV cache then holds
    exactly the prompt and the emitted tokens: the same logits a plain engine gives."""
    with counted_engine(tiny_gguf, encoding, monkeypatch) as counted:
        turn = counted.script.push("<|channel|>final<|message|>Done here.<|return|>")
        prompt = unique_prompt(encoding, "a final first")
        plan = plan_steering(encoding, [], ToolChoice())
        params = SamplingParams(max_tokens=64, temperature=0.0, stop_tokens=STOPS)
        tokens, result = run(counted.engine, prompt, params, plan.start())
        assert tokens == turn
        assert result.steering.choices == 1  # final: the model's pick, not the guess's
        assert counted.steps[0] == [len(prompt) + 3]  # the guess was evaluated
        assert counted.steps[1] == [2]  # final<|message|>, in the dropped guess's cells
        assert_continues_as_fresh(counted, [*prompt, *turn])


WEATHER = "functions.get_weather"


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        (
            "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>final"
            "<|message|>Ok.<|return|>",
            3,  # the guess, whole
        ),
        (
            '<|channel|>commentary to=functions.get_weather json<|message|>{"city":"Oslo"}<|call|>',
            1,
        ),
        (
            ' to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Oslo"}<|call|>',
            0,
        ),
    ],
    ids=["reasoning", "channel-then-recipient", "recipient-first"],
)
def test_with_tools_the_likely_header_is_evaluated_with_the_prompt(
    tiny_gguf: Path,
    encoding: HarmonyEncoding,
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    accepted: int,
) -> None:
    """Where tools are offered the header may name its recipient before its channel, so the
    steering forces nothing after `<|start|>assistant` (no lead); the likely header
    (`<|channel|>analysis<|message|>`) is still evaluated with the prompt's last chunk as a
    draft: a reasoning turn's first text comes from that step's logits, two steps earlier, and
    any other header gets its own tokens, the guess's cells dropped where it parted from it
    (the cache then gives what a fresh evaluation gives)."""
    with counted_engine(tiny_gguf, encoding, monkeypatch) as counted:
        turn = counted.script.push(text)
        prompt = unique_prompt(encoding, f"tools {accepted}")
        plan = plan_steering(encoding, [WEATHER], ToolChoice())
        params = SamplingParams(max_tokens=64, temperature=0.0, stop_tokens=STOPS)
        tokens, _ = run(counted.engine, prompt, params, plan.start())
        assert tokens == turn
        assert counted.steps[0] == [len(prompt) + 3]  # the prompt and the guessed header
        if accepted == 3:  # the first text came from the prefill's logits
            assert counted.steps[1] == [1]
        assert_continues_as_fresh(counted, [*prompt, *turn])


@pytest.mark.parametrize("tools", [[], [WEATHER]], ids=["chat", "tools"])
def test_the_stream_says_which_tokens_likely_come_first(
    tiny_gguf: Path, encoding: HarmonyEncoding, tools: list[str]
) -> None:
    """Once the engine started a generation, its stream holds the header it most likely
    starts with (the lead the steering forces, then the guess), for the consumer to parse
    ahead. Chat and tools alike: `<|channel|>analysis<|message|>`."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=2048, n_threads=1, speculative="off")
    engine = LlamaEngine(config)

    async def likely() -> tuple[int, ...]:
        plan = plan_steering(encoding, tools, ToolChoice())
        stream = engine.submit(unique_prompt(encoding, f"likely {tools}"), GREEDY, plan.start())
        async for _ in stream:
            pass
        return stream.likely

    try:
        likely_tokens = asyncio.run(likely())
    finally:
        engine.close()
    header = encoding.encode("<|channel|>analysis<|message|>", allowed_special="all")
    assert likely_tokens == tuple(header)


def test_with_tools_a_one_token_generation_leaves_no_guessed_cells(
    tiny_gguf: Path, encoding: HarmonyEncoding
) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=2048, n_threads=1, speculative="off")
    engine = LlamaEngine(config)
    try:
        prompt = unique_prompt(encoding, "one token, tools")
        plan = plan_steering(encoding, [WEATHER], ToolChoice())
        one = SamplingParams(max_tokens=1, temperature=0.0, stop_tokens=STOPS)
        tokens, _ = run(engine, prompt, one, plan.start())
        assert len(tokens) == 1  # picked from the prompt's logits: never evaluated
        scheduler, ctx = engine._scheduler, engine._ctx
        assert scheduler is not None
        assert ctx is not None
        # the token ended the generation (its result sent) before the engine thread dropped
        # the guess's cells in the same step: read the slots once that step is over
        slot = next(slot for slot in scheduler.slots if slot.tokens)
        wait_until(lambda: slot.tokens == prompt and ctx.seq_end(slot.seq_id) == len(prompt), 10)
        assert [slot.tokens for slot in scheduler.slots if slot.tokens] == [prompt]
    finally:
        engine.close()


def test_a_generation_the_lead_ends_leaves_no_guessed_cells(
    tiny_gguf: Path, encoding: HarmonyEncoding
) -> None:
    """max_tokens=1 ends the generation with the lead (`<|channel|>`), before any pick: the
    guessed header evaluated with the prompt leaves the sequence, which holds the prompt and
    the emitted token only."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=2048, n_threads=1, speculative="off")
    engine = LlamaEngine(config)
    try:
        prompt = unique_prompt(encoding, "one token")
        plan = plan_steering(encoding, [], ToolChoice())
        one = SamplingParams(max_tokens=1, temperature=0.0, stop_tokens=STOPS)
        tokens, _ = run(engine, prompt, one, plan.start())
        assert tokens == [200005]  # <|channel|>
        scheduler = engine._scheduler
        assert scheduler is not None
        held = [slot.tokens for slot in scheduler.slots if slot.tokens]
        assert held == [[*prompt, 200005]]
        ctx = engine._ctx
        assert ctx is not None
        seq = next(slot.seq_id for slot in scheduler.slots if slot.tokens)
        assert ctx.seq_end(seq) == len(prompt) + 1
    finally:
        engine.close()


def test_the_vocabulary_trie_is_built_while_no_generation_runs(
    tiny_gguf: Path, encoding: HarmonyEncoding
) -> None:
    """The trie the first grammar-constrained token needs is built by the idle engine thread a
    slice at a time, without a request asking for it; a job submitted meanwhile is served."""
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=512, n_threads=1, speculative="off")
    engine = LlamaEngine(config)
    try:
        assert engine._ctx is not None
        build = trie_build(engine._ctx)
        tokens, _ = run(engine, unique_prompt(encoding, "idle"), GREEDY)
        assert tokens
        deadline = time.monotonic() + 120
        while not build.done and time.monotonic() < deadline:
            time.sleep(0.05)
        assert build.done
        assert build.slices > 400  # a slice at a time: 201,088 tokens, 512 a slice
    finally:
        engine.close()


def test_a_generation_is_announced_once_with_its_batch_ready_just_before_llama_decode(
    engine: LlamaEngine, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`TokenChannel.begin` wakes the consumer to make its opening events while the prompt is
    evaluated: it comes after the batch's filling, right before llama_decode (which holds no
    GIL), so the woken loop does not take the GIL from the engine thread's last Python."""
    calls: list[str] = []
    fill, begin, decode = Batch.fill, TokenChannel.begin, lc.llama_decode

    def filled(self: Batch, parts: Sequence[BatchPart]) -> list[int]:
        calls.append("fill")
        return fill(self, parts)

    def begun(self: TokenChannel) -> None:
        calls.append("begin")
        begin(self)

    def decoded(*args: Any) -> int:
        calls.append("decode")
        return int(decode(*args))

    monkeypatch.setattr(Batch, "fill", filled)
    monkeypatch.setattr(TokenChannel, "begin", begun)
    monkeypatch.setattr(lc, "llama_decode", decoded)
    params = SamplingParams(max_tokens=4, temperature=0.0, stop_tokens=frozenset())
    tokens, _ = run(engine, unique_prompt(encoding, "announced"), params)
    assert len(tokens) == 4
    assert calls[:3] == ["fill", "begin", "decode"]
    assert calls.count("begin") == 1
    assert calls.count("fill") == calls.count("decode") > 1


def test_an_engine_thread_stopped_by_an_error_ends_its_requests_and_refuses_more(
    tiny_gguf: Path, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception out of a scheduler step (a bug) ends the engine thread: the requests it had
    end with the error, the engine says why it cannot generate (`failure`: /health and
    /v1/models show it), and later requests are refused at once instead of waiting in a queue
    nothing reads."""
    engine = LlamaEngine(EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=1))
    try:

        def broken(self: Scheduler) -> None:
            raise RuntimeError("a step that fails")

        monkeypatch.setattr(Scheduler, "step", broken)
        prompt = unique_prompt(encoding, "a broken step")
        tokens, result = run(engine, prompt, GREEDY)
        assert tokens == []
        assert result.stop_reason is StopReason.ERROR
        assert result.error is not None
        assert "a step that fails" in result.error
        assert engine.failure is not None
        assert "a step that fails" in engine.failure
        with pytest.raises(EngineUnavailable, match="a step that fails"):
            run(engine, prompt, GREEDY)
    finally:
        engine.close()


def test_the_vocabulary_is_refused_once_an_internal_error_freed_the_model(
    tiny_gguf: Path, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine thread frees the model and the context when an internal error ends it; a
    grammar check or a token text asked afterwards is refused (EngineUnavailable, with the
    failure) instead of reading the freed vocabulary."""
    engine = LlamaEngine(EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=1))
    try:
        assert engine.token_text(0) != ""  # the vocabulary is read while the model is loaded

        def broken(self: Scheduler) -> None:
            raise RuntimeError("a step that fails")

        monkeypatch.setattr(Scheduler, "step", broken)
        _, result = run(engine, unique_prompt(encoding, "freed"), GREEDY)
        assert result.stop_reason is StopReason.ERROR
        engine._thread.join(30)  # the thread's end: the model is freed by then
        assert not engine._thread.is_alive()
        with pytest.raises(EngineUnavailable, match="a step that fails"):
            engine.token_text(0)
        with pytest.raises(EngineUnavailable, match="a step that fails"):
            engine.validate_grammar('root ::= "a"')
    finally:
        engine.close()
