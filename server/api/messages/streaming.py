"""One message's run: generation events -> MessagesEmitter -> stream events, with pings.

The waiting and ordering machinery is the Responses stream's (server.api.responses.streaming):
`with_keepalive` bridges a long wait (the prompt being evaluated, the engine busy) with `ping`
events without cancelling the generation; `SequentialItems` holds back what the generation wrote
after a reasoning segment until that segment's summary is done, so blocks never interleave.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from server.api.messages.emitter import MessagesEmitter
from server.api.messages.schemas import StreamEvent
from server.api.responses.streaming import EventSource, SequentialItems, with_keepalive
from server.contracts.events import Finished, FinishReason, GenerationEvent

log = logging.getLogger(__name__)


class MessageRun:
    """A prepared generation and the emitter of its message."""

    def __init__(self, prepared: EventSource, emitter: MessagesEmitter) -> None:
        self._prepared = prepared
        self._emitter = emitter

    async def events(self, ping_s: float | None = None) -> AsyncIterator[StreamEvent]:
        """Every stream event; the last one is `message_stop` or an `error` event."""
        emitter = self._emitter
        for started in emitter.start():
            yield started
        in_order = SequentialItems(emitter.summaries)
        generation: AsyncIterator[GenerationEvent] = self._prepared.events()
        try:
            async with aclosing(with_keepalive(generation, ping_s)) as events:
                async for event in events:
                    if event is None:
                        for ping in emitter.ping():
                            yield ping
                        continue
                    for ordered in in_order.feed(event):
                        for out in emitter.feed(ordered):
                            yield out
        except Exception as exc:
            log.exception("message %s: generation raised", emitter.message_id)
            failure = Finished(FinishReason.ERROR, error=f"internal error: {type(exc).__name__}")
            for out in emitter.feed(failure):
                yield out
        if not emitter.done:
            failure = Finished(FinishReason.ERROR, error="generation ended without a result")
            for out in emitter.feed(failure):
                yield out
