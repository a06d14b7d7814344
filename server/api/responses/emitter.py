"""ResponsesEmitter: generation events -> Responses stream events, every number final at birth.

One emitter per response owns the sequence numbers, output indexes, content indexes and item
ids. Each harmony message becomes one output item: the code that opens it emits
`output_item.added` (and `content_part.added`), the code that closes it emits the `.done` event,
`content_part.done` and `output_item.done`; items follow one another strictly. What each kind
of item sends at each step is its row in the lifecycle table (items.LIFECYCLES). A reasoning item
shows what the visibility view allows: its raw text as a `reasoning_text` content part, its
summary as a `summary_text` part (`reasoning_summary_part.added ... .done`) after the content,
before `output_item.done`; it is not emitted at all when nothing may be shown. The stream ends
with exactly one terminal event built from the generation's `Finished` event. The non-streaming
body is `fold()` of the very same events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from server.api.logprobs import token_entries
from server.api.response_fields import new_id, now
from server.api.responses.adapter import approval_request_id, mcp_call_id
from server.api.responses.items import (
    LIFECYCLES,
    SERVER_RUN,
    ItemKind,
    OpenItem,
    mcp_error,
    ready_item_events,
    server_call_opened,
    server_call_result,
    server_call_running,
    summary_done,
    summary_part_added,
    summary_text_delta,
    usage_out,
)
from server.api.responses.schemas import (
    ContentPartAdded,
    IncompleteDetails,
    ItemStatus,
    McpCallItem,
    McpListToolsItem,
    OutputItem,
    OutputItemAdded,
    OutputItemDone,
    OutputTextDelta,
    ReasoningDelta,
    ReasoningDone,
    ReasoningEventNames,
    ReasoningTextDelta,
    ReasoningTextDone,
    ResponseCompleted,
    ResponseCreated,
    ResponseError,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseObject,
    ResponseStatus,
    ResponseUsage,
    StreamEvent,
    TerminalEvent,
)
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
    ToolOutput,
    ToolTarget,
)
from server.core.visibility import ReasoningView
from server.harmony.token_bytes import TokenBytes

log = logging.getLogger(__name__)

RAW = ReasoningView(raw=True, summary=None)
SEGMENT_ITEMS: dict[SegmentKind, ItemKind] = {  # tool calls: by the tool's kind (_kind_of)
    SegmentKind.REASONING: "reasoning",
    SegmentKind.PREAMBLE: "message",
    SegmentKind.FINAL: "message",
}


class ResponsesEmitter:
    """Turns one generation's events into the stream events of one response."""

    def __init__(
        self,
        base: ResponseObject,
        new_item_id: Callable[[str], str] = new_id,
        *,
        view: ReasoningView = RAW,
        logprobs: TokenBytes | None = None,
        call_kind: Callable[[ToolTarget], ItemKind | None] | None = None,
        ready: Sequence[McpListToolsItem | McpCallItem] = (),
        container_id: str = "",
        approval_id: Callable[[str, ToolTarget, str], str] | None = None,
        approved: Mapping[str, str] | None = None,
        reasoning_events: ReasoningEventNames = "openai",
    ) -> None:
        """`call_kind`: the item of a call to a server-run tool (None: a client's call);
        `ready`: items complete before generation (MCP listings), streamed first;
        `container_id`: the python tool's sandbox of this conversation; `approval_id`: the
        signed id of a call's approval request (call id, target, arguments), known once the
        call is written: the request item is sent whole when it closes; `approved`: the calls
        the client approved (call id -> approval request id), run before the first round, each
        shown as a whole `mcp_call` item when its result comes; `reasoning_events`: the names
        of the raw reasoning text's events (OpenAI's `response.reasoning_text.*`, or Open
        Responses' `response.reasoning.*`)."""
        self._base = base
        self._logprobs = logprobs  # the output text's logprobs were asked for
        self._new_item_id = new_item_id
        self._view = view
        self._call_kind = call_kind
        self._ready = list(ready)
        self._container_id = container_id
        self._approval_id = approval_id
        self._approved = dict(approved or {})
        self._spec_reasoning = reasoning_events == "open-responses"
        self._sequence = 0
        self._output: list[OutputItem] = []
        self._open: OpenItem | None = None
        self.terminal: TerminalEvent | None = None

    @property
    def response_id(self) -> str:
        return self._base.id

    @property
    def waits_for_summaries(self) -> bool:
        """Whether each reasoning item waits for a summary before it closes."""
        return self._view.summary is not None

    @property
    def done(self) -> bool:
        return self.terminal is not None

    def start(self) -> list[StreamEvent]:
        """`response.created` and `response.in_progress`: the first two events."""
        snapshot = self._snapshot()
        events: list[StreamEvent] = [
            ResponseCreated(sequence_number=self._next(), response=snapshot),
            ResponseInProgress(sequence_number=self._next(), response=snapshot),
        ]
        for item in self._ready:
            events += ready_item_events(item, len(self._output), self._next)
            self._output.append(item)
        return events

    def keepalive(self) -> list[StreamEvent]:
        """A real event for idle stretches: `response.in_progress` between items (a long
        prefill), a running server-run call's own running event while it runs (a slow tool)."""
        item = self._open
        if self.terminal is not None:
            return []
        if item is None:
            return [ResponseInProgress(sequence_number=self._next(), response=self._snapshot())]
        if item.kind in SERVER_RUN and item.ended is not None:
            return server_call_running(item, self._next)
        return []

    def feed(self, event: GenerationEvent) -> list[StreamEvent]:
        if self.terminal is not None:
            return []
        if isinstance(event, DecodeWarning):
            # the unparsed text is not logged: it can be chain of thought
            log.info("response %s: %s (%d tokens)", self._base.id, event.message, len(event.tokens))
            return []
        if isinstance(event, Finished):
            return [*self._close_open(), self._finish(event)]
        if isinstance(event, (SummaryStart, SummaryDelta, SummaryEnd)):
            return self._summary(event)
        if isinstance(event, ToolOutput):
            return self._tool_output(event)
        return self._segment(event)

    def _segment(self, event: SegmentStart | SegmentDelta | SegmentEnd) -> list[StreamEvent]:
        if event.kind is SegmentKind.REASONING and not self._view.any:
            return []  # no reasoning item at all
        if isinstance(event, SegmentStart):
            return [*self._close_open(), *self._open_item(event)]
        return self._delta(event) if isinstance(event, SegmentDelta) else self._end(event)

    # -------------------------------------------------------------------------- opening

    def _open_item(self, start: SegmentStart) -> list[StreamEvent]:
        kind, target = self._kind_of(start)
        lifecycle = LIFECYCLES[kind]
        item = OpenItem(
            kind=kind,
            id=self._item_id(kind, start.call_id or ""),
            output_index=len(self._output),
            segment=start.index,
            phase="commentary" if start.kind is SegmentKind.PREAMBLE else "final_answer",
            call_id=start.call_id or "",
            target=target,
            container_id=self._container_id,
        )
        self._open = item
        if kind == "mcp_approval_request":
            return []  # its id signs its arguments: sent whole when it closes (_close_open)
        added: list[StreamEvent] = [
            OutputItemAdded(
                sequence_number=self._next(),
                output_index=item.output_index,
                item=self._shape(item, "in_progress", ""),
            )
        ]
        added += server_call_opened(item, self._next)
        part = lifecycle.part(self._view.raw)
        if part is not None:
            added.append(
                ContentPartAdded(
                    sequence_number=self._next(),
                    item_id=item.id,
                    output_index=item.output_index,
                    content_index=0,
                    part=part,
                )
            )
        return added

    def _item_id(self, kind: ItemKind, call_id: str) -> str:
        """A new id; a server-run call's and an approval request's name their call (a client
        that sends them back as input replays the call's exact tokens). An approval request's
        is signed when it closes."""
        if kind == "mcp_approval_request":
            return approval_request_id(call_id)
        if kind == "mcp_call":
            return mcp_call_id(call_id)
        return self._new_item_id(LIFECYCLES[kind].prefix)

    def _kind_of(self, start: SegmentStart) -> tuple[ItemKind, ToolTarget | None]:
        if start.kind is not SegmentKind.TOOL_CALL:
            return SEGMENT_ITEMS[start.kind], None
        target = start.target or ToolTarget("")
        server_run = self._call_kind(target) if self._call_kind is not None else None
        if server_run is not None:
            return server_run, target
        return ("custom_tool_call" if target.kind == "custom" else "function_call"), target

    # -------------------------------------------------------------------------- streaming

    def _delta(self, event: SegmentDelta) -> list[StreamEvent]:
        item = self._open
        if item is None or item.segment != event.index or not event.text:
            return []
        if not self._shows_text(item):
            return []  # the raw chain of thought is not shown
        item.parts.append(event.text)
        delta = LIFECYCLES[item.kind].delta
        if delta is None:
            return []
        out = delta(item, self._next(), event.text)
        if self._logprobs is not None and isinstance(out, OutputTextDelta):
            out.logprobs = token_entries(event.logprobs, self._logprobs)
            item.scores += out.logprobs
        return self._named([out])

    def _shows_text(self, item: OpenItem) -> bool:
        """Whether the item's text is streamed: all but reasoning whose raw text is hidden."""
        return item.kind != "reasoning" or self._view.raw

    # -------------------------------------------------------------------------- summaries

    def _summary(self, event: SummaryStart | SummaryDelta | SummaryEnd) -> list[StreamEvent]:
        """The summary part of the reasoning item that waits for it (see `_end`)."""
        item = self._open
        if item is None or item.ended is None or item.segment != event.segment:
            return []
        if isinstance(event, SummaryStart):
            if item.summary is not None:
                return []  # one summary part per item
            item.summary = []
            return [summary_part_added(item, self._next())]
        if item.summary is None:
            return []
        if isinstance(event, SummaryEnd):
            item.summary_complete = event.complete
            return self._close_open()
        item.summary.append(event.text)
        return [summary_text_delta(item, self._next(), event.text)] if event.text else []

    # -------------------------------------------------------------------------- closing

    def _end(self, end: SegmentEnd) -> list[StreamEvent]:
        """A segment ended; a reasoning item stays open for its summary when one follows."""
        item = self._open
        if item is None or end.index != item.segment:
            return []
        waits = item.kind == "reasoning" and self.waits_for_summaries
        if item.kind in SERVER_RUN and end.complete:
            waits = True  # for the call's result (ToolOutput)
        if not waits:
            return self._close_open(end)
        item.ended = end
        return self._done_events(item, item.text)

    def _approval_request_added(self, item: OpenItem, arguments: str) -> list[StreamEvent]:
        """An approval request's `output_item.added`, once its arguments are known (its id
        signs them)."""
        if self._approval_id is not None and item.target is not None:
            item.id = self._approval_id(item.call_id, item.target, arguments)
        shape = self._shape(item, "in_progress", "")
        return [
            OutputItemAdded(
                sequence_number=self._next(), output_index=item.output_index, item=shape
            )
        ]

    def _approved_call(self, output: ToolOutput) -> list[StreamEvent]:
        """An approved call that ran before the first round: its whole `mcp_call` item."""
        done = McpCallItem(
            id=mcp_call_id(output.call_id),
            server_label=output.target.namespace,
            name=output.target.name,
            arguments=output.arguments,
            output=None if output.is_error else output.text,
            error=mcp_error(output.details, output.text) if output.is_error else None,
            status="failed" if output.is_error else "completed",
            approval_request_id=self._approved.pop(output.call_id),
        )
        events = ready_item_events(done, len(self._output), self._next)
        self._output.append(done)
        return events

    def _tool_output(self, output: ToolOutput) -> list[StreamEvent]:
        """A server-run call's result: the open call item completes (or fails) and closes (an
        approved call that ran before the first round: its whole item)."""
        if self._open is None and output.call_id in self._approved:
            return self._approved_call(output)
        item = self._open
        if item is None or item.kind not in SERVER_RUN or item.segment != output.index:
            return []
        item.details = dict(output.details)
        ran = item.kind == "code_interpreter_call" and "outputs" in item.details
        if output.is_error and not ran:  # code that raised still ran: its output shows why
            item.error = mcp_error(output.details, output.text)
        else:
            item.output = output.text
        return [*server_call_result(item, self._next), *self._close_open()]

    def _close_open(self, end: SegmentEnd | None = None) -> list[StreamEvent]:
        item = self._open
        if item is None or (end is not None and end.index != item.segment):
            return []
        self._open = None
        end = end or item.ended
        status: ItemStatus = "completed" if end is not None and end.complete else "incomplete"
        text = LIFECYCLES[item.kind].final(item.text)
        events = self._done_events(item, text) if item.ended is None else []
        if item.kind == "mcp_approval_request":
            events = self._approval_request_added(item, text)
        events += summary_done(item, self._next) if item.summary is not None else []
        done = self._shape(item, status, text)
        self._output.append(done)
        events.append(
            OutputItemDone(sequence_number=self._next(), output_index=item.output_index, item=done)
        )
        return events

    def _done_events(self, item: OpenItem, text: str) -> list[StreamEvent]:
        if not self._shows_text(item):
            return []  # no content part was opened
        return self._named(LIFECYCLES[item.kind].done(item, self._next, text))

    def _named(self, events: list[StreamEvent]) -> list[StreamEvent]:
        """The raw reasoning text's events under the names this response uses."""
        if not self._spec_reasoning:
            return events
        return [_spec_named(event) for event in events]

    def _shape(self, item: OpenItem, status: ItemStatus, text: str) -> OutputItem:
        return LIFECYCLES[item.kind].shape(item, status, text, self._view.raw)

    # -------------------------------------------------------------------------- the end

    def _finish(self, finished: Finished) -> TerminalEvent:
        sequence = self._next()
        usage = usage_out(finished.usage, finished.summaries)
        reason = finished.reason
        terminal: TerminalEvent
        if reason in (FinishReason.STOP, FinishReason.TOOL_CALL):
            response = self._snapshot("completed", usage)
            terminal = ResponseCompleted(sequence_number=sequence, response=response)
        elif reason is FinishReason.LENGTH:
            response = self._snapshot("incomplete", usage, incomplete_details=IncompleteDetails())
            terminal = ResponseIncomplete(sequence_number=sequence, response=response)
        else:
            cancelled = reason is FinishReason.CANCELLED
            message = "generation was cancelled" if cancelled else "generation failed"
            if finished.error:
                message = f"{message}: {finished.error}"
            status: ResponseStatus = "cancelled" if cancelled else "failed"
            response = self._snapshot(status, usage, error=ResponseError(message=message))
            terminal = ResponseFailed(sequence_number=sequence, response=response)
        self.terminal = terminal
        return terminal

    def _snapshot(
        self,
        status: ResponseStatus = "in_progress",
        usage: ResponseUsage | None = None,
        **fields: object,
    ) -> ResponseObject:
        completed_at = None if status == "in_progress" else now()
        update = {"status": status, "output": list(self._output), "usage": usage}
        return self._base.model_copy(update={**update, "completed_at": completed_at, **fields})

    def _next(self) -> int:
        sequence = self._sequence
        self._sequence += 1
        return sequence


def _spec_named(event: StreamEvent) -> StreamEvent:
    """OpenAI's reasoning text event as Open Responses names it (the same fields)."""
    if isinstance(event, ReasoningTextDelta):
        return ReasoningDelta(**event.model_dump(exclude={"type"}))
    if isinstance(event, ReasoningTextDone):
        return ReasoningDone(**event.model_dump(exclude={"type"}))
    return event


def fold(events: Sequence[StreamEvent]) -> ResponseObject:
    """The non-streaming body: the response the stream's terminal event carries."""
    terminals = [
        e for e in events if isinstance(e, (ResponseCompleted, ResponseIncomplete, ResponseFailed))
    ]
    if len(terminals) != 1 or terminals[0] is not events[-1]:
        raise RuntimeError("a response stream must end with exactly one terminal event")
    return terminals[0].response
