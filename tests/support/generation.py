"""A scripted generation: what `Prepared.events()` yields, given in advance, to drive the API
layer's stream run and emitters without the engine (the events the real core would send, and
optionally a failure after them, as a decoder bug would raise)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from server.contracts.events import GenerationEvent


class Generation:
    """Yields `events`, then raises `error` if one is given."""

    def __init__(self, events: Sequence[GenerationEvent], error: Exception | None = None) -> None:
        self._events = events
        self._error = error

    async def events(self) -> AsyncIterator[GenerationEvent]:
        for event in self._events:
            yield event
        if self._error is not None:
            raise self._error
