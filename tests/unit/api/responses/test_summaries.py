"""Reasoning summaries in Responses streams: the emitter under each visibility view, the events
in item order (SequentialItems), checked by the grammar checker and the SDK's types."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from server.api.responses.emitter import ResponsesEmitter, fold
from server.api.responses.schemas import ResponseObject
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
    SummaryReport,
    SummaryStart,
    Usage,
)
from server.contracts.transcript import ToolSpec
from server.core.tool_names import ToolNames
from server.core.visibility import ReasoningView
from tests.support.event_grammar import CheckedStream, check_stream

RAW = "SECRET raw chain of thought"
TOOLS = (ToolSpec("exec_command"),)
REPORT = SummaryReport(count=1, usage=Usage(prompt_tokens=40, completion_tokens=12))


def segment(index: int, kind: SegmentKind, text: str, recipient: str | None = None) -> list[Any]:
    call_id = "call_1" if recipient else None
    return [
        SegmentStart(index, kind, "x", recipient=recipient, call_id=call_id),
        SegmentDelta(index, kind, text),
        SegmentEnd(index, kind, text, (1,), recipient=recipient, call_id=call_id),
    ]


def arrival(final: Sequence[GenerationEvent]) -> list[GenerationEvent]:
    """What the generation core yields: the answer starts while the summary is written."""
    return [
        *segment(0, SegmentKind.REASONING, RAW),
        SummaryStart(0),
        *final[:2],
        SummaryDelta(0, "**Plan** "),
        SummaryDelta(0, "Answer briefly."),
        SummaryEnd(0, "**Plan** Answer briefly."),
        *final[2:],
        Finished(FinishReason.STOP, Usage(prompt_tokens=9, completion_tokens=7), summaries=REPORT),
    ]


def emit(events: Sequence[GenerationEvent], view: ReasoningView) -> CheckedStream:
    counter = itertools.count()
    emitter = ResponsesEmitter(
        ResponseObject(id="resp_1", created_at=1, model="m"),
        new_item_id=lambda prefix: f"{prefix}{next(counter)}",
        view=view,
    )
    order = SequentialItems(emitter.waits_for_summaries)
    names = ToolNames(TOOLS)  # the core gives tool calls their targets
    out = emitter.start()
    for event in events:
        for ordered in order.feed(names.to_client(event)):
            out += emitter.feed(ordered)
    checked = check_stream([e.model_dump(mode="json") for e in out])
    assert fold(out).model_dump(mode="json") == checked.terminal["response"]
    return checked


def test_raw_and_summary() -> None:
    final = segment(1, SegmentKind.FINAL, "Hi.")
    checked = emit(arrival(final), ReasoningView(raw=True, summary="auto"))
    reasoning, message = checked.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": RAW}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "**Plan** Answer briefly."}]
    assert message["content"][0]["text"] == "Hi."
    types = checked.types()
    assert types.index("response.reasoning_summary_part.done") < types.index(
        "response.output_item.done"
    )
    usage = checked.terminal["response"]["usage"]
    assert usage["output_tokens"] == 7
    assert usage["summary_usage"]["output_tokens"] == 12
    assert usage["summary_usage"]["summaries"] == 1


def test_summary_only_never_shows_the_raw_text() -> None:
    call = segment(1, SegmentKind.TOOL_CALL, '{"cmd":"ls"}', recipient="functions.exec_command")
    checked = emit(arrival(call), ReasoningView(raw=False, summary="auto"))
    reasoning, function_call = checked.items
    assert reasoning["content"] == []
    assert reasoning["summary"][0]["text"] == "**Plan** Answer briefly."
    assert function_call["type"] == "function_call"
    assert RAW not in str(checked.events)
    assert "response.content_part.added" not in checked.types()[:8]


def test_no_reasoning_items_at_all() -> None:
    events = [
        *segment(0, SegmentKind.REASONING, RAW),
        *segment(1, SegmentKind.FINAL, "Hi."),
        Finished(FinishReason.STOP),
    ]
    checked = emit(events, ReasoningView(raw=False, summary=None))
    (message,) = checked.items
    assert message["type"] == "message"
    assert RAW not in str(checked.events)


def test_a_cut_summary_is_marked_incomplete() -> None:
    events = [
        *segment(0, SegmentKind.REASONING, RAW),
        SummaryStart(0),
        SummaryDelta(0, "Half"),
        SummaryEnd(0, "Half", complete=False),
        Finished(FinishReason.LENGTH),
    ]
    checked = emit(events, ReasoningView(raw=True, summary="auto"))
    (done,) = [e for e in checked.events if e["type"] == "response.reasoning_summary_part.done"]
    assert done["status"] == "incomplete"
    assert checked.items[0]["summary"] == [{"type": "summary_text", "text": "Half"}]


@pytest.mark.parametrize("raw", [True, False])
def test_a_failure_inside_the_summary_still_closes_the_item(raw: bool) -> None:
    emitter = ResponsesEmitter(
        ResponseObject(id="resp_1", created_at=1, model="m"),
        view=ReasoningView(raw=raw, summary="auto"),
    )
    out = emitter.start()
    for event in [*segment(0, SegmentKind.REASONING, RAW), SummaryStart(0), SummaryDelta(0, "S")]:
        out += emitter.feed(event)
    out += emitter.feed(Finished(FinishReason.ERROR, error="boom"))
    checked = check_stream([e.model_dump(mode="json") for e in out])
    assert checked.terminal["type"] == "response.failed"
    assert checked.items[0]["summary"] == [{"type": "summary_text", "text": "S"}]


def _renumbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(e, sequence_number=n) for n, e in enumerate(events)]


def test_the_checker_rejects_summary_events_out_of_place() -> None:
    good = emit(arrival(segment(1, SegmentKind.FINAL, "Hi.")), ReasoningView(True, "auto"))
    events = list(good.events)
    types = good.types()
    added = types.index("response.reasoning_summary_part.added")
    # inside the message item
    message_part = types.index("response.content_part.added", added)
    message_id = events[message_part]["item_id"]
    stray = dict(events[added], output_index=1, item_id=message_id)
    with pytest.raises(AssertionError, match="inside a message item"):
        check_stream(_renumbered([*events[: message_part + 1], stray, *events[message_part + 1 :]]))
    # inside the reasoning item's content part
    part_done = types.index("response.content_part.done")
    early = [*events[:part_done], events[added], *events[part_done:added], *events[added + 1 :]]
    with pytest.raises(AssertionError, match="summary part inside the content part"):
        check_stream(_renumbered(early))
