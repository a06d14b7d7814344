"""Server-sent events on the wire: the only place that formats SSE bytes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any, Protocol

from fastapi.responses import StreamingResponse
from fastapi.sse import format_sse_event
from starlette.types import Receive, Scope, Send

DONE = format_sse_event(data_str="[DONE]")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


# Characters JSON may carry raw but that many line readers (Python's str.splitlines, and so
# httpx's iter_lines; JavaScript engines before ES2019) take for line breaks: escaped, so an
# event's data always stays on its one line whatever the model wrote.
LINE_BREAKING = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def encode_json(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).translate(LINE_BREAKING)


def sse_data(payload: Any) -> bytes:
    """`data: <json>` event, as Chat Completions streams use."""
    return format_sse_event(data_str=encode_json(payload))


def sse_event(event: str, payload: Any) -> bytes:
    """`event: <name>` + `data: <json>`, as Responses streams use."""
    return format_sse_event(event=event, data_str=encode_json(payload))


class Dumpable(Protocol):
    """A pydantic model."""

    def model_dump(self, *, mode: str, exclude: set[str] | None = None) -> dict[str, Any]: ...

    def model_dump_json(self) -> str: ...


class TypedEvent(Dumpable, Protocol):
    """A pydantic stream event that names itself (Responses and Messages events)."""

    @property
    def type(self) -> str: ...


def sse_typed(event: TypedEvent) -> bytes:
    """`event: <its type>` + `data: <its JSON>`."""
    return sse_event(event.type, event.model_dump(mode="json"))


class SharedField:
    """`sse_typed` for a stream whose events carry one large object in a field, often the
    same object in events one after the other (a Responses stream opens with two events that
    carry one response snapshot of some 18 KB for Codex CLI: its instructions and tools): the
    object's JSON is made once for all the events in a row that carry it, by pydantic itself
    (the same text as `encode_json` of its dump, which costs ≈ 0.13 ms for that snapshot)."""

    def __init__(self, field: str) -> None:
        self._field = field
        self._last: Dumpable | None = None
        self._last_json = ""

    def __call__(self, event: TypedEvent) -> bytes:
        shared: Dumpable | None = getattr(event, self._field, None)
        if shared is None:
            return sse_typed(event)
        if shared is not self._last:
            self._last, self._last_json = shared, shared.model_dump_json().translate(LINE_BREAKING)
        rest = event.model_dump(mode="json", exclude={self._field})
        head = encode_json(rest)[:-1]  # the other fields, without the closing brace
        comma = "," if rest else ""
        return format_sse_event(
            event=event.type, data_str=f'{head}{comma}"{self._field}":{self._last_json}}}'
        )


_END = b"\x00end"  # a queue item no formatted event can be (events end in a blank line)
WRITE_AHEAD = 4096  # events a stream may run ahead of a client that is not reading


async def coalesced(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The formatted events, with all those ready at once joined into one write.

    A producer task runs the events into a queue; each write takes everything queued. So the
    events one engine chunk yields go out together, and a client slower than generation gets
    fewer, larger writes (bounded by WRITE_AHEAD events) instead of one write per event.
    Leaving early (the client went away) cancels the producer, which closes `events`.
    """
    queue: asyncio.Queue[bytes] = asyncio.Queue(WRITE_AHEAD)
    failed: list[Exception] = []

    async def produce() -> None:
        try:
            async for event in events:
                await queue.put(event)
        except Exception as exc:  # handed to the writer, which raises it after what came first
            failed.append(exc)
        finally:  # also when cancelled: the generation behind the events is stopped
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()
        await queue.put(_END)

    producer = asyncio.ensure_future(produce())
    try:
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            done = batch[-1] is _END
            data = b"".join(batch[:-1] if done else batch)
            if data:
                yield data
            if done:
                break
        if failed:
            raise failed[0]
    finally:
        producer.cancel()
        with suppress(asyncio.CancelledError):
            await producer


class _EventStream(StreamingResponse):
    """A streaming response of SSE events that calls `on_end` (if any) once it ended, however
    it ended (also when the client left before its body ran: the body's own code then never
    runs)."""

    def __init__(self, content: AsyncIterator[bytes], on_end: Callable[[], object] | None) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_end is not None:
                self._on_end()


def sse_response(
    events: AsyncIterator[bytes], on_end: Callable[[], object] | None = None
) -> StreamingResponse:
    """The streaming HTTP response of formatted events, coalesced; `on_end` runs once it
    ended."""
    return _EventStream(coalesced(events), on_end)
