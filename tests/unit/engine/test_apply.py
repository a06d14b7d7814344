"""The step's apply half on the real llama.cpp context of the tiny model: a part's tokens join
its sequence, the prefill advances (and is scored), the lead is handed over at its end, a pick
emits the model's own tokens (greedy here) while they confirm the extra evaluated after the
pending one, the unconfirmed cells are dropped, forced tokens are emitted ahead, a decode its
clients left keeps only what its prompt chunks evaluated.

What the model would pick is read from a second sequence of the same context (`greedy`), never
assumed; a steering that forces chosen tokens stands for harmony's (`Script`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.contracts.directives import Directive, Force
from server.contracts.events import TokenLogprob
from server.engine import apply
from server.engine.base import BatchPart, EngineConfig, SamplingParams, StopReason
from server.engine.channel import TokenChannel
from server.engine.job import FORCED_AHEAD_MAX, Job
from server.engine.llama_context import LlamaContext
from server.engine.picker import TokenPicker
from server.engine.plan import Extra, Kind
from server.engine.sampling.logprobs import token_logprob
from server.engine.slots import Slot
from server.engine.speculative.draft_length import VerifyCost
from server.engine.speculative.drafter import Speculator

N_CTX = 256
PROMPT = tuple(range(100, 120))
REFERENCE = 1  # the sequence `greedy` reads the model's picks on


@pytest.fixture(scope="module")
def ctx(tiny_gguf: Path) -> Iterator[LlamaContext]:
    config = EngineConfig(model_path=str(tiny_gguf), n_ctx=N_CTX, n_slots=2, n_threads=1)
    context = LlamaContext(config)
    yield context
    context.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


@pytest.fixture(autouse=True)
def _empty_sequences(ctx: LlamaContext) -> None:
    for seq_id in range(ctx.n_seq):
        ctx.truncate(seq_id, 0)


class Script:
    """A steering that gives its directives in turn (then no directive), and records what it
    was told was emitted."""

    def __init__(self, *directives: Directive) -> None:
        self.directives = list(directives)
        self.accepted: list[int] = []

    def next(self) -> Directive:
        return self.directives.pop(0) if self.directives else None

    def accept(self, token: int) -> None:
        self.accepted.append(token)

    def likely(self) -> tuple[int, ...]:
        return ()


class Forever:
    """A steering that forces `token` at every position."""

    def __init__(self, token: int) -> None:
        self.token = token

    def next(self) -> Directive:
        return Force((self.token,))

    def accept(self, token: int) -> None:
        pass

    def likely(self) -> tuple[int, ...]:
        return ()


def greedy(ctx: LlamaContext, tokens: Sequence[int], n: int) -> list[int]:
    """The model's next `n` greedy picks after `tokens`, one decode each (on REFERENCE)."""
    ctx.truncate(REFERENCE, 0)
    (index,) = ctx.decode([BatchPart(REFERENCE, list(tokens), 0, True)])
    picks: list[int] = []
    while True:
        picks.append(int(np.argmax(ctx.logits(index))))
        if len(picks) == n:
            ctx.truncate(REFERENCE, 0)
            return picks
        part = BatchPart(REFERENCE, [picks[-1]], len(tokens) + len(picks) - 1, True)
        (index,) = ctx.decode([part])


def job_of(
    ctx: LlamaContext,
    loop: asyncio.AbstractEventLoop,
    *,
    prompt: Sequence[int] = PROMPT,
    steering: Script | Forever | None = None,
    **params: Any,
) -> Job:
    sampling = SamplingParams(**{"max_tokens": 50, "temperature": 0.0, **params})
    job = Job(list(prompt), sampling, TokenChannel(loop), steering=steering)
    job.slot = Slot(0)
    job.picker = TokenPicker(ctx, sampling, steering, None)
    return job


def received(job: Job, loop: asyncio.AbstractEventLoop) -> tuple[list[int], list[object]]:
    """Every token the job's client got, and their logprobs (the channel closed)."""
    job.channel.close(job.result(StopReason.MAX_TOKENS, None))

    async def drain() -> tuple[list[int], list[object]]:
        tokens: list[int] = []
        logprobs: list[object] = []
        async for chunk in job.channel:
            tokens += chunk
            logprobs += chunk.logprobs
        return tokens, logprobs

    return loop.run_until_complete(drain())


