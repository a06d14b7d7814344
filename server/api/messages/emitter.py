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

What each kind of block sends when it starts, with each text delta and just before it stops is
a table (`_LIFECYCLES`). The stream starts with `message_start` (and a `ping`) and ends with
`message_delta` (stop reason, usage) and `message_stop`, or with an `error` event when generation
failed. The non-streaming body is `fold()` of the very same events.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from server.api.messages import schemas as wire
from server.api.messages.adapter import tool_use_id
from server.api.messages.errors import error_event
from server.api.messages.signature import ThinkingSigner
from server.contracts import events as ev
from server.contracts.errors import ServerError
from server.core.history import prompt_tokens
from server.core.visibility import ReasoningView

log = logging.getLogger(__name__)

RAW = ReasoningView(raw=True, summary=None)
BlockKind = Literal["thinking", "text", "tool_use"]
BLOCK_KINDS: dict[ev.SegmentKind, BlockKind] = {
    ev.SegmentKind.REASONING: "thinking",
    ev.SegmentKind.PREAMBLE: "text",
    ev.SegmentKind.FINAL: "text",
    ev.SegmentKind.TOOL_CALL: "tool_use",
}


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
    def waits_for_summaries(self) -> bool:
        """Whether thinking blocks show summaries, which come after their reasoning ended."""
        return self._view.summary is not None

    def start(self) -> list[wire.StreamEvent]:
        """`message_start` and a first `ping`, as Anthropic's API begins a stream."""
        usage = wire.UsageOut(input_tokens=self._input_tokens)
        message = wire.MessageOut(id=self.message_id, model=self._model, usage=usage)
        return [wire.MessageStart(message=message), wire.Ping()]

    def keepalive(self) -> list[wire.StreamEvent]:
        """A `ping` for idle stretches (a long prompt being evaluated)."""
        return [] if self.done else [wire.Ping()]

    def feed(self, event: ev.GenerationEvent) -> list[wire.StreamEvent]:
        if self.done:
            return []
        if isinstance(event, ev.DecodeWarning):
            # the unparsed text is not logged: it can be chain of thought
            log.info(
                "message %s: %s (%d tokens)", self.message_id, event.message, len(event.tokens)
            )
            return []
        if isinstance(event, ev.Finished):
            return [*self._close(), *self._finish(event)]
        if isinstance(event, (ev.SummaryStart, ev.SummaryDelta, ev.SummaryEnd)):
            return self._summary(event) if self.waits_for_summaries else []
        if isinstance(event, ev.ToolOutput):
            return []  # Messages offers no server-run tools
        return self._segment(event)

    def _segment(
        self, event: ev.SegmentStart | ev.SegmentDelta | ev.SegmentEnd
    ) -> list[wire.StreamEvent]:
        if event.kind is ev.SegmentKind.REASONING and not self._view.raw:
            return []  # a summary may stand in for it later (see _summary)
        if isinstance(event, ev.SegmentStart):
            return [*self._close(), *self._open_block(event)]
        block = self._open
        if block is None or block.segment != event.index:
            return []
        if isinstance(event, ev.SegmentDelta):
            return self._delta(block, event.text)
        return self._close(event)

    # -------------------------------------------------------------------------- blocks

    def _open_block(self, start: ev.SegmentStart) -> list[wire.StreamEvent]:
        kind = BLOCK_KINDS[start.kind]
        return [self._new_block(kind, start.index, _LIFECYCLES[kind].block(start))]

    def _new_block(
        self, kind: BlockKind, segment: int, content: wire.ContentBlock
    ) -> wire.StreamEvent:
        self._open = _Block(self._blocks, kind, segment)
        self._blocks += 1
        return wire.ContentBlockStart(index=self._open.index, content_block=content)

    def _delta(self, block: _Block, text: str) -> list[wire.StreamEvent]:
        if not text:
            return []
        block.parts.append(text)
        delta = _LIFECYCLES[block.kind].delta
        if delta is None or (block.kind == "thinking" and not self._thinking_text):
            return []  # sent whole when the block stops (a tool's input), or not at all
        return [wire.ContentBlockDelta(index=block.index, delta=delta(text))]

    def _close(self, end: ev.SegmentEnd | None = None) -> list[wire.StreamEvent]:
        """Close the open block, after its last delta (a signature, a tool's input)."""
        block, self._open = self._open, None
        if block is None:
            return []
        events: list[wire.StreamEvent] = []
        last = _LIFECYCLES[block.kind].last
        if last is not None:
            delta = last(self, "".join(block.parts), end)
            events.append(wire.ContentBlockDelta(index=block.index, delta=delta))
        events.append(wire.ContentBlockStop(index=block.index))
        return events

    def _signature(self, text: str, end: ev.SegmentEnd | None) -> wire.BlockDelta:
        """A thinking block's signature: over what it shows, and the exact tokens of complete
        raw reasoning (signature.py)."""
        shown = text if self._thinking_text else ""
        tokens = None
        if self._view.raw and end is not None and end.complete:
            tokens = prompt_tokens(end.tokens, self._message_start)
        return wire.SignatureDelta(signature=self._signer.sign(shown, tokens))

    def _input(self, text: str, _: ev.SegmentEnd | None) -> wire.BlockDelta:
        """A tool_use block's input, whole."""
        return wire.InputJsonDelta(partial_json=self._tool_input(text))

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

    def _summary(
        self, event: ev.SummaryStart | ev.SummaryDelta | ev.SummaryEnd
    ) -> list[wire.StreamEvent]:
        """A thinking block showing the summary of reasoning segment `event.segment`."""
        if isinstance(event, ev.SummaryStart):
            return [
                *self._close(),
                self._new_block("thinking", event.segment, wire.ThinkingBlock()),
            ]
        block = self._open
        if block is None or block.kind != "thinking" or block.segment != event.segment:
            return []
        if isinstance(event, ev.SummaryDelta):
            return self._delta(block, event.text)
        return self._close()

    # -------------------------------------------------------------------------- the end

    def _finish(self, finished: ev.Finished) -> list[wire.StreamEvent]:
        self.done = True
        reason = finished.reason
        if reason in (ev.FinishReason.ERROR, ev.FinishReason.CANCELLED):
            cancelled = reason is ev.FinishReason.CANCELLED
            message = "generation was cancelled" if cancelled else "generation failed"
            if finished.error:
                message = f"{message}: {finished.error}"
            return [error_event(500, message)]
        stop_reason: wire.StopReason = "end_turn"
        if finished.stop_sequence is not None:
            stop_reason = "stop_sequence"
        elif reason is ev.FinishReason.TOOL_CALL:
            stop_reason = "tool_use"
        elif reason is ev.FinishReason.LENGTH:
            stop_reason = "max_tokens"
        delta = wire.MessageDeltaBody(stop_reason=stop_reason, stop_sequence=finished.stop_sequence)
        return [wire.MessageDelta(delta=delta, usage=usage_out(finished.usage)), wire.MessageStop()]


