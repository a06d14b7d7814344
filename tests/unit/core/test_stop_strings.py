"""StopStrings: the final answer ends at the first stop string, wherever the deltas split it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
)
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


def test_a_stop_at_the_very_start_sends_nothing() -> None:
    text, filt, out = run(["STOP"], ["STOP here"])
    assert text == ""
    assert filt.matched == "STOP"
    assert out == [SegmentEnd(0, FINAL, "", (), complete=False)]


def test_the_end_holds_everything_sent_with_the_segments_index() -> None:
    filt = StopStrings(["END"])
    out: list[GenerationEvent] = []
    for piece in ("one ", "two E", "N", "x three EN", "D four"):
        out += filt.filter(SegmentDelta(3, FINAL, piece))
    assert out == [
        SegmentDelta(3, FINAL, "one "),
        SegmentDelta(3, FINAL, "two "),
        SegmentDelta(3, FINAL, "ENx three "),
        SegmentEnd(3, FINAL, "one two ENx three ", (), complete=False),
    ]
    assert filt.hit
    assert filt.matched == "END"
    after = SegmentDelta(3, FINAL, "END again")
    assert filt.filter(after) == [after]  # after the stop, events pass as they are
    end = SegmentEnd(3, FINAL, "x", (1,))
    assert filt.filter(end) == [end]


def test_a_later_final_segment_starts_afresh() -> None:
    """The text held at a segment's end is flushed there, not carried into the next one."""
    filt = StopStrings(["STOP"])
    first_end = SegmentEnd(0, FINAL, "a S", (1,))
    assert filt.filter(SegmentDelta(0, FINAL, "a S")) == [SegmentDelta(0, FINAL, "a ")]
    assert filt.filter(first_end) == [SegmentDelta(0, FINAL, "S"), first_end]
    assert filt.filter(SegmentDelta(1, FINAL, "TOP")) == [SegmentDelta(1, FINAL, "TOP")]
    assert not filt.hit
    assert filt.filter(SegmentDelta(1, FINAL, " b STOP")) == [
        SegmentDelta(1, FINAL, " b "),
        SegmentEnd(1, FINAL, "TOP b ", (), complete=False),
    ]


def test_other_kinds_and_empty_stops_pass_untouched() -> None:
    for stops in ([], [""], ["", ""]):
        filt = StopStrings(stops)
        delta = SegmentDelta(0, FINAL, "anything")
        assert filt.filter(delta) == [delta]
        assert not filt.hit
    filt = StopStrings(["", "x"])
    assert filt.filter(SegmentDelta(0, FINAL, "abc")) == [SegmentDelta(0, FINAL, "abc")]
    reasoning_end = SegmentEnd(0, SegmentKind.REASONING, "x", (1,))
    assert filt.filter(reasoning_end) == [reasoning_end]
    tool = SegmentDelta(1, SegmentKind.TOOL_CALL, "x")
    assert filt.filter(tool) == [tool]
    assert filt.matched is None


def test_only_the_final_segments_end_flushes_the_held_text() -> None:
    filt = StopStrings(["STOP"])
    assert filt.filter(SegmentDelta(0, FINAL, "a S")) == [SegmentDelta(0, FINAL, "a ")]
    other_end = SegmentEnd(1, SegmentKind.REASONING, "x", (1,))
    assert filt.filter(other_end) == [other_end]
    finished = Finished(FinishReason.STOP)  # not a segment's event: passed on as it is
    assert filt.filter(finished) == [finished]
    assert filt.filter(SegmentDelta(0, FINAL, "TOP")) == [
        SegmentEnd(0, FINAL, "a ", (), complete=False)
    ]


@pytest.mark.parametrize(
    ("stops", "pieces", "sent"),
    [
        (["STOP"], ["ST", "OP"], []),  # shorter than the stop: all held
        (["STOP"], ["Hello STO", "P"], ["Hello "]),
        (["abab"], ["xaba", "b"], ["x"]),  # the longest end that begins the stop is held
        (["BCX", "C!"], ["xBC", "!"], ["x", "B"]),  # each stop's end counts, the longest wins
        (["C!", "BCX"], ["xBC", "X"], ["x"]),
        (["aaa"], ["baa", "a"], ["b"]),
        (["ab"], ["a", "a", "b"], ["a"]),
    ],
)
def test_each_delta_sends_all_that_cannot_begin_a_stop(
    stops: list[str], pieces: list[str], sent: list[str]
) -> None:
    filt = StopStrings(stops)
    out: list[GenerationEvent] = []
    for piece in pieces:
        out += filt.filter(SegmentDelta(0, FINAL, piece))
    assert filt.hit
    assert [e.text for e in out if isinstance(e, SegmentDelta)] == sent
    assert out[-1] == SegmentEnd(0, FINAL, "".join(sent), (), complete=False)


def held_back(text: str, stops: list[str]) -> int:
    """The reference: the longest end of `text` that a stop string begins with."""
    ends = [n for n in range(1, len(text) + 1) for s in stops if s.startswith(text[-n:])]
    return max(ends, default=0)


@settings(derandomize=True, max_examples=300)
@given(
    stops=st.lists(st.text("ab", min_size=1, max_size=4), min_size=1, max_size=3),
    pieces=st.lists(st.text("abc", max_size=5), max_size=6),
)
def test_the_filter_matches_a_reference_on_every_split(stops: list[str], pieces: list[str]) -> None:
    """After every delta the text sent is all of the text so far but the longest end that
    begins a stop string; at the first stop anywhere the segment ends there."""
    filt = StopStrings(stops)
    sent = ""
    so_far = ""
    for piece in pieces:
        so_far += piece
        out = filt.filter(SegmentDelta(0, FINAL, piece))
        assert all(e.text for e in out if isinstance(e, SegmentDelta))  # no empty deltas
        sent += "".join(e.text for e in out if isinstance(e, SegmentDelta))
        found = [(i, s) for s in stops if (i := so_far.find(s)) >= 0]
        if found:
            cut, stop = min(found, key=lambda hit: hit[0])
            assert filt.matched == stop
            assert sent == so_far[:cut]
            assert out[-1] == SegmentEnd(0, FINAL, sent, (), complete=False)
            return
        assert not filt.hit
        assert sent == so_far[: len(so_far) - held_back(so_far, stops)]
    end = SegmentEnd(0, FINAL, so_far, (1,))
    out = filt.filter(end)
    assert out[-1] is end
    assert sent + "".join(e.text for e in out if isinstance(e, SegmentDelta)) == so_far
