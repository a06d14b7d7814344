"""Scheduler: continuous batching over the context's sequences, one llama_decode per step.

Each step's batch holds the pending token(s) of every generating request plus a chunk of the
prompt of the oldest request still being prefilled (a small chunk while others generate, so their
streams keep flowing). After the decode, each request whose logits came back picks its next
token(s) with its own sampler and steering; tokens the steering then leaves no choice about (most
of a harmony header) are emitted at once and evaluated in the same next step (`_forced_ahead`);
those forced before the model's first choice go with the prompt's last chunk (`_lead`), and
after them the header the model most likely writes first, as a draft.
Requests wait when every slot is busy; a prompt goes
to the slot with the longest cached prefix (see slots.py); when the KV cache is full, the least
recently used idle conversation is dropped. With the prompt cache on disk (prompt_cache.py), a
prompt's save points are saved as its prefill reaches them (chunks end there), an evicted
conversation is saved before it is dropped, every conversation is saved at shutdown, and a new
prompt starts from the longest saved prefix when the disk holds more of it than the memory (read
only once a slot is free for it, one read for the requests waiting on the same entry).

Log-probabilities are computed only for requests that ask (SamplingParams.logprobs): each
sampled token's travels with it to the channel. A request for the prompt's own
(`prompt_logprobs`) evaluates its whole prompt, reusing nothing cached, in chunks of
`PROMPT_LOGPROBS_CHUNK` tokens whose every position keeps its logits.

With speculation on (speculative/), a generating request's pending token is followed by the
tokens its drafter proposes, and the pick keeps those the picker confirms (a plain step is the
pick of an empty draft: one path picks, scores and emits every token). A batch that carries
drafts fits one ubatch: llama.cpp places a later ubatch's cells after the earlier ones advanced
each sequence, and in the sliding-window layers a cell is free once it falls out of its
sequence's window as of that advance; a prefill chunk placed after a drafting sequence's drafts
could take cells that sequence's window needs again once its rejected drafts are dropped. After
every rollback the scheduler checks that the sequence's window is whole.

In the batch-invariant mode (EngineConfig.batch_invariant) a request's tokens depend on the
request alone: llama.cpp's kernels round differently by batch shape, so each sequence's part of
a step is its own llama_decode; a prompt is evaluated in chunks of `prefill_chunk` tokens from
its first one (chunk boundaries at multiples of it), from the start, reusing no prefix another
request (or an earlier turn) computed, and its drafts depend on its own acceptance. Each
sequence has KV cells of its own (LlamaContext), so its cells stay in the order of its positions
whatever other requests take or its rollbacks give back: attention sums over them in the same
order, and a run with speculation gives exactly the tokens of one without.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from enum import Enum
from functools import partial

from server.contracts.directives import Constrain, Steering, SteeringStats
from server.contracts.events import Timings, TokenLogprob, Usage
from server.engine.base import EngineResult, SamplingHook, SamplingParams, StopReason
from server.engine.channel import TokenChannel
from server.engine.disk_cache.prompt_cache import Found, PromptCache
from server.engine.llama_context import ABORTED, BatchPart, DecodeError, LlamaContext
from server.engine.picker import TokenPicker
from server.engine.sampling.logprobs import token_logprob
from server.engine.slots import (
    Slot,
    SlotChoice,
    choose_slot,
    common_prefix_length,
    eviction_order,
    longest_prefix,
)
from server.engine.speculative.drafter import SequenceDrafter, Speculator
from server.engine.speculative.ngram import NgramDrafter
from server.engine.stop_flag import StopFlag

log = logging.getLogger(__name__)

NO_ROOM = 1  # llama_decode: no KV cells left for the batch
PROMPT_LOGPROBS_CHUNK = 64  # prompt tokens per step when each keeps its logits (n_vocab floats)
FORCED_AHEAD_MAX = 16  # tokens the steering forces, emitted ahead into one step
SHUTDOWN_SAVE_S = 30.0  # at most this long, in all, for the saves at shutdown to find room


def rejected_cells(n_draft: int, kept: int) -> int:
    """The cells a verify drops from the end of the sequence: the draft tokens not kept. A
    function of its own so that a test can inject an off-by-one here (a rejected token left
    in the cache) and see the speculative output change: the rollback's negative control."""
    return n_draft - kept


