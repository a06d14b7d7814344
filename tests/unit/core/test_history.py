"""History: exact tokens for replayed items, restored reasoning, bounded memory."""

from __future__ import annotations

from openai_harmony import HarmonyEncoding

from server.contracts.events import SegmentEnd, SegmentKind
from server.contracts.transcript import (
    AssistantMessage,
    Reasoning,
    ToolCall,
    Transcript,
    UserMessage,
)
from server.core.history import History


def segment(
    encoding: HarmonyEncoding, kind: SegmentKind, text: str, raw: str, call_id: str | None = None
) -> SegmentEnd:
    tokens = tuple(encoding.encode(raw, allowed_special="all"))
    return SegmentEnd(index=0, kind=kind, text=text, tokens=tokens, call_id=call_id)


def history_with_call(encoding: HarmonyEncoding) -> History:
    history = History(encoding.encode("<|start|>assistant", allowed_special="all"))
    history.record(
        [
            segment(
                encoding,
                SegmentKind.REASONING,
                "Need it.",
                "<|channel|>analysis<|message|>Need it.<|end|>",
            ),
            segment(
                encoding,
                SegmentKind.TOOL_CALL,
                '{"a": 1}',
                "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
                '<|message|>{"a": 1}<|call|>',
                call_id="call_1",
            ),
        ]
    )
    return history


def test_tool_call_gets_tokens_and_its_reasoning_back(encoding: HarmonyEncoding) -> None:
    history = history_with_call(encoding)
    transcript = Transcript(
        items=(UserMessage("x"), ToolCall(call_id="call_1", name="f", arguments='{"a":1}'))
    )
    items = history.apply(transcript).items
    reasoning, call = items[1], items[2]
    assert isinstance(reasoning, Reasoning)
    assert isinstance(call, ToolCall)
    assert encoding.decode_utf8(list(reasoning.tokens or ())) == (
        "<|start|>assistant<|channel|>analysis<|message|>Need it.<|end|>"
    )
    assert encoding.decode_utf8(list(call.tokens or ())).endswith('{"a": 1}<|call|>')


def test_reasoning_sent_back_is_not_duplicated(encoding: HarmonyEncoding) -> None:
    history = history_with_call(encoding)
    transcript = Transcript(
        items=(
            UserMessage("x"),
            Reasoning("Need it."),
            ToolCall(call_id="call_1", name="f", arguments='{"a": 1}'),
        )
    )
    items = history.apply(transcript).items
    assert [type(i).__name__ for i in items] == ["UserMessage", "Reasoning", "ToolCall"]
    assert items[1].tokens is not None  # type: ignore[union-attr]


def test_changed_arguments_are_rendered_fresh(encoding: HarmonyEncoding) -> None:
    history = history_with_call(encoding)
    call = ToolCall(call_id="call_1", name="f", arguments='{"a": 2}')
    assert history.apply(Transcript(items=(call,))).items == (call,)


def test_final_answer_replays_with_end_instead_of_return(encoding: HarmonyEncoding) -> None:
    history = History(encoding.encode("<|start|>assistant", allowed_special="all"))
    history.record(
        [segment(encoding, SegmentKind.FINAL, "Hi!", "<|channel|>final<|message|>Hi!<|return|>")]
    )
    (item,) = history.apply(Transcript(items=(AssistantMessage("Hi!"),))).items
    assert isinstance(item, AssistantMessage)
    assert encoding.decode_utf8(list(item.tokens or ())) == (
        "<|start|>assistant<|channel|>final<|message|>Hi!<|end|>"
    )


def test_incomplete_segments_are_not_recorded(encoding: HarmonyEncoding) -> None:
    history = History(encoding.encode("<|start|>assistant", allowed_special="all"))
    cut = segment(encoding, SegmentKind.FINAL, "Hi", "<|channel|>final<|message|>Hi")
    history.record([SegmentEnd(0, SegmentKind.FINAL, "Hi", cut.tokens, complete=False)])
    assert len(history) == 0


def test_memory_is_bounded(encoding: HarmonyEncoding) -> None:
    history = History(encoding.encode("<|start|>assistant", allowed_special="all"), max_entries=3)
    for i in range(10):
        text = f"answer {i}"
        raw = f"<|channel|>final<|message|>{text}<|return|>"
        history.record([segment(encoding, SegmentKind.FINAL, text, raw)])
    assert len(history) == 3
    (old,) = history.apply(Transcript(items=(AssistantMessage("answer 0"),))).items
    (recent,) = history.apply(Transcript(items=(AssistantMessage("answer 9"),))).items
    assert old.tokens is None  # type: ignore[union-attr]
    assert recent.tokens is not None  # type: ignore[union-attr]
