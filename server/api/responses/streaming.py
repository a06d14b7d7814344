"""One response's run: generation events -> emitter -> stream events, with keepalive ticks.

`with_keepalive` waits for the next generation event in a task, so that a long wait (the prompt
being evaluated, the engine busy with another request) can be bridged by real events without
cancelling the generation. `SequentialItems` holds back what the generation already wrote after
a reasoning segment until that segment's summary is done, so that items stay strictly one after
the other. `ResponseRun` drives the emitter and hands the finished response to a callback
(store, logging) before the terminal event leaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

from server.api.responses.emitter import ResponsesEmitter
from server.api.responses.schemas import ResponseObject, StreamEvent
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentEnd,
    SegmentKind,
    SummaryDelta,
    SummaryEnd,
    SummaryStart,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Finisher = Callable[[ResponseObject, list[SegmentEnd]], Awaitable[None]]


class EventSource(Protocol):
    """A prepared generation (server.core.generation.Prepared)."""

    def events(self) -> AsyncIterator[GenerationEvent]: ...


async def with_keepalive(
    events: AsyncIterator[T], interval_s: float | None
) -> AsyncGenerator[T | None, None]:
    """The events of `events`, and None whenever `interval_s` passed without one.

    The pending `__anext__` runs in a task that a timeout never cancels; only leaving early
    (the client went away) cancels it, which stops the generation.
    """
    pending: asyncio.Task[T] | None = None
    try:
        while interval_s is None:
            try:
                yield await _next(events)
            except StopAsyncIteration:
                return
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next(events))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            task, pending = pending, None
            try:
                event = task.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        if pending is not None:
            pending.cancel()
            pending.add_done_callback(_retrieve)
        else:
            await _aclose(events)


async def _next(events: AsyncIterator[T]) -> T:
    return await events.__anext__()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("generation task ended with %r after the client left", task.exception())


async def _aclose(events: AsyncIterator[Any]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


class SequentialItems:
    """Events in item order: after a reasoning segment, its summary before anything else.

    A summary arrives after its segment ended, while the generation goes on with the next
    message; those later events wait here until `SummaryEnd` of the segment, then follow in
    their order. Summary runs come one at a time (server.core.summaries), so one gate suffices.
    """

    def __init__(self, summaries: bool) -> None:
        self._summaries = summaries
        self._waiting: int | None = None  # the reasoning segment whose summary is awaited
        self._held: list[GenerationEvent] = []

    def feed(self, event: GenerationEvent) -> list[GenerationEvent]:
        if not self._summaries:
            return [event]
        if isinstance(event, Finished):  # last by contract; never held back
            self._waiting, held, self._held = None, self._held, []
            return [*held, event]
        if self._waiting is None:
            if isinstance(event, SegmentEnd) and event.kind is SegmentKind.REASONING:
                self._waiting = event.index
            return [event]
        if (
            not isinstance(event, (SummaryStart, SummaryDelta, SummaryEnd))
            or event.segment != self._waiting
        ):
            self._held.append(event)
            return []
        if not isinstance(event, SummaryEnd):
            return [event]
        self._waiting, held, self._held = None, self._held, []
        out: list[GenerationEvent] = [event]
        for later in held:
            out += self.feed(later)
        return out


class ResponseRun:
    """A prepared generation and the emitter of its response."""

    def __init__(self, prepared: EventSource, emitter: ResponsesEmitter, finish: Finisher) -> None:
        self._prepared = prepared
        self._emitter = emitter
        self._finish = finish

    async def events(self, keepalive_s: float | None = None) -> AsyncIterator[StreamEvent]:
        """Every stream event of the response; exactly one terminal event, the last."""
        emitter = self._emitter
        for started in emitter.start():
            yield started
        ended: list[SegmentEnd] = []
        in_order = SequentialItems(emitter.summaries)
        generation: AsyncIterator[GenerationEvent] = self._prepared.events()
        try:
            async with aclosing(with_keepalive(generation, keepalive_s)) as events:
                async for event in events:
                    if event is None:
                        for tick in emitter.keepalive():
                            yield tick
                        continue
                    if isinstance(event, SegmentEnd):
                        ended.append(event)
                    for ordered in in_order.feed(event):
                        for out in await self._feed(ordered, ended):
                            yield out
        except Exception as exc:
            log.exception("response %s: generation raised", emitter.response_id)
            failure = Finished(FinishReason.ERROR, error=f"internal error: {type(exc).__name__}")
            for out in await self._feed(failure, ended):
                yield out
        if emitter.terminal is None:
            failure = Finished(FinishReason.ERROR, error="generation ended without a result")
            for out in await self._feed(failure, ended):
                yield out

    async def _feed(self, event: GenerationEvent, ended: list[SegmentEnd]) -> list[StreamEvent]:
        """The emitter's events for `event`; the finish callback runs before a terminal one."""
        emitter = self._emitter
        out = emitter.feed(event)
        if emitter.terminal is not None and out and out[-1] is emitter.terminal:
            try:
                await self._finish(emitter.terminal.response, ended)
            except Exception:  # the response stands even if storing it failed
                log.exception("response %s: finishing (storing) failed", emitter.response_id)
        return out
