"""The shapes the Responses emitter builds: each item kind's lifecycle (a table), the events of
a reasoning item's summary part, and usage.

Pure: what an item of each kind sends when it opens, with each text delta and when its text is
done (`LIFECYCLES`), and what it looks like in `output_item.added` (empty, in progress) and
`.done` (final), given what was streamed into it and whether the raw reasoning may be shown.
Sequence numbers come from the emitter, which owns them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from server.api.logprobs import TokenLogprobOut
from server.api.responses.adapter import custom_input
from server.api.responses.schemas import (
    CodeInterpreterCallCodeDelta,
    CodeInterpreterCallCodeDone,
    CodeInterpreterCallCompleted,
    CodeInterpreterCallInProgress,
    CodeInterpreterCallInterpreting,
    CodeInterpreterCallItem,
    ContentPartDone,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    CustomToolCallItem,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallItem,
    InputTokensDetails,
    ItemStatus,
    McpApprovalRequestItem,
    McpCallArgumentsDelta,
    McpCallArgumentsDone,
    McpCallCompleted,
    McpCallFailed,
    McpCallInProgress,
    McpCallItem,
    McpListToolsCompleted,
    McpListToolsFailed,
    McpListToolsInProgress,
    McpListToolsItem,
    MessageItem,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    OutputTextDone,
    OutputTextPart,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningSummaryPartAdded,
    ReasoningSummaryPartDone,
    ReasoningSummaryTextDelta,
    ReasoningSummaryTextDone,
    ReasoningTextDelta,
    ReasoningTextDone,
    ReasoningTextPart,
    ResponseUsage,
    StreamEvent,
    SummaryTextPart,
    SummaryUsage,
    WebSearchCallCompleted,
    WebSearchCallInProgress,
    WebSearchCallItem,
    WebSearchCallSearching,
)
from server.contracts.events import SegmentEnd, SummaryReport, ToolTarget, Usage

ItemKind = Literal[
    "reasoning",
    "message",
    "function_call",
    "custom_tool_call",
    "mcp_call",
    "mcp_approval_request",
    "code_interpreter_call",
    "web_search_call",
]
# the items of calls the server runs: each waits for its call's result (ToolOutput) to close
SERVER_RUN: frozenset[ItemKind] = frozenset(
    {"mcp_call", "code_interpreter_call", "web_search_call"}
)
NextSequence = Callable[[], int]  # the emitter's next sequence number


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
    scores: list[TokenLogprobOut] = field(default_factory=list)  # output text's, when asked for
    ended: SegmentEnd | None = None  # reasoning whose content is done, waiting for its summary
    summary: list[str] | None = None  # the summary part's text, once the part is open
    summary_complete: bool = True
    output: str | None = None  # a server-run call's result, once it ran
    error: dict[str, Any] | None = None  # a server-run call's error, once it failed
    details: dict[str, Any] = field(default_factory=dict)  # the backend's item fields
    container_id: str = ""  # a code interpreter call's: its conversation's sandbox

    @property
    def text(self) -> str:
        return "".join(self.parts)


TextPart = ReasoningTextPart | OutputTextPart


def _as_written(text: str) -> str:
    return text


@dataclass(frozen=True)
class Lifecycle:
    """How an output item of one kind streams, between `output_item.added` and `.done`.

    - `prefix`: of its id;
    - `part(raw)`: the content part it opens, if any (`raw`: the raw reasoning may be shown);
    - `delta(item, sequence, text)`: the event of one text delta; None where the text is sent
      whole when the item closes;
    - `done(item, next_sequence, text)`: the events that close its text;
    - `shape(item, status, text, raw)`: the item as `.added` (in progress, empty) and `.done`
      (final) show it;
    - `final(written)`: its final text, from what the model wrote.
    """

    prefix: str
    part: Callable[[bool], TextPart | None]
    delta: Callable[[OpenItem, int, str], StreamEvent] | None
    done: Callable[[OpenItem, NextSequence, str], list[StreamEvent]]
    shape: Callable[[OpenItem, ItemStatus, str, bool], OutputItem]
    final: Callable[[str], str] = _as_written


@dataclass(frozen=True)
class _TextEvents:
    """The delta and done events of an item's one text part (reasoning text, output text)."""

    delta_type: type[ReasoningTextDelta] | type[OutputTextDelta]
    done_type: type[ReasoningTextDone] | type[OutputTextDone]
    part_type: type[ReasoningTextPart] | type[OutputTextPart]

    def delta(self, item: OpenItem, sequence: int, text: str) -> StreamEvent:
        return self.delta_type(
            sequence_number=sequence,
            item_id=item.id,
            output_index=item.output_index,
            content_index=0,
            delta=text,
        )

    def done(self, item: OpenItem, next_sequence: NextSequence, text: str) -> list[StreamEvent]:
        done = self.done_type(
            sequence_number=next_sequence(),
            item_id=item.id,
            output_index=item.output_index,
            content_index=0,
            text=text,
        )
        part = self.part_type(text=text)
        if isinstance(done, OutputTextDone) and isinstance(part, OutputTextPart):
            done.logprobs = part.logprobs = list(item.scores)
        return [done, _part_done(item, next_sequence(), part)]


