"""Reasoning summaries: the visibility policy, the summary prompt, and merging the summaries'
events into the main generation's without blocking either (scripted sources, no engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from server.api.stream_run import SequentialItems
from server.contracts.events import (
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentEnd,
    SegmentKind,
    SegmentStart,
    SummaryDelta,
    SummaryEnd,
    SummaryStart,
    Timings,
    Usage,
)
from server.contracts.transcript import UserMessage
from server.core.summaries import SummaryConfig, SummaryMerge, SummaryRunner, summary_transcript
from server.core.visibility import ReasoningView, resolve_view

REASONING, FINAL = SegmentKind.REASONING, SegmentKind.FINAL


def segment(index: int, kind: SegmentKind, text: str) -> list[GenerationEvent]:
    return [
        SegmentStart(index, kind, kind.value),
        SegmentDelta(index, kind, text),
        SegmentEnd(index, kind, text, (index,)),
    ]


@pytest.mark.parametrize(
    ("visibility", "requested", "exclude", "expected"),
    [
        ("raw", None, False, ReasoningView(raw=True, summary=None)),
        ("raw", "concise", False, ReasoningView(raw=True, summary="concise")),
        ("raw", "auto", True, ReasoningView(raw=False, summary=None)),
        ("summary", None, False, ReasoningView(raw=False, summary="auto")),
        ("summary", "detailed", False, ReasoningView(raw=False, summary="detailed")),
        ("summary", "auto", True, ReasoningView(raw=False, summary=None)),
        ("none", "auto", False, ReasoningView(raw=False, summary=None)),
    ],
)
def test_reasoning_view(
    visibility: str, requested: str | None, exclude: bool, expected: ReasoningView
) -> None:
    assert resolve_view(visibility, requested, exclude=exclude) == expected  # type: ignore[arg-type]


def test_summary_prompt_quotes_only_the_reasoning() -> None:
    transcript = summary_transcript("  Think about X.  ", "concise", SummaryConfig())
    assert transcript.items == (UserMessage("Think about X."),)
    assert transcript.reasoning_effort == "low"
    assert transcript.tools == ()
    assert transcript.instructions is not None
    assert "one sentence" in transcript.instructions
    assert "not a request to you" in transcript.instructions


def test_long_reasoning_keeps_its_head_and_tail() -> None:
    text = "A" * 5000 + "B" * 20000 + "C" * 5000
    (item,) = summary_transcript(text, "auto", SummaryConfig(max_input_chars=1000)).items
    assert isinstance(item, UserMessage)
    assert item.text.startswith("A" * 250)
    assert item.text.endswith("C" * 750)
    assert len(item.text) < 1100


class Gate:
    """Lets a scripted source go on only when the test says so."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def __getitem__(self, name: str) -> asyncio.Event:
        return self._events.setdefault(name, asyncio.Event())


async def main_source(
    events: Sequence[GenerationEvent | str], gate: Gate
) -> AsyncIterator[GenerationEvent]:
    for event in events:
        if isinstance(event, str):
            await gate[event].wait()
        else:
            yield event


async def collect(merge: SummaryMerge) -> list[GenerationEvent]:
    return [event async for event in merge.events()]


def summary_runner(gate: Gate, started: list[str], cancelled: list[str]) -> SummaryRunner:
    async def run(reasoning: str) -> AsyncIterator[GenerationEvent]:
        started.append(reasoning)
        try:
            yield SegmentStart(0, REASONING, "analysis")
            yield SegmentDelta(0, REASONING, "thinking about the summary")
            await gate[f"summary {reasoning}"].wait()
            yield SegmentStart(1, FINAL, "final")
            for word in ("Sum ", reasoning):
                yield SegmentDelta(1, FINAL, word)
            yield Finished(
                FinishReason.STOP,
                Usage(prompt_tokens=50, completion_tokens=9),
                Timings(decode_s=0.5, completion_tokens=9),
            )
        except asyncio.CancelledError:
            cancelled.append(reasoning)
            raise

    return run


def test_summaries_run_beside_the_answer_and_end_before_finished() -> None:
    async def scenario() -> tuple[list[GenerationEvent], list[tuple[SegmentEnd, str]]]:
        gate, started, cancelled = Gate(), list[str](), list[str]()
        main = [
            *segment(0, REASONING, "r0"),
            "answer",
            *segment(1, FINAL, "The answer."),
            Finished(FinishReason.STOP, Usage(prompt_tokens=10, completion_tokens=5)),
        ]
        recorded: list[tuple[SegmentEnd, str]] = []
        merge = SummaryMerge(
            main_source(main, gate), summary_runner(gate, started, cancelled), recorded.extend
        )
        events: list[GenerationEvent] = []
        async for event in merge.events():
            events.append(event)
            if isinstance(event, SummaryStart):
                await asyncio.sleep(0.01)
                assert started == ["r0"]  # submitted as soon as the segment ended
                gate["answer"].set()  # the answer goes on while the summary is running
            if isinstance(event, SegmentEnd) and event.kind is FINAL:
                gate["summary r0"].set()
        return events, recorded

    events, recorded = asyncio.run(scenario())
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("SummaryStart") == 3  # right after the reasoning segment's end
    assert kinds.index("SummaryDelta") > kinds.index("SegmentEnd", 4)  # the answer came first
    assert kinds[-1] == "Finished"
    assert kinds.count("Finished") == 1
    summary_end = next(e for e in events if isinstance(e, SummaryEnd))
    assert (summary_end.segment, summary_end.text, summary_end.complete) == (0, "Sum r0", True)
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.usage == Usage(prompt_tokens=10, completion_tokens=5)  # the main's own
    assert finished.summaries is not None
    assert finished.summaries.count == 1
    assert finished.summaries.usage.completion_tokens == 9
    assert finished.summaries.wait_s >= 0
    assert [(end.index, text) for end, text in recorded] == [(0, "Sum r0")]