@dataclass(frozen=True)
class _Lifecycle:
    """How a content block of one kind streams, between `content_block_start` and `_stop`.

    - `block(start)`: the block `content_block_start` opens;
    - `delta(text)`: the delta of one text delta; None where the text is not streamed;
    - `last(emitter, text, end)`: the delta sent just before the stop, given the block's text.
    """

    block: Callable[[ev.SegmentStart], wire.ContentBlock]
    delta: Callable[[str], wire.BlockDelta] | None = None
    last: Callable[[MessagesEmitter, str, ev.SegmentEnd | None], wire.BlockDelta] | None = None


def _tool_use_block(start: ev.SegmentStart) -> wire.ContentBlock:
    name = start.target.qualified_name if start.target is not None else ""
    return wire.ToolUseBlock(id=tool_use_id(start.call_id or ""), name=name)


_LIFECYCLES: dict[BlockKind, _Lifecycle] = {
    "thinking": _Lifecycle(
        lambda _: wire.ThinkingBlock(),
        delta=lambda text: wire.ThinkingDelta(thinking=text),
        last=MessagesEmitter._signature,
    ),
    "text": _Lifecycle(lambda _: wire.TextBlock(), delta=lambda text: wire.TextDelta(text=text)),
    # the input is sent whole when the call is complete (a JSON object always)
    "tool_use": _Lifecycle(_tool_use_block, last=MessagesEmitter._input),
}


def usage_out(usage: ev.Usage) -> wire.UsageOut:
    """Anthropic's split: uncached input, cache reads (our reused KV state), output."""
    return wire.UsageOut(
        input_tokens=usage.prompt_tokens - usage.cached_tokens,
        output_tokens=usage.completion_tokens,
        cache_creation_input_tokens=0,
        cache_read_input_tokens=usage.cached_tokens,
        output_tokens_details=wire.OutputTokensDetails(thinking_tokens=usage.reasoning_tokens),
    )


def fold(events: Sequence[wire.StreamEvent]) -> wire.MessageOut:
    """The non-streaming body: the message the stream's events build, as a client accumulates
    them. An `error` event raises ServerError with its message."""
    message: wire.MessageOut | None = None
    blocks: dict[int, wire.ContentBlock] = {}
    inputs: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, wire.ErrorEvent):
            raise ServerError(event.error.message)
        if isinstance(event, wire.MessageStart):
            message = event.message.model_copy(deep=True)
        elif isinstance(event, wire.ContentBlockStart):
            blocks[event.index] = event.content_block.model_copy(deep=True)
        elif isinstance(event, wire.ContentBlockDelta):
            _apply(blocks[event.index], event, inputs)
        elif isinstance(event, wire.ContentBlockStop):
            block = blocks[event.index]
            if isinstance(block, wire.ToolUseBlock):
                block.input = json.loads("".join(inputs.get(event.index, ())) or "{}")
        elif isinstance(event, wire.MessageDelta) and message is not None:
            message.stop_reason = event.delta.stop_reason
            message.stop_sequence = event.delta.stop_sequence
            message.usage = event.usage
    if message is None or not events or not isinstance(events[-1], wire.MessageStop):
        raise RuntimeError("a message stream must start with message_start, end with message_stop")
    message.content = [blocks[index] for index in sorted(blocks)]
    return message


def _apply(
    block: wire.ContentBlock, event: wire.ContentBlockDelta, inputs: dict[int, list[str]]
) -> None:
    delta = event.delta
    if isinstance(delta, wire.TextDelta) and isinstance(block, wire.TextBlock):
        block.text += delta.text
    elif isinstance(delta, wire.ThinkingDelta) and isinstance(block, wire.ThinkingBlock):
        block.thinking += delta.thinking
    elif isinstance(delta, wire.SignatureDelta) and isinstance(block, wire.ThinkingBlock):
        block.signature = delta.signature
    elif isinstance(delta, wire.InputJsonDelta):
        inputs.setdefault(event.index, []).append(delta.partial_json)