def prefilled(ctx: LlamaContext, job: Job) -> int:
    """The job's whole prompt evaluated in one chunk; the batch index of its logits."""
    part = BatchPart(0, job.prompt_tokens, 0, True)
    (index,) = ctx.decode([part])
    assert not apply.evaluated(ctx, job, part, index)
    assert apply.follow(ctx, job, part, index) == apply.Outcome(pick=True)
    return index


def verify(ctx: LlamaContext, job: Job, draft: Sequence[int], kind: Kind = Kind.DRAFT) -> int:
    """The job's pending token and `draft` after it evaluated (the verify step); the batch
    index of the last logits."""
    assert job.slot is not None
    job.extra = Extra(kind, tuple(draft))
    tokens = [*job.pending, *draft]
    part = BatchPart(0, tokens, len(job.slot.tokens), True, outputs=len(tokens))
    (index,) = ctx.decode([part])
    assert not apply.evaluated(ctx, job, part, index)
    assert job.pending == ()
    assert apply.follow(ctx, job, part, index) == apply.Outcome(pick=True)
    return index


# evaluated and follow: the prefill


def test_a_prompt_chunk_joins_the_sequence_and_advances_the_prefill_to_its_save_point(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop)
    job.save_points = (8, 20)
    assert job.slot is not None
    first = BatchPart(0, PROMPT[:8], 0, False)
    assert apply.evaluated(ctx, job, first, *ctx.decode([first]))  # 8: a save point
    assert (job.slot.tokens, job.next_prompt, job.evaluated) == (list(PROMPT[:8]), 8, 8)
    assert apply.follow(ctx, job, first, -1) == apply.GOES_ON
    middle = BatchPart(0, PROMPT[8:14], 8, False)
    assert not apply.evaluated(ctx, job, middle, *ctx.decode([middle]))  # 14: none
    assert apply.follow(ctx, job, middle, -1) == apply.GOES_ON
    last = BatchPart(0, PROMPT[14:], 14, True)
    (index,) = ctx.decode([last])
    assert apply.evaluated(ctx, job, last, index)  # 20: the prompt, saved before its pick
    assert (job.slot.tokens, job.next_prompt, job.evaluated) == (list(PROMPT), 20, 20)
    assert not job.prefilling
    assert apply.follow(ctx, job, last, index) == apply.Outcome(pick=True)
    assert job.prefilled > 0
    assert received(job, loop) == ([], [])  # nothing emitted by the prefill