_REASONING_TEXT = _TextEvents(ReasoningTextDelta, ReasoningTextDone, ReasoningTextPart)
_OUTPUT_TEXT = _TextEvents(OutputTextDelta, OutputTextDone, OutputTextPart)


# -------------------------------------------------------------------------- reasoning


def _reasoning_part(raw: bool) -> TextPart | None:
    return ReasoningTextPart() if raw else None


def _reasoning_item(item: OpenItem, status: ItemStatus, text: str, raw: bool) -> OutputItem:
    final = status != "in_progress"
    content = [ReasoningTextPart(text=text)] if final and raw else []
    opened = final and item.summary is not None
    summary = [SummaryTextPart(text="".join(item.summary or []))] if opened else []
    return ReasoningItem(id=item.id, content=content, summary=summary, status=status)


# -------------------------------------------------------------------------- messages


def _message_part(_: bool) -> TextPart | None:
    return OutputTextPart()


def _message_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    parts = (
        [OutputTextPart(text=text, logprobs=list(item.scores))] if status != "in_progress" else []
    )
    return MessageItem(id=item.id, status=status, content=parts, phase=item.phase)


def _part_done(item: OpenItem, sequence: int, part: TextPart) -> StreamEvent:
    return ContentPartDone(
        sequence_number=sequence,
        item_id=item.id,
        output_index=item.output_index,
        content_index=0,
        part=part,
    )


# -------------------------------------------------------------------------- tool calls


def _no_part(_: bool) -> TextPart | None:
    return None


def _arguments_delta(item: OpenItem, sequence: int, text: str) -> StreamEvent:
    return FunctionCallArgumentsDelta(
        sequence_number=sequence, item_id=item.id, output_index=item.output_index, delta=text
    )


def _arguments_done(item: OpenItem, next_sequence: NextSequence, text: str) -> list[StreamEvent]:
    done = FunctionCallArgumentsDone(
        sequence_number=next_sequence(),
        item_id=item.id,
        output_index=item.output_index,
        name=item.target.name if item.target else "",
        arguments=text,
    )
    return [done]


def _function_call_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    target = item.target or ToolTarget("")
    return FunctionCallItem(
        id=item.id,
        call_id=item.call_id,
        name=target.name,
        namespace=_namespace(target),
        arguments=text,
        status=status,
    )


def _custom_input_done(item: OpenItem, next_sequence: NextSequence, text: str) -> list[StreamEvent]:
    """The raw input, as one delta (when there is any) and `.done`."""
    events: list[StreamEvent] = []
    if text:
        events.append(
            CustomToolCallInputDelta(
                sequence_number=next_sequence(),
                item_id=item.id,
                output_index=item.output_index,
                delta=text,
            )
        )
    events.append(
        CustomToolCallInputDone(
            sequence_number=next_sequence(),
            item_id=item.id,
            output_index=item.output_index,
            input=text,
        )
    )
    return events


def _custom_tool_call_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    target = item.target or ToolTarget("")
    return CustomToolCallItem(
        id=item.id,
        call_id=item.call_id,
        name=target.name,
        namespace=_namespace(target),
        input=text,
        status=status,
    )


def _namespace(target: ToolTarget) -> str | None:
    return None if target.in_default_namespace else target.namespace  # not sent


# -------------------------------------------------------------------------- MCP calls


def _mcp_arguments_delta(item: OpenItem, sequence: int, text: str) -> StreamEvent:
    return McpCallArgumentsDelta(
        sequence_number=sequence, item_id=item.id, output_index=item.output_index, delta=text
    )


def _mcp_arguments_done(
    item: OpenItem, next_sequence: NextSequence, text: str
) -> list[StreamEvent]:
    return [
        McpCallArgumentsDone(
            sequence_number=next_sequence(),
            item_id=item.id,
            output_index=item.output_index,
            arguments=text,
        )
    ]


