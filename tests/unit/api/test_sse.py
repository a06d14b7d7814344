"""SSE events stay one line per data field whatever the model wrote."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from server.api.sse import coalesced, sse_data, sse_event

TEXT = "a\u2028b\x85c\u2029d\ne\rf\x0bg\x1ch"  # every character str.splitlines breaks on


def test_line_breaking_characters_are_escaped_and_round_trip() -> None:
    for event in (sse_data({"text": TEXT}), sse_event("x", {"text": TEXT})):
        lines = [line for line in event.decode().splitlines() if line]
        assert lines[-1].startswith("data: ")
        assert len(lines) == (1 if event.startswith(b"data") else 2)
        assert json.loads(lines[-1][len("data: ") :]) == {"text": TEXT}


class _Engine:
    """Events as a generation makes them: three at once (one engine chunk), then two more,
    each only once `step` is set (the next chunk); `done` once all are out."""

    def __init__(self, fail: bool = False) -> None:
        self.step = asyncio.Event()
        self.done = asyncio.Event()
        self.closed = False
        self.fail = fail

    async def events(self) -> AsyncIterator[bytes]:
        try:
            for name in ("a", "b", "c"):
                yield sse_data({"e": name})
            for name in ("d", "e"):
                await self.step.wait()
                self.step.clear()
                yield sse_data({"e": name})
            self.done.set()
            if self.fail:
                raise RuntimeError("generation failed")
        finally:
            self.closed = True


def _names(write: bytes) -> list[str]:
    return [json.loads(line[6:])["e"] for line in write.decode().splitlines() if line]


def test_events_ready_together_go_out_in_one_write() -> None:
    async def writes() -> list[list[str]]:
        engine, received = _Engine(), []
        async for write in coalesced(engine.events()):
            received.append(_names(write))
            engine.step.set()  # the client keeps up: the next chunk comes after this write
        return received

    assert asyncio.run(writes()) == [["a", "b", "c"], ["d"], ["e"]]


def test_a_slow_reader_gets_everything_that_piled_up_in_one_write() -> None:
    async def writes() -> list[list[str]]:
        engine, received = _Engine(), []
        async for write in coalesced(engine.events()):
            received.append(_names(write))
            if len(received) == 1:  # the client is busy while both later chunks come
                while not engine.done.is_set():
                    engine.step.set()
                    await asyncio.sleep(0)
        return received

    assert asyncio.run(writes()) == [["a", "b", "c"], ["d", "e"]]


def test_an_error_comes_after_the_events_before_it() -> None:
    engine, received = _Engine(fail=True), []

    async def writes() -> None:
        async for write in coalesced(engine.events()):
            received.append(_names(write))
            engine.step.set()

    with pytest.raises(RuntimeError, match="generation failed"):
        asyncio.run(writes())
    assert received == [["a", "b", "c"], ["d"], ["e"]]
    assert engine.closed


def test_a_reader_that_leaves_closes_the_events() -> None:
    engine = _Engine()

    async def leave_after_first() -> None:
        stream = coalesced(engine.events())
        async for _ in stream:
            break
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(leave_after_first())
    assert engine.closed