def test_summaries_come_one_at_a_time_in_segment_order() -> None:
    async def scenario() -> list[GenerationEvent]:
        gate, started, cancelled = Gate(), list[str](), list[str]()
        main = [
            *segment(0, REASONING, "r0"),
            *segment(1, REASONING, "r1"),
            "end",
            Finished(FinishReason.STOP),
        ]
        merge = SummaryMerge(main_source(main, gate), summary_runner(gate, started, cancelled))
        task = asyncio.ensure_future(collect(merge))
        await asyncio.sleep(0.01)
        gate["summary r1"].set()  # the second summary finishes first
        await asyncio.sleep(0.01)
        gate["summary r0"].set()
        gate["end"].set()
        return await task

    events = asyncio.run(scenario())
    runs = [
        (type(e).__name__, e.segment)
        for e in events
        if isinstance(e, (SummaryStart, SummaryDelta, SummaryEnd))
    ]
    assert runs == [
        ("SummaryStart", 0),
        ("SummaryDelta", 0),
        ("SummaryDelta", 0),
        ("SummaryEnd", 0),
        ("SummaryStart", 1),
        ("SummaryDelta", 1),
        ("SummaryDelta", 1),
        ("SummaryEnd", 1),
    ]
    assert isinstance(events[-1], Finished)


def test_leaving_early_cancels_the_summaries() -> None:
    async def scenario() -> list[str]:
        gate, started, cancelled = Gate(), list[str](), list[str]()
        main = [*segment(0, REASONING, "r0"), "never", Finished(FinishReason.STOP)]
        merge = SummaryMerge(main_source(main, gate), summary_runner(gate, started, cancelled))
        events = merge.events()
        async for event in events:
            if isinstance(event, SummaryStart):
                break
        await asyncio.sleep(0.01)
        await events.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)
        return cancelled

    assert asyncio.run(scenario()) == ["r0"]


def test_a_failed_generation_stops_its_summaries_and_ends_them() -> None:
    async def scenario() -> list[GenerationEvent]:
        gate, started, cancelled = Gate(), list[str](), list[str]()
        main = [*segment(0, REASONING, "r0"), Finished(FinishReason.ERROR, error="boom")]
        merge = SummaryMerge(main_source(main, gate), summary_runner(gate, started, cancelled))
        return await collect(merge)

    events = asyncio.run(scenario())
    summary_end = next(e for e in events if isinstance(e, SummaryEnd))
    assert summary_end.complete is False
    assert isinstance(events[-1], Finished)
    assert events[-1].reason is FinishReason.ERROR


def test_empty_reasoning_gets_an_empty_summary_without_a_generation() -> None:
    async def scenario() -> tuple[list[GenerationEvent], list[str]]:
        gate, started, cancelled = Gate(), list[str](), list[str]()
        main = [*segment(0, REASONING, " "), Finished(FinishReason.STOP)]
        merge = SummaryMerge(main_source(main, gate), summary_runner(gate, started, cancelled))
        return await collect(merge), started

    events, started = asyncio.run(scenario())
    assert started == []
    assert [type(e).__name__ for e in events][-3:] == ["SummaryStart", "SummaryEnd", "Finished"]
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.summaries is not None
    assert finished.summaries.count == 0


def test_sequential_items_hold_the_next_item_until_the_summary_ends() -> None:
    arrived: list[GenerationEvent] = [
        *segment(0, REASONING, "r0"),
        SummaryStart(0),
        *segment(1, FINAL, "answer")[:2],
        SummaryDelta(0, "S"),
        SummaryEnd(0, "S"),
        segment(1, FINAL, "answer")[2],
        Finished(FinishReason.STOP),
    ]
    order = SequentialItems(summaries=True)
    out = [event for e in arrived for event in order.feed(e)]
    names = [(type(e).__name__, getattr(e, "index", getattr(e, "segment", None))) for e in out]
    assert names == [
        ("SegmentStart", 0),
        ("SegmentDelta", 0),
        ("SegmentEnd", 0),
        ("SummaryStart", 0),
        ("SummaryDelta", 0),
        ("SummaryEnd", 0),
        ("SegmentStart", 1),
        ("SegmentDelta", 1),
        ("SegmentEnd", 1),
        ("Finished", None),
    ]
    passthrough = SequentialItems(summaries=False)
    assert [event for e in arrived for event in passthrough.feed(e)] == arrived
