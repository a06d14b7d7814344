"""Scheduler: continuous batching over the context's sequences, one llama_decode per step.

Each step has two halves with the decode between them. The plan (plan.py) decides the batch from
the running jobs and the budgets alone: every generating job's pending tokens and the extra
tokens it carries after them (a speculative draft, the batch-invariant mode's repeat, the header
guessed after the lead), then a chunk of the oldest prefill. The apply (apply.py) takes each
job's part of one decode's logits: picks, scores, emits, rolls back the rejected extra, and
returns how the job ended (finished, failed, its window lost) as data. The scheduler keeps
what lies between and around them: the queue and admission, the disk cache's reads (restored,
saved and evicted through `Memory`), the decode and its retries (no room: the extras dropped,
then idle conversations evicted), retiring cancelled jobs, and acting on the outcomes
(finishing, forgetting).

Requests wait when every slot is busy; a prompt goes to the slot with the longest cached prefix
(see slots.py), never to one another conversation's pin holds while another slot may free (a
pinned conversation's KV waits for its next turn); when the KV cache is full, the least recently
used idle conversation is dropped, pinned ones last.
With the prompt cache on disk (prompt_cache.py), a prompt's save points are saved as its prefill
reaches them (chunks end there), an evicted conversation is saved before it is dropped, every
conversation is saved at shutdown, and a new prompt starts from the longest saved prefix when
the disk holds more of it than the memory (read only once a slot is free for it, one read for
the requests waiting on the same entry).

Log-probabilities are computed only for requests that ask (SamplingParams.logprobs): each
sampled token's travels with it to the channel. A request for the prompt's own
(`prompt_logprobs`) evaluates its whole prompt, reusing nothing cached, in chunks whose every
position keeps its logits (plan.PROMPT_LOGPROBS_CHUNK).

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

from server.engine import apply
from server.engine.base import BatchPart, SamplingHook, StopReason
from server.engine.channel import announcer
from server.engine.disk_cache.prompt_cache import Found, PromptCache
from server.engine.job import Job, Phase
from server.engine.llama_context import ABORTED, DecodeError, LlamaContext
from server.engine.picker import TokenPicker
from server.engine.plan import Budgets, Kind, decide, without_extra
from server.engine.slots import Slot, SlotChoice, choose_slot, eviction_order, longest_prefix
from server.engine.speculative.drafter import Speculator
from server.engine.speculative.ngram import NgramDrafter
from server.engine.step_trace import StepTrace
from server.engine.stop_flag import StopFlag

log = logging.getLogger(__name__)

NO_ROOM = 1  # llama_decode: no KV cells left for the batch
SHUTDOWN_SAVE_S = 30.0  # at most this long, in all, for the saves at shutdown to find room


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
        backend_sampling: bool = False,
    ) -> None:
        self._ctx = ctx
        self._invariant = batch_invariant
        # free text drawn inside the graph (sampling/backend_chain.py); never in the invariant
        # mode, whose tokens must not depend on how a step is made up
        self._backend = backend_sampling and not batch_invariant
        self._budgets = Budgets(
            ctx.n_batch,
            ctx.n_ubatch,
            ctx.n_ctx,
            max(1, prefill_chunk),
            invariant=batch_invariant,
            save_points=cache is not None,
            backend=self._backend,
        )
        # evaluate the likely first header with the prompt (plan.py): its cells must be removable
        # as a draft's are (no window-sized sliding-window cache), outside the invariant mode
        self._guess_header = guess_header and not batch_invariant
        self._cache = cache
        self._speculator = speculator
        self._hook = hook
        self.slots = [Slot(seq_id) for seq_id in range(ctx.n_seq)]
        self._memory = Memory(ctx, self.slots, cache)
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._loading: list[tuple[Job, Future[Found | None]]] = []  # reading from disk
        # the n-gram index each slot's last generation left: the next turn extends it
        self._indexes: dict[int, NgramDrafter] = {}
        self._trace = StepTrace.from_env(ctx)  # debug only (step_trace.py)

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
        self._memory.save_all(SHUTDOWN_SAVE_S)
        if self._trace is not None:
            self._trace.close()

    def fail_all(self, error: str, reason: StopReason = StopReason.UNAVAILABLE) -> None:
        """End every job with `error`: at shutdown, or off the engine thread once it is stuck for
        good (an RPC host dropped): the engine can no longer generate them (UNAVAILABLE; an
        internal error's own request: ERROR)."""
        for job in [*self._running, *self._waiting, *(job for job, _ in self._loading)]:
            self._finish(job, reason, error)

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
            decoded = time.perf_counter()
            ran_parts, indices = ran  # without the drafts the cache had no room for
            # a step of generating sequences only, timed for the draft controller
            timer = self._speculator if not any(job.prefilling for job in jobs) else None
            drafted = sum(_drafted(job) for job in jobs)
            completed = sum(job.completed for job in jobs)
            for part, job, index in zip(ran_parts, jobs, indices, strict=True):
                try:
                    self._advance(job, part, index)
                except Exception as exc:  # a failing request must not stop the others
                    log.exception("generation failed")
                    self._finish(job, StopReason.ERROR, f"{type(exc).__name__}: {exc}")
                    timer = None
                job.channel.flush()  # the step's tokens of this job, in one wake
            emitted = sum(job.completed for job in jobs) - completed
            took = time.perf_counter() - started
            if timer is not None:
                timer.step_took(drafted, took, len(jobs), emitted)
            if self._trace is not None:
                self._trace.step(ran_parts, took, decoded - started, drafted, emitted)

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
            choice = choose_slot(self.slots, job.prompt_tokens, job.pin)
            if choice is None:
                return
            self._waiting.popleft()
            try:
                self._start(job, choice)
            except Exception as exc:  # one bad request must not stop the engine thread
                log.exception("could not start a generation")
                if job.slot is not None:
                    self._memory.forget(job.slot)
                self._finish(job, StopReason.ERROR, f"{type(exc).__name__}: {exc}")

    def _free_slots(self) -> int:
        """Slots no job runs in, less those promised to the jobs being read from disk."""
        return sum(not slot.busy for slot in self.slots) - len(self._loading)

    def _start(self, job: Job, choice: SlotChoice) -> None:
        ctx, slot = self._ctx, choice.slot
        slot.busy = True
        job.slot = slot
        self._move_pin(slot, job)
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
        keep = self._memory.restore(job, slot, keep)
        job.phase = Phase.RUNNING
        job.cached = job.next_prompt = keep
        job.started = time.perf_counter()
        chooser = self._hook(job.prompt_tokens) if self._hook is not None else None
        job.picker = TokenPicker(
            ctx, job.params, job.steering, chooser, seq_id=slot.seq_id, backend=self._backend
        )
        if self._speculator is not None and job.params.speculate:
            earlier = self._indexes.pop(slot.seq_id, None)
            job.drafter = self._speculator.follow(job.prompt_tokens, earlier)
        if not job.params.prompt_logprobs and job.params.max_tokens > 0:
            job.read_lead(ctx.n_ctx, guess=self._guess_header)
        self._running.append(job)

    def _move_pin(self, slot: Slot, job: Job) -> None:
        """The slot is now the job's conversation's: its pin holds this slot alone (the one it
        held before, if another, goes back to the others with its cache intact); a slot taken
        by a job without a pin holds none."""
        if job.pin is not None:
            for other in self.slots:
                if other.pin is job.pin:
                    other.pin = None
        slot.pin = job.pin

    def _plan(self) -> tuple[list[BatchPart], list[Job]]:
        """This step's batch (plan.py), each job's extra tokens set for the pick and its
        sequence's backend chain set or taken off as the plan decided."""
        jobs = self._running
        planned = decide([job.row() for job in jobs], self._budgets, self._propose)
        owners = [jobs[p.row] for p in planned]
        for p, job in zip(planned, owners, strict=True):
            job.extra = p.extra
            apply.sample_where(job, p.backend)
        return [p.part for p in planned], owners

    def _propose(self, row: int, limit: int) -> tuple[int, ...]:
        return self._running[row].propose(limit)

    def _decode(
        self, parts: list[BatchPart], owners: list[Job]
    ) -> tuple[list[BatchPart], list[int]] | None:
        """Run the batch, dropping the drafts, then idle conversations, while the cache has no
        room for it. Returns the parts that ran and the batch index of each one's logits."""
        prefilling = any(job.prefilling for job in owners)
        before = announcer(job.channel for job in owners)
        while True:
            try:
                with _stop_once_all_left(owners) if prefilling else nullcontext() as stop:
                    return parts, self._ctx.decode(parts, stop, before)
            except DecodeError as exc:
                if exc.code == ABORTED:
                    for job in apply.keep_aborted(self._ctx, parts, owners):
                        assert job.slot is not None
                        self._memory.forget(job.slot)
                    return None
                if exc.code == NO_ROOM and any(job.extra for job in owners):
                    parts = [
                        without_extra(p, job.extra) for p, job in zip(parts, owners, strict=True)
                    ]
                    for job in owners:
                        job.extra = None
                    continue
                victims = eviction_order(self.slots) if exc.code == NO_ROOM else []
                if victims:
                    self._memory.evict(victims[0])
                    continue
                self._fail_batch(owners, exc)
                return None

    def _fail_batch(self, owners: list[Job], exc: DecodeError) -> None:
        if exc.code == NO_ROOM:  # the newest request gives way; the others go on next step
            self._finish(owners[-1], StopReason.CONTEXT_FULL)
            return
        log.error("llama_decode failed with code %d", exc.code)
        for job in owners:
            if job.slot is not None:
                self._memory.forget(job.slot)
            self._finish(job, StopReason.ERROR, str(exc))

    def _advance(self, job: Job, part: BatchPart, index: int) -> None:
        """Apply the decode to the job's part (apply.py) and act on how it ended."""
        assert job.slot is not None
        if apply.evaluated(self._ctx, job, part, index):  # a save point: saved before the rest
            self._memory.save(job.slot.seq_id, job.slot.tokens)
        outcome = apply.follow(self._ctx, job, part, index)
        if outcome.pick:
            self._pick(job, index)
        else:
            self._act(job, outcome)

    def _pick(self, job: Job, index: int) -> None:
        self._act(job, apply.pick(self._ctx, job, index))

    def _act(self, job: Job, outcome: apply.Outcome) -> None:
        """Finish, forget or fail the job as its outcome says (a failure raises: `step` ends the
        job with it)."""
        if outcome.forget and job.slot is not None:
            self._memory.forget(job.slot)
        if outcome.end is not None:
            self._finish(job, outcome.end)
        if outcome.failure is not None:
            raise RuntimeError(outcome.failure)

    def _finish(self, job: Job, reason: StopReason, error: str | None = None) -> None:
        if job.phase is Phase.DONE:
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
        job.phase = Phase.DONE
        job.channel.close(job.result(reason, error))

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


class Memory:
    """The slots' sequences in the KV cache and their copies on disk: dropped (`forget`), saved,
    saved then dropped for room (`evict`), started from a prefix read from disk (`restore`)."""

    def __init__(self, ctx: LlamaContext, slots: list[Slot], cache: PromptCache | None) -> None:
        self._ctx = ctx
        self._slots = slots
        self._cache = cache

    def forget(self, slot: Slot) -> None:
        self._ctx.truncate(slot.seq_id, 0)
        slot.tokens.clear()

    def evict(self, slot: Slot) -> None:
        """Drop an idle conversation for room, saving it to disk first."""
        self.save(slot.seq_id, slot.tokens)
        self.forget(slot)

    def save(self, seq_id: int, tokens: list[int], wait_s: float = 0.0) -> None:
        if self._cache is None or not tokens:
            return
        try:
            self._cache.save(seq_id, tokens, wait_s)
        except Exception:  # the disk cache never fails a generation
            log.exception("prompt cache: could not save a sequence")

    def save_all(self, within_s: float) -> None:
        """Save every conversation (waiting, within `within_s` in all, for the disk writes
        before them to make room)."""
        if self._cache is None:
            return
        deadline = time.monotonic() + within_s
        for slot in self._slots:
            self.save(slot.seq_id, slot.tokens, max(0.0, deadline - time.monotonic()))

    def restore(self, job: Job, slot: Slot, keep: int) -> int:
        """Start from the prefix read from disk if it is longer than `keep`."""
        found, job.disk = job.disk, None
        if self._cache is None or found is None or found.n_tokens <= keep:
            return keep
        while not self._cache.load(slot.seq_id, found):  # the sequence is empty now
            slot.tokens.clear()
            victims = [v for v in eviction_order(self._slots) if v is not slot]
            if not victims:
                log.warning("prompt cache: no room to restore %d tokens", found.n_tokens)
                self._cache.stats.misses += 1
                return 0
            self.evict(victims[0])
        slot.tokens[:] = job.prompt_tokens[: found.n_tokens]
        return found.n_tokens


def _drafted(job: Job) -> int:
    """The drafted tokens the job carries this step."""
    extra = job.extra
    return len(extra.tokens) if extra is not None and extra.kind is Kind.DRAFT else 0


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
