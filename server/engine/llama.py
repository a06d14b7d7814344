"""LlamaEngine: the one thread that owns llama.cpp, running one generation at a time.

Requests queue up; the worker evaluates each prompt after the longest prefix already in the KV
cache (so a tool round that extends the previous prompt evaluates only its new tokens), then
samples until a stop token, the token limit, the end of the context, or cancellation.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from server.engine.base import (
    EngineConfig,
    EngineResult,
    ModelInfo,
    SamplingHook,
    SamplingParams,
    Steering,
    StopReason,
)
from server.engine.channel import TokenChannel
from server.engine.llama_context import DecodeError, LlamaContext
from server.engine.picker import TokenPicker
from server.events import Timings, Usage

log = logging.getLogger(__name__)


@dataclass
class _Job:
    prompt_tokens: list[int]
    params: SamplingParams
    channel: TokenChannel
    steering: Steering | None = None
    submitted: float = field(default_factory=time.perf_counter)


@dataclass
class _Clock:
    """Timestamps of one generation."""

    submitted: float
    started: float = 0.0
    prefilled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0

    def timings(self, evaluated: int, completed: int) -> Timings:
        return Timings(
            queue_s=self.started - self.submitted,
            prefill_s=max(self.prefilled - self.started, 0.0),
            decode_s=max(self.last_token - self.first_token, 0.0),
            ttft_s=max(self.first_token - self.submitted, 0.0) if completed else 0.0,
            evaluated_tokens=evaluated,
            completion_tokens=completed,
        )


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class LlamaEngine:
    """Engine on llama-cpp-python's C API; construct it, submit prompts, close it."""

    def __init__(self, config: EngineConfig, sampling_hook: SamplingHook | None = None) -> None:
        self._config = config
        self._hook = sampling_hook
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._cached_tokens: list[int] = []  # tokens whose KV state is in sequence 0, in order
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._ctx: LlamaContext | None = None
        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    @property
    def info(self) -> ModelInfo:
        assert self._ctx is not None
        return self._ctx.info

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        steering: Steering | None = None,
    ) -> TokenChannel:
        channel = TokenChannel(asyncio.get_running_loop())
        self._jobs.put(_Job(list(prompt_tokens), params, channel, steering))
        return channel

    def validate_grammar(self, grammar: str) -> None:
        assert self._ctx is not None
        self._ctx.validate_grammar(grammar)  # reads only the vocabulary

    def token_text(self, token_id: int) -> str:
        assert self._ctx is not None
        return self._ctx.token_text(token_id)  # the vocabulary is read-only once loaded

    def close(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        try:
            self._ctx = LlamaContext(self._config)
        except BaseException as exc:  # reported to the constructor's caller
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while (job := self._jobs.get()) is not None:
                self._serve(self._ctx, job)
        finally:
            self._ctx.close()

    def _serve(self, ctx: LlamaContext, job: _Job) -> None:
        clock = _Clock(submitted=job.submitted, started=time.perf_counter())
        state = _Generation(job, clock)
        try:
            self._generate(ctx, state)
        except DecodeError as exc:
            log.exception("generation failed")
            self._forget_cache(ctx)
            state.finish(StopReason.ERROR, error=str(exc))
        except Exception as exc:  # never let one request kill the worker
            log.exception("generation failed")
            self._forget_cache(ctx)
            state.finish(StopReason.ERROR, error=f"{type(exc).__name__}: {exc}")

    def _generate(self, ctx: LlamaContext, state: _Generation) -> None:
        prompt = state.job.prompt_tokens
        if not prompt or len(prompt) >= ctx.n_ctx:
            state.finish(StopReason.ERROR, error=f"prompt of {len(prompt)} tokens does not fit")
            return
        if not self._prefill(ctx, state):
            state.finish(StopReason.CANCELLED)
            return
        chooser = self._hook(prompt) if self._hook is not None else None
        picker = TokenPicker(ctx, state.job.params, state.job.steering, chooser)
        try:
            reason = self._decode_loop(ctx, state, picker)
        finally:
            picker.free()
        state.finish(reason)

    def _prefill(self, ctx: LlamaContext, state: _Generation) -> bool:
        """Evaluate the prompt after its cached prefix; False if cancelled midway."""
        prompt = state.job.prompt_tokens
        n_common = min(common_prefix_length(self._cached_tokens, prompt), len(prompt) - 1)
        n_keep = ctx.truncate(ctx.reusable_prefix(n_common))
        del self._cached_tokens[n_keep:]
        state.cached = n_keep
        for start in range(n_keep, len(prompt), ctx.n_batch):
            if state.job.channel.cancelled:
                return False
            chunk = prompt[start : start + ctx.n_batch]
            ctx.evaluate(chunk, start)
            self._cached_tokens.extend(chunk)
            state.evaluated += len(chunk)
        state.clock.prefilled = time.perf_counter()
        return True

    def _decode_loop(
        self, ctx: LlamaContext, state: _Generation, picker: TokenPicker
    ) -> StopReason:
        params = state.job.params
        channel = state.job.channel
        stop_tokens = params.stop_tokens
        cached = self._cached_tokens
        while True:
            tokens = picker.next_tokens()
            for token in tokens:
                picker.accept(token)
                state.add_token(token)
                if token in stop_tokens:
                    state.stop_token = token
                    return StopReason.STOP_TOKEN
                if state.completed >= params.max_tokens:
                    return StopReason.MAX_TOKENS
            if channel.cancelled:
                return StopReason.CANCELLED
            if len(cached) + len(tokens) >= ctx.n_ctx:
                return StopReason.CONTEXT_FULL
            if len(tokens) == 1:
                ctx.evaluate_one(tokens[0], len(cached))
            else:
                ctx.evaluate(tokens, len(cached))
            cached.extend(tokens)

    def _forget_cache(self, ctx: LlamaContext) -> None:
        self._cached_tokens.clear()
        ctx.truncate(0)


@dataclass
class _Generation:
    """Progress of the generation being served."""

    job: _Job
    clock: _Clock
    cached: int = 0
    evaluated: int = 0
    completed: int = 0
    stop_token: int | None = None

    def add_token(self, token: int) -> None:
        now = time.perf_counter()
        if self.completed == 0:
            self.clock.first_token = now
        self.clock.last_token = now
        self.completed += 1
        self.job.channel.push(token)

    def finish(self, reason: StopReason, error: str | None = None) -> None:
        usage = Usage(
            prompt_tokens=len(self.job.prompt_tokens),
            cached_tokens=self.cached,
            evaluated_tokens=self.evaluated,
            completion_tokens=self.completed,
        )
        result = EngineResult(
            stop_reason=reason,
            usage=usage,
            timings=self.clock.timings(self.evaluated, self.completed),
            stop_token=self.stop_token,
            error=error,
        )
        self.job.channel.close(result)
