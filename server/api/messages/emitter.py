"""MessagesEmitter: generation events -> Anthropic stream events; `fold` makes the message.

One emitter per message owns the content block indexes. Each harmony message becomes one
content block, opened by `content_block_start` and closed by `content_block_stop`; blocks follow
one another strictly:

- analysis -> `thinking` (`thinking_delta`s, then a `signature_delta` just before the stop; see
  signature.py). Under the `summary` visibility the block holds the reasoning's summary and opens
  when the summary starts; with `display: omitted` it holds no text, only the signature; where
  no reasoning may be shown there is no block;
- a commentary preamble or the final answer -> `text` (`text_delta`s);
- a tool call -> `tool_use` with a `toolu_` id; its input is sent as one `input_json_delta` when
  the call is complete (a JSON object always: arguments that are not one are sent as `{}`).

The stream starts with `message_start` (and a `ping`) and ends with `message_delta` (stop reason,
usage) and `message_stop`, or with an `error` event when generation failed. The non-streaming
body is `fold()` of the very same events.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from server.api.messages.adapter import tool_use_id
from server.api.messages.errors import error_event
from server.api.messages.schemas import (
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    ErrorEvent,
    InputJsonDelta,
    MessageDelta,
    MessageDeltaBody,
    MessageOut,
    MessageStart,
    MessageStop,
    OutputTokensDetails,
    Ping,
    SignatureDelta,
    StopReason,
    StreamEvent,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    UsageOut,
)
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
    Usage,
)
from server.core.history import prompt_tokens
from server.core.visibility import ReasoningView

log = logging.getLogger(__name__)

RAW = ReasoningView(raw=True, summary=None)
BlockKind = Literal["thinking", "text", "tool_use"]


@dataclass
class _Block:
    """The open content block: which segment (or summary of a segment) it shows."""

    index: int
    kind: BlockKind
    segment: int
    parts: list[str] = field(default_factory=list)


class MessagesEmitter:
    """Turns one generation's events into the stream events of one message."""

    def __init__(
        self,
        message_id: str,
        model: str,
        *,
        input_tokens: int,
        signer: ThinkingSigner,
        message_start: Sequence[int],
        view: ReasoningView = RAW,
        thinking_text: bool = True,
    ) -> None:
        self.message_id = message_id
        self._model = model
        self._input_tokens = input_tokens
        self._signer = signer
        self._message_start = tuple(message_start)
        self._view = view
        self._thinking_text = thinking_text  # False: thinking blocks carry only the signature
        self._open: _Block | None = None
        self._blocks = 0
        self.done = False  # message_stop or error sent

    @property
    def summaries(self) -> bool:
        """Whether thinking blocks show summaries, which come after their reasoning ended."""
        return self._view.summary is not None

    def start(self) -> list[StreamEvent]:
        """`message_start` and a first `ping`, as Anthropic's API begins a stream."""
        usage = UsageOut(input_tokens=self._input_tokens)
        message = MessageOut(id=self.message_id, model=self._model, usage=usage)
        return [MessageStart(message=message), Ping()]

    def ping(self) -> list[StreamEvent]:
        """A keepalive for idle stretches (a long prompt being evaluated)."""
        return [] if self.done else [Ping()]

    def feed(self, event: GenerationEvent) -> list[StreamEvent]:
        if self.done:
            return []
        if isinstance(event, DecodeWarning):
            # the unparsed text is not logged: it can be chain of thought
            log.info(
                "message %s: %s (%d tokens)", self.message_id, event.message, len(event.tokens)
            )
            return []
        if isinstance(event, Finished):
            return [*self._close(), *self._finish(event)]
        if isinstance(event, (SummaryStart, SummaryDelta, SummaryEnd)):
            return self._summary(event) if self.summaries else []
        return self._segment(event)

    def _segment(self, event: SegmentStart | SegmentDelta | SegmentEnd) -> list[StreamEvent]:
        if event.kind is SegmentKind.REASONING and not self._view.raw:
            return []  # a summary may stand in for it later (see _summary)
        if isinstance(event, SegmentStart):
            return [*self._close(), *self._open_block(event)]
        block = self._open
        if block is None or block.segment != event.index:
            return []
        if isinstance(event, SegmentDelta):
            return self._delta(block, event.text)
        return self._close(event)

    # -------------------------------------------------------------------------- blocks

    def _open_block(self, start: SegmentStart) -> list[StreamEvent]:
        content: ContentBlock
        if start.kind is SegmentKind.REASONING:
            kind: BlockKind = "thinking"
            content = ThinkingBlock()
        elif start.kind is SegmentKind.TOOL_CALL:
            kind = "tool_use"
            name = start.target.qualified_name if start.target is not None else ""
            content = ToolUseBlock(id=tool_use_id(start.call_id or ""), name=name)
        else:
            kind = "text"
            content = TextBlock()
        return [self._new_block(kind, start.index, content)]

    def _new_block(self, kind: BlockKind, segment: int, content: ContentBlock) -> StreamEvent:
        self._open = _Block(self._blocks, kind, segment)
        self._blocks += 1
        return ContentBlockStart(index=self._open.index, content_block=content)

    def _delta(self, block: _Block, text: str) -> list[StreamEvent]:
        if not text:
            return []
        block.parts.append(text)
        if block.kind == "tool_use" or (block.kind == "thinking" and not self._thinking_text):
            return []  # the input is sent whole when the call is complete
        delta = ThinkingDelta(thinking=text) if block.kind == "thinking" else TextDelta(text=text)
        return [ContentBlockDelta(index=block.index, delta=delta)]

    def _close(self, end: SegmentEnd | None = None) -> list[StreamEvent]:
        """Close the open block; a thinking block gets its signature, a tool_use its input."""
        block, self._open = self._open, None
        if block is None:
            return []
        text = "".join(block.parts)
        events: list[StreamEvent] = []
        if block.kind == "thinking":
            shown = text if self._thinking_text else ""
            tokens = None
            if self._view.raw and end is not None and end.complete:
                tokens = prompt_tokens(end.tokens, self._message_start)
            signature = SignatureDelta(signature=self._signer.sign(shown, tokens))
            events.append(ContentBlockDelta(index=block.index, delta=signature))
        elif block.kind == "tool_use":
            arguments = InputJsonDelta(partial_json=self._tool_input(text))
            events.append(ContentBlockDelta(index=block.index, delta=arguments))
        events.append(ContentBlockStop(index=block.index))
        return events

    def _tool_input(self, arguments: str) -> str:
        try:
            value = json.loads(arguments)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return arguments
        log.warning("message %s: a tool call's arguments are not a JSON object", self.message_id)
        return "{}"

    # -------------------------------------------------------------------------- summaries

    def _summary(self, event: SummaryStart | SummaryDelta | SummaryEnd) -> list[StreamEvent]:
        """A thinking block showing the summary of reasoning segment `event.segment`."""
        if isinstance(event, SummaryStart):
            return [*self._close(), self._new_block("thinking", event.segment, ThinkingBlock())]
        block = self._open
        if block is None or block.kind != "thinking" or block.segment != event.segment:
            return []
        if isinstance(event, SummaryDelta):
            return self._delta(block, event.text)
        return self._close()

    # -------------------------------------------------------------------------- the end

    def _finish(self, finished: Finished) -> list[StreamEvent]:
        self.done = True
        reason = finished.reason
        if reason in (FinishReason.ERROR, FinishReason.CANCELLED):
            cancelled = reason is FinishReason.CANCELLED
            message = "generation was cancelled" if cancelled else "generation failed"
            if finished.error:
                message = f"{message}: {finished.error}"
            return [error_event(500, message)]
        stop_reason: StopReason = "end_turn"
        if finished.stop_sequence is not None:
            stop_reason = "stop_sequence"
        elif reason is FinishReason.TOOL_CALL:
            stop_reason = "tool_use"
        elif reason is FinishReason.LENGTH:
            stop_reason = "max_tokens"
        delta = MessageDeltaBody(stop_reason=stop_reason, stop_sequence=finished.stop_sequence)
        return [MessageDelta(delta=delta, usage=usage_out(finished.usage)), MessageStop()]


