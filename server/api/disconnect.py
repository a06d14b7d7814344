"""Stop generating for clients that went away while waiting for a non-streaming answer.

Streaming responses need nothing: starlette cancels the stream when the client disconnects,
which closes the event iterator and cancels the engine request. A non-streaming handler is not
told, so it consumes the events in a task and polls the connection beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")
POLL_S = 0.25


class ClientGone(Exception):
    """The client disconnected before the answer was complete."""


async def consume_while_connected(
    request: Request, events: AsyncIterator[T], consume: Callable[[T], None]
) -> None:
    """Feed every event to `consume`; raise ClientGone (generation cancelled) on disconnect."""

    async def drain() -> None:
        async for event in events:
            consume(event)

    task = asyncio.ensure_future(drain())
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ClientGone
        task.result()
    finally:
        if not task.done():
            task.cancel()
