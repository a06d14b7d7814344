"""LlamaEngine: the one thread that owns llama.cpp, serving every request through its scheduler.

Requests are queued by submit() from any event loop; the worker thread admits them into the
context's sequences and advances all running generations together (see scheduler.py). A request
whose prompt extends what a sequence already holds evaluates only its new tokens.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from server.contracts.directives import Steering
from server.contracts.errors import EngineUnavailable
from server.engine.base import (
    EngineConfig,
    EngineLoad,
    ModelInfo,
    PromptCacheStats,
    SamplingHook,
    SamplingParams,
    SlotPin,
    StopReason,
)
from server.engine.channel import TokenChannel
from server.engine.disk_cache.prompt_cache import PromptCache
from server.engine.disk_cache.state_layout import UnknownStateFormat
from server.engine.job import Job
from server.engine.llama_context import LlamaContext
from server.engine.loading.offload import gpu_devices
from server.engine.rpc.backend import AbortWatch, abort_reason
from server.engine.rpc.hosts import RpcError, unreachable
from server.engine.sampling.backend_chain import resolve
from server.engine.sampling.vocab_trie import trie_build
from server.engine.scheduler import Scheduler
from server.engine.speculative.verify_cost import start_speculation

log = logging.getLogger(__name__)

CLOSED = "The server cannot generate: the model was closed"
IDLE_AFTER_S = 0.05  # no job for this long: the engine thread's idle work may go on


def backend_sampling(config: EngineConfig) -> bool:
    """Whether free text is drawn inside the graph (EngineConfig.backend_sampling, `auto`
    resolved: sampling/backend_chain.py); the output layer is on a GPU when any layer is
    offloaded (it counts as the last)."""
    on_gpu = config.n_gpu_layers != 0 and bool(gpu_devices())
    on = resolve(config.backend_sampling, output_on_gpu=on_gpu, speculative=config.speculative)
    log.info("backend sampling %s (%s)", "on" if on else "off", config.backend_sampling)
    return on


class IdleWork(Protocol):
    """Work the engine thread does a short step at a time while no generation runs."""

    def advance(self) -> bool:
        """One step (a few milliseconds); True when nothing is left."""


def wait_for_job(
    jobs: queue.SimpleQueue[Job | None], idle: list[IdleWork], quiet_s: float = IDLE_AFTER_S
) -> Job | None:
    """The next job (None: stop), waiting for one. With `idle` work left and no job for
    `quiet_s`, the work goes on a step at a time while none is queued (finished work leaves
    the list), so a job waits for one step at most; a client's next request usually comes
    sooner than `quiet_s` after its last reply (an agent's loop, a benchmark), and then waits
    for none."""
    if idle:
        try:
            return jobs.get(timeout=quiet_s)
        except queue.Empty:
            pass
    while idle:
        try:
            return jobs.get_nowait()
        except queue.Empty:
            if idle[0].advance():
                idle.pop(0)
    return jobs.get()


class LlamaEngine:
    """Engine on llama-cpp-python's C API; construct it, submit prompts, close it."""

    def __init__(
        self,
        config: EngineConfig,
        sampling_hook: SamplingHook | None = None,
        abort: Callable[[], bool] | None = None,
    ) -> None:
        """Load the model (a RuntimeError when it cannot; LoadAborted once `abort()` is true
        while it loads) and start the engine thread."""
        self._config = config
        self._hook = sampling_hook
        self._abort = abort
        self._closed = False  # close() was called: nothing is accepted any more
        self._freed = False  # the engine thread freed the model and the context
        self._lock = threading.Lock()  # held to submit, to read the vocabulary, to close, to free
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._idle: list[IdleWork] = []  # what the engine thread does while nothing runs
        self._ctx: LlamaContext | None = None
        self._scheduler: Scheduler | None = None
        self._cache: PromptCache | None = None
        self._failure: str | None = None
        self._parked = False  # the engine thread is stuck for good in a decode (an RPC host left)
        self._watch = AbortWatch(self._fail) if config.rpc_servers else None
        if self._watch is not None:
            self._watch.install()
        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error

    @property
    def info(self) -> ModelInfo:
        assert self._ctx is not None
        return self._ctx.info

    @property
    def load(self) -> EngineLoad:
        scheduler = self._scheduler
        running = scheduler.running if scheduler is not None else 0
        return EngineLoad(
            waiting=self._jobs.qsize() + (scheduler.waiting if scheduler is not None else 0),
            running=running,
            slots=self._config.n_slots,
            max_waiting=self._config.max_waiting,
        )

    @property
    def prompt_cache(self) -> PromptCacheStats | None:
        return self._cache.stats if self._cache is not None else None

    @property
    def failure(self) -> str | None:
        return self._failure

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        steering: Steering | None = None,
        save_points: Sequence[int] = (),
        pin: SlotPin | None = None,
    ) -> TokenChannel:
        if self._failure is not None:  # (never waits for the lock a stuck RPC decode may hold)
            raise EngineUnavailable(f"The server cannot generate: {self._failure}")
        channel = TokenChannel(asyncio.get_running_loop())
        points = tuple(sorted(set(save_points)))
        with self._lock:  # queued before close() queues its stop or the thread fails, or refused
            if self._failure is not None:
                raise EngineUnavailable(f"The server cannot generate: {self._failure}")
            if self._closed:
                raise EngineUnavailable(CLOSED)
            self._jobs.put(Job(list(prompt_tokens), params, channel, steering, points, pin))
        return channel

    def validate_grammar(self, grammar: str) -> None:
        with self._lock:
            self._vocabulary().validate_grammar(grammar)  # reads only the vocabulary

    def token_text(self, token_id: int) -> str:
        with self._lock:
            return self._vocabulary().token_text(token_id)  # read-only once loaded

    def _vocabulary(self) -> LlamaContext:
        """The context, to read its vocabulary (under `_lock`); EngineUnavailable once close()
        was called or the engine thread freed the model (it does when it ends, also on an
        internal error), so a freed context is never read."""
        if self._freed and self._failure is not None:
            raise EngineUnavailable(f"The server cannot generate: {self._failure}")
        if self._ctx is None or self._closed or self._freed:
            raise EngineUnavailable(CLOSED)
        return self._ctx

    def close(self) -> None:
        """Stop the engine thread (it saves, then frees the model) and wait for it, or until it
        is parked for good: an RPC host that is gone stops a decode or the freeing of the model
        (see server.engine.rpc.backend.AbortWatch), and the process must still exit."""
        with self._lock:
            self._closed = True  # no submit or vocabulary read from now on
        if self._parked:  # the engine thread waits for a host that is gone
            return
        if self._thread.is_alive():
            self._jobs.put(None)
        while self._thread.is_alive() and not self._parked:
            self._thread.join(0.1)
        self._refuse_queued(CLOSED)  # submitted while it closed: they end, not hang

    def _run(self) -> None:
        try:
            self._ctx = LlamaContext(self._config, self._abort)
            self._ctx.reserve_outputs(1 + max(self._config.draft_max, 1))  # the same in any mode
            self._cache = self._open_cache(self._ctx)
            speculator = start_speculation(self._ctx, self._config)
        except BaseException as exc:  # reported to the constructor's caller
            self._load_error = exc
            self._ready.set()
            return
        self._ready.set()
        # the vocabulary's trie, which the first grammar-constrained token needs, is built
        # while nothing runs instead of in that token's step (sampling/vocab_trie.py)
        self._idle.append(trie_build(self._ctx))
        config = self._config
        scheduler = Scheduler(
            self._ctx,
            self._hook,
            config.prefill_chunk,
            self._cache,
            speculator,
            batch_invariant=config.batch_invariant,
            guess_header=self._ctx.n_swa == 0 or config.swa_full,
            backend_sampling=backend_sampling(config),
        )
        self._scheduler = scheduler
        try:
            while self._receive(scheduler):
                scheduler.step()
        except Exception as exc:  # a bug: the thread ends, and the engine says so
            failure = f"the engine stopped on an internal error ({type(exc).__name__}: {exc})"
            log.exception("%s", failure)
            with self._lock:  # a submit from now on is refused; one queued before is ended
                self._failure = f"{failure}; restart the server"
            scheduler.fail_all(failure, StopReason.ERROR)
            self._refuse_queued(failure)
        finally:
            scheduler.shutdown()  # saves every conversation to disk
            if self._cache is not None:
                self._cache.close()  # waits for the writes
            with self._lock:
                self._freed = True
                self._ctx.close()

    def _fail(self, message: str) -> None:
        """An RPC host dropped (ggml's abort, on its RPC thread): end every request, report it.

        The engine thread stays blocked in the decode that needed the host; nothing else runs
        on it again, so its jobs are ended from here.
        """
        self._parked = True
        down = unreachable(self._config.rpc_servers, attempts=5)
        hosts = "RPC host " + ", ".join(down) if down else "an RPC host"
        self._failure = (
            f"{hosts} stopped answering while the model was running ({abort_reason(message)})"
        )
        log.error("%s", self._failure)
        if not self._ready.is_set():  # it dropped while the model was loading
            self._load_error = RpcError(self._failure)
            self._ready.set()
        self._refuse_queued(self._failure)
        if self._scheduler is not None:
            self._scheduler.fail_all(self._failure)

    def _refuse_queued(self, message: str) -> None:
        """End the jobs still queued (the engine thread takes no more) with `message`."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.channel.close(job.result(StopReason.UNAVAILABLE, message))

    def _open_cache(self, ctx: LlamaContext) -> PromptCache | None:
        if self._config.prompt_cache_dir is None:
            return None
        try:
            return PromptCache(ctx, self._config)
        except (OSError, UnknownStateFormat) as exc:  # the server runs without it
            log.warning("prompt cache off: %s", exc)
            return None

    def _receive(self, scheduler: Scheduler) -> bool:
        """Move submitted jobs to the scheduler (waiting when idle); False to stop."""
        if not scheduler.busy:
            job = wait_for_job(self._jobs, self._idle)
            if job is None:
                return False
            scheduler.add(job)
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return True
            if job is None:
                return False
            scheduler.add(job)