class _Phase(Enum):
    WAITING = 1
    RUNNING = 2
    DONE = 3


@dataclass
class Job:
    """One generation request and its progress."""

    prompt_tokens: list[int]
    params: SamplingParams
    channel: TokenChannel
    steering: Steering | None = None
    save_points: tuple[int, ...] = ()  # prompt lengths to save on disk once evaluated
    looked_up: bool = False  # the disk was asked for a longer prefix
    disk: Found | None = None  # what the disk had, read, until the job starts
    submitted: float = field(default_factory=time.perf_counter)
    phase: _Phase = _Phase.WAITING
    slot: Slot | None = None
    picker: TokenPicker | None = None
    next_prompt: int = 0  # index of the next prompt token to evaluate
    pending: tuple[int, ...] = ()  # emitted tokens not evaluated yet
    lead: tuple[int, ...] = ()  # forced before the model's first choice (_lead)
    guess: tuple[int, ...] = ()  # the steering's likely header after the lead (_plan)
    drafter: SequenceDrafter | None = None  # with speculation on: what it drafts, and counts
    draft: tuple[int, ...] = ()  # the tokens drafted after `pending` in this step's batch
    guessed: bool = False  # the draft is the batch-invariant mode's one-token guess (_guess)
    announced: bool = False  # its channel was told the engine evaluates it (TokenChannel.begin)
    cached: int = 0
    evaluated: int = 0
    completed: int = 0
    stop_token: int | None = None
    started: float = 0.0
    prefilled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.next_prompt < len(self.prompt_tokens)

    def result(self, reason: StopReason, error: str | None) -> EngineResult:
        usage = Usage(
            prompt_tokens=len(self.prompt_tokens),
            cached_tokens=self.cached,
            evaluated_tokens=self.evaluated,
            completion_tokens=self.completed,
        )
        started = self.started or time.perf_counter()
        timings = Timings(
            queue_s=started - self.submitted,
            prefill_s=max(self.prefilled - started, 0.0) if self.prefilled else 0.0,
            decode_s=max(self.last_token - self.first_token, 0.0),
            ttft_s=max(self.first_token - self.submitted, 0.0) if self.completed else 0.0,
            evaluated_tokens=self.evaluated,
            completion_tokens=self.completed,
            draft_n=self.drafter.drafted if self.drafter is not None else 0,
            draft_n_accepted=self.drafter.accepted if self.drafter is not None else 0,
        )
        steering = SteeringStats()
        if self.picker is not None:
            steering = SteeringStats(self.picker.choices, self.picker.overrides)
        return EngineResult(
            reason,
            usage,
            timings,
            self.stop_token,
            error,
            steering,
            prompt_logprobs=tuple(self.prompt_logprobs),
        )


