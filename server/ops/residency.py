"""Residency: whether the model is in memory — loaded, unloading, unloaded, loading — and the
idle unload that moves it between them.

`ModelResidency` is the engine the app serves through when `--idle-unload` is on (it fits the
Engine protocol). While the model is loaded every generation goes to the LlamaEngine. After
`idle_unload_s` without a generation running it closes that engine: the engine thread saves its
conversations to the disk prompt cache and frees the model and the context, so the GPU and host
memory go back to the machine. The next generation opens the engine again. Generations that
arrive while the model is unloading, unloaded or loading wait as `PendingStream`s; they already
hold their admission place (server.core.admission), so the 429 bound counts them like any other
waiting request. Grammar checks and token texts are answered by the vocabulary alone (a few MB,
kept loaded), so preparing a request never touches an engine that may be closing.

The one worker thread (`model-residency`) makes every transition; the lock guards the state.

    loaded --idle_unload_s without a generation--> unloading --engine closed--> unloaded
    unloaded --a generation waits--> loading --engine opened--> loaded
    loading --the load failed--> unloaded (the waiting generations end with the error)
    loaded --the engine failed (an RPC host dropped)--> unloading --> unloaded

With several models served (server.ops.fleet), every model has a residency, and the ones
not loaded at start begin unloaded; a `LoadGate` (the fleet's memory budget) decides when a
load may start, and may unload another idle model first (`evict()`); without --idle-unload a
model is then unloaded only to make room for another.

A failed load is kept (`ResidencyReport.load_error`: /health answers 503, /v1/server
and /metrics report it) until a load succeeds, and the next attempt waits a backoff that
doubles with each failure (`RELOAD_BACKOFF_S`): meanwhile requests are refused at once with
the reason (`failure`) instead of each paying a whole load before failing. An engine that
failed while loaded (an RPC host dropped) is unloaded at once, as a failed load is: what it
holds that can be freed is freed (a thread stuck on a host that is gone keeps its part), the
fleet gets its room back, its reason is kept as the load error with the same backoff, and the
next request after it loads the model again (`failed_last`: its RPC hosts are connected anew
first), which fails at once while a host is still gone. `close()` (shutdown) ends the waiting
generations first, stops a load in progress (llama.cpp's progress callback, `closing`) and
never starts the waiting generations on an engine that finished loading meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from server.contracts.directives import Steering
from server.contracts.errors import EngineUnavailable
from server.contracts.events import Timings, Usage
from server.engine.base import (
    Engine,
    EngineLoad,
    EngineResult,
    ModelInfo,
    PromptCacheStats,
    SamplingParams,
    SlotPin,
    StopReason,
    TokenChunk,
    TokenStream,
)

log = logging.getLogger(__name__)

RELOAD_BACKOFF_S = (5.0, 300.0)  # the wait after a failed load: the first, doubling up to the last
FAILURE_POLL_S = 1.0  # how often a loaded engine's failure is looked at when nothing ends


class ModelState(StrEnum):
    LOADED = "loaded"
    UNLOADING = "unloading"
    UNLOADED = "unloaded"
    LOADING = "loading"


@dataclass(frozen=True, slots=True)
class ResidencyReport:
    """What /health, /v1/server and /metrics say about the model's residency."""

    state: ModelState = ModelState.LOADED
    idle_unload_s: float | None = None  # None: the model stays loaded
    loads: int = 0  # loads after an unload (the start-up's not counted)
    unloads: int = 0
    last_load_s: float | None = None  # how long the last of those loads took
    last_unload_s: float | None = None
    load_error: str | None = None  # why the last load failed (None once a load succeeds)
    load_failures: int = 0  # failed loads after an unload
    retry_in_s: float | None = None  # while backing off after a failed load


class LoadGate(Protocol):
    """The memory budget several residencies share (server.ops.fleet.ModelFleet)."""

    def acquire(self, member: ModelResidency) -> None:
        """Block until `member` may load (other idle models unloaded to make room); raises
        when it never will (the shutdown)."""
        ...

    def release(self, member: ModelResidency) -> None:
        """`member` gave its memory back (unloaded, or its load failed)."""
        ...

    def changed(self) -> None:
        """A member went idle: a load waiting for room may go on."""
        ...