def usage_out(usage: Usage) -> UsageOut:
    """Anthropic's split: uncached input, cache reads (our reused KV state), output."""
    return UsageOut(
        input_tokens=usage.prompt_tokens - usage.cached_tokens,
        output_tokens=usage.completion_tokens,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=usage.cached_tokens,
        output_tokens_details=OutputTokensDetails(thinking_tokens=usage.reasoning_tokens),
    )


def fold(events: Sequence[StreamEvent]) -> MessageOut:
    """The non-streaming body: the message the stream's events build, as a client accumulates
    them. An `error` event raises ServerError with its message."""
    message: MessageOut | None = None
    blocks: dict[int, ContentBlock] = {}
    inputs: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ErrorEvent):
            raise ServerError(event.error.message)
        if isinstance(event, MessageStart):
            message = event.message.model_copy(deep=True)
        elif isinstance(event, ContentBlockStart):
            blocks[event.index] = event.content_block.model_copy(deep=True)
        elif isinstance(event, ContentBlockDelta):
            _apply(blocks[event.index], event, inputs)
        elif isinstance(event, ContentBlockStop):
            block = blocks[event.index]
            if isinstance(block, ToolUseBlock):
                block.input = json.loads("".join(inputs.get(event.index, ())) or "{}")
        elif isinstance(event, MessageDelta) and message is not None:
            message.stop_reason = event.delta.stop_reason
            message.stop_sequence = event.delta.stop_sequence
            message.usage = event.usage
    if message is None or not events or not isinstance(events[-1], MessageStop):
        raise RuntimeError("a message stream must start with message_start, end with message_stop")
    message.content = [blocks[index] for index in sorted(blocks)]
    return message


def _apply(block: ContentBlock, event: ContentBlockDelta, inputs: dict[int, list[str]]) -> None:
    delta = event.delta
    if isinstance(delta, TextDelta) and isinstance(block, TextBlock):
        block.text += delta.text
    elif isinstance(delta, ThinkingDelta) and isinstance(block, ThinkingBlock):
        block.thinking += delta.thinking
    elif isinstance(delta, SignatureDelta) and isinstance(block, ThinkingBlock):
        block.signature = delta.signature
    elif isinstance(delta, InputJsonDelta):
        inputs.setdefault(event.index, []).append(delta.partial_json)
