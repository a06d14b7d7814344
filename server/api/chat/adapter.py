"""Chat Completions <-> the generation core: request -> Transcript; events -> deltas -> chunks.

Streaming sends each delta in a chunk as it comes; the non-streaming body folds the very same
deltas, so both answers always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from server.api.chat.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessageIn,
    Delta,
    MessageOut,
    UsageOut,
)
from server.api.common import clamp_effort, effort_for_budget, text_of_parts, timings_out
from server.errors import InvalidRequest
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
from server.generation import GenerationOptions
from server.transcript import (
    AssistantMessage,
    DeveloperMessage,
    Item,
    Reasoning,
    ReasoningEffort,
    ToolCall,
    ToolResult,
    Transcript,
    UserMessage,
)

FINISH_REASONS = {
    FinishReason.STOP: "stop",
    FinishReason.TOOL_CALL: "tool_calls",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "stop",
    FinishReason.ERROR: "stop",
}
TEXT_PARTS = ("text", "input_text", "output_text")


def check_supported(request: ChatCompletionRequest) -> None:
    if request.n not in (None, 1):
        raise InvalidRequest("only n=1 is supported", param="n")
    if request.logprobs:
        raise InvalidRequest("logprobs are not supported", param="logprobs")
    if request.tools:
        raise InvalidRequest("tools are not supported by this endpoint yet", param="tools")
    if request.stop:
        raise InvalidRequest("stop sequences are not supported yet", param="stop")


def to_transcript(
    request: ChatCompletionRequest, default_effort: ReasoningEffort, date: str
) -> Transcript:
    """The neutral transcript of a chat request (leading system/developer text = instructions)."""
    check_supported(request)
    messages = request.messages
    n_lead = next(
        (i for i, m in enumerate(messages) if m.role not in ("system", "developer")), len(messages)
    )
    instructions = "\n\n".join(_text(m, i) for i, m in enumerate(messages[:n_lead]))
    names: dict[str, str] = {}
    items: list[Item] = []
    for index, message in enumerate(messages[n_lead:], start=n_lead):
        items.extend(_items(message, index, names))
    return Transcript(
        items=tuple(items),
        instructions=instructions or None,
        reasoning_effort=requested_effort(request) or default_effort,
        conversation_date=date,
    )


def requested_effort(request: ChatCompletionRequest) -> ReasoningEffort | None:
    config = request.reasoning
    if config is not None and config.effort is not None:
        return clamp_effort(config.effort, "reasoning.effort")
    if request.reasoning_effort is not None:
        return clamp_effort(request.reasoning_effort, "reasoning_effort")
    if config is not None and config.max_tokens is not None:
        return effort_for_budget(config.max_tokens)
    if config is not None and config.enabled is False:
        return "low"
    return None


def generation_options(request: ChatCompletionRequest) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=request.max_completion_tokens or request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
    )


def include_reasoning(request: ChatCompletionRequest) -> bool:
    if request.reasoning is not None and request.reasoning.exclude:
        return False
    return request.include_reasoning is not False


def _text(message: ChatMessageIn, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return text_of_parts(content, TEXT_PARTS, f"messages[{index}].content")


def _items(message: ChatMessageIn, index: int, names: dict[str, str]) -> list[Item]:
    role = message.role
    if role == "user":
        return [UserMessage(_text(message, index))]
    if role in ("system", "developer"):
        return [DeveloperMessage(_text(message, index))]
    if role == "tool":
        return [_tool_result(message, index, names)]
    return _assistant_items(message, index, names)


def _assistant_items(message: ChatMessageIn, index: int, names: dict[str, str]) -> list[Item]:
    items: list[Item] = []
    reasoning = _previous_reasoning(message)
    if reasoning:
        items.append(Reasoning(reasoning))
    text = _text(message, index)
    calls = message.tool_calls or []
    if text:
        items.append(AssistantMessage(text, channel="commentary" if calls else "final"))
    for call in calls:
        names[call.id] = call.function.name
        items.append(
            ToolCall(call_id=call.id, name=call.function.name, arguments=call.function.arguments)
        )
    return items


def _previous_reasoning(message: ChatMessageIn) -> str | None:
    if message.reasoning:
        return message.reasoning
    if message.reasoning_content:
        return message.reasoning_content
    details = message.reasoning_details or []
    texts = [d.text for d in details if d.type == "reasoning.text" and d.text]
    if texts:
        return "".join(texts)
    return message.thinking or None


def _tool_result(message: ChatMessageIn, index: int, names: dict[str, str]) -> ToolResult:
    call_id = message.tool_call_id
    if not call_id:
        raise InvalidRequest(
            "a tool message needs tool_call_id", param=f"messages[{index}].tool_call_id"
        )
    name = names.get(call_id) or message.name
    if name is None:
        raise InvalidRequest(
            f"tool_call_id {call_id!r} matches no earlier assistant tool call",
            param=f"messages[{index}].tool_call_id",
        )
    return ToolResult(call_id=call_id, name=name, output=_text(message, index))


@dataclass
class ChatTranslator:
    """Turns generation events into chat deltas; remembers how the generation finished.

    Several analysis messages become one reasoning text, separated by a newline.
    """

    include_reasoning: bool
    finished: Finished | None = None
    warnings: list[DecodeWarning] = field(default_factory=list)
    _has_reasoning: bool = False
    _needs_separator: bool = False

    def deltas(self, event: GenerationEvent) -> list[Delta]:
        if isinstance(event, SegmentDelta):
            return self._delta(event)
        if isinstance(event, SegmentStart) and event.kind is SegmentKind.REASONING:
            self._needs_separator = self._has_reasoning
        elif isinstance(event, DecodeWarning):
            self.warnings.append(event)
        elif isinstance(event, Finished):
            self.finished = event
        return []

    def _delta(self, event: SegmentDelta) -> list[Delta]:
        if event.kind is SegmentKind.REASONING:
            if not self.include_reasoning:
                return []
            text = "\n" + event.text if self._needs_separator else event.text
            self._has_reasoning, self._needs_separator = True, False
            return [Delta(reasoning=text, reasoning_content=text)]
        if event.kind in (SegmentKind.FINAL, SegmentKind.PREAMBLE):
            return [Delta(content=event.text)]
        return []

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
        message["reasoning_content"] = reasoning
        message["reasoning_details"] = [
            {"type": "reasoning.text", "text": reasoning, "format": "unknown", "index": 0}
        ]
    finished = translator.finished
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
    if finished is not None:
        body["usage"] = usage_out(finished.usage)
        body["timings"] = timings_out(finished.timings, finished.usage)
    return body