def test_a_prefill_chunk_counts_only_its_prompt_tokens_not_the_lead_it_carries(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    steering = Script()
    job = job_of(ctx, loop, steering=steering)
    assert job.slot is not None
    job.lead = (7, 8)
    job.next_prompt = job.evaluated = 12
    job.slot.tokens = list(PROMPT[:12])
    ctx.decode([BatchPart(0, PROMPT[:12], 0, False)])
    part = BatchPart(0, [*PROMPT[12:], 7, 8], 12, True)
    assert apply.prompt_part(job, part) == 8
    (index,) = ctx.decode([part])
    assert not apply.evaluated(ctx, job, part, index)
    assert (job.next_prompt, job.evaluated) == (20, 20)
    assert job.slot.tokens == [*PROMPT, 7, 8]
    # the lead was carried: handed to the client, never told to the steering again, and the
    # model's first pick is at this chunk's logits
    assert apply.follow(ctx, job, part, index) == apply.Outcome(pick=True)
    assert steering.accepted == []
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    (pick,) = greedy(ctx, [*PROMPT, 7, 8], 1)
    assert job.pending == (pick,)  # the lead is not pending: it was evaluated
    assert received(job, loop)[0] == [7, 8, pick]


def test_a_lead_not_carried_by_the_last_chunk_is_emitted_and_becomes_the_pending_tokens(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    steering = Script()
    job = job_of(ctx, loop, steering=steering)
    job.lead = (7, 8)
    part = BatchPart(0, PROMPT, 0, True)
    (index,) = ctx.decode([part])
    assert not apply.evaluated(ctx, job, part, index)
    assert apply.follow(ctx, job, part, index) == apply.GOES_ON  # no pick: the lead is next
    assert job.pending == (7, 8)
    assert job.completed == 2
    prefilled_at = job.prefilled
    # the next step evaluates the lead, and the model picks after it: the lead is not handed
    # over again, nor the prefill's end taken again
    step = BatchPart(0, [7, 8], len(PROMPT), True)
    (index,) = ctx.decode([step])
    assert not apply.evaluated(ctx, job, step, index)
    assert apply.follow(ctx, job, step, index) == apply.Outcome(pick=True)
    assert job.completed == 2
    assert job.prefilled == prefilled_at
    assert steering.accepted == []
    assert received(job, loop)[0] == [7, 8]


def test_a_lead_with_a_stop_token_ends_the_generation_at_the_prefills_end(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, stop_tokens=frozenset({7}))
    job.lead = (7, 8)
    part = BatchPart(0, PROMPT, 0, True)
    (index,) = ctx.decode([part])
    apply.evaluated(ctx, job, part, index)
    assert apply.follow(ctx, job, part, index) == apply.Outcome(StopReason.STOP_TOKEN)
    assert job.stop_token == 7
    assert received(job, loop)[0] == [7]


def test_a_lead_that_fills_max_tokens_ends_the_generation(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, max_tokens=1)
    job.lead = (7, 8)
    part = BatchPart(0, PROMPT, 0, True)
    (index,) = ctx.decode([part])
    apply.evaluated(ctx, job, part, index)
    assert apply.follow(ctx, job, part, index) == apply.Outcome(StopReason.MAX_TOKENS)
    assert received(job, loop)[0] == [7]


def test_a_prompt_asked_for_alone_ends_at_its_prefill_with_its_logprobs(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, max_tokens=0, logprobs=2, prompt_logprobs=True)
    first = BatchPart(0, PROMPT[:8], 0, True, all_logits=True)
    (index,) = ctx.decode([first])
    apply.evaluated(ctx, job, first, index)
    want = [token_logprob(ctx.logits(j), PROMPT[j + 1], 2) for j in range(8)]
    assert job.prompt_logprobs == want
    assert apply.follow(ctx, job, first, index) == apply.GOES_ON  # scored, still prefilling
    last = BatchPart(0, PROMPT[8:], 8, True, all_logits=True)
    (index,) = ctx.decode([last])
    apply.evaluated(ctx, job, last, index)
    want += [token_logprob(ctx.logits(j), PROMPT[8 + j + 1], 2) for j in range(11)]
    assert job.prompt_logprobs == want  # the last token predicts nothing of the prompt
    assert apply.follow(ctx, job, last, index) == apply.Outcome(StopReason.MAX_TOKENS)


def test_prompt_logprobs_without_alternatives_score_the_token_alone(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, max_tokens=0, prompt_logprobs=True)
    part = BatchPart(0, PROMPT, 0, True, all_logits=True)
    (index,) = ctx.decode([part])
    apply.evaluated(ctx, job, part, index)
    assert job.prompt_logprobs == [
        token_logprob(ctx.logits(j), PROMPT[j + 1], 0) for j in range(19)
    ]
    assert all(isinstance(p, TokenLogprob) and p.top == () for p in job.prompt_logprobs)


# pick: the model's tokens, the extra confirmed or dropped


def test_a_plain_pick_emits_the_models_token_as_the_next_pending_one(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    steering = Script()
    job = job_of(ctx, loop, steering=steering, logprobs=3)
    index = prefilled(ctx, job)
    want = token_logprob(ctx.logits(index), int(np.argmax(ctx.logits(index))), 3)
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    (pick,) = greedy(ctx, PROMPT, 1)
    assert job.pending == (pick,)
    assert job.completed == 1
    assert job.first_token > 0
    assert job.last_token == job.first_token
    assert steering.accepted == [pick]
    assert received(job, loop) == ([pick], [want])


def test_a_step_of_one_token_picks_at_batch_index_0_and_max_tokens_1_gives_one_token(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, max_tokens=2)
    assert job.slot is not None
    apply.pick(ctx, job, prefilled(ctx, job))
    picks = greedy(ctx, PROMPT, 2)
    step = BatchPart(0, list(job.pending), len(PROMPT), True)
    (index,) = ctx.decode([step])
    assert index == 0  # the batch's only row
    assert not apply.evaluated(ctx, job, step, index)
    assert apply.follow(ctx, job, step, index) == apply.Outcome(pick=True)
    assert apply.pick(ctx, job, index) == apply.Outcome(StopReason.MAX_TOKENS)
    assert received(job, loop)[0] == picks
    ctx.truncate(0, 0)
    one = job_of(ctx, loop, max_tokens=1)
    index = prefilled(ctx, one)  # the pick follows the prefill
    assert apply.pick(ctx, one, index) == apply.Outcome(StopReason.MAX_TOKENS)
    assert received(one, loop)[0] == picks[:1]


def test_a_draft_confirmed_in_part_keeps_its_confirmed_cells_and_the_next_pick_pends(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, logprobs=1)
    assert job.slot is not None
    apply.pick(ctx, job, prefilled(ctx, job))
    picks = greedy(ctx, PROMPT, 4)  # the pending token, then what the model says after it
    assert job.pending == (picks[0],)
    wrong = picks[3] + 1
    index = verify(ctx, job, (picks[1], picks[2], wrong))
    scores = [token_logprob(ctx.logits(index - 3 + k), picks[1 + k], 1).logprob for k in range(3)]
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    assert job.extra is None
    assert job.slot.tokens == [*PROMPT, *picks[:3]]  # the unconfirmed draft token dropped
    assert ctx.seq_end(0) == len(job.slot.tokens)
    assert job.pending == (picks[3],)
    tokens, logprobs = received(job, loop)
    assert tokens == picks
    assert [p.logprob for p in logprobs[1:] if isinstance(p, TokenLogprob)] == scores


def test_a_draft_confirmed_whole_is_kept_and_the_pick_after_it_pends(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop)
    assert job.slot is not None
    job.drafter = Speculator(VerifyCost.interpolate({0: 1.0, 16: 2.0}, 16)).follow(PROMPT)
    apply.pick(ctx, job, prefilled(ctx, job))
    picks = greedy(ctx, PROMPT, 5)
    index = verify(ctx, job, picks[1:4])
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    assert job.slot.tokens == [*PROMPT, *picks[:4]]
    assert ctx.seq_end(0) == len(job.slot.tokens)
    assert job.pending == (picks[4],)
    assert (job.drafter.drafted, job.drafter.accepted) == (3, 3)
    assert list(job.drafter.ngram.tokens) == [*PROMPT, *picks]  # every emitted token
    assert received(job, loop)[0] == picks


def test_a_draft_rejected_at_once_drops_all_its_cells_and_settles_none(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop)
    assert job.slot is not None
    job.drafter = Speculator(VerifyCost.interpolate({0: 1.0, 16: 2.0}, 16)).follow(PROMPT)
    apply.pick(ctx, job, prefilled(ctx, job))
    picks = greedy(ctx, PROMPT, 2)
    index = verify(ctx, job, (picks[1] + 1, picks[1], picks[1]))
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    assert job.slot.tokens == [*PROMPT, picks[0]]
    assert ctx.seq_end(0) == len(PROMPT) + 1
    assert job.pending == (picks[1],)
    assert (job.drafter.drafted, job.drafter.accepted) == (3, 0)


def test_a_repeat_or_header_guess_is_verified_the_same_and_settles_no_drafter(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    for kind in (Kind.REPEAT, Kind.HEADER):
        job = job_of(ctx, loop)
        assert job.slot is not None
        job.drafter = Speculator(VerifyCost.interpolate({0: 1.0, 16: 2.0}, 16)).follow(PROMPT)
        apply.pick(ctx, job, prefilled(ctx, job))
        picks = greedy(ctx, PROMPT, 3)
        index = verify(ctx, job, (picks[1], picks[2] + 1), kind)
        assert apply.pick(ctx, job, index) == apply.GOES_ON
        assert job.slot.tokens == [*PROMPT, *picks[:2]]
        assert job.pending == (picks[2],)
        assert (job.drafter.drafted, job.drafter.accepted) == (0, 0)
        ctx.truncate(0, 0)


def test_a_stop_token_in_the_draft_ends_the_generation_and_drops_the_cells_after_it(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    picks = greedy(ctx, PROMPT, 5)
    if picks[2] in picks[:2]:  # the stop must first come where the test says
        pytest.skip("the tiny model repeats itself here")
    job = job_of(ctx, loop, stop_tokens=frozenset({picks[2]}))
    assert job.slot is not None
    apply.pick(ctx, job, prefilled(ctx, job))
    index = verify(ctx, job, picks[1:4])
    assert apply.pick(ctx, job, index) == apply.Outcome(StopReason.STOP_TOKEN)
    assert job.stop_token == picks[2]
    # the stop token was emitted, never evaluated: its cell and the draft's after it dropped
    assert job.slot.tokens == [*PROMPT, *picks[:2]]
    assert ctx.seq_end(0) == len(PROMPT) + 2
    assert received(job, loop)[0] == picks[:3]


def test_max_tokens_ends_the_generation_within_a_confirmed_draft(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, max_tokens=3)
    assert job.slot is not None
    apply.pick(ctx, job, prefilled(ctx, job))
    picks = greedy(ctx, PROMPT, 5)
    index = verify(ctx, job, picks[1:4])
    assert apply.pick(ctx, job, index) == apply.Outcome(StopReason.MAX_TOKENS)
    assert job.completed == 3
    assert job.slot.tokens == [*PROMPT, *picks[:2]]
    assert received(job, loop)[0] == picks[:3]


def test_a_client_that_left_stops_the_pick_after_its_first_token(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop)
    assert job.slot is not None
    apply.pick(ctx, job, prefilled(ctx, job))
    picks = greedy(ctx, PROMPT, 5)
    index = verify(ctx, job, picks[1:4])
    job.channel.cancel()
    assert apply.pick(ctx, job, index) == apply.GOES_ON  # the scheduler ends it next
    assert job.slot.tokens == [*PROMPT, picks[0]]
    assert job.pending == (picks[1],)  # nothing forced ahead for a client that left


def test_forced_tokens_are_scored_none_and_a_forced_pick_takes_no_logits(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    steering = Script(None, Force((9, 10)))
    job = job_of(ctx, loop, steering=steering, logprobs=2)
    index = prefilled(ctx, job)
    assert apply.pick(ctx, job, index) == apply.GOES_ON  # sampled, then 9 and 10 forced ahead
    (pick,) = greedy(ctx, PROMPT, 1)
    assert job.pending == (pick, 9, 10)
    assert steering.accepted == [pick, 9, 10]
    tokens, logprobs = received(job, loop)
    assert tokens == [pick, 9, 10]
    assert logprobs[1:] == [None, None]
    assert isinstance(logprobs[0], TokenLogprob)


def test_a_forced_pick_at_the_logits_emits_every_forced_token_unscored(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    steering = Script(Force((9, 10)))
    job = job_of(ctx, loop, steering=steering, logprobs=2)
    index = prefilled(ctx, job)
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    assert job.pending == (9, 10)
    assert received(job, loop) == ([9, 10], [None, None])


def test_forced_tokens_ahead_stop_at_the_bound_and_before_the_context_is_full(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, steering=Forever(9))
    assert job.slot is not None
    job.slot.tokens = list(PROMPT)  # the pick below reads the logits after them
    ctx.decode([BatchPart(0, PROMPT, 0, True)])
    apply.pick(ctx, job, 0)
    assert job.pending == (9,) * (1 + FORCED_AHEAD_MAX)
    long = tuple(range(100, 100 + N_CTX - 6))
    near = job_of(ctx, loop, prompt=long, steering=Forever(9))
    assert near.slot is not None
    near.slot.tokens = list(long)
    ctx.truncate(0, 0)
    ctx.decode([BatchPart(0, long, 0, True)])
    apply.pick(ctx, near, 0)
    # the step evaluates them after the sequence's cells, and one cell stays free
    assert len(near.slot.tokens) + len(near.pending) == N_CTX - 1
    assert near.pending == (9,) * 5


def test_forced_tokens_after_a_confirmed_draft_token_fill_the_context_but_one_cell(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    long = tuple(range(100, 100 + N_CTX - 12))
    job = job_of(ctx, loop, prompt=long, steering=Forever(9))
    assert job.slot is not None
    ctx.decode([BatchPart(0, long, 0, False)])
    job.slot.tokens = list(long)
    job.next_prompt = len(long)
    job.pending = (9,)
    index = verify(ctx, job, (9, 5))  # the steering's 9 confirmed, the 5 after it not
    assert apply.pick(ctx, job, index) == apply.GOES_ON
    assert job.slot.tokens == [*long, 9, 9]
    assert ctx.seq_end(0) == len(long) + 2
    # the confirmed token's pick is pending, then what the steering forces, up to the cell
    # the context keeps free
    assert len(job.slot.tokens) + len(job.pending) == N_CTX - 1
    assert list(job.pending) == [9] * 9


def test_a_forced_stop_token_ahead_ends_the_generation(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    job = job_of(ctx, loop, steering=Script(None, Force((9, 10, 11))), stop_tokens=frozenset({10}))
    index = prefilled(ctx, job)
    assert apply.pick(ctx, job, index) == apply.Outcome(StopReason.STOP_TOKEN)
    assert job.stop_token == 10
    (pick,) = greedy(ctx, PROMPT, 1)
    assert received(job, loop)[0] == [pick, 9, 10]


# keep_aborted: a decode its clients left


def test_an_aborted_decode_keeps_what_its_prompt_chunks_evaluated_and_drops_the_rest(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    prefilling = job_of(ctx, loop)
    assert prefilling.slot is not None
    ctx.decode([BatchPart(0, PROMPT[:5], 0, False)])  # the ubatches before the stop
    generating = job_of(ctx, loop)
    generating.slot = Slot(1)
    generating.slot.tokens = list(PROMPT)
    ctx.decode([BatchPart(1, [*PROMPT, 3, 4], 0, False)])  # its step's tokens evaluated
    parts = [BatchPart(0, PROMPT[:8], 0, False), BatchPart(1, [3, 4], len(PROMPT), True)]
    with caplog.at_level(logging.INFO, logger="server.engine.apply"):
        assert apply.keep_aborted(ctx, parts, [prefilling, generating]) == []
    assert caplog.messages == ["a decode stopped: its clients left (5 prompt tokens kept)"]
    assert prefilling.slot.tokens == list(PROMPT[:5])
    assert (prefilling.next_prompt, prefilling.evaluated) == (5, 5)
    assert ctx.seq_end(0) == 5
    assert generating.slot.tokens == list(PROMPT)  # its step's tokens dropped
    assert ctx.seq_end(1) == len(PROMPT)
    assert (generating.next_prompt, generating.evaluated) == (0, 0)


def test_an_aborted_chunk_keeps_no_more_than_its_prompt_tokens_nor_a_scored_chunk(
    ctx: LlamaContext, loop: asyncio.AbstractEventLoop
) -> None:
    carrying = job_of(ctx, loop)
    assert carrying.slot is not None
    carrying.next_prompt = carrying.evaluated = 16
    carrying.slot.tokens = list(PROMPT[:16])
    ctx.decode([BatchPart(0, [*PROMPT, 7, 8], 0, False)])  # the prompt's end and its lead
    part = BatchPart(0, [*PROMPT[16:], 7, 8], 16, True)
    assert apply.keep_aborted(ctx, [part], [carrying]) == []
    assert carrying.slot.tokens == list(PROMPT)  # the lead is not the prompt's
    assert (carrying.next_prompt, carrying.evaluated) == (20, 20)
    assert ctx.seq_end(0) == 20
    scored = job_of(ctx, loop, prompt_logprobs=True)
    assert scored.slot is not None
    ctx.truncate(0, 0)
    ctx.decode([BatchPart(0, PROMPT[:8], 0, False)])
    part = BatchPart(0, PROMPT[:8], 0, True, all_logits=True)
    assert apply.keep_aborted(ctx, [part], [scored]) == []
    assert scored.slot.tokens == []  # its logprobs were not read: evaluated again
    assert ctx.seq_end(0) == 0
    behind = job_of(ctx, loop)
    assert behind.slot is not None
    part = BatchPart(0, PROMPT[8:16], 8, False)  # the stop came before any of its ubatches
    assert apply.keep_aborted(ctx, [part], [behind]) == []
    assert behind.next_prompt == 0


def test_rejected_cells_are_the_draft_tokens_not_kept() -> None:
    assert apply.rejected_cells(5, 2) == 3
    assert apply.rejected_cells(3, 3) == 0
