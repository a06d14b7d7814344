"""Stream run: one response's generation events -> its API's emitter -> wire events, streamed or
folded. The one stream tail every API shares; an API supplies only its emitter (`Emitter`).

- `with_keepalive` bridges a long wait (the prompt being evaluated, the engine busy with another
  request) with the emitter's keepalive events, without cancelling the generation.
- `SequentialItems` keeps items one after the other: what the generation writes after a
  reasoning segment waits until that segment's summary is done (emitters whose reasoning items
  hold their summary).
- The stream always ends with the emitter's terminal: an exception from the generation becomes a
  failed `Finished` event, and a generation that ends without one gets one. A client that went
  away closes the run, and nothing more is sent.
- An optional finish callback runs once the emitter is done, before its last events leave
  (Responses stores the response there).
- A non-streaming answer is the fold of the very same events: consumed while the client is
  connected (499 when it left), then folded by the API, which raises its error for a failed
  generation. Several runs (chat's `n`, several completion prompts) are consumed side by side
  (`respond_all`); the first that fails stops the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, Generic, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from server.api.disconnect import ClientGone, consume_while_connected
from server.api.sse import sse_response
from server.contracts.errors import EngineUnavailable
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentEnd,
    SegmentKind,
    SummaryDelta,
    SummaryEnd,
    SummaryStart,
    ToolOutput,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
W = TypeVar("W")  # one wire event of an API's stream


class EventSource(Protocol):
    """An admitted generation (server.core.prepared.Prepared, server.core.raw.RawGeneration).
    One whose first round can be submitted before its events are read has it as `first`
    (a `FirstRound`: Prepared's)."""

    def events(self) -> AsyncIterator[GenerationEvent]: ...


class FirstRound(Protocol):
    """A generation's first round, submitted before its events are read
    (server.core.prepared.FirstRound)."""

    async def begin(self) -> None: ...

    def abandon(self) -> None: ...


class Emitter(Protocol[W]):
    """One response's translator: generation events in, the API's wire events out.

    It owns every index and id of its response, and decides how the stream ends: once `done`,
    it has sent its terminal events (or, for a cancelled generation, chose to send nothing).
    """

    @property
    def waits_for_summaries(self) -> bool:
        """Whether a reasoning item stays open for its summary (the run keeps later events
        back meanwhile: SequentialItems)."""
        ...

    @property
    def done(self) -> bool: ...

    def start(self) -> list[W]:
        """The events that open the stream."""
        ...

    def keepalive(self) -> list[W]:
        """Events for an idle stretch (none where the API has no such event, or not now)."""
        ...

    def feed(self, event: GenerationEvent) -> list[W]: ...


Ended = SegmentEnd | ToolOutput
Finish = Callable[[list[W], list[Ended]], Awaitable[None]]
"""Runs once the emitter is done, with its last events (the terminal ones) and every segment
that ended (and every server-run tool's output, in order), before those events leave."""


class StreamRun(Generic[W]):
    """A prepared generation and the emitter of its response."""

    def __init__(
        self,
        source: EventSource,
        emitter: Emitter[W],
        *,
        name: str,
        finish: Finish[W] | None = None,
    ) -> None:
        self._source = source
        self._emitter = emitter
        self._name = name  # for the log: "response resp_...", "message msg_..."
        self._finish = finish
        self._ahead = _Ahead(source, name)
        self.unavailable: str | None = None  # why the model could not generate it (a 503)

    async def stream(
        self, encode: Callable[[W], bytes], keepalive_s: float | None
    ) -> StreamingResponse:
        """The streaming HTTP response: every wire event, encoded as SSE.

        A source that can begin is submitted here, before the response exists: its headers
        and opening events are made while the engine evaluates the prompt (not before the
        submission, as from inside the response's body: 0.5-0.8 ms of a streamed response's
        start). A response that never reads its events (the client left first) abandons the
        generation at its end (a no-op once the events took it over).
        """
        await self._ahead.begin()

        async def encoded() -> AsyncIterator[bytes]:
            async for event in self.events(keepalive_s):
                yield encode(event)

        return sse_response(encoded(), on_end=self._ahead.abandon)

    async def respond(self, request: Request, body: Callable[[list[W]], Any]) -> Response:
        """The non-streaming HTTP response: the events folded by `body` into the JSON body.

        `body` raises the API's error for a failed generation; one the model could not generate
        (an RPC host dropped, its load failed) is EngineUnavailable, 503 in the API's shape; a
        client that left before the end gets 499 (nobody is listening; the generation was
        cancelled).
        """
        events: list[W] = []
        try:
            await consume_while_connected(request, self.events(), events.append)
        except ClientGone:
            return Response(status_code=499)
        raise_unavailable([self])
        return JSONResponse(body(events))

    async def events(self, keepalive_s: float | None = None) -> AsyncGenerator[W, None]:
        """Every wire event of the response; the emitter's terminal ones last.

        A source that can (`Prepared.first`) is submitted before the opening events are made,
        which are then made while the engine evaluates the prompt.
        """
        emitter = self._emitter
        async with aclosing(self._ahead.opening(emitter.start)) as opening:
            async for started in opening:
                yield started
        ended: list[Ended] = []
        in_order = SequentialItems(emitter.waits_for_summaries)
        try:
            generation = with_keepalive(self._source.events(), keepalive_s)
            async with aclosing(generation) as events:
                async for event in events:
                    if event is None:
                        for tick in emitter.keepalive():
                            yield tick
                        continue
                    if isinstance(event, SegmentEnd | ToolOutput):
                        ended.append(event)
                    for ordered in in_order.feed(event):
                        for out in await self._feed(ordered, ended):
                            yield out
        except Exception as exc:
            log.exception("%s: generation raised", self._name)
            failure = Finished(FinishReason.ERROR, error=f"internal error: {type(exc).__name__}")
            for out in await self._feed(failure, ended):
                yield out
        if not emitter.done:
            failure = Finished(FinishReason.ERROR, error="generation ended without a result")
            for out in await self._feed(failure, ended):
                yield out

    async def _feed(self, event: GenerationEvent, ended: list[Ended]) -> list[W]:
        """The emitter's events for `event`; the finish callback runs before the last ones."""
        emitter = self._emitter
        if emitter.done:
            return []
        if isinstance(event, Finished) and event.unavailable:
            self.unavailable = event.error or "the model cannot generate"
        out = emitter.feed(event)
        if emitter.done and self._finish is not None:
            try:
                await self._finish(out, ended)
            except Exception:  # the response stands even if finishing (storing) it failed
                log.exception("%s: finishing (storing) failed", self._name)
        return out


class _Ahead:
    """This layer's side of a generation submitted before its events are read (the source's
    `first` round, where it has one): submitted before the response exists and before the
    opening events (which are then made while the engine evaluates the prompt), abandoned
    where the events are never read (a no-op once they took the round over)."""

    def __init__(self, source: EventSource, name: str) -> None:
        self._first: FirstRound | None = getattr(source, "first", None)
        self._name = name

    @property
    def abandon(self) -> Callable[[], None] | None:
        """What ends the begun round if the events are never read; None where none begins."""
        return self._first.abandon if self._first is not None else None

    async def begin(self) -> None:
        """Submit the first round, and wait until the engine evaluates it (or briefly)."""
        first = self._first
        if first is None:
            return
        try:
            await first.begin()
        except Exception:  # its events submit it again, and end with the error
            log.debug("%s: the generation could not begin", self._name, exc_info=True)
        except BaseException:  # cancelled while it began: nobody reads its events
            first.abandon()
            raise

    async def opening(self, start: Callable[[], list[W]]) -> AsyncGenerator[W, None]:
        """The emitter's opening events (`start`), after the first round's submission (already
        begun by `stream`)."""
        try:
            await self.begin()
            for started in start():
                yield started
        except BaseException:  # the client left before the generation's events were read
            if self._first is not None:
                self._first.abandon()
            raise


async def respond_all(
    request: Request,
    runs: Sequence[StreamRun[W]],
    body: Callable[[list[list[W]]], Any],
    *,
    failed: Callable[[W], bool],
) -> Response:
    """The non-streaming HTTP response of several runs side by side: each run's events, folded
    together by `body` (which raises the API's error for a failed run). The first event for
    which `failed` holds stops the other runs; a client that left gets 499."""
    events: list[list[W]] = [[] for _ in runs]

    async def until_failed() -> AsyncIterator[tuple[int, W]]:
        async with aclosing(merged([run.events() for run in runs])) as every:
            async for index, event in every:
                yield index, event
                if failed(event):
                    return  # closing `merged` cancels the others

    try:
        await consume_while_connected(
            request, until_failed(), lambda item: events[item[0]].append(item[1])
        )
    except ClientGone:
        return Response(status_code=499)
    raise_unavailable(runs)
    return JSONResponse(body(events))


def raise_unavailable(runs: Sequence[StreamRun[Any]]) -> None:
    """EngineUnavailable (503) when a run's model could not generate it, instead of the 500
    the API's fold raises for a failed generation: the model is back once its RPC hosts are,
    or its next load succeeds, and a client may try again."""
    for run in runs:
        if run.unavailable is not None:
            raise EngineUnavailable(f"The server cannot generate: {run.unavailable}")


async def merged(sources: Sequence[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Every source's items as they come, tagged with the source's position; an exception of
    one source is raised here, and leaving early cancels every source."""
    queue: asyncio.Queue[tuple[int, T | None, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        error: BaseException | None = None
        try:
            async for item in source:
                await queue.put((index, item, None, False))
        except Exception as exc:  # handed to the consumer
            error = exc
        finally:
            queue.put_nowait((index, None, error, True))

    tasks = [asyncio.ensure_future(pump(i, source)) for i, source in enumerate(sources)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item, error, ended = await queue.get()
            if error is not None:
                raise error
            if ended:
                remaining -= 1
            else:
                yield index, item  # type: ignore[misc]  # not None: not an end marker
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


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
