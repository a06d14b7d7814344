"""Generation events -> Chat Completions deltas, chunks, and the folded non-streaming body.

Streaming sends each delta in a chunk as it comes; the non-streaming body merges the very same
deltas, so both answers always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.api.chat.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    Delta,
    MessageOut,
    ToolCallDelta,
    ToolCallOut,
    UsageOut,
)
from server.api.common import timings_out
from server.events import (
    DecodeWarning,
    Finished,
    FinishReason,
    GenerationEvent,
    SegmentDelta,
    SegmentKind,
    SegmentStart,
    Usage,
)
from server.transcript import FUNCTIONS_NAMESPACE

FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.TOOL_CALL: "tool_calls",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "stop",
    FinishReason.ERROR: "stop",
}


def function_name(recipient: str | None) -> str:
    """`functions.get_weather` -> `get_weather`; other recipients are passed whole."""
    prefix = FUNCTIONS_NAMESPACE + "."
    if recipient and recipient.startswith(prefix):
        return recipient[len(prefix) :]
    return recipient or ""


@dataclass
class ChatTranslator:
    """Turns generation events into chat deltas; remembers how the generation finished.

    Several analysis messages become one reasoning text, separated by a newline. Tool calls are
    numbered in the order the model makes them.
    """

    include_reasoning: bool
    reasoning_content: bool = True  # also send the reasoning as `reasoning_content`
    finished: Finished | None = None
    warnings: list[DecodeWarning] = field(default_factory=list)
    _has_reasoning: bool = False
    _needs_separator: bool = False
    _tool_calls: int = 0

    def deltas(self, event: GenerationEvent) -> list[Delta]:
        if isinstance(event, SegmentDelta):
            return self._delta(event)
        if isinstance(event, SegmentStart):
            return self._start(event)
        if isinstance(event, DecodeWarning):
            self.warnings.append(event)
        elif isinstance(event, Finished):
            self.finished = event
        return []

    def _start(self, event: SegmentStart) -> list[Delta]:
        if event.kind is SegmentKind.REASONING:
            self._needs_separator = self._has_reasoning
        elif event.kind is SegmentKind.TOOL_CALL:
            call = ToolCallDelta(
                index=self._tool_calls,
                id=event.call_id or "",
                type="function",
                function={"name": function_name(event.recipient), "arguments": ""},
            )
            self._tool_calls += 1
            return [Delta(tool_calls=[call])]
        return []

    def _delta(self, event: SegmentDelta) -> list[Delta]:
        if event.kind is SegmentKind.REASONING:
            if not self.include_reasoning:
                return []
            text = "\n" + event.text if self._needs_separator else event.text
            self._has_reasoning, self._needs_separator = True, False
            delta = Delta(reasoning=text)
            if self.reasoning_content:
                delta["reasoning_content"] = text
            return [delta]
        if event.kind is SegmentKind.TOOL_CALL:
            fragment = ToolCallDelta(index=self._tool_calls - 1, function={"arguments": event.text})
            return [Delta(tool_calls=[fragment])]
        return [Delta(content=event.text)]

    @property
    def finish_reason(self) -> str:
        reason = self.finished.reason if self.finished else FinishReason.ERROR
        return FINISH_REASONS[reason]


def usage_out(usage: Usage) -> UsageOut:
    return UsageOut(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        prompt_tokens_details={"cached_tokens": usage.cached_tokens},
        completion_tokens_details={"reasoning_tokens": usage.reasoning_tokens},
    )


@dataclass(frozen=True)
class ChunkFactory:
    """Builds chunks that share one id, timestamp and model name."""

    id: str
    created: int
    model: str

    def chunk(self, delta: Delta, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=[
                {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            ],
        )

    def usage_chunk(self, finished: Finished) -> ChatCompletionChunk:
        chunk = ChatCompletionChunk(
            id=self.id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=[],
            usage=usage_out(finished.usage),
        )
        chunk["timings"] = timings_out(finished.timings, finished.usage)
        return chunk


def fold(deltas: list[Delta], translator: ChatTranslator, factory: ChunkFactory) -> ChatCompletion:
    """The non-streaming body: the same deltas, merged."""
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning", "") for d in deltas)
    message = MessageOut(role="assistant", content=content or None)
    if reasoning:
        message["reasoning"] = reasoning
        if translator.reasoning_content:
            message["reasoning_content"] = reasoning
        message["reasoning_details"] = [
            {"type": "reasoning.text", "text": reasoning, "format": "unknown", "index": 0}
        ]
    calls = _merged_tool_calls(deltas)
    if calls:
        message["tool_calls"] = calls
    body = ChatCompletion(
        id=factory.id,
        object="chat.completion",
        created=factory.created,
        model=factory.model,
        choices=[
            {
                "index": 0,
                "message": message,
                "finish_reason": translator.finish_reason,
                "logprobs": None,
            }
        ],
    )
    finished = translator.finished
    if finished is not None:
        body["usage"] = usage_out(finished.usage)
        body["timings"] = timings_out(finished.timings, finished.usage)
    return body


def _merged_tool_calls(deltas: list[Delta]) -> list[ToolCallOut]:
    calls: list[ToolCallOut] = []
    for delta in deltas:
        for fragment in delta.get("tool_calls", []):
            function = fragment.get("function", {})
            if "id" in fragment:
                name = function.get("name", "")
                calls.append(
                    ToolCallOut(id=fragment["id"], type="function", function={"name": name})
                )
                calls[-1]["function"]["arguments"] = ""
            calls[fragment["index"]]["function"]["arguments"] += function.get("arguments", "")
    return calls