def _mcp_call_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    target = item.target or ToolTarget("")
    if item.error is not None:
        final: Any = "failed"
    elif status == "completed" and item.output is None:
        final = "incomplete"  # the call was written but never ran
    else:
        final = status
    return McpCallItem(
        id=item.id,
        server_label=target.namespace,
        name=target.name,
        arguments=text,
        output=item.output,
        error=item.error,
        status=final,
    )


def _no_events(item: OpenItem, next_sequence: NextSequence, text: str) -> list[StreamEvent]:
    return []


def _approval_request_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    target = item.target or ToolTarget("")
    return McpApprovalRequestItem(
        id=item.id, server_label=target.namespace, name=target.name, arguments=text
    )


def mcp_error(details: Mapping[str, Any], text: str) -> dict[str, Any]:
    """An `mcp_call` item's `error`: the backend's, else a protocol error with the text."""
    error = details.get("error")
    if isinstance(error, dict):
        return error
    return {"type": "mcp_protocol_error", "code": -32603, "message": text}


def mcp_call_result(item: OpenItem, sequence: int) -> StreamEvent:
    """`response.mcp_call.completed` or `.failed`, once the call ran."""
    kind = McpCallFailed if item.error is not None else McpCallCompleted
    return kind(sequence_number=sequence, item_id=item.id, output_index=item.output_index)


# -------------------------------------------------------------------------- built-in tools


def _code_delta(item: OpenItem, sequence: int, text: str) -> StreamEvent:
    return CodeInterpreterCallCodeDelta(
        sequence_number=sequence, item_id=item.id, output_index=item.output_index, delta=text
    )


def _code_done(item: OpenItem, next_sequence: NextSequence, text: str) -> list[StreamEvent]:
    """The code is written: `.code.done`, then the run starts (`.interpreting`)."""
    ids = {"item_id": item.id, "output_index": item.output_index}
    return [
        CodeInterpreterCallCodeDone(sequence_number=next_sequence(), code=text, **ids),
        CodeInterpreterCallInterpreting(sequence_number=next_sequence(), **ids),
    ]


def _ran_status(item: OpenItem, status: ItemStatus) -> Any:
    """A server-run call's status: failed, never run (incomplete), or as the item ended."""
    if item.error is not None:
        return "failed"
    if status == "completed" and item.output is None:
        return "incomplete"  # the call was written but never ran
    return status


def _code_interpreter_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    outputs = item.details.get("outputs")
    return CodeInterpreterCallItem(
        id=item.id,
        code=text,
        container_id=str(item.details.get("container_id") or item.container_id),
        outputs=outputs if isinstance(outputs, list) else None,
        status=_ran_status(item, status),
    )


def _searching(item: OpenItem, next_sequence: NextSequence, text: str) -> list[StreamEvent]:
    """The call is written: the browser runs it (`.searching`)."""
    ids = {"item_id": item.id, "output_index": item.output_index}
    return [WebSearchCallSearching(sequence_number=next_sequence(), **ids)]


_ACTIONS = {
    "search": {"type": "search"},
    "open": {"type": "open_page"},
    "find": {"type": "find_in_page", "pattern": "", "url": ""},
}


def _web_search_item(item: OpenItem, status: ItemStatus, text: str, _: bool) -> OutputItem:
    action = item.details.get("action")
    if not isinstance(action, dict) or "type" not in action:
        name = item.target.name if item.target else "search"
        action = _ACTIONS.get(name, _ACTIONS["search"])
    return WebSearchCallItem(id=item.id, action=dict(action), status=_ran_status(item, status))


# A server-run call's events before its result: (opened, running). `opened` follows its
# `output_item.added`; `running` follows the written call (code_interpreter_call's is part of
# `_code_done`, web_search_call's is `_searching`) and comes again as a keepalive while it runs.
_CALL_PROGRESS: dict[str, tuple[type[Any], type[Any]]] = {
    "mcp_call": (McpCallInProgress, McpCallInProgress),
    "code_interpreter_call": (CodeInterpreterCallInProgress, CodeInterpreterCallInterpreting),
    "web_search_call": (WebSearchCallInProgress, WebSearchCallSearching),
}


def _call_progress(item: OpenItem, next_sequence: NextSequence, running: bool) -> list[StreamEvent]:
    events = _CALL_PROGRESS.get(item.kind)
    if events is None:
        return []
    ids = {"item_id": item.id, "output_index": item.output_index}
    return [events[running](sequence_number=next_sequence(), **ids)]


