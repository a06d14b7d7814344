"""TokenChannel: hands sampled tokens from the engine thread to an asyncio consumer.

The engine thread appends tokens and flushes once a step; the consumer drains everything that
arrived since it last looked, so a slow consumer gets larger chunks instead of a growing backlog
of wake-ups. The loop is woken at most once per step and per drained chunk, and not at all while
the consumer is busy or pacing:
a paced consumer takes at most one chunk per interval while tokens come faster than that, so
each chunk (one decoder pass, one network write downstream) carries several tokens. The first
token and the end of the generation are never held back, nor is the chunk after one that the
consumer says reached its client as nothing (`unpace`: harmony's header tokens, before the first
visible text). A token's logprob (when the request
asked for them) travels with it, in the chunk's `logprobs`.

A generation is announced to its consumer once, when the engine is about to evaluate its first
tokens (`announcer`, run by the scheduler right before llama_decode: `begin`); a consumer waits
for it in `evaluating`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from functools import partial

from server.contracts.events import TokenLogprob
from server.engine.base import EngineResult, TokenChunk


class TokenChannel:
    """One generation's token stream: written by the engine thread, read by one coroutine."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._tokens = TokenChunk()
        self._result: EngineResult | None = None
        self._wake_pending = False
        self._unpaced = False  # the consumer showed nothing of the last chunk
        self.likely: tuple[int, ...] = ()  # set once by the engine thread as the job starts
        self._ready = asyncio.Event()
        self._evaluating = asyncio.Event()  # the engine began evaluating it, or it ended
        self._announced = False  # `begin` was called (engine thread)
        self._cancelled = threading.Event()
        self._on_close: list[Callable[[EngineResult], object]] = []
        self._on_cancel: list[Callable[[], object]] = []

    # engine-thread side

    def push(
        self, token: int, logprob: TokenLogprob | None = None, *, scored: bool = False
    ) -> None:
        """Hand over one token, seen by the consumer once `flush`ed (or at the close);
        `scored`: the request asked for logprobs (`logprob` is then the token's, or None for a
        token no distribution was sampled for)."""
        with self._lock:
            self._tokens.append(token)
            if scored:
                self._tokens.logprobs.append(logprob)

    def flush(self) -> None:
        """Wake the consumer for the tokens pushed since it last drained, unless a wake is
        pending. The engine flushes once a step, after a generation's picks: woken at its first
        token, the consumer took the GIL from the picks after it (0.5 ms at the end of a
        prefill, before the first visible token, to decode the header tokens alone)."""
        with self._lock:
            if not self._tokens or self._wake_pending:
                return
            self._wake_pending = True
        self._call_soon(self._ready.set)

    def begin(self) -> None:
        """The engine is about to evaluate the generation's first tokens: a consumer waiting
        in `evaluating` goes on. Called with the batch ready, just before llama_decode (which
        holds no GIL): the loop wakes (a write to its socket) while the engine thread enters
        it."""
        self._call_soon(self._evaluating.set)

    def close(self, result: EngineResult) -> None:
        with self._lock:
            self._result = result
            callbacks, self._on_close = self._on_close, []
        self._call_soon(self._ended)  # always: a pacing consumer waits for the end too
        for callback in callbacks:
            self._call_soon(callback, result)

    def _ended(self) -> None:  # on the consumer's loop
        self._evaluating.set()
        self._ready.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _call_soon(self, callback: Callable[..., object], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the consumer's loop is gone: nobody is listening
            self.cancel()

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback()` once the generation is cancelled (on the thread that cancels it;
        at once if it already is; perhaps twice): a decode under way can stop. Returns what
        ends the watch."""
        with self._lock:
            self._on_cancel.append(callback)
        if self.cancelled:  # set before the watch: `cancel` may have missed it
            callback()

        def unwatch() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._on_cancel.remove(callback)

        return unwatch

    # consumer side

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            callbacks = list(self._on_cancel)
        for callback in callbacks:
            callback()

    async def evaluating(self, within_s: float) -> None:
        """Wait until the engine evaluates the generation (or it ended), `within_s` at most."""
        if self._evaluating.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._evaluating.wait(), within_s)

    def unpace(self) -> None:
        """The chunk just taken reached the client as nothing it shows: the next one is handed
        over as soon as it comes, not held to the pacing interval."""
        self._unpaced = True

    def on_close(self, callback: Callable[[EngineResult], object]) -> None:
        """Call `callback(result)` on the consumer's loop once the engine is done."""
        with self._lock:
            result = self._result
            if result is None:
                self._on_close.append(callback)
                return
        with contextlib.suppress(RuntimeError):  # the consumer's loop may be gone
            self._loop.call_soon_threadsafe(callback, result)

    @property
    def result(self) -> EngineResult:
        if self._result is None:
            raise RuntimeError("the generation has not finished")
        return self._result

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self.paced(0.0)

    async def paced(self, interval_s: float) -> AsyncIterator[TokenChunk]:
        """The chunks, at most one per `interval_s` while tokens come faster (see the module)."""
        loop = self._loop
        while True:
            self._ready.clear()
            with self._lock:
                chunk, self._tokens = self._tokens, TokenChunk()
                done = self._result is not None
                if not chunk:  # nothing new: the next token wakes the loop
                    self._wake_pending = False
            if chunk:
                due = loop.time() + interval_s
                self._unpaced = False
                yield chunk
            if done:
                return
            if not chunk:
                await self._ready.wait()
            elif interval_s > 0 and not self._unpaced and loop.time() < due:
                await self._pause(due)

    async def _pause(self, due: float) -> None:
        """Wait until `due` or the end. Tokens pushed meanwhile do not wake the loop (a wake is
        pending); a wake scheduled before the last drain may still come, and is waited past."""
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            self._ready.set()

        timer = self._loop.call_at(due, fire)
        try:
            while not fired and self._result is None:
                self._ready.clear()
                await self._ready.wait()
        finally:
            timer.cancel()


def announcer(channels: Iterable[TokenChannel]) -> Callable[[], None] | None:
    """What tells the consumers of a batch's new generations that the engine evaluates them
    (their opening events are made while the engine thread is in llama_decode), once each:
    called with the batch ready, right before llama_decode. None when every one was told."""
    fresh = [channel for channel in channels if not channel._announced]
    return partial(_announce, fresh) if fresh else None


def _announce(fresh: list[TokenChannel]) -> None:
    for channel in fresh:
        if not channel._announced:  # a decode tried again (no room) announces once
            channel._announced = True
            channel.begin()
