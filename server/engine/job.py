"""Job: one generation request and its progress, from the queue to its result.

A job waits (in the scheduler's queue, or while its prompt is read from disk), runs in a slot
(its prompt prefilled chunk by chunk, then generating: its pending tokens evaluated each step,
followed by the `Extra` the plan gave it), and is done once its channel is closed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from server.contracts.directives import Constrain, Steering, SteeringStats
from server.contracts.events import Timings, TokenLogprob, Usage
from server.engine.base import EngineResult, SamplingParams, SlotPin, StopReason
from server.engine.channel import TokenChannel
from server.engine.disk_cache.prompt_cache import Found
from server.engine.picker import TokenPicker
from server.engine.plan import Extra, Row
from server.engine.slots import Slot
from server.engine.speculative.drafter import SequenceDrafter

FORCED_AHEAD_MAX = 16  # tokens the steering forces, emitted ahead into one step


class Phase(Enum):
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
    pin: SlotPin | None = None  # its conversation's claim on the slot it runs in (slots.py)
    looked_up: bool = False  # the disk was asked for a longer prefix
    disk: Found | None = None  # what the disk had, read, until the job starts
    submitted: float = field(default_factory=time.perf_counter)
    phase: Phase = Phase.WAITING
    slot: Slot | None = None
    picker: TokenPicker | None = None
    next_prompt: int = 0  # index of the next prompt token to evaluate
    pending: tuple[int, ...] = ()  # emitted tokens not evaluated yet
    lead: tuple[int, ...] = ()  # forced before the model's first choice (read_lead)
    guess: tuple[int, ...] = ()  # the steering's likely header after the lead (plan.py)
    drafter: SequenceDrafter | None = None  # with speculation on: what it drafts, and counts
    extra: Extra | None = None  # evaluated after `pending` in this step's batch (plan.py)
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

    @property
    def draft(self) -> tuple[int, ...]:
        """The tokens evaluated after the pending ones this step, whatever their kind."""
        return self.extra.tokens if self.extra is not None else ()

    def row(self) -> Row:
        """What the plan reads of this running job (a generating job's next pick: what it
        needs of the step, read from its steering ahead)."""
        assert self.slot is not None
        assert self.picker is not None
        backend = self.picker.next_pick() if self.pending and not self.prefilling else False
        return Row(
            self.slot.seq_id,
            len(self.slot.tokens),
            self.pending,
            self.prompt_tokens,
            self.next_prompt,
            self.lead,
            self.guess,
            self.save_points,
            bool(self.params.prompt_logprobs),
            self.params.max_tokens - self.completed,
            backend,
        )

    def propose(self, limit: int) -> tuple[int, ...]:
        """Its drafter's proposal, at most `limit` tokens: drafts in content only (after a
        forced or chosen header token the steering decides, not the context)."""
        assert self.picker is not None
        directive = self.picker.last
        if self.drafter is None or not (directive is None or isinstance(directive, Constrain)):
            return ()
        banned = directive.banned if directive is not None else frozenset()
        return self.drafter.propose(limit, banned)

    def read_lead(self, n_ctx: int, *, guess: bool) -> None:
        """The tokens the steering forces before the model's first choice (`<|channel|>` after
        the prompt's `<|start|>assistant`), accepted by the steering now, and (`guess`) the
        header the model most likely writes after them. The lead is emitted when the prefill
        ends and, when the prompt's last chunk has room for it, evaluated with it (plan.py): the
        model's first choice then comes straight from the prefill's logits, a step earlier.
        Reading stops at a stop token, and before the end of the context."""
        assert self.picker is not None
        lead: list[int] = []
        room = min(FORCED_AHEAD_MAX, n_ctx - 1 - len(self.prompt_tokens))
        while len(lead) < room and not set(lead) & self.params.stop_tokens:
            tokens = self.picker.forced_ahead()
            if not tokens:
                break
            for token in tokens:
                self.picker.accept(token)
            lead.extend(tokens)
        self.lead = tuple(lead)
        # a guess only where a pick follows the lead (it neither stops nor fills max_tokens);
        # also without a lead: where tools are offered nothing is forced after the prompt's
        # `<|start|>assistant` (a recipient may come before the channel), and the guess is
        # the whole `<|channel|>analysis<|message|>`
        ends = bool(set(self.lead) & self.params.stop_tokens)
        ends = ends or self.params.max_tokens <= len(self.lead)
        if self.steering is not None and guess and not ends:
            self.guess = self.steering.likely()
        # what the consumer may parse ahead, while the prompt is evaluated
        self.channel.likely = (*self.lead, *self.guess)

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
