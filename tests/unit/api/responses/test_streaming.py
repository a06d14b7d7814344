"""Streaming a response: keepalive ticks that never cancel the generation, and the shared
StreamRun driving the Responses emitter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from server.api.responses.emitter import ResponsesEmitter, fold
from server.api.responses.schemas import ResponseObject, StreamEvent
from server.api.stream_run import Ended, StreamRun, with_keepalive
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
)
from tests.support.event_grammar import CheckedStream, check_stream
from tests.support.generation import Generation


class SlowSource:
    """An async generator that sleeps before each value and records how it ended."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.ended = ""

    async def events(self) -> AsyncIterator[int]:
        try:
            for number, delay in enumerate(self.delays):
                await asyncio.sleep(delay)
                yield number
            self.ended = "finished"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        except GeneratorExit:
            self.ended = "closed"
            raise


async def collect(source: SlowSource, interval: float | None) -> list[int | None]:
    return [event async for event in with_keepalive(source.events(), interval)]


def test_ticks_bridge_a_slow_first_event_and_nothing_is_lost() -> None:
    source = SlowSource([0.25, 0.0, 0.0])
    events = asyncio.run(collect(source, 0.05))
    assert [e for e in events if e is not None] == [0, 1, 2]
    assert events.index(0) >= 3  # several ticks before the first event
    assert None not in events[events.index(0) :]
    assert source.ended == "finished"


def test_without_an_interval_events_pass_through() -> None:
    source = SlowSource([0.01, 0.01])
    assert asyncio.run(collect(source, None)) == [0, 1]


def test_leaving_early_cancels_the_waiting_generation() -> None:
    source = SlowSource([0.0, 10.0])

    async def consume_two() -> list[int | None]:
        stream = with_keepalive(source.events(), 0.01)
        taken = [await anext(stream), await anext(stream)]  # the first event, then a tick
        await stream.aclose()  # the client went away
        await asyncio.sleep(0.05)
        return taken

    assert asyncio.run(consume_two()) == [0, None]
    assert source.ended == "cancelled"


def test_leaving_between_events_closes_the_generation() -> None:
    source = SlowSource([0.0, 0.0, 0.0])

    async def consume_one() -> None:
        stream = with_keepalive(source.events(), 1.0)
        assert await anext(stream) == 0
        await stream.aclose()

    asyncio.run(consume_one())
    assert source.ended == "closed"


def run_response(
    generation: Generation, finish_error: Exception | None = None
) -> tuple[CheckedStream, list[str]]:
    finished: list[str] = []

    async def finish(last: list[StreamEvent], ended: list[Ended]) -> None:
        finished.append(f"{fold(last).status}:{len(ended)}")
        if finish_error is not None:
            raise finish_error

    emitter = ResponsesEmitter(ResponseObject(id="resp_1", created_at=1, model="m"))
    run = StreamRun(generation, emitter, name="response resp_1", finish=finish)

    async def collect() -> list[dict[str, Any]]:
        return [event.model_dump(mode="json") async for event in run.events(0.5)]

    return check_stream(asyncio.run(collect())), finished


ANSWER: list[GenerationEvent] = [
    SegmentStart(0, SegmentKind.FINAL, "final"),
    SegmentDelta(0, SegmentKind.FINAL, "Hi"),
    SegmentEnd(0, SegmentKind.FINAL, "Hi", (1, 2)),
]


def test_the_finisher_runs_before_the_terminal_event() -> None:
    checked, finished = run_response(Generation([*ANSWER, Finished(FinishReason.STOP)]))
    assert checked.types()[-1] == "response.completed"
    assert finished == ["completed:1"]


def test_a_generation_that_raises_still_ends_with_response_failed() -> None:
    checked, finished = run_response(Generation(ANSWER[:2], RuntimeError("decoder bug")))
    assert checked.types()[-1] == "response.failed"
    assert checked.items[0]["status"] == "incomplete"
    assert "RuntimeError" in checked.terminal["response"]["error"]["message"]
    assert finished == ["failed:0"]


def test_a_generation_without_a_finished_event_still_ends() -> None:
    checked, _ = run_response(Generation(ANSWER))
    assert checked.types()[-1] == "response.failed"
    assert [item["status"] for item in checked.items] == ["completed"]


def test_a_failing_store_does_not_cost_the_client_its_terminal_event() -> None:
    generation = Generation([*ANSWER, Finished(FinishReason.STOP)])
    checked, finished = run_response(generation, OSError("disk full"))
    assert checked.types()[-1] == "response.completed"
    assert finished == ["completed:1"]
