"""Speculative decoding on the real tiny gpt-oss: the output is the non-speculative output.

Two engines on one model, speculation on and off: greedy output is identical token for token
(free text, forced copies, harmony's steering with tool-call and answer grammars); sampled
output has the same distribution at every position (chi-square over seeds, with drafts that are
partly wrong), and a deliberately biased acceptance rule fails that test; a rejected draft leaves
the KV cache as if it had never been decoded, sliding-window layers included.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai_harmony import HarmonyEncoding

from devkit.forced import ForcedScript
from server.contracts.events import TokenLogprob
from server.contracts.transcript import ToolChoice, Transcript, UserMessage
from server.engine import apply as scheduler
from server.engine.base import EngineConfig, EngineResult, SamplingParams
from server.engine.job import Job
from server.engine.llama import LlamaEngine
from server.engine.llama_context import BatchPart, LlamaContext
from server.engine.loading.gpt_oss import SLIDING_WINDOW
from server.engine.scheduler import Scheduler
from server.engine.speculative.drafter import SequenceDrafter
from server.engine.speculative.verify_cost import measure_verify_cost, start_speculation
from server.harmony.render import render
from server.harmony.steering import plan_steering
from tests.support.chi_square import homogeneity
from tests.support.engine_runs import STOPS, run, with_speculation_on_and_off


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100000) for _ in range(n)]


class Pair:
    """The same model twice: speculation on and off, each with its own forced scripts."""

    def __init__(self, model: Path, encoding: HarmonyEncoding) -> None:
        self.scripts = {mode: ForcedScript(encoding) for mode in ("on", "off")}
        self.engines = {
            mode: LlamaEngine(
                EngineConfig(model_path=str(model), n_ctx=4096, n_threads=1, speculative=mode),
                sampling_hook=self.scripts[mode],
            )
            for mode in ("on", "off")
        }

    def both(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        script: Sequence[int] = (),
        plan: Any = None,
    ) -> tuple[list[int], list[int], EngineResult]:
        """(output off, output on, the speculative run's result)."""
        outputs: dict[str, tuple[list[int], EngineResult]] = {}
        for mode in ("off", "on"):
            if script:
                self.scripts[mode].push_tokens(script)
            steering = plan.start() if plan is not None else None
            outputs[mode] = run(self.engines[mode], prompt, params, steering)
        return outputs["off"][0], outputs["on"][0], outputs["on"][1]

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()


@pytest.fixture(scope="module")
def pair(tiny_gguf: Path, encoding: HarmonyEncoding) -> Iterator[Pair]:
    pair = Pair(tiny_gguf, encoding)
    yield pair
    pair.close()


def greedy_comparison(pair: Pair, seeds: range) -> tuple[list[int], int, int]:
    """Greedy copies, speculation on and off: the prompts whose outputs differ, the draft
    tokens and the accepted ones."""
    greedy = SamplingParams(max_tokens=48, temperature=0.0)
    differ = []
    drafted = accepted = 0
    for seed in seeds:
        body = tokens(seed, 40)
        prompt = [seed + 7, *body, *body[:20], *tokens(seed + 100, 10), *body[:3]]
        # the first tokens copy the prompt (forced), then the model goes on by itself
        script = body[3:20] if seed % 2 else []
        off, on, result = pair.both(prompt, greedy, script)
        if on != off:
            differ.append(seed)
        drafted += result.timings.draft_n
        accepted += result.timings.draft_n_accepted
    return differ, drafted, accepted


def test_greedy_output_is_identical_over_many_prompts(pair: Pair) -> None:
    differ, drafted, accepted = greedy_comparison(pair, range(24))
    assert differ == []
    assert accepted > 100  # the copies were drafted and confirmed
    assert drafted > accepted  # and some drafts were rejected (their cells dropped)


def test_an_off_by_one_rollback_fails_the_comparison(
    tiny_gguf: Path, encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control of the test above: a rollback that drops one cell too few (the
    first rejected draft token stays in the cache, before the token that replaced it) changes
    the output. A pair of its own: the caches it leaves are wrong."""
    monkeypatch.setattr(scheduler, "rejected_cells", lambda n_draft, kept: n_draft - kept - 1)
    broken = Pair(tiny_gguf, encoding)
    try:
        differ, drafted, accepted = greedy_comparison(broken, range(8))
    finally:
        broken.close()
    assert drafted > accepted > 0
    assert differ  # the comparison above would fail


CALL = "<|channel|>commentary to=functions.open_file <|constrain|>json<|message|>"


def test_greedy_output_is_identical_under_harmony_steering_and_grammars(
    pair: Pair, encoding: HarmonyEncoding
) -> None:
    path = "/srv/app/handlers/payment_gateway.py"
    call_grammar = r'root ::= "{\"path\":\"" [a-z/_.]+ "\",\"line\":" [0-9]+ "}"'
    answer_grammar = r'root ::= "The file " [a-z/_. ]+ "."'
    plan = plan_steering(
        encoding,
        ["functions.open_file"],
        ToolChoice(),
        call_grammars={"functions.open_file": call_grammar},
        final_grammar=answer_grammar,
    )
    greedy = SamplingParams(max_tokens=64, temperature=0.0, stop_tokens=STOPS)
    text = f"Open {path} at line 12, then {path} again: {path}."
    drafted = 0
    for i, script in enumerate(
        (
            f'{CALL}{{"path":"{path[:9]}',
            f'{CALL}{{"path":"{path}","line":1',
            f"<|channel|>analysis<|message|>Open {path} at line 12, then {path}",
            f"<|channel|>final<|message|>The file {path[:12]}",
            "<|channel|>",
        )
    ):
        transcript = Transcript(items=(UserMessage(f"{i}: {text}"),))
        prompt = render(encoding, transcript)
        forced = encoding.encode(script, allowed_special="all")
        off, on, result = pair.both(prompt, greedy, forced, plan)
        assert on == off, script
        assert on[: len(forced)] == forced
        drafted += result.timings.draft_n
    assert drafted > 0


def test_sampled_output_is_identical_for_a_seed(pair: Pair) -> None:
    """The verify draws exactly the tokens a plain step draws, in the same order."""
    body = tokens(5, 30)
    prompt = [3, *body, *body[:4]]
    for seed in range(6):
        params = SamplingParams(max_tokens=24, temperature=0.3, seed=seed)
        off, on, _ = pair.both(prompt, params, body[4:14])
        assert on == off


def test_drafts_stop_at_max_tokens_and_the_cache_continues(pair: Pair) -> None:
    body = tokens(9, 50)
    prompt = [11, *body, *body[:3]]
    params = SamplingParams(max_tokens=10, temperature=0.0)
    off, on, result = pair.both(prompt, params, body[3:40])
    assert on == off == body[3:13]
    assert result.usage.completion_tokens == 10
    # the next turn continues the conversation: only its new tokens are evaluated
    follow = [*prompt, *on, *tokens(10, 5)]
    off2, on2, result2 = pair.both(follow, SamplingParams(max_tokens=12, temperature=0.0))
    assert on2 == off2
    assert result2.usage.evaluated_tokens == 6


def test_a_request_can_decline_speculation(pair: Pair) -> None:
    """`speculate=False` on an engine with speculation: no drafts, the same tokens (what the
    speculative benchmark compares, request by request, on one engine)."""
    body = tokens(12, 40)
    prompt = [13, *body, *body[:3]]
    engine, script = pair.engines["on"], pair.scripts["on"]
    results = {}
    for speculate in (True, False):
        script.push_tokens(body[3:30])
        params = SamplingParams(max_tokens=27, temperature=0.0, speculate=speculate)
        results[speculate] = run(engine, [20 + speculate, *prompt], params)
    assert results[True][0] == results[False][0] == body[3:30]
    assert results[True][1].timings.draft_n_accepted > 0
    assert results[False][1].timings.draft_n == 0


def test_rejected_drafts_leave_the_cache_as_never_decoded(tiny_gguf: Path) -> None:
    """Seq 0 decodes a draft and drops it; seq 1 never saw it: the next logits agree, beyond
    the sliding window too."""
    ctx = LlamaContext(EngineConfig(model_path=str(tiny_gguf), n_ctx=2048, n_slots=2, n_threads=1))
    try:
        prefix = tokens(20, 3 * SLIDING_WINDOW)
        end = len(prefix)
        ctx.decode([BatchPart(0, prefix, 0, False), BatchPart(1, prefix, 0, False)])
        for round_ in range(3):
            draft = tokens(30 + round_, 12)
            ctx.decode([BatchPart(0, [prefix[-1], *draft], end, True, 13)])
            assert ctx.truncate(0, end) == end
        nxt = tokens(40, 4)
        (a,) = ctx.decode([BatchPart(0, nxt, end, True)])
        got = ctx.logits(a).copy()
        (b,) = ctx.decode([BatchPart(1, nxt, end, True)])
        want = ctx.logits(b).copy()
        assert int(np.argmax(got)) == int(np.argmax(want))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    finally:
        ctx.close()


def test_speculation_is_off_without_a_full_size_sliding_window_cache(tiny_gguf: Path) -> None:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=1, swa_full=False)
    ctx = LlamaContext(config)
    try:
        assert ctx.n_swa > 0
        assert start_speculation(ctx, config) is None
        on = EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=1, speculative="on")
        assert start_speculation(ctx, on) is not None
        assert start_speculation(ctx, EngineConfig(model_path="x", speculative="off")) is None
    finally:
        ctx.close()


class Recording:
    """A context whose decodes are recorded (the parts of each)."""

    def __init__(self, ctx: LlamaContext) -> None:
        self.ctx = ctx
        self.n_swa = ctx.n_swa
        self.parts: list[BatchPart] = []
        self.read: list[int] = []

    def decode(self, parts: Sequence[BatchPart]) -> list[int]:
        self.parts.extend(parts)
        return self.ctx.decode(parts)

    def logits(self, index: int) -> Any:
        self.read.append(index)
        return self.ctx.logits(index)

    def truncate(self, seq_id: int, n_keep: int) -> int:
        return self.ctx.truncate(seq_id, n_keep)


def test_each_timed_verify_keeps_the_logits_of_all_its_tokens(tiny_gguf: Path) -> None:
    """The verify cost of k drafts is the time of 1 + k tokens with 1 + k output rows, up to
    --draft-max 64 (the context the timed steps follow is 64 tokens long)."""
    ctx = LlamaContext(EngineConfig(model_path=str(tiny_gguf), n_ctx=1024, n_threads=1))
    try:
        recording = Recording(ctx)
        cost, fastest = measure_verify_cost(recording, 0, 64, rounds=1, ks=(0, 16, 64))
        timed = [part for part in recording.parts if part.start_pos > 0]
        assert {len(part.tokens) for part in timed} == {1, 17, 65}
        assert all(part.outputs == len(part.tokens) and part.logits for part in timed)
        # each timed step waits for its logits (a GPU's llama_decode returns before its end)
        assert sorted(set(recording.read)) == [0, 16, 64]
        assert set(fastest) == {0, 16, 64}
        assert cost.draft_max == 64
        assert ctx.truncate(0, 0) == 0  # the sequence is empty again
    finally:
        ctx.close()


# Sampled output: the distribution at each position, over seeds.

TEMPERATURE = 0.07  # the tiny model's logits are flat; this makes its choices contested
POSITIONS = 5
SEEDS = 600


def positions(engine: LlamaEngine, prompt: list[int], offset: int) -> list[list[int]]:
    """The tokens at each position over SEEDS seeded generations."""
    out: list[list[int]] = [[] for _ in range(POSITIONS)]
    for seed in range(SEEDS):
        params = SamplingParams(max_tokens=POSITIONS, temperature=TEMPERATURE, seed=offset + seed)
        generated, _ = run(engine, prompt, params)
        for i, token in enumerate(generated):
            out[i].append(token)
    return out


def worst_ratio(a: list[list[int]], b: list[list[int]]) -> float:
    """The largest chi-square statistic over its critical value, over the positions (0 where a
    position's pooled draws make one group: one token with nearly all of the mass)."""
    ratios = []
    for x, y in zip(a, b, strict=True):
        pooled = np.bincount(np.asarray(x + y), minlength=max(x + y) + 1).astype(np.float64)
        stat, critical = homogeneity(x, y, pooled / pooled.sum())
        ratios.append(stat / critical)
    return max(ratios)


def likeliest_drafts(n_prompt: int, likely: list[int], wrong: list[int]) -> Any:
    """A drafter that proposes the greedy continuation while the generation follows it, and
    tokens the model does not pick otherwise: drafts right part of the time, by construction."""

    def propose(self: SequenceDrafter, limit: int, banned: frozenset[int]) -> tuple[int, ...]:
        made = self.ngram.tokens[n_prompt:]
        if made == likely[: len(made)]:
            return tuple(likely[len(made) : len(made) + min(limit, 3)])
        return tuple(wrong[: min(limit, 2)])

    return propose


def second_chance(verify: Any) -> Any:
    """A biased rule: a draw that misses the draft gets a second draw, which may accept it
    (the draft's probability p becomes p(2 - p))."""

    def biased(self: Scheduler, job: Job, index: int) -> None:
        assert job.picker is not None
        draft, first, pick = job.draft, index - len(job.draft), job.picker.next_tokens

        def picks(i: int) -> tuple[int, ...]:
            chosen = pick(i)
            j = i - first
            if j < len(draft) and chosen != (draft[j],) and pick(i) == (draft[j],):
                return (draft[j],)
            return chosen

        job.picker.next_tokens = picks  # type: ignore[method-assign,assignment]
        verify(self, job, index)

    return biased


@pytest.mark.slow
def test_sampled_distribution_matches_with_partly_wrong_drafts(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = [17, *tokens(50, 40)]
    likely, _ = run(pair.engines["off"], prompt, SamplingParams(max_tokens=8, temperature=0.0))
    wrong = tokens(51, 4)
    monkeypatch.setattr(SequenceDrafter, "propose", likeliest_drafts(len(prompt), likely, wrong))
    off = positions(pair.engines["off"], prompt, 0)
    on = positions(pair.engines["on"], prompt, 10_000)
    drafted = accepted = 0
    for seed in range(50):  # how often the drafts were right
        params = SamplingParams(max_tokens=POSITIONS, temperature=TEMPERATURE, seed=seed)
        result = run(pair.engines["on"], prompt, params)[1]
        drafted += result.timings.draft_n
        accepted += result.timings.draft_n_accepted
    assert accepted >= 10  # both often: the test exercises acceptance and rollback alike
    assert drafted - accepted >= 10
    assert worst_ratio(off, on) < 1.0
    monkeypatch.setattr(Scheduler, "_pick", second_chance(Scheduler._pick))
    biased = positions(pair.engines["on"], prompt, 20_000)
    assert worst_ratio(off, biased) > 1.0


def test_a_draft_that_finds_no_room_leaves_the_history_exact(
    tiny_gguf: Path, encoding: HarmonyEncoding
) -> None:
    """The cache fills up while a copy is drafted (an idle conversation holds the rest): the
    batch runs again without the draft, and the sequence's token history counts only what was
    decoded, so the generation and the next turn on the same conversation go on."""
    script = ForcedScript(encoding)
    config = EngineConfig(
        model_path=str(tiny_gguf), n_ctx=512, n_slots=2, n_threads=1, speculative="on"
    )
    engine = LlamaEngine(config, sampling_hook=script)
    try:
        greedy = SamplingParams(max_tokens=8, temperature=0.0)
        run(engine, [21, *tokens(60, 200)], greedy)  # idle: ≈208 of the 512 cells
        body = tokens(61, 250)
        prompt = [22, *body, *body[:3]]
        script.push_tokens(body[3:240])  # a copy the drafts follow, past the cells left
        params = SamplingParams(max_tokens=237, temperature=0.0)
        out, result = run(engine, prompt, params)
        assert result.error is None
        assert out == body[3:240]
        assert result.timings.draft_n_accepted > 0
        follow = [*prompt, *out, *tokens(62, 5)]
        out2, result2 = run(engine, follow, SamplingParams(max_tokens=4, temperature=0.0))
        assert result2.error is None
        assert len(out2) == 4
    finally:
        engine.close()


NEAR_TIE = 0.1  # nats between the top two logprobs: batch shapes move margins this much


def always_rejected(self: SequenceDrafter, limit: int, banned: frozenset[int]) -> tuple[int, ...]:
    """Drafts of `draft_max` tokens the tiny model never picks: every step rolls back."""
    return tuple(tokens(len(self.ngram.tokens), self.speculator.draft_max))[:limit]


def beside_long_prefills(
    engine: LlamaEngine, prompt: list[int], max_tokens: int
) -> tuple[list[int], list[TokenLogprob | None], EngineResult]:
    """A greedy generation of `prompt` (with its top-2 logprobs) while prompts of 2100 tokens
    are prefilled one after another beside it: each a new request whose chunks share its
    steps, the idle ones evicted for room, so the cache's cells are reused all over."""

    async def collect() -> tuple[list[int], list[TokenLogprob | None], EngineResult]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2)
        stream = engine.submit(prompt, params)
        done = asyncio.Event()

        async def prefills() -> None:
            i = 0
            while not done.is_set():
                other = [i + 30, *tokens(100 + i, 2100)]
                async for _ in engine.submit(other, SamplingParams(max_tokens=1)):
                    pass
                i += 1

        beside = asyncio.create_task(prefills())
        out: list[int] = []
        scores: list[TokenLogprob | None] = []
        async for chunk in stream:
            out.extend(chunk)
            scores.extend(chunk.logprobs)
        done.set()
        await beside
        return out, scores, stream.result

    return asyncio.run(collect())


@pytest.mark.slow
def test_rejected_drafts_beside_long_prefills_keep_the_sliding_window(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every draft rejected, 2k-token prefills beside it. llama.cpp places a later ubatch's
    cells once the earlier ones have advanced each sequence, and frees a sliding-window cell
    once it is out of its sequence's window as of that advance: a prefill chunk in a later
    ubatch of a drafting step could take cells the drafting sequence's window needs again
    after the rollback. After every rollback the window is whole, and the tokens are those of
    the run without speculation up to near-ties (the two runs' batches differ in shape)."""
    monkeypatch.setattr(SequenceDrafter, "propose", always_rejected)
    pick = Scheduler._pick
    lost: list[int] = []

    def checked(self: Scheduler, job: Job, index: int) -> None:
        pick(self, job, index)
        assert job.slot is not None
        n = len(job.slot.tokens)
        if self._ctx.reusable_prefix(job.slot.seq_id, n) != n:
            lost.append(n)

    monkeypatch.setattr(Scheduler, "_pick", checked)
    prompt = [5, *tokens(1, 150)]
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=4096, n_slots=3, n_threads=1)
    runs = with_speculation_on_and_off(config, lambda e: beside_long_prefills(e, prompt, 240))
    (on, _, result), (off, scores, _) = runs["on"], runs["off"]
    assert result.error is None
    assert result.timings.draft_n > 2000  # every step drafted, and rolled back
    assert not lost, f"the window lost cells after the rollbacks at {lost[:5]}"
    assert len(on) == len(off) == 240
    part = next((i for i, (a, b) in enumerate(zip(on, off, strict=True)) if a != b), None)
    if part is not None:  # the runs part only where the model's top two nearly tie
        score = scores[part]
        assert score is not None
        margin = score.top[0][1] - score.top[1][1]
        assert margin < NEAR_TIE, f"token {part}: {on[part]} != {off[part]} at {margin:.3f} nats"


@pytest.mark.slow
def test_batch_invariant_speculation_beside_long_prefills_is_exact(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run in the batch-invariant mode: the sequence's steps and verifies are decodes of
    its own, so its tokens are exactly those of the run without speculation — no near-tie
    excepted — although every draft was rejected and rolled back beside the prefills."""
    monkeypatch.setattr(SequenceDrafter, "propose", always_rejected)
    prompt = [5, *tokens(1, 150)]
    config = EngineConfig(
        model_path=str(tiny_gguf),
        n_ctx=3 * 2560,  # each sequence's own cells: 2560
        n_slots=3,
        n_threads=1,
        batch_invariant=True,
    )
    runs = with_speculation_on_and_off(config, lambda e: beside_long_prefills(e, prompt, 240))
    (on, _, result), (off, _, _) = runs["on"], runs["off"]
    assert result.error is None
    assert result.timings.draft_n > 1000
    assert on == off
