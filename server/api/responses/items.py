"""The shapes the Responses emitter builds: output items as they open and close, the events of
a reasoning item's summary part, and usage.

Pure: what an item looks like in `output_item.added` (empty, in progress) and `.done` (final),
given what was streamed into it and whether the raw reasoning may be shown. Sequence numbers
come from the emitter, which owns them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from server.api.responses.schemas import (
    CustomToolCallItem,
    FunctionCallItem,
    InputTokensDetails,
    ItemStatus,
    MessageItem,
    OutputItem,
    OutputTextPart,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningSummaryPartAdded,
    ReasoningSummaryPartDone,
    ReasoningSummaryTextDelta,
    ReasoningSummaryTextDone,
    ReasoningTextPart,
    ResponseUsage,
    StreamEvent,
    SummaryTextPart,
    SummaryUsage,
)
from server.contracts.events import SegmentEnd, SummaryReport, ToolTarget, Usage

ItemKind = Literal["reasoning", "message", "function_call", "custom_tool_call"]
ID_PREFIXES: dict[ItemKind, str] = {
    "reasoning": "rs_",
    "message": "msg_",
    "function_call": "fc_",
    "custom_tool_call": "ctc_",
}


@dataclass
class OpenItem:
    """The item being streamed: what it is, where it sits, and its text so far."""

    kind: ItemKind
    id: str
    output_index: int
    segment: int
    phase: Literal["commentary", "final_answer"] = "final_answer"
    call_id: str = ""
    target: ToolTarget | None = None  # tool calls only
    parts: list[str] = field(default_factory=list)
    ended: SegmentEnd | None = None  # reasoning whose content is done, waiting for its summary
    summary: list[str] | None = None  # the summary part's text, once the part is open
    summary_complete: bool = True

    @property
    def text(self) -> str:
        return "".join(self.parts)


def output_item(item: OpenItem, status: ItemStatus, text: str, *, raw: bool) -> OutputItem:
    """The item as `output_item.added` (empty, in progress) or `.done` (final) shows it.

    `raw`: whether a reasoning item may carry its raw text as content.
    """
    final = status != "in_progress"
    if item.kind == "reasoning":
        content = [ReasoningTextPart(text=text)] if final and raw else []
        opened = final and item.summary is not None
        summary = [SummaryTextPart(text="".join(item.summary or []))] if opened else []
        return ReasoningItem(id=item.id, content=content, summary=summary, status=status)
    if item.kind == "message":
        parts = [OutputTextPart(text=text)] if final else []
        return MessageItem(id=item.id, status=status, content=parts, phase=item.phase)
    target = item.target or ToolTarget("")
    namespace = None if target.in_default_namespace else target.namespace  # not sent
    if item.kind == "custom_tool_call":
        return CustomToolCallItem(
            id=item.id,
            call_id=item.call_id,
            name=target.name,
            namespace=namespace,
            input=text,
            status=status,
        )
    return FunctionCallItem(
        id=item.id,
        call_id=item.call_id,
        name=target.name,
        namespace=namespace,
        arguments=text,
        status=status,
    )


def empty_part(kind: ItemKind, raw_reasoning: bool) -> ReasoningTextPart | OutputTextPart | None:
    """The content part an item opens with, if it has one."""
    if kind == "reasoning":
        return ReasoningTextPart() if raw_reasoning else None
    if kind == "message":
        return OutputTextPart()
    return None


def summary_part_added(item: OpenItem, sequence: int) -> ReasoningSummaryPartAdded:
    """The reasoning item's one summary part opens (`summary_index` 0)."""
    return ReasoningSummaryPartAdded(
        sequence_number=sequence,
        item_id=item.id,
        output_index=item.output_index,
        summary_index=0,
        part=SummaryTextPart(),
    )


def summary_text_delta(item: OpenItem, sequence: int, text: str) -> ReasoningSummaryTextDelta:
    return ReasoningSummaryTextDelta(
        sequence_number=sequence,
        item_id=item.id,
        output_index=item.output_index,
        summary_index=0,
        delta=text,
    )


def summary_done(item: OpenItem, next_sequence: Callable[[], int]) -> list[StreamEvent]:
    """`reasoning_summary_text.done` and `reasoning_summary_part.done` (`incomplete` if cut)."""
    text = "".join(item.summary or [])
    return [
        ReasoningSummaryTextDone(
            sequence_number=next_sequence(),
            item_id=item.id,
            output_index=item.output_index,
            summary_index=0,
            text=text,
        ),
        ReasoningSummaryPartDone(
            sequence_number=next_sequence(),
            item_id=item.id,
            output_index=item.output_index,
            summary_index=0,
            part=SummaryTextPart(text=text),
            status=None if item.summary_complete else "incomplete",
        ),
    ]


def usage_out(usage: Usage, summaries: SummaryReport | None = None) -> ResponseUsage:
    """The generation's usage; the summaries' tokens apart, in `summary_usage`."""
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens),
        total_tokens=usage.total_tokens,
        summary_usage=_summary_usage(summaries) if summaries is not None else None,
    )


def _summary_usage(summaries: SummaryReport) -> SummaryUsage:
    spent = summaries.usage
    return SummaryUsage(
        summaries=summaries.count,
        input_tokens=spent.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=spent.cached_tokens),
        output_tokens=spent.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=spent.reasoning_tokens),
        total_tokens=spent.total_tokens,
    )
