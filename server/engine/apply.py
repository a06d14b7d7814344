"""Apply: what one decode's logits make of each job of its batch, returned as data.

For each job's part of the batch: its tokens join its sequence; a prompt chunk advances the
prefill (scored where the request asked for its prompt's logprobs); at the prefill's end the
lead is handed to the client; then the job picks its next token(s) with its own sampler and
steering (`pick`), scores and emits them, and drops the cells of the extra tokens the pick did
not confirm. Tokens the steering then leaves no choice about (most of a harmony header) are
emitted at once and evaluated in the next step (`_forced_ahead`).

A pick reads the logits after the pending tokens, and at each next position while every token
so far equals the job's extra (a speculative draft, the invariant mode's repeat or the header
guessed after the lead: plan.py); the logits there are those of the true prefix. A plain step
is the pick of no extra: it picks (and emits) once. After every rollback the sequence's
sliding window must be whole (a rejected draft's cells may have taken cells it needs again).

Before the decode, `sample_where` sets or takes off the sequence's backend chain as the plan
decided (its pick is then the token the chain drew in the graph: picker.py).

Nothing here finishes, forgets or evicts: each call returns an `Outcome` (the generation ended,
the sequence's cells cannot be trusted, the job failed) that the scheduler acts on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from server.contracts.events import TokenLogprob
from server.engine.base import BatchPart, StopReason
from server.engine.job import FORCED_AHEAD_MAX, Job
from server.engine.llama_context import LlamaContext
from server.engine.plan import Kind
from server.engine.sampling.logprobs import token_logprob
from server.engine.slots import common_prefix_length

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job's part of a step ended, for the scheduler to act on."""

    end: StopReason | None = None  # the generation ended: finish the job with this reason
    pick: bool = False  # the job picks next at its part's logits (`pick`)
    forget: bool = False  # its sequence's cells cannot be trusted: drop them all
    failure: str | None = None  # the job fails with this (an `end` before it stands)


GOES_ON = Outcome()


def sample_where(job: Job, backend: bool | None) -> None:
    """Before the decode: the job's next pick drawn by its sequence's backend chain (True),
    from the logits on the host (False: the chain taken off), or left as it is (None)."""
    assert job.picker is not None
    job.picker.sample_on_backend(backend)


def rejected_cells(n_draft: int, kept: int) -> int:
    """The cells a verify drops from the end of the sequence: the draft tokens not kept. A
    function of its own so that a test can inject an off-by-one here (a rejected token left
    in the cache) and see the speculative output change: the rollback's negative control."""
    return n_draft - kept


def evaluated(ctx: LlamaContext, job: Job, part: BatchPart, index: int) -> bool:
    """Record the job's part as evaluated: its tokens join the sequence; a prompt chunk
    advances the prefill (its logprobs scored where every position kept its logits), a
    generating job's pending tokens are no longer pending. True when the prefill reached one of
    its save points (the scheduler saves the sequence before anything follows)."""
    assert job.slot is not None
    job.slot.tokens.extend(part.tokens)
    if not job.prefilling:
        job.pending = ()
        return False
    if part.all_logits:
        _score_prompt(ctx, job, part, index)
    prompt = prompt_part(job, part)
    job.next_prompt += prompt
    job.evaluated += prompt
    return job.next_prompt in job.save_points


def follow(ctx: LlamaContext, job: Job, part: BatchPart, index: int) -> Outcome:
    """After `evaluated`: at the prefill's end, its time and the lead handed to the client (the
    steering accepted it at the start; when the last chunk did not carry it, it is the next
    step's pending tokens); then whether the job picks at `index`."""
    if part.start_pos < len(job.prompt_tokens) and not job.prefilling:  # the prefill's end
        ctx.synchronize()  # the prefill's end, not its queuing (GPU)
        job.prefilled = time.perf_counter()
        if job.lead:
            for token in job.lead:
                end = _emit(job, token, accepted=True)
                if end is not None:
                    return Outcome(end)
            if prompt_part(job, part) == len(part.tokens):  # the lead was not carried
                job.pending = job.lead
                return GOES_ON
    if index < 0 or job.prefilling:  # a prompt chunk whose logits were kept for scoring
        return GOES_ON
    if job.params.max_tokens <= 0:  # the prompt alone was asked for (its logprobs)
        return Outcome(StopReason.MAX_TOKENS)
    return Outcome(pick=True)