class Scheduler:
    """Owns the slots and the running jobs; used by the engine thread only."""

    def __init__(
        self,
        ctx: LlamaContext,
        hook: SamplingHook | None,
        prefill_chunk: int,
        cache: PromptCache | None = None,
        speculator: Speculator | None = None,
        *,
        batch_invariant: bool = False,
        guess_header: bool = False,
    ) -> None:
        self._ctx = ctx
        self._invariant = batch_invariant
        # evaluate the likely first header with the prompt (_plan): its cells must be removable
        # as a draft's are (no window-sized sliding-window cache), outside the invariant mode
        self._guess_header = guess_header and not batch_invariant
        self._cache = cache
        self._speculator = speculator
        self._hook = hook
        self._prefill_chunk = max(1, prefill_chunk)
        self.slots = [Slot(seq_id) for seq_id in range(ctx.n_seq)]
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._loading: list[tuple[Job, Future[Found | None]]] = []  # reading from disk
        # the n-gram index each slot's last generation left: the next turn extends it
        self._indexes: dict[int, NgramDrafter] = {}

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._running or self._loading)

    @property
    def waiting(self) -> int:  # read from other threads: a snapshot is all they need
        return len(self._waiting) + len(self._loading)

    @property
    def running(self) -> int:
        return len(self._running)

    def add(self, job: Job) -> None:
        self._waiting.append(job)

    def shutdown(self) -> None:
        """End every job and save every conversation (waiting, within SHUTDOWN_SAVE_S in all,
        for the disk writes before them to make room)."""
        self.fail_all("the engine shut down")
        self._loading.clear()
        if self._cache is not None:
            deadline = time.monotonic() + SHUTDOWN_SAVE_S
            for slot in self.slots:
                self._save(slot.seq_id, slot.tokens, max(0.0, deadline - time.monotonic()))

    def fail_all(self, error: str) -> None:
        """End every job with `error`: at shutdown, or off the engine thread once it is stuck for
        good (an RPC host dropped)."""
        for job in [*self._running, *self._waiting, *(job for job, _ in self._loading)]:
            self._finish(job, StopReason.ERROR, error)

    def step(self) -> None:
        """Admit what fits, run one batch, let each request pick its next tokens."""
        self._retire()
        self._collect_loads()
        self._admit()
        parts, owners = self._plan()
        if not parts:
            if self._loading:  # nothing to run until a file is read
                wait([future for _, future in self._loading], 0.05, FIRST_COMPLETED)
            return
        if self._invariant:  # each sequence in a llama_decode of its own
            batches = [([part], [job]) for part, job in zip(parts, owners, strict=True)]
        else:
            batches = [(parts, owners)]
        for batch, jobs in batches:
            started = time.perf_counter()
            ran = self._decode(batch, jobs)
            if ran is None:
                continue
            ran_parts, indices = ran  # without the drafts the cache had no room for
            # a step of one generating sequence, timed for the speculator (draft_length.py)
            timer = self._speculator if len(jobs) == 1 and not jobs[0].prefilling else None
            drafted = 0 if jobs[0].guessed else len(jobs[0].draft)
            for part, job, index in zip(ran_parts, jobs, indices, strict=True):
                try:
                    self._advance(job, part, index)
                except Exception as exc:  # a failing request must not stop the others
                    log.exception("generation failed")
                    self._finish(job, StopReason.ERROR, f"{type(exc).__name__}: {exc}")
                    timer = None
                job.channel.flush()  # the step's tokens of this job, in one wake
            if timer is not None:
                timer.step_took(drafted, time.perf_counter() - started)

    def _retire(self) -> None:
        for job in [j for j in self._waiting if j.channel.cancelled]:
            self._waiting.remove(job)
            self._finish(job, StopReason.CANCELLED)
        for job, future in [(j, f) for j, f in self._loading if j.channel.cancelled]:
            self._loading.remove((job, future))
            self._finish(job, StopReason.CANCELLED)
        for job in list(self._running):
            assert job.slot is not None
            if job.channel.cancelled:
                self._finish(job, StopReason.CANCELLED)
            elif job.pending and len(job.slot.tokens) + len(job.pending) >= self._ctx.n_ctx:
                self._finish(job, StopReason.CONTEXT_FULL)

    def _admit(self) -> None:
        """Start waiting jobs in order while a slot is free for them.

        A job whose prompt the disk may hold more of is read first (off the engine thread) and
        started once read; it keeps a free slot promised meanwhile, so a read starts only for a
        job that runs as soon as it is read, and at most one state per free slot is held in
        memory.
        """
        while self._waiting:
            job = self._waiting[0]
            if not job.prompt_tokens or len(job.prompt_tokens) >= self._ctx.n_ctx:
                self._waiting.popleft()
                error = f"prompt of {len(job.prompt_tokens)} tokens does not fit"
                self._finish(job, StopReason.ERROR, error)
                continue
            if self._free_slots() <= 0:
                return
            if (
                self._cache is not None
                and not job.looked_up
                and not job.params.prompt_logprobs
                and not self._invariant  # its prompt is evaluated from the start
            ):
                job.looked_up = True
                cached = longest_prefix(self.slots, job.prompt_tokens)
                future = self._cache.lookup(job.prompt_tokens, cached)
                if future is not None:  # read off the engine thread; admitted once read
                    self._loading.append((self._waiting.popleft(), future))
                    continue
            choice = choose_slot(self.slots, job.prompt_tokens)
            if choice is None:
                return
            self._waiting.popleft()
            try:
                self._start(job, choice)
            except Exception as exc:  # one bad request must not stop the engine thread
                log.exception("could not start a generation")
                if job.slot is not None:
                    self._forget(job.slot)
                self._finish(job, StopReason.ERROR, f"{type(exc).__name__}: {exc}")

    def _free_slots(self) -> int:
        """Slots no job runs in, less those promised to the jobs being read from disk."""
        return sum(not slot.busy for slot in self.slots) - len(self._loading)

    def _start(self, job: Job, choice: SlotChoice) -> None:
        ctx, slot = self._ctx, choice.slot
        slot.busy = True
        job.slot = slot
        computed = job.params.prompt_logprobs or self._invariant  # every position evaluated
        reuse = 0 if computed else choice.keep
        keep = ctx.truncate(slot.seq_id, ctx.reusable_prefix(slot.seq_id, reuse))
        del slot.tokens[keep:]
        if job.params.prompt_logprobs:
            job.disk = None
            job.prompt_logprobs = [None]  # the first token has nothing before it
        elif choice.donor is not None and not self._invariant:
            shared = ctx.reusable_prefix(choice.donor.seq_id, choice.shared)
            if shared > keep:
                ctx.share_prefix(choice.donor.seq_id, slot.seq_id, shared)
                slot.tokens[:] = job.prompt_tokens[:shared]
                keep = shared
        keep = self._restore(job, slot, keep)
        job.phase = _Phase.RUNNING
        job.cached = job.next_prompt = keep
        job.started = time.perf_counter()
        chooser = self._hook(job.prompt_tokens) if self._hook is not None else None
        job.picker = TokenPicker(ctx, job.params, job.steering, chooser)
        if self._speculator is not None and job.params.speculate:
            earlier = self._indexes.pop(slot.seq_id, None)
            job.drafter = self._speculator.follow(job.prompt_tokens, earlier)
        if not job.params.prompt_logprobs and job.params.max_tokens > 0:
            job.lead = self._lead(job)
            # a guess only where a pick follows the lead (it neither stops nor fills max_tokens);
            # also without a lead: where tools are offered nothing is forced after the prompt's
            # `<|start|>assistant` (a recipient may come before the channel), and the guess is
            # the whole `<|channel|>analysis<|message|>`
            ends = bool(set(job.lead) & job.params.stop_tokens)
            ends = ends or job.params.max_tokens <= len(job.lead)
            if job.steering is not None and self._guess_header and not ends:
                job.guess = job.steering.likely()
            # what the consumer may parse ahead, while the prompt is evaluated
            job.channel.likely = (*job.lead, *job.guess)
        self._running.append(job)

    def _lead(self, job: Job) -> tuple[int, ...]:
        """The tokens the steering forces before the model's first choice (`<|channel|>` after
        the prompt's `<|start|>assistant`), accepted by the steering now. They are emitted when
        the prefill ends and, when the prompt's last chunk has room for them, evaluated with it
        (`_plan`): the model's first choice then comes straight from the prefill's logits, a
        step earlier. Reading stops at a stop token, and before the end of the context."""
        assert job.picker is not None
        lead: list[int] = []
        room = min(FORCED_AHEAD_MAX, self._ctx.n_ctx - 1 - len(job.prompt_tokens))
        while len(lead) < room and not set(lead) & job.params.stop_tokens:
            tokens = job.picker.forced_ahead()
            if not tokens:
                break
            for token in tokens:
                job.picker.accept(token)
            lead.extend(tokens)
        return tuple(lead)

    def _plan(self) -> tuple[list[BatchPart], list[Job]]:
        """This step's batch: every generating job's pending tokens (and draft), then a chunk of
        the oldest prefill. A batch that carries drafts fits one ubatch (`_draft_room`)."""
        parts: list[BatchPart] = []
        owners: list[Job] = []
        generating = [job for job in self._running if job.pending and job.slot is not None]
        prefill = next((job for job in self._running if job.prefilling), None)
        pending = sum(len(job.pending) for job in generating)
        budget = self._ctx.n_batch - pending
        shared_room = self._draft_room(pending, prefill is not None)
        for job in generating:
            assert job.slot is not None
            # decoded alone, a job's draft has the ubatch to itself
            room = self._ctx.n_ubatch - len(job.pending) if self._invariant else shared_room
            job.draft = self._draft(job, room) if room > 0 else ()
            job.guessed = self._invariant and not job.draft and len(job.pending) == 1
            if job.guessed:
                job.draft = self._guess(job)
            shared_room -= len(job.draft)
            budget -= len(job.draft)
            tokens = (*job.pending, *job.draft) if job.draft else job.pending
            start = len(job.slot.tokens)
            outputs = 1 + len(job.draft)
            if self._invariant:  # two rows at least: see _guess
                outputs = min(len(tokens), max(2, outputs))
            parts.append(BatchPart(job.slot.seq_id, tokens, start, True, outputs))
            owners.append(job)
        if any(job.draft for job in generating) and not self._invariant:
            budget = min(budget, self._ctx.n_ubatch - sum(len(part.tokens) for part in parts))
        if prefill is not None and prefill.slot is not None and (budget > 0 or self._invariant):
            start = prefill.next_prompt
            if self._invariant:  # chunk boundaries at multiples of the chunk, whatever else runs
                size = min(self._prefill_chunk, self._ctx.n_batch)
                cap = size - start % size
            else:
                cap = min(budget, self._prefill_chunk) if parts else budget
            if self._cache is not None:  # end the chunk at the next save point
                cap = min([cap, *(p - start for p in prefill.save_points if p > start)])
            scored = prefill.params.prompt_logprobs
            if scored:
                cap = min(cap, PROMPT_LOGPROBS_CHUNK)
            chunk = prefill.prompt_tokens[start : start + cap]
            last = start + len(chunk) == len(prefill.prompt_tokens)
            # the lead after the prompt's last chunk, when it fits (a save point at the prompt's
            # end caps the chunk there: the state saved is the prompt's alone)
            outputs = 1
            if last and len(prefill.lead) <= cap - len(chunk):
                chunk = [*chunk, *prefill.lead]
                # and the header the model most likely picks after it, as a draft: its first
                # pick and the next come from this step's logits while they match the guess
                # (`_pick`; a miss drops the guess's cells), a step fewer to the first text for
                # each token guessed right after the lead (three where there is no lead)
                room = self._ctx.n_ctx - 1 - len(prefill.prompt_tokens) - len(prefill.lead)
                guess = prefill.guess[: max(0, min(cap - len(chunk), room))]
                if guess:  # (a job has one only where self._guess_header: _start)
                    chunk = [*chunk, *guess]
                    prefill.draft, prefill.guessed, outputs = guess, True, 1 + len(guess)
            parts.append(
                BatchPart(prefill.slot.seq_id, chunk, start, last, outputs, all_logits=scored)
            )
            owners.append(prefill)
        return parts, owners

    def _guess(self, job: Job) -> tuple[int, ...]:
        """The batch-invariant mode's one-token draft, when a step would evaluate one token.

        llama.cpp's CPU kernels compute a row alike in any batch of two rows or more, but take
        another path for one row (a matrix-vector product; measured on the trained tiny model:
        logits up to 0.15 apart), and the model's last layer runs on the rows whose logits are
        kept. So every step of a generation keeps two rows at least: one token alone is followed
        by a guess (its own repeat), verified as any draft — kept when the model picks it — and
        otherwise rolled back. With speculation on or off, every token is then computed the same
        way, and the two give the same tokens. No guess at the end of the context."""
        assert job.slot is not None
        if len(job.slot.tokens) + len(job.pending) + 1 >= self._ctx.n_ctx:
            return ()
        return job.pending[-1:]

    def _draft_room(self, pending: int, prefilling: bool) -> int:
        """How many drafted tokens this step's batch may carry: the batch stays within one
        ubatch, so llama.cpp places every cell of it before any of its positions advance (see
        the module's docstring); with a prefill waiting, half the ubatch stays for its chunk."""
        ubatch = self._ctx.n_ubatch
        return (ubatch // 2 if prefilling else ubatch) - pending

    def _draft(self, job: Job, budget: int) -> tuple[int, ...]:
        """What to verify after the job's pending tokens: drafts in content only (after a
        forced or chosen header token the steering decides, not the context), never past the
        batch, the context or the tokens still allowed."""
        assert job.slot is not None
        assert job.picker is not None
        directive = job.picker.last
        if job.drafter is None or not (directive is None or isinstance(directive, Constrain)):
            return ()
        limit = min(
            budget,
            self._ctx.n_ctx - 1 - len(job.slot.tokens) - len(job.pending),
            job.params.max_tokens - job.completed - 1,
        )
        banned = directive.banned if directive is not None else frozenset()
        return job.drafter.propose(limit, banned)

    def _decode(
        self, parts: list[BatchPart], owners: list[Job]
    ) -> tuple[list[BatchPart], list[int]] | None:
        """Run the batch, dropping the drafts, then idle conversations, while the cache has no
        room for it. Returns the parts that ran and the batch index of each one's logits."""
        prefilling = any(job.prefilling for job in owners)
        fresh = [job for job in owners if not job.announced]
        before = partial(_announce, fresh) if fresh else None
        while True:
            try:
                with _stop_once_all_left(owners) if prefilling else nullcontext() as stop:
                    return parts, self._ctx.decode(parts, stop, before)
            except DecodeError as exc:
                if exc.code == ABORTED:
                    self._keep_aborted(parts, owners)
                    return None
                if exc.code == NO_ROOM and any(job.draft for job in owners):
                    parts = [_undrafted(part, job) for part, job in zip(parts, owners, strict=True)]
                    continue
                victims = eviction_order(self.slots) if exc.code == NO_ROOM else []
                if victims:
                    self._evict(victims[0])
                    continue
                self._fail_batch(owners, exc)
                return None

    def _keep_aborted(self, parts: list[BatchPart], owners: list[Job]) -> None:
        """After a decode stopped because every client of the batch left: what each prompt
        chunk had evaluated stays cached (a request sent again continues from it); the rest of
        the batch is dropped from the KV cache. The jobs end at the next step (_retire)."""
        kept_total = 0
        for part, job in zip(parts, owners, strict=True):
            slot = job.slot
            assert slot is not None
            start = part.start_pos
            kept = 0
            if job.prefilling and not part.all_logits:  # the prompt's tokens (not the lead)
                kept = max(self._ctx.seq_end(slot.seq_id) - start, 0)
                kept = min(kept, _prompt_part(job, part))
            if self._ctx.truncate(slot.seq_id, start + kept) != start + kept:
                self._forget(slot)
                continue
            slot.tokens.extend(part.tokens[:kept])
            job.next_prompt += kept
            job.evaluated += kept
            kept_total += kept
        log.info("a decode stopped: its clients left (%d prompt tokens kept)", kept_total)

    def _fail_batch(self, owners: list[Job], exc: DecodeError) -> None:
        if exc.code == NO_ROOM:  # the newest request gives way; the others go on next step
            self._finish(owners[-1], StopReason.CONTEXT_FULL)
            return
        log.error("llama_decode failed with code %d", exc.code)
        for job in owners:
            if job.slot is not None:
                self._forget(job.slot)
            self._finish(job, StopReason.ERROR, str(exc))

    def _advance(self, job: Job, part: BatchPart, index: int) -> None:
        assert job.slot is not None
        assert job.picker is not None
        job.slot.tokens.extend(part.tokens)
        if job.prefilling:
            if part.all_logits:
                self._score_prompt(job, part, index)
            prompt = _prompt_part(job, part)
            job.next_prompt += prompt
            job.evaluated += prompt
            if job.next_prompt in job.save_points:
                self._save(job.slot.seq_id, job.slot.tokens)
            if not job.prefilling:
                self._ctx.synchronize()  # the prefill's end, not its queuing (GPU)
                job.prefilled = time.perf_counter()
                if job.lead and self._emit_lead(job, carried=prompt < len(part.tokens)):
                    return
        else:
            job.pending = ()
        if index < 0 or job.prefilling:  # a prompt chunk whose logits were kept for scoring
            return
        if job.params.max_tokens <= 0:  # the prompt alone was asked for (its logprobs)
            self._finish(job, StopReason.MAX_TOKENS)
            return
        self._pick(job, index)

    def _emit_lead(self, job: Job, *, carried: bool) -> bool:
        """At the end of the prefill, hand the lead to the client (the steering accepted it at
        the start); when the last chunk did not carry it, it is the next step's pending tokens.
        True when no pick follows now."""
        for token in job.lead:
            if self._emit(job, token, accepted=True):
                return True
        if not carried:
            job.pending = job.lead
            return True
        return False

    def _scores(self, job: Job, index: int, tokens: tuple[int, ...]) -> list[TokenLogprob | None]:
        """The logprobs to report with `tokens` (None: not asked for, or forced by steering)."""
        assert job.picker is not None
        n_top = job.params.logprobs
        if n_top is None or job.picker.forced:
            return [None] * len(tokens)
        return [token_logprob(self._ctx.logits(index), tokens[0], n_top)]

    def _score_prompt(self, job: Job, part: BatchPart, index: int) -> None:
        """The logprob of each prompt token after this chunk's positions (the logits at batch
        index `first + j` predict the token after the chunk's j-th)."""
        first = index - len(part.tokens) + 1
        n_top = job.params.logprobs or 0
        prompt = job.prompt_tokens
        for j in range(len(part.tokens)):
            following = part.start_pos + j + 1
            if following < len(prompt):
                logits = self._ctx.logits(first + j)
                job.prompt_logprobs.append(token_logprob(logits, prompt[following], n_top))

    def _pick(self, job: Job, index: int) -> None:
        """Pick the next tokens at the logits after the pending ones, and at each next position
        while every token so far equals the job's draft (the logits there are those of the true
        prefix); drop the cells of the rest of the draft. A plain step is the pick of an empty
        draft: it picks (and emits) once."""
        assert job.slot is not None
        assert job.picker is not None
        draft, job.draft = job.draft, ()
        first = index - len(draft)  # the logits after the pending token
        emitted: list[int] = []
        ended = False
        while not ended and len(emitted) <= len(draft) and emitted == list(draft[: len(emitted)]):
            if emitted and job.channel.cancelled:  # the client left: stop within this step
                break
            position = first + len(emitted)
            tokens = job.picker.next_tokens(position)
            for token, score in zip(tokens, self._scores(job, position, tokens), strict=True):
                emitted.append(token)
                if self._emit(job, token, score):
                    ended = True
                    break
        accepted = common_prefix_length(emitted, draft)
        if draft and job.drafter is not None and not job.guessed:
            job.drafter.settle(len(draft), accepted)
        keep = min(accepted, len(emitted) - 1)  # the last emitted token is not evaluated yet
        dropped = rejected_cells(len(draft), keep)
        if dropped > 0:
            n_keep = len(job.slot.tokens) - dropped
            if self._ctx.truncate(job.slot.seq_id, n_keep) != n_keep:
                job.slot.tokens.clear()
                raise RuntimeError("the KV cache could not drop a rejected draft")
            del job.slot.tokens[n_keep:]
            if self._ctx.reusable_prefix(job.slot.seq_id, n_keep) != n_keep:
                self._forget(job.slot)  # its window lost cells: nothing in it can be trusted
                raise RuntimeError("a rejected draft's cells took the sliding window with them")
        ahead = None if ended else self._forced_ahead(job, len(emitted) - keep)
        if ahead is not None:
            job.pending = (*emitted[keep:], *ahead)

    def _forced_ahead(self, job: Job, pending: int) -> list[int] | None:
        """The tokens the steering leaves no choice about after the picked ones (most of a
        harmony header: `<|message|>` after a channel, `<|start|>assistant<|channel|>` after
        `<|end|>`), emitted now, so the next step evaluates them with the picked token instead
        of one step each; None when one of them ended the generation."""
        assert job.picker is not None
        assert job.slot is not None
        ahead: list[int] = []
        room = min(FORCED_AHEAD_MAX, self._ctx.n_ctx - 1 - len(job.slot.tokens) - pending)
        while len(ahead) < room and not job.channel.cancelled:
            tokens = job.picker.forced_ahead()
            if not tokens:
                break
            for token in tokens:
                ahead.append(token)
                if self._emit(job, token):  # a stop token, max_tokens
                    return None
        return ahead

    def _emit(
        self, job: Job, token: int, score: TokenLogprob | None = None, *, accepted: bool = False
    ) -> bool:
        """Hand one token to the client (`accepted`: the steering has taken it already); True
        when the generation ended with it."""
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
            self._finish(job, StopReason.STOP_TOKEN)
            return True
        if job.completed >= job.params.max_tokens:
            self._finish(job, StopReason.MAX_TOKENS)
            return True
        return False

    def _finish(self, job: Job, reason: StopReason, error: str | None = None) -> None:
        if job.phase is _Phase.DONE:
            return
        if job in self._running:
            self._running.remove(job)
        if job.slot is not None:
            job.slot.busy = False
            job.slot.last_used = time.perf_counter()
        if job.picker is not None:
            job.picker.free()
        index = job.drafter.index() if job.drafter is not None else None
        if index is not None and job.slot is not None:
            self._indexes[job.slot.seq_id] = index
        job.phase = _Phase.DONE
        job.channel.close(job.result(reason, error))

    def _forget(self, slot: Slot) -> None:
        self._ctx.truncate(slot.seq_id, 0)
        slot.tokens.clear()

    def _evict(self, slot: Slot) -> None:
        """Drop an idle conversation for room, saving it to disk first."""
        self._save(slot.seq_id, slot.tokens)
        self._forget(slot)

    def _save(self, seq_id: int, tokens: list[int], wait_s: float = 0.0) -> None:
        if self._cache is None or not tokens:
            return
        try:
            self._cache.save(seq_id, tokens, wait_s)
        except Exception:  # the disk cache never fails a generation
            log.exception("prompt cache: could not save a sequence")

    def _collect_loads(self) -> None:
        """Jobs whose disk read ended go back to the head of the queue, in their order."""
        done = [(job, future) for job, future in self._loading if future.done()]
        for job, future in done:
            self._loading.remove((job, future))
            try:
                job.disk = future.result()
            except Exception:  # a failed read is a miss, never a failed request
                log.exception("prompt cache: could not read an entry")
            if job.disk is None and self._cache is not None:
                self._cache.stats.misses += 1
        self._waiting.extendleft(reversed([job for job, _ in done]))

    def _restore(self, job: Job, slot: Slot, keep: int) -> int:
        """Start from the prefix read from disk if it is longer than `keep`."""
        found, job.disk = job.disk, None
        if self._cache is None or found is None or found.n_tokens <= keep:
            return keep
        while not self._cache.load(slot.seq_id, found):  # the sequence is empty now
            slot.tokens.clear()
            victims = [v for v in eviction_order(self.slots) if v is not slot]
            if not victims:
                log.warning("prompt cache: no room to restore %d tokens", found.n_tokens)
                self._cache.stats.misses += 1
                return 0
            self._evict(victims[0])
        slot.tokens[:] = job.prompt_tokens[: found.n_tokens]
        return found.n_tokens


def _prompt_part(job: Job, part: BatchPart) -> int:
    """How many of a prefill chunk's tokens are the prompt's: the last chunk may carry the
    lead after them (`Scheduler._plan`)."""
    return min(len(part.tokens), len(job.prompt_tokens) - part.start_pos)


def _undrafted(part: BatchPart, job: Job) -> BatchPart:
    """The part without the job's draft (the cache has no room for it): a generating job's
    pending tokens, or a prompt's last chunk and its lead without the guessed header."""
    if not job.draft:
        return part
    tokens = part.tokens[: len(part.tokens) - len(job.draft)]
    job.draft = ()
    return BatchPart(part.seq_id, tokens, part.start_pos, part.logits, 1, part.all_logits)


def _announce(fresh: list[Job]) -> None:
    """Tell the consumers of the batch's new generations that the engine evaluates them (their
    events are made while this thread is in llama_decode)."""
    for job in fresh:
        if not job.announced:  # a decode tried again (no room) announces once
            job.announced = True
            job.channel.begin()


@contextmanager
def _stop_once_all_left(owners: list[Job]) -> Iterator[StopFlag]:
    """A stop flag for one decode of the batch, set once every request of it was cancelled
    (its client left), on the thread that cancels the last one."""
    stop = StopFlag()
    channels = [job.channel for job in owners]

    def check() -> None:
        if all(channel.cancelled for channel in channels):
            stop.set()

    unwatch = [channel.on_cancel(check) for channel in channels]
    try:
        yield stop
    finally:
        for end in unwatch:
            end()
