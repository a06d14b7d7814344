"""Rounds: the one loop that consumes the engine, for chat-style and raw generations alike.

A round is one engine generation: its prompt submitted (`Rounds.submit`), its chunks read at
the stream's pace and made into events by the generation's `Reader` (server.core.prepared's
for harmony, server.core.raw's for raw text), and one `Finished` made of the engine's result.
What every round does lives here once:

- a chunk that showed the client nothing (harmony's header tokens, a raw text held back for a
  possible stop string) does not hold the next one to the pacing interval (`TokenStream.unpace`);
- a stop string ends the reading, and the engine's result is awaited (it stops within a token);
- a consumer that leaves cancels the engine, and its round is still reported once the engine
  lets go of it (`leave`: also for a round begun ahead and never read);
- every report reaches `on_finished` (the metrics), once per round.

The Generator makes one and hands it to every generation (server.core.generation).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from typing import Protocol

from server.contracts.events import Finished, GenerationEvent, SegmentDelta
from server.engine.base import Engine, EngineResult, TokenChunk, TokenStream


class Reader(Protocol):
    """What one kind of generation makes of a round's chunks."""

    @property
    def stop(self) -> str | None:
        """The stop string that ended the round's text; None while none did."""
        ...

    def feed(self, chunk: TokenChunk) -> Iterable[GenerationEvent]:
        """The events of one engine chunk."""
        ...

    def let_go(self, *, read: bool) -> None:
        """The chunks are no longer read: `read` when the reading ended (the engine's end, a
        stop string), not when the consumer left or it raised."""
        ...

    def tail(self) -> Iterable[GenerationEvent]:
        """The events once the engine ended (after a stop string too), before the report."""
        ...

    def finished(self, result: EngineResult, stop: str | None) -> Finished:
        """The round's report; `stop`: the stop string that ended it (None for a round whose
        consumer left)."""
        ...


class Rounds:
    """The engine rounds of every generation: submitted, read, reported."""

    def __init__(
        self,
        engine: Engine,
        *,
        stream_interval_s: float = 0.0,
        on_finished: Callable[[Finished], None] | None = None,
    ) -> None:
        self.engine = engine
        self.submit = engine.submit  # a round is submitted to the engine as it is
        self.stream_interval_s = stream_interval_s  # engine chunks at most this often
        self.on_finished = on_finished  # e.g. metrics; called once per round (summaries too)

    async def run(
        self, stream: TokenStream, reader: Reader, opening: Sequence[GenerationEvent] = ()
    ) -> AsyncGenerator[GenerationEvent, None]:
        """The round's events: `opening`, the reader's events of every chunk, its tail, then
        the report. Leaving early cancels the engine (the round is reported once it lets go)."""
        consumed = False
        try:
            for event in opening:
                yield event
            async for chunk in stream.paced(self.stream_interval_s):
                shown = False
                for event in reader.feed(chunk):
                    shown = shown or isinstance(event, SegmentDelta)
                    yield event
                if not shown:  # header tokens, a held-back text: the next chunk at once
                    stream.unpace()
                if reader.stop is not None:
                    break
            consumed = True
        finally:
            reader.let_go(read=consumed)
            stream.cancel()  # no-op once finished; stops the engine if the consumer left
            if not consumed and reader.stop is None:
                stream.on_close(functools.partial(self._left, reader))
        if reader.stop is not None:
            async for _ in stream:  # the engine stops within a token; wait for its result
                pass
        for event in reader.tail():
            yield event
        yield self._report(reader.finished(stream.result, reader.stop))

    def leave(self, stream: TokenStream, reader: Reader) -> None:
        """A round nobody reads: the engine stops it, and it is reported once it lets go (as a
        round whose consumer left)."""
        stream.cancel()
        stream.on_close(functools.partial(self._left, reader))

    def _left(self, reader: Reader, result: EngineResult) -> Finished:
        return self._report(reader.finished(result, None))

    def _report(self, finished: Finished) -> Finished:
        if self.on_finished is not None:
            self.on_finished(finished)
        return finished
