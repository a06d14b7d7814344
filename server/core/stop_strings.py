"""StopStrings: ends the final answer at the first of the request's stop strings.

Works on the decoder's events: final-answer text that could be the start of a stop string is
held back until the next delta shows whether it is; when a stop string appears, the text before
it is sent, the segment ends there (marked incomplete, since its tokens run past the text) and
the caller stops generating.
"""

from __future__ import annotations

from collections.abc import Sequence

from server.contracts.events import GenerationEvent, SegmentDelta, SegmentEnd, SegmentKind


class StopStrings:
    """One generation's stop-string filter over FINAL segment text."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self._sent: list[str] = []
        self.matched: str | None = None  # the stop string that appeared

    @property
    def hit(self) -> bool:
        return self.matched is not None

    def filter(self, event: GenerationEvent) -> list[GenerationEvent]:
        """The events to pass on in place of `event`; sets `hit` when a stop string appeared."""
        if not self._stops or self.hit:
            return [event]
        if isinstance(event, SegmentDelta) and event.kind is SegmentKind.FINAL:
            return self._delta(event)
        if isinstance(event, SegmentEnd) and event.kind is SegmentKind.FINAL:
            flushed = self._emit(event, self._held)
            self._held, self._sent = "", []
            return [*flushed, event]
        return [event]

    def _delta(self, event: SegmentDelta) -> list[GenerationEvent]:
        text = self._held + event.text
        found = [(i, stop) for stop in self._stops if (i := text.find(stop)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda hit: hit[0])
            out = self._emit(event, text[:cut])
            end = SegmentEnd(event.index, event.kind, "".join(self._sent), (), complete=False)
            return [*out, end]
        keep = self._suffix_to_hold(text)
        self._held = text[len(text) - keep :] if keep else ""
        return self._emit(event, text[: len(text) - keep])

    def _emit(self, event: SegmentDelta | SegmentEnd, text: str) -> list[GenerationEvent]:
        if not text:
            return []
        self._sent.append(text)
        return [SegmentDelta(event.index, event.kind, text)]

    def _suffix_to_hold(self, text: str) -> int:
        """Length of the longest end of `text` that begins some stop string."""
        longest = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop.startswith(text[-n:]):
                    longest = n
                    break
        return longest
