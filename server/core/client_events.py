"""ClientEvents: sampled token ids -> the events a client sees, one engine chunk at a time (the
harmony decoder, stop strings over the final answer, tool names back in the client's names,
logprobs with the deltas they are the text of)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

from server.contracts.events import (
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentStart,
    TokenLogprob,
)
from server.core.stop_strings import StopStrings
from server.core.tool_names import ToolNames
from server.harmony.decoder import HarmonyDecoder
from server.harmony.tokens import MESSAGE_TERMINATORS as TERMINATORS


class ClientEvents:
    """Sampled token ids -> the events a client sees, one engine chunk at a time.

    The decoder parses the tokens, stop strings cut the final answer, and tool names go back to
    the client's names; consecutive deltas of one segment in a chunk are joined (one delta per
    segment and chunk goes out, not one per token). Once a stop string matched, nothing more
    is decoded. Where the request asked for logprobs, each content token's (the tokens of a
    segment after its header, before its terminator) goes out with the next delta of its segment.
    """

    def __init__(
        self, decoder: HarmonyDecoder, stops: StopStrings, names: ToolNames | None
    ) -> None:
        self._decoder = decoder
        self._stops = stops
        self._names = names
        self.ended: list[SegmentEnd] = []  # messages completed while sampling (the history's)
        self._open = False  # a segment's content is being sampled
        self._scores: list[TokenLogprob] = []  # content tokens not yet sent with a delta

    @property
    def stopped(self) -> bool:
        """A stop string matched: the generation must end."""
        return self._stops.hit

    @property
    def stop_sequence(self) -> str | None:
        return self._stops.matched

    def feed(
        self, tokens: list[int], logprobs: Sequence[TokenLogprob | None] = ()
    ) -> Iterator[GenerationEvent]:
        texts: list[SegmentDelta] = []
        pending: SegmentDelta | None = None
        for event in self._filtered(tokens, logprobs):
            if (
                isinstance(event, SegmentDelta)
                and pending is not None
                and event.index == pending.index
            ):
                texts.append(event)
                continue
            if pending is not None:
                yield self._for_client(_joined(pending, texts))
                pending = None
            if isinstance(event, SegmentDelta):
                pending, texts = event, [event]
            else:
                yield self._for_client(event)
        if pending is not None:
            yield self._for_client(_joined(pending, texts))

    def finish(self) -> Iterator[GenerationEvent]:
        """What the decoder still holds once the engine stopped (not after a stop string)."""
        for event in self._decoder.finish():
            for passed in self._stops.filter(event):
                yield self._for_client(passed)

    def _filtered(
        self, tokens: list[int], logprobs: Sequence[TokenLogprob | None]
    ) -> Iterator[GenerationEvent]:
        for at, token in enumerate(tokens):
            score = logprobs[at] if at < len(logprobs) else None
            if score is not None and self._open and token not in TERMINATORS:
                self._scores.append(score)
            for event in self._decoder.feed(token):
                if isinstance(event, SegmentStart | SegmentEnd):
                    self._open = isinstance(event, SegmentStart)
                for passed in self._stops.filter(event):
                    if isinstance(passed, SegmentEnd):  # complete messages only: the history
                        self.ended.append(passed)
                        self._scores = []
                    yield self._scored(passed)
                if self._stops.hit:
                    return

    def _scored(self, event: GenerationEvent) -> GenerationEvent:
        """A delta with the logprobs of the content tokens it is the text of."""
        if not isinstance(event, SegmentDelta) or not self._scores:
            return event
        scores, self._scores = tuple(self._scores), []
        return dataclasses.replace(event, logprobs=scores)

    def _for_client(self, event: GenerationEvent) -> GenerationEvent:
        return self._names.to_client(event) if self._names is not None else event


def _joined(first: SegmentDelta, deltas: list[SegmentDelta]) -> SegmentDelta:
    if len(deltas) == 1:
        return first
    text = "".join(d.text for d in deltas)
    return dataclasses.replace(
        first, text=text, logprobs=tuple(lp for d in deltas for lp in d.logprobs)
    )