class Vocabulary(Protocol):
    """The model's vocabulary without its weights (server.engine.loading.vocabulary)."""

    def validate_grammar(self, grammar: str) -> None: ...

    def token_text(self, token_id: int) -> str: ...

    def close(self) -> None: ...


class ModelResidency:
    """The Engine the app uses when the model may be unloaded while idle."""

    def __init__(
        self,
        engine: Engine | None,
        open_engine: Callable[[], Engine],
        vocabulary: Vocabulary,
        idle_unload_s: float | None,
        *,
        unloaded: Unloaded | None = None,
        gate: LoadGate | None = None,
        name: str = "the model",
    ) -> None:
        """`engine` loaded at start, or None and what is known of the model before its first
        load (`unloaded`); `idle_unload_s` None: unloaded only to make room (`gate`)."""
        self._engine: Engine | None = engine
        self._open_engine = open_engine
        self._vocabulary = vocabulary
        self.idle_unload_s = idle_unload_s
        self._gate = gate
        self.name = name  # for the log
        if engine is not None:
            self._info = engine.info
            load = engine.load
            self._slots, self._max_waiting = load.slots, load.max_waiting
            caching = engine.prompt_cache is not None
        else:
            assert unloaded is not None, "an unloaded residency needs its model's facts"
            self._info = unloaded.info
            self._slots, self._max_waiting = unloaded.slots, unloaded.max_waiting
            caching = unloaded.prompt_cache
        self._cache_before: PromptCacheStats | None = (
            PromptCacheStats() if caching else None
        )  # the counters of the engines closed so far
        self._cond = threading.Condition()
        self._state = ModelState.LOADED if engine is not None else ModelState.UNLOADED
        self._again = " again" if engine is not None else ""  # "" until a first load
        self._active = 0  # generations submitted and not finished (waiting ones included)
        self._pending: list[PendingStream] = []
        self._idle_since = time.monotonic()
        self.last_used = self._idle_since  # the last request's start or end (the fleet's LRU)
        self._closing = False  # begin_shutdown() was called
        self._closed = False
        self._loads = 0
        self._unloads = 0
        self._last_load_s: float | None = None
        self._last_unload_s: float | None = None
        self._load_error: str | None = None
        self._load_failures = 0
        self._failed_in_row = 0
        self._retry_at = 0.0  # time.monotonic() before which no load is tried again
        self._failed_last = False  # the last engine failed while loaded (until a load succeeds)
        self._thread = threading.Thread(target=self._run, name="model-residency", daemon=True)
        self._thread.start()

    # what the API reads

    @property
    def state(self) -> ModelState:
        return self._state

    @property
    def busy(self) -> bool:
        """Requests in flight or waiting, or a load or unload under way: not to be unloaded
        (read without the lock: the fleet's snapshot; evict() checks again)."""
        return self._active > 0 or self._state is not ModelState.LOADED

    @property
    def failed_last(self) -> bool:
        """The last engine failed while loaded, and no load succeeded since: the next load
        connects its RPC hosts anew (the failed engine's connections are stuck for good)."""
        return self._failed_last

    @property
    def closing(self) -> bool:
        """True once close() began: a load in progress stops (see startup.load_engine)."""
        return self._closing

    @property
    def report(self) -> ResidencyReport:
        with self._cond:
            wait = self._retry_at - time.monotonic() if self._load_error is not None else 0.0
            return ResidencyReport(
                self._state,
                self.idle_unload_s,
                self._loads,
                self._unloads,
                self._last_load_s,
                self._last_unload_s,
                self._load_error,
                self._load_failures,
                max(0.0, wait) if self._load_error is not None else None,
            )

    # the Engine protocol

    @property
    def info(self) -> ModelInfo:
        return self._info  # the same file and context at every load

    @property
    def load(self) -> EngineLoad:
        with self._cond:
            engine, pending = self._engine, len(self._pending)
        if engine is None:
            return EngineLoad(pending, 0, self._slots, self._max_waiting)
        now = engine.load
        return dataclasses.replace(now, waiting=now.waiting + pending)

    @property
    def prompt_cache(self) -> PromptCacheStats | None:
        with self._cond:
            engine, before = self._engine, self._cache_before
        if before is None:
            return None
        now = engine.prompt_cache if engine is not None else None
        return before if now is None else _added(before, now)

    @property
    def failure(self) -> str | None:
        """Why requests are refused now: the engine's failure, or a failed load while its
        backoff lasts (after it, the next request tries a load again)."""
        with self._cond:
            engine, error = self._engine, self._load_error
            if engine is None and error is not None and time.monotonic() < self._retry_at:
                return error
        return engine.failure if engine is not None else None

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        steering: Steering | None = None,
        save_points: Sequence[int] = (),
        pin: SlotPin | None = None,
    ) -> TokenStream:
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._closing:
                raise EngineUnavailable("The server is shutting down")
            engine = self._engine if self._state is ModelState.LOADED else None
            error = self._load_error
            if engine is None and error is not None and time.monotonic() < self._retry_at:
                raise EngineUnavailable(error)
            self._active += 1
            self.last_used = time.monotonic()
            if engine is None:
                pending = PendingStream(
                    self, loop, (list(prompt_tokens), params, steering, tuple(save_points), pin)
                )
                self._pending.append(pending)
                self._cond.notify_all()
                return pending
        try:
            stream = engine.submit(prompt_tokens, params, steering, save_points, pin)
        except BaseException:
            self._finished()
            raise
        stream.on_close(lambda _result: self._finished())
        return stream

    def validate_grammar(self, grammar: str) -> None:
        self._vocabulary.validate_grammar(grammar)

    def token_text(self, token_id: int) -> str:
        return self._vocabulary.token_text(token_id)

    def begin_shutdown(self) -> None:
        """The shutdown began: the generations waiting for a load end now (with an error), a
        load in progress stops, no load or unload starts again and new generations are
        refused; those running on a loaded engine go on (the drain)."""
        with self._cond:
            self._closing = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for stream in pending:  # their streams end now, not after a load
            stream.fail("The server is shutting down")

    def close(self) -> None:
        """begin_shutdown(), then stop the worker, close the engine (saving its
        conversations), free the vocabulary."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self.begin_shutdown()
        self._thread.join()
        with self._cond:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        self._vocabulary.close()

    # the worker thread

    def evict(self) -> bool:
        """Unload now to make room for another model, if idle or failed (False: it is not)."""
        with self._cond:
            failed = self._failed_engine()
            if failed is not None and not self._closing:
                self._state = ModelState.UNLOADING
                self._engine = None
        if failed is not None and not self._closing:
            try:
                self._drop(failed)
            finally:
                with self._cond:
                    self._state = ModelState.UNLOADED
                    self._cond.notify_all()
            return True
        with self._cond:
            engine = self._engine
            if (
                self._closing
                or self._state is not ModelState.LOADED
                or self._active > 0
                or engine is None
                or engine.failure is not None
            ):
                return False
            self._state = ModelState.UNLOADING
            self._engine = None
        try:
            self._unload(engine, "another model needs the memory", "the memory budget")
        finally:
            if self._gate is not None:  # before a request that came meanwhile asks it again
                self._gate.release(self)
            with self._cond:
                self._state = ModelState.UNLOADED
                self._cond.notify_all()  # that request loads it again
        return True

    def _finished(self) -> None:
        with self._cond:
            self._active -= 1
            idle = self._active == 0
            if idle:
                self._idle_since = self.last_used = time.monotonic()
            if idle or self._failed_engine() is not None:  # the worker unloads a failed one
                self._cond.notify_all()
        if idle and self._gate is not None:
            self._gate.changed()  # outside the lock: the fleet's lock is taken before ours

    def _run(self) -> None:
        with self._cond:
            while not self._closing:
                failed = self._failed_engine()
                if failed is not None:
                    self._state = ModelState.UNLOADING
                    self._engine = None
                    self._cond.release()
                    try:
                        self._drop(failed)
                    finally:
                        self._cond.acquire()
                    self._state = ModelState.UNLOADED
                    continue
                if self._state is ModelState.UNLOADED and self._pending:
                    self._state = ModelState.LOADING
                    self._cond.release()
                    try:
                        self._reload()
                    finally:
                        self._cond.acquire()
                    continue
                idle_for = time.monotonic() - self._idle_since
                engine = self._engine
                unloadable = (
                    self.idle_unload_s is not None
                    and self._state is ModelState.LOADED
                    and self._active == 0
                    and engine is not None
                )
                if unloadable and idle_for >= (self.idle_unload_s or 0.0):
                    self._state = ModelState.UNLOADING
                    engine, self._engine = self._engine, None
                    self._cond.release()
                    try:
                        self._unload(engine, f"no request for {idle_for:.0f} s", "--idle-unload")
                        if self._gate is not None:
                            self._gate.release(self)
                    finally:
                        self._cond.acquire()
                    self._state = ModelState.UNLOADED
                    continue
                wait = (self.idle_unload_s or 0.0) - idle_for if unloadable else None
                if self._state is ModelState.LOADED:  # a failure no request's end reported
                    wait = min(wait, FAILURE_POLL_S) if wait is not None else FAILURE_POLL_S
                self._cond.wait(wait)

    def _failed_engine(self) -> Engine | None:
        """The loaded engine, once it reports that it can no longer generate (under the lock)."""
        engine = self._engine
        if self._state is ModelState.LOADED and engine is not None and engine.failure is not None:
            return engine
        return None

    def _drop(self, engine: Engine) -> None:
        """Unload an engine that failed while loaded (off the lock): its requests have ended
        with its failure (the engine ends them); close() frees what is not held by a thread
        stuck on a host that is gone, and returns at once where one is. Its failure is kept
        as a failed load's reason is, with the same backoff: requests meanwhile get it at once,
        the first after it loads the model again."""
        failure = engine.failure or "the engine failed"
        log.error("%s failed: %s; unloading it, a request loads it again", self.name, failure)
        engine.close()
        if self._gate is not None:
            self._gate.release(self)
        with self._cond:
            self._unloads += 1
            self._failed_last = True
            self._record_failure(f"{self._title()} failed while loaded: {failure}")

    def _title(self) -> str:
        return self.name[0].upper() + self.name[1:]

    def _record_failure(self, error: str) -> float:
        """Keep `error` as the reason requests are refused until the backoff ends (under the
        lock); the backoff, which doubles with each failure in a row."""
        first, most = RELOAD_BACKOFF_S
        backoff: float = min(most, first * 2.0**self._failed_in_row)
        self._failed_in_row += 1
        self._load_error = error
        self._retry_at = time.monotonic() + backoff
        return backoff

    def _unload(self, engine: Engine | None, why: str, rule: str) -> None:
        assert engine is not None
        log.info("%s: unloading %s (%s); the next request loads it again", why, self.name, rule)
        started = time.perf_counter()
        stats = engine.prompt_cache
        engine.close()  # saves the conversations to the prompt cache, frees model and context
        seconds = time.perf_counter() - started
        with self._cond:
            if stats is not None and self._cache_before is not None:
                self._cache_before = _added(self._cache_before, stats)
            self._unloads += 1
            self._last_unload_s = seconds
        log.info("%s unloaded in %.1f s", self.name, seconds)

    def _reload(self) -> None:
        log.info("a request is waiting: loading %s%s", self.name, self._again)
        try:
            if self._gate is not None:
                self._gate.acquire(self)  # room made, or waited for
        except Exception as exc:  # the shutdown
            self._load_failed(exc)
            return
        started = time.perf_counter()
        try:
            engine = self._open_engine()
        except Exception as exc:  # reported to the waiting requests, recorded and logged
            if self._gate is not None:
                self._gate.release(self)
            self._load_failed(exc)
            return
        seconds = time.perf_counter() - started
        with self._cond:
            if self._closing:  # shutting down: the waiting requests have ended already
                log.info("the model finished loading during the shutdown: closing it unused")
                self._engine = engine  # close() closes it
                self._state = ModelState.LOADED
                return
            self._engine = engine
            self._info = engine.info  # as llama.cpp resolved it (the context's size)
            self._state = ModelState.LOADED
            self._loads += 1
            self._last_load_s = seconds
            self._load_error, self._failed_in_row = None, 0
            self._failed_last = False
            pending, self._pending = self._pending, []
        log.info("%s loaded%s in %.1f s; %d request(s) were waiting",
                 self.name, self._again, seconds, len(pending))  # fmt: skip
        self._again = " again"
        for stream in pending:
            stream.start(engine)

    def _load_failed(self, exc: Exception) -> None:
        with self._cond:
            self._state = ModelState.UNLOADED
            pending, self._pending = self._pending, []
            if self._closing:  # abandoned for the shutdown: not a failure to report
                log.info("the model's load stopped for the shutdown (%s)", exc)
                return
            self._load_failures += 1
            error = f"{self._title()} could not be loaded{self._again}: {exc}"
            backoff = self._record_failure(error)
        log.error("loading %s%s failed: %s; the next try in %g s at the earliest",
                  self.name, self._again, exc, backoff)  # fmt: skip
        for stream in pending:
            stream.fail(error)


@dataclass(frozen=True, slots=True)
class Unloaded:
    """What is known of a model before its first load (its GGUF header, its settings)."""

    info: ModelInfo
    slots: int
    max_waiting: int
    prompt_cache: bool  # whether its engine keeps the disk prompt cache


def _added(a: PromptCacheStats, b: PromptCacheStats) -> PromptCacheStats:
    return PromptCacheStats(
        **{f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(a)}
    )


Request = tuple[list[int], SamplingParams, Steering | None, tuple[int, ...], SlotPin | None]


class PendingStream:
    """A generation submitted while the model was not loaded: it is handed to the engine once
    the model is loaded again, and its queue time (and time to first token) include the wait."""

    def __init__(
        self, residency: ModelResidency, loop: asyncio.AbstractEventLoop, request: Request
    ):
        self._residency = residency
        self._loop = loop
        self._request = request
        self._submitted = time.perf_counter()
        self._waited = 0.0
        self._inner: TokenStream | None = None
        self._result: EngineResult | None = None  # set when it ended before reaching the engine
        self._ready = asyncio.Event()  # started on the engine, or ended
        self._callbacks: list[Callable[[EngineResult], object]] = [
            lambda _result: residency._finished()
        ]

    # the worker thread's side

    def start(self, engine: Engine) -> None:
        self._call_soon(self._start, engine)

    def fail(self, message: str) -> None:
        self._call_soon(self._end, StopReason.UNAVAILABLE, message)

    def _call_soon(self, callback: Callable[..., object], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the consumer's loop is gone: nobody waits for it
            self._residency._finished()

    # the consumer's loop

    def _start(self, engine: Engine) -> None:
        if self._result is not None:  # cancelled while the model was loading
            return
        self._waited = time.perf_counter() - self._submitted
        prompt, params, steering, save_points, pin = self._request
        try:
            inner = engine.submit(prompt, params, steering, save_points, pin)
        except EngineUnavailable as exc:
            self._end(StopReason.UNAVAILABLE, exc.message)
            return
        self._inner = inner
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            self.on_close(callback)
        self._ready.set()

    def _end(self, reason: StopReason, error: str | None) -> None:
        if self._result is not None or self._inner is not None:
            return
        waited = time.perf_counter() - self._submitted
        usage = Usage(prompt_tokens=len(self._request[0]))
        self._result = EngineResult(reason, usage, Timings(queue_s=waited), error=error)
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self._result)
        self._ready.set()

    def _with_wait(self, result: EngineResult) -> EngineResult:
        timings = result.timings
        waited = dataclasses.replace(
            timings,
            queue_s=timings.queue_s + self._waited,
            ttft_s=timings.ttft_s + self._waited if result.usage.completion_tokens else 0.0,
        )
        return dataclasses.replace(result, timings=waited)

    async def _chunks(self, interval_s: float) -> AsyncIterator[TokenChunk]:
        await self._ready.wait()
        if self._inner is None:
            return
        async for chunk in self._inner.paced(interval_s):
            yield chunk

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks(0.0)

    def paced(self, interval_s: float) -> AsyncIterator[TokenChunk]:
        return self._chunks(interval_s)

    @property
    def result(self) -> EngineResult:
        if self._inner is not None:
            return self._with_wait(self._inner.result)
        if self._result is None:
            raise RuntimeError("the generation has not finished")
        return self._result

    def cancel(self) -> None:
        if self._inner is not None:
            self._inner.cancel()
        else:
            self._end(StopReason.CANCELLED, None)

    async def evaluating(self, within_s: float) -> None:
        if self._inner is not None:  # none while the model loads: no wait then
            await self._inner.evaluating(within_s)

    def unpace(self) -> None:
        if self._inner is not None:
            self._inner.unpace()

    @property
    def likely(self) -> tuple[int, ...]:
        return self._inner.likely if self._inner is not None else ()

    def on_close(self, callback: Callable[[EngineResult], object]) -> None:
        if self._inner is not None:
            self._inner.on_close(lambda result: callback(self._with_wait(result)))
        elif self._result is not None:
            result = self._result
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon(callback, result)
        else:
            self._callbacks.append(callback)
