"""TokenChannel: hands sampled tokens from the engine thread to an asyncio consumer.

The engine thread appends tokens; the consumer drains everything that arrived since it last
looked, so a slow consumer gets larger chunks instead of a growing backlog of wake-ups. The loop
is woken at most once per drained chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable

from server.engine.base import EngineResult


class TokenChannel:
    """One generation's token stream: written by the engine thread, read by one coroutine."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._tokens: list[int] = []
        self._result: EngineResult | None = None
        self._wake_pending = False
        self._ready = asyncio.Event()
        self._cancelled = threading.Event()
        self._on_close: list[Callable[[EngineResult], object]] = []

    # engine-thread side

    def push(self, token: int) -> None:
        with self._lock:
            self._tokens.append(token)
            self._wake()

    def close(self, result: EngineResult) -> None:
        with self._lock:
            self._result = result
            self._wake()
            callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            self._call_soon(callback, result)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:  # the consumer's loop is gone: nobody is listening
                self._cancelled.set()

    def _call_soon(self, callback: Callable[[EngineResult], object], result: EngineResult) -> None:
        with contextlib.suppress(RuntimeError):  # the consumer's loop may be gone
            self._loop.call_soon_threadsafe(callback, result)

    # consumer side

    def cancel(self) -> None:
        self._cancelled.set()

    def on_close(self, callback: Callable[[EngineResult], object]) -> None:
        """Call `callback(result)` on the consumer's loop once the engine is done."""
        with self._lock:
            result = self._result
            if result is None:
                self._on_close.append(callback)
                return
        self._call_soon(callback, result)

    @property
    def result(self) -> EngineResult:
        if self._result is None:
            raise RuntimeError("the generation has not finished")
        return self._result

    async def __aiter__(self) -> AsyncIterator[list[int]]:
        while True:
            self._ready.clear()
            with self._lock:
                chunk, self._tokens = self._tokens, []
                self._wake_pending = False
                done = self._result is not None
            if chunk:
                yield chunk
            if done:
                return
            if not chunk:
                await self._ready.wait()