def pick(ctx: LlamaContext, job: Job, index: int) -> Outcome:
    """Pick the next tokens at the logits after the pending ones, and at each next position
    while every token so far equals the job's extra; drop the cells of the rest of the extra."""
    assert job.slot is not None
    assert job.picker is not None
    extra, job.extra = job.extra, None
    draft = extra.tokens if extra is not None else ()
    first = index - len(draft)  # the logits after the pending token
    emitted: list[int] = []
    end: StopReason | None = None
    while end is None and len(emitted) <= len(draft) and emitted == list(draft[: len(emitted)]):
        if emitted and job.channel.cancelled:  # the client left: stop within this step
            break
        position = first + len(emitted)
        tokens = job.picker.next_tokens(position)
        for token, score in zip(tokens, _scores(ctx, job, position, tokens), strict=True):
            emitted.append(token)
            end = _emit(job, token, score)
            if end is not None:
                break
    accepted = common_prefix_length(emitted, draft)
    if extra is not None and extra.kind is Kind.DRAFT and job.drafter is not None:
        job.drafter.settle(len(draft), accepted)
    keep = min(accepted, len(emitted) - 1)  # the last emitted token is not evaluated yet
    dropped = rejected_cells(len(draft), keep)
    if dropped > 0:
        n_keep = len(job.slot.tokens) - dropped
        if ctx.truncate(job.slot.seq_id, n_keep) != n_keep:
            job.slot.tokens.clear()
            return Outcome(end, failure="the KV cache could not drop a rejected draft")
        del job.slot.tokens[n_keep:]
        if ctx.reusable_prefix(job.slot.seq_id, n_keep) != n_keep:
            # its window lost cells: nothing in it can be trusted
            failure = "a rejected draft's cells took the sliding window with them"
            return Outcome(end, forget=True, failure=failure)
    if end is None:
        ahead, end = _forced_ahead(ctx, job, len(emitted) - keep)
        if end is None:
            job.pending = (*emitted[keep:], *ahead)
    return Outcome(end)


def keep_aborted(ctx: LlamaContext, parts: Sequence[BatchPart], owners: Sequence[Job]) -> list[Job]:
    """After a decode stopped because every client of the batch left: what each prompt chunk
    had evaluated stays cached (a request sent again continues from it); the rest of the batch
    is dropped from the KV cache. Returns the jobs whose sequence could not be cut back (the
    scheduler forgets their cells); the jobs end at the next step (their clients left)."""
    lost: list[Job] = []
    kept_total = 0
    for part, job in zip(parts, owners, strict=True):
        slot = job.slot
        assert slot is not None
        start = part.start_pos
        kept = 0
        if job.prefilling and not part.all_logits:  # the prompt's tokens (not the lead)
            kept = max(ctx.seq_end(slot.seq_id) - start, 0)
            kept = min(kept, prompt_part(job, part))
        if ctx.truncate(slot.seq_id, start + kept) != start + kept:
            lost.append(job)
            continue
        slot.tokens.extend(part.tokens[:kept])
        job.next_prompt += kept
        job.evaluated += kept
        kept_total += kept
    log.info("a decode stopped: its clients left (%d prompt tokens kept)", kept_total)
    return lost


def prompt_part(job: Job, part: BatchPart) -> int:
    """How many of a prefill chunk's tokens are the prompt's: the last chunk may carry the
    lead (and the guessed header) after them (plan.py)."""
    return min(len(part.tokens), len(job.prompt_tokens) - part.start_pos)


def _forced_ahead(ctx: LlamaContext, job: Job, pending: int) -> tuple[list[int], StopReason | None]:
    """The tokens the steering leaves no choice about after the picked ones (most of a
    harmony header: `<|message|>` after a channel, `<|start|>assistant<|channel|>` after
    `<|end|>`), emitted now, so the next step evaluates them with the picked token instead
    of one step each; and the end of the generation, where one of them ended it."""
    assert job.picker is not None
    assert job.slot is not None
    ahead: list[int] = []
    room = min(FORCED_AHEAD_MAX, ctx.n_ctx - 1 - len(job.slot.tokens) - pending)
    while len(ahead) < room and not job.channel.cancelled:
        tokens = job.picker.forced_ahead()
        if not tokens:
            break
        for token in tokens:
            ahead.append(token)
            end = _emit(job, token)  # a stop token, max_tokens
            if end is not None:
                return ahead, end
    return ahead, None


def _emit(
    job: Job, token: int, score: TokenLogprob | None = None, *, accepted: bool = False
) -> StopReason | None:
    """Hand one token to the client (`accepted`: the steering has taken it already); the
    reason the generation ended with it, if it did."""
    assert job.picker is not None
    if not accepted:
        job.picker.accept(token)
    if job.drafter is not None:
        job.drafter.append(token)
    now = time.perf_counter()
    if job.completed == 0:
        job.first_token = now
    job.last_token = now
    job.completed += 1
    job.channel.push(token, score, scored=job.params.logprobs is not None)
    if token in job.params.stop_tokens:
        job.stop_token = token
        return StopReason.STOP_TOKEN
    if job.completed >= job.params.max_tokens:
        return StopReason.MAX_TOKENS
    return None


def _scores(
    ctx: LlamaContext, job: Job, index: int, tokens: tuple[int, ...]
) -> list[TokenLogprob | None]:
    """The logprobs to report with `tokens` (None: not asked for, or forced by steering)."""
    assert job.picker is not None
    n_top = job.params.logprobs
    if n_top is None or job.picker.forced:
        return [None] * len(tokens)
    return [token_logprob(ctx.logits(index), tokens[0], n_top)]


def _score_prompt(ctx: LlamaContext, job: Job, part: BatchPart, index: int) -> None:
    """The logprob of each prompt token after this chunk's positions (the logits at batch
    index `first + j` predict the token after the chunk's j-th)."""
    first = index - len(part.tokens) + 1
    n_top = job.params.logprobs or 0
    prompt = job.prompt_tokens
    for j in range(len(part.tokens)):
        following = part.start_pos + j + 1
        if following < len(prompt):
            logits = ctx.logits(first + j)
            job.prompt_logprobs.append(token_logprob(logits, prompt[following], n_top))
