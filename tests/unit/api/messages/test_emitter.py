"""MessagesEmitter and fold: generation events -> Anthropic stream events -> the message."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from server.api.messages.emitter import MessagesEmitter, fold
from server.api.messages.schemas import StreamEvent
from server.api.messages.signature import ThinkingSigner
from server.contracts.errors import ServerError
from server.contracts.events import (
    DecodeWarning,
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
    ToolTarget,
    Usage,
)
from server.core.visibility import ReasoningView
from tests.support.anthropic import CheckedMessageStream, check_messages_sse
from tests.support.sse import SSEEvent

USAGE = Usage(prompt_tokens=100, cached_tokens=60, completion_tokens=20, reasoning_tokens=7)
SIGNER = ThinkingSigner(b"k" * 32)
START = (200006, 173781)  # <|start|>assistant
RAW = ReasoningView(raw=True, summary=None)
TOKENS = (200005, 35644, 200008, 11, 12, 200007)  # the analysis message as sampled


def segment(
    index: int, kind: SegmentKind, parts: Sequence[str], *, complete: bool = True
) -> list[GenerationEvent]:
    call = kind is SegmentKind.TOOL_CALL
    call_id = f"call_{index}" if call else None
    target = ToolTarget("get_weather") if call else None
    recipient = "functions.get_weather" if call else None
    events: list[GenerationEvent] = [
        SegmentStart(index, kind, "x", recipient, call_id=call_id, target=target)
    ]
    events += [SegmentDelta(index, kind, part) for part in parts]
    end = SegmentEnd(index, kind, "".join(parts), TOKENS, complete, call_id=call_id, target=target)
    return [*events, end]


def emit(
    events: Sequence[GenerationEvent],
    view: ReasoningView = RAW,
    *,
    thinking_text: bool = True,
) -> list[StreamEvent]:
    emitter = MessagesEmitter(
        "msg_1",
        "m",
        input_tokens=100,
        signer=SIGNER,
        message_start=START,
        view=view,
        thinking_text=thinking_text,
    )
    out = emitter.start()
    for event in events:
        out += emitter.feed(event)
    return out


def checked(events: Sequence[StreamEvent]) -> CheckedMessageStream:
    """The events through the SDK-typed grammar checker, as they go on the wire."""
    lines: list[str] = []
    for event in events:
        sse = SSEEvent(event.type, event.model_dump_json())
        lines += [f"event: {sse.event}", f"data: {sse.data}", ""]
    return check_messages_sse(lines)


def test_reasoning_preamble_and_call_become_three_blocks() -> None:
    events = [
        *segment(0, SegmentKind.REASONING, ["Need ", "weather."]),
        *segment(1, SegmentKind.PREAMBLE, ["Looking."]),
        *segment(2, SegmentKind.TOOL_CALL, ['{"city":', '"Paris"}']),
        Finished(FinishReason.TOOL_CALL, USAGE),
    ]
    out = emit(events)
    checked(out)
    message = fold(out)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    thinking, text, call = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == "Need weather."
    assert SIGNER.tokens("Need weather.", thinking.signature) == (*START, *TOKENS)
    assert text.type == "text"
    assert text.text == "Looking."
    assert call.type == "tool_use"
    assert (call.id, call.name, call.input) == ("toolu_2", "get_weather", {"city": "Paris"})
    assert message.stop_reason == "tool_use"
    usage = message.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (40, 60, 20)
    assert usage.output_tokens_details.thinking_tokens == 7


def test_the_call_input_comes_whole_and_always_an_object() -> None:
    out = emit(
        [*segment(0, SegmentKind.TOOL_CALL, ["not", " json"]), Finished(FinishReason.TOOL_CALL)]
    )
    deltas = [e.delta.model_dump() for e in out if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert deltas == [{"type": "input_json_delta", "partial_json": "{}"}]
    message = fold(out)
    assert message.content[0].type == "tool_use"
    assert message.content[0].input == {}


@pytest.mark.parametrize(
    ("finished", "stop_reason", "stop_sequence"),
    [
        (Finished(FinishReason.STOP), "end_turn", None),
        (Finished(FinishReason.STOP, stop_sequence="###"), "stop_sequence", "###"),
        (Finished(FinishReason.LENGTH), "max_tokens", None),
        (Finished(FinishReason.TOOL_CALL), "tool_use", None),
    ],
)
def test_stop_reasons(finished: Finished, stop_reason: str, stop_sequence: str | None) -> None:
    out = emit([*segment(0, SegmentKind.FINAL, ["Hi"]), finished])
    checked(out)
    message = fold(out)
    assert (message.stop_reason, message.stop_sequence) == (stop_reason, stop_sequence)


@pytest.mark.parametrize("reason", [FinishReason.ERROR, FinishReason.CANCELLED])
def test_a_failed_generation_ends_with_an_error_event(reason: FinishReason) -> None:
    events = [*segment(0, SegmentKind.FINAL, ["Hi"])[:2], Finished(reason, error="boom")]
    out = emit(events)
    types = checked(out).types()
    assert types[-3:] == ["content_block_delta", "content_block_stop", "error"]  # closed first
    assert out[-1].model_dump()["error"]["type"] == "api_error"
    assert "boom" in out[-1].model_dump()["error"]["message"]
    with pytest.raises(ServerError, match="boom"):
        fold(out)


def test_an_incomplete_reasoning_is_signed_without_tokens() -> None:
    out = emit(
        [*segment(0, SegmentKind.REASONING, ["cut"], complete=False), Finished(FinishReason.LENGTH)]
    )
    thinking = fold(out).content[0]
    assert thinking.type == "thinking"
    assert SIGNER.verify("cut", thinking.signature)
    assert SIGNER.tokens("cut", thinking.signature) is None


def test_omitted_thinking_text_keeps_the_signature() -> None:
    out = emit(
        [*segment(0, SegmentKind.REASONING, ["secret"]), Finished(FinishReason.STOP)],
        thinking_text=False,
    )
    thinking = fold(out).content[0]
    assert thinking.type == "thinking"
    assert thinking.thinking == ""
    assert SIGNER.tokens("", thinking.signature) == (*START, *TOKENS)
    assert "secret" not in str([e.model_dump() for e in out])


def test_no_reasoning_shown_no_block() -> None:
    hidden = ReasoningView(raw=False, summary=None)
    events = [
        *segment(0, SegmentKind.REASONING, ["secret"]),
        *segment(1, SegmentKind.FINAL, ["Hi"]),
    ]
    message = fold(emit([*events, Finished(FinishReason.STOP)], hidden))
    assert [b.type for b in message.content] == ["text"]


def test_a_summary_stands_in_for_the_reasoning() -> None:
    summary = ReasoningView(raw=False, summary="auto")
    events = [
        *segment(0, SegmentKind.REASONING, ["secret"]),
        SummaryStart(0),
        SummaryDelta(0, "**Plan** "),
        SummaryDelta(0, "greet."),
        SummaryEnd(0, "**Plan** greet."),
        *segment(1, SegmentKind.FINAL, ["Hi"]),
        DecodeWarning("ignored"),
        Finished(FinishReason.STOP),
    ]
    out = emit(events, summary)
    checked(out)
    thinking, text = fold(out).content
    assert thinking.type == "thinking"
    assert thinking.thinking == "**Plan** greet."
    assert SIGNER.verify("**Plan** greet.", thinking.signature)
    assert SIGNER.tokens("**Plan** greet.", thinking.signature) is None  # the raw stays home
    assert text.type == "text"
    assert "secret" not in str([e.model_dump() for e in out])


def test_fold_needs_a_complete_stream() -> None:
    out = emit(segment(0, SegmentKind.FINAL, ["Hi"]))
    with pytest.raises(RuntimeError):
        fold(out)  # no message_delta, no message_stop