def server_call_opened(item: OpenItem, next_sequence: NextSequence) -> list[StreamEvent]:
    """The `.in_progress` event right after a server-run call's `output_item.added`."""
    return _call_progress(item, next_sequence, running=False)


def server_call_running(item: OpenItem, next_sequence: NextSequence) -> list[StreamEvent]:
    """A keepalive while a server-run call runs: its running event again (`mcp_call.in_progress`,
    `.interpreting`, `.searching`), so a client's idle timer sees the stream alive."""
    return _call_progress(item, next_sequence, running=True)


def server_call_result(item: OpenItem, next_sequence: NextSequence) -> list[StreamEvent]:
    """The event of a server-run call's result, once it ran: an MCP call's `.completed` or
    `.failed`; a built-in's `.completed` (OpenAI's API has no `.failed` event for them: a failed
    one shows its status in `output_item.done`)."""
    if item.kind == "mcp_call":
        return [mcp_call_result(item, next_sequence())]
    if item.error is not None:
        return []
    ids = {"item_id": item.id, "output_index": item.output_index}
    if item.kind == "code_interpreter_call":
        return [CodeInterpreterCallCompleted(sequence_number=next_sequence(), **ids)]
    return [WebSearchCallCompleted(sequence_number=next_sequence(), **ids)]


def ready_item_events(
    item: McpListToolsItem | McpCallItem, output_index: int, next_sequence: NextSequence
) -> list[StreamEvent]:
    """The whole lifecycle of an item that was ready before generation (a server's listing, an
    approved call that ran), as OpenAI streams it."""
    events: list[StreamEvent] = []
    ids = {"item_id": item.id, "output_index": output_index}
    if isinstance(item, McpListToolsItem):
        opened = item.model_copy(update={"tools": [], "error": None})
        events.append(
            OutputItemAdded(sequence_number=next_sequence(), output_index=output_index, item=opened)
        )
        events.append(McpListToolsInProgress(sequence_number=next_sequence(), **ids))
        ended = McpListToolsFailed if item.error else McpListToolsCompleted
        events.append(ended(sequence_number=next_sequence(), **ids))
    else:
        opened_call = item.model_copy(
            update={"arguments": "", "output": None, "error": None, "status": "in_progress"}
        )
        events.append(
            OutputItemAdded(
                sequence_number=next_sequence(), output_index=output_index, item=opened_call
            )
        )
        events.append(McpCallInProgress(sequence_number=next_sequence(), **ids))
        if item.arguments:
            delta = item.arguments
            events.append(
                McpCallArgumentsDelta(sequence_number=next_sequence(), delta=delta, **ids)
            )
        events.append(
            McpCallArgumentsDone(sequence_number=next_sequence(), arguments=item.arguments, **ids)
        )
        ended_call = McpCallFailed if item.error is not None else McpCallCompleted
        events.append(ended_call(sequence_number=next_sequence(), **ids))
    events.append(
        OutputItemDone(sequence_number=next_sequence(), output_index=output_index, item=item)
    )
    return events


LIFECYCLES: dict[ItemKind, Lifecycle] = {
    "reasoning": Lifecycle(
        "rs_", _reasoning_part, _REASONING_TEXT.delta, _REASONING_TEXT.done, _reasoning_item
    ),
    "message": Lifecycle(
        "msg_", _message_part, _OUTPUT_TEXT.delta, _OUTPUT_TEXT.done, _message_item
    ),
    "function_call": Lifecycle(
        "fc_", _no_part, _arguments_delta, _arguments_done, _function_call_item
    ),
    # the raw input is known once the whole call is written: it is sent when the item closes
    "custom_tool_call": Lifecycle(
        "ctc_", _no_part, None, _custom_input_done, _custom_tool_call_item, final=custom_input
    ),
    "mcp_call": Lifecycle(
        "mcp_", _no_part, _mcp_arguments_delta, _mcp_arguments_done, _mcp_call_item
    ),
    # its arguments are in the item when it is done; nothing streams in between
    "mcp_approval_request": Lifecycle("mcpr_", _no_part, None, _no_events, _approval_request_item),
    "code_interpreter_call": Lifecycle(
        "ci_", _no_part, _code_delta, _code_done, _code_interpreter_item
    ),
    # a browser call's arguments are not streamed: the item shows the action once it ran
    "web_search_call": Lifecycle("ws_", _no_part, None, _searching, _web_search_item),
}


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
