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
from enum import Enum
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
    StopReason,
    TokenChunk,
    TokenStream,
)

log = logging.getLogger(__name__)


class ModelState(str, Enum):
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


class Vocabulary(Protocol):
    """The model's vocabulary without its weights (server.engine.loading.vocabulary)."""

    def validate_grammar(self, grammar: str) -> None: ...

    def token_text(self, token_id: int) -> str: ...

    def close(self) -> None: ...


class ModelResidency:
    """The Engine the app uses when the model may be unloaded while idle."""

    def __init__(
        self,
        engine: Engine,
        open_engine: Callable[[], Engine],
        vocabulary: Vocabulary,
        idle_unload_s: float,
    ) -> None:
        self._engine: Engine | None = engine
        self._open_engine = open_engine
        self._vocabulary = vocabulary
        self.idle_unload_s = idle_unload_s
        self._info = engine.info
        load = engine.load
        self._slots, self._max_waiting = load.slots, load.max_waiting
        self._cache_before: PromptCacheStats | None = (
            PromptCacheStats() if engine.prompt_cache is not None else None
        )  # the counters of the engines closed so far
        self._cond = threading.Condition()
        self._state = ModelState.LOADED
        self._active = 0  # generations submitted and not finished (waiting ones included)
        self._pending: list[PendingStream] = []
        self._idle_since = time.monotonic()
        self._closing = False
        self._loads = 0
        self._unloads = 0
        self._last_load_s: float | None = None
        self._last_unload_s: float | None = None
        self._thread = threading.Thread(target=self._run, name="model-residency", daemon=True)
        self._thread.start()

    # what the API reads

    @property
    def state(self) -> ModelState:
        return self._state

    @property
    def report(self) -> ResidencyReport:
        with self._cond:
            return ResidencyReport(
                self._state,
                self.idle_unload_s,
                self._loads,
                self._unloads,
                self._last_load_s,
                self._last_unload_s,
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
        engine = self._engine
        return engine.failure if engine is not None else None

    def submit(
        self,
        prompt_tokens: Sequence[int],
        params: SamplingParams,
        steering: Steering | None = None,
        save_points: Sequence[int] = (),
    ) -> TokenStream:
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._closing:
                raise EngineUnavailable("The server is shutting down")
            self._active += 1
            engine = self._engine if self._state is ModelState.LOADED else None
            if engine is None:
                pending = PendingStream(
                    self, loop, (list(prompt_tokens), params, steering, tuple(save_points))
                )
                self._pending.append(pending)
                self._cond.notify_all()
                return pending
        try:
            stream = engine.submit(prompt_tokens, params, steering, save_points)
        except BaseException:
            self._finished()
            raise
        stream.on_close(lambda _result: self._finished())
        return stream

    def validate_grammar(self, grammar: str) -> None:
        self._vocabulary.validate_grammar(grammar)

    def token_text(self, token_id: int) -> str:
        return self._vocabulary.token_text(token_id)

    def close(self) -> None:
        """Stop the worker, close the engine (saving its conversations), free the vocabulary;
        generations still waiting for a load end with an error."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            engine, self._engine = self._engine, None
            pending, self._pending = self._pending, []
        for stream in pending:
            stream.fail("the server is shutting down")
        if engine is not None:
            engine.close()
        self._vocabulary.close()

    # the worker thread

    def _finished(self) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._idle_since = time.monotonic()
                self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while not self._closing:
                if self._state is ModelState.UNLOADED and self._pending:
                    self._state = ModelState.LOADING
                    self._cond.release()
                    try:
                        self._reload()
                    finally:
                        self._cond.acquire()
                    continue
                idle_for = time.monotonic() - self._idle_since
                unloadable = self._state is ModelState.LOADED and self._active == 0
                if unloadable and idle_for >= self.idle_unload_s:
                    self._state = ModelState.UNLOADING
                    engine, self._engine = self._engine, None
                    self._cond.release()
                    try:
                        self._unload(engine, idle_for)
                    finally:
                        self._cond.acquire()
                    self._state = ModelState.UNLOADED
                    continue
                self._cond.wait(self.idle_unload_s - idle_for if unloadable else None)

    def _unload(self, engine: Engine | None, idle_for: float) -> None:
        assert engine is not None
        log.info(
            "no request for %.0f s: unloading the model (--idle-unload); the next request "
            "loads it again",
            idle_for,
        )
        started = time.perf_counter()
        stats = engine.prompt_cache
        engine.close()  # saves the conversations to the prompt cache, frees model and context
        seconds = time.perf_counter() - started
        with self._cond:
            if stats is not None and self._cache_before is not None:
                self._cache_before = _added(self._cache_before, stats)
            self._unloads += 1
            self._last_unload_s = seconds
        log.info("model unloaded in %.1f s", seconds)

    def _reload(self) -> None:
        log.info("a request is waiting: loading the model again")
        started = time.perf_counter()
        try:
            engine = self._open_engine()
        except Exception as exc:  # reported to the waiting requests and logged
            log.error("loading the model again failed: %s", exc)
            with self._cond:
                self._state = ModelState.UNLOADED
                pending, self._pending = self._pending, []
            for stream in pending:
                stream.fail(f"The model could not be loaded again: {exc}")
            return
        seconds = time.perf_counter() - started
        with self._cond:
            self._engine = engine
            self._state = ModelState.LOADED
            self._loads += 1
            self._last_load_s = seconds
            pending, self._pending = self._pending, []
        log.info("model loaded again in %.1f s; %d request(s) were waiting", seconds, len(pending))
        for stream in pending:
            stream.start(engine)


def _added(a: PromptCacheStats, b: PromptCacheStats) -> PromptCacheStats:
    return PromptCacheStats(
        **{f.name: getattr(a, f.name) + getattr(b, f.name) for f in dataclasses.fields(a)}
    )


Request = tuple[list[int], SamplingParams, Steering | None, tuple[int, ...]]


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
        self._call_soon(self._end, StopReason.ERROR, message)

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
        prompt, params, steering, save_points = self._request
        try:
            inner = engine.submit(prompt, params, steering, save_points)
        except EngineUnavailable as exc:
            self._end(StopReason.ERROR, exc.message)
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

    def on_close(self, callback: Callable[[EngineResult], object]) -> None:
        if self._inner is not None:
            self._inner.on_close(lambda result: callback(self._with_wait(result)))
        elif self._result is not None:
            result = self._result
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon(callback, result)
        else:
            self._callbacks.append(callback)
