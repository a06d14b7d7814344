"""StopStrings: the final answer ends at the first stop string, wherever the deltas split it."""

from __future__ import annotations

from server.contracts.events import GenerationEvent, SegmentDelta, SegmentEnd, SegmentKind
from server.core.stop_strings import StopStrings

FINAL = SegmentKind.FINAL


def run(stops: list[str], pieces: list[str]) -> tuple[str, StopStrings, list[GenerationEvent]]:
    filt = StopStrings(stops)
    out: list[GenerationEvent] = []
    for piece in pieces:
        out += filt.filter(SegmentDelta(0, FINAL, piece))
        if filt.hit:
            break
    else:
        out += filt.filter(SegmentEnd(0, FINAL, "".join(pieces), ()))
    text = "".join(e.text for e in out if isinstance(e, SegmentDelta))
    return text, filt, out


def test_stop_split_across_deltas() -> None:
    text, filt, out = run(["STOP"], ["Hello ", "ST", "OP and more"])
    assert text == "Hello "
    assert filt.hit
    end = out[-1]
    assert isinstance(end, SegmentEnd)
    assert end.text == "Hello "
    assert not end.complete


def test_held_text_is_released_when_it_is_not_a_stop() -> None:
    text, filt, out = run(["STOP"], ["Hello ST", "ART here"])
    assert text == "Hello START here"
    assert not filt.hit
    assert isinstance(out[-1], SegmentEnd)


def test_text_held_at_the_end_is_flushed() -> None:
    text, _, _ = run(["STOP"], ["Hello S"])
    assert text == "Hello S"


def test_earliest_stop_wins_and_other_kinds_pass() -> None:
    filt = StopStrings(["b", "a"])
    reasoning = SegmentDelta(0, SegmentKind.REASONING, "a b")
    assert filt.filter(reasoning) == [reasoning]
    text, _, _ = run(["bc", "a"], ["xxbc a"])
    assert text == "xx"
