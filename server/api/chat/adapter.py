"""Chat Completions request -> the neutral Transcript and GenerationOptions.

The steps every API adapter has, by the same names: `reasoning_view`, `to_transcript`,
`generation_options`, and `WIRE_NAMES` for the core's errors.
"""

from __future__ import annotations

from server.api.chat.schemas import ChatCompletionRequest, ChatMessageIn, ToolIn
from server.api.request_fields import (
    clamp_effort,
    effort_for_budget,
    text_of_parts,
    to_response_format,
    to_summary_style,
    to_tool_choice,
)
from server.contracts import transcript
from server.contracts.errors import InvalidRequest, RequestField
from server.core.generation import GenerationOptions
from server.core.visibility import ReasoningView, ReasoningVisibility, SummaryStyle, resolve_view

TEXT_PARTS = ("text", "input_text", "output_text")
WIRE_NAMES = {
    RequestField.CONVERSATION: "messages",
    RequestField.MAX_TOKENS: "max_completion_tokens",
    RequestField.TOOL_CHOICE: "tool_choice",
    RequestField.RESPONSE_FORMAT: "response_format",
    RequestField.REASONING: "reasoning",
}


def check_supported(request: ChatCompletionRequest) -> None:
    if request.top_logprobs is not None and not request.logprobs:
        raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    if request.reasoning_logprobs and not request.logprobs:
        raise InvalidRequest("reasoning_logprobs needs logprobs: true", param="reasoning_logprobs")


def to_transcript(
    request: ChatCompletionRequest, default_effort: transcript.ReasoningEffort, date: str
) -> transcript.Transcript:
    """The neutral transcript of a chat request (leading system/developer text = instructions)."""
    check_supported(request)
    messages = request.messages
    n_lead = next(
        (i for i, m in enumerate(messages) if m.role not in ("system", "developer")), len(messages)
    )
    instructions = "\n\n".join(_text(m, i) for i, m in enumerate(messages[:n_lead]))
    names: dict[str, str] = {}
    items: list[transcript.Item] = []
    for index, message in enumerate(messages[n_lead:], start=n_lead):
        items.extend(_items(message, index, names))
    return transcript.Transcript(
        items=tuple(items),
        instructions=instructions or None,
        tools=tuple(_tool_spec(tool, i) for i, tool in enumerate(request.tools or [])),
        reasoning_effort=requested_effort(request) or default_effort,
        conversation_date=date,
        response_format=to_response_format(request.response_format, "response_format"),
    )


def generation_options(
    request: ChatCompletionRequest, summary: SummaryStyle | None = None
) -> GenerationOptions:
    stop = request.stop
    budget = request.reasoning.max_tokens if request.reasoning is not None else None
    return GenerationOptions(
        max_tokens=request.max_completion_tokens or request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        tool_choice=to_tool_choice(request.tool_choice),
        reasoning_budget=budget,
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        summary=summary,
        logprobs=(request.top_logprobs or 0) if request.logprobs else None,
    )


def requested_effort(request: ChatCompletionRequest) -> transcript.ReasoningEffort | None:
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


def include_reasoning(request: ChatCompletionRequest) -> bool:
    if request.reasoning is not None and request.reasoning.exclude:
        return False
    return request.include_reasoning is not False


def reasoning_view(
    request: ChatCompletionRequest, visibility: ReasoningVisibility
) -> ReasoningView:
    """What of the reasoning this completion shows: the server's policy, then the request."""
    config = request.reasoning
    summary = to_summary_style(config.summary if config else None, "reasoning.summary")
    return resolve_view(visibility, summary, exclude=not include_reasoning(request))


def _tool_spec(tool: ToolIn, index: int) -> transcript.ToolSpec:
    if tool.type != "function" or tool.function is None:
        raise InvalidRequest(
            f"tool type {tool.type!r} is not supported here; use function tools "
            "(custom tools are supported on /v1/responses)",
            param=f"tools[{index}]",
        )
    function = tool.function
    return transcript.ToolSpec(
        name=function.name,
        description=function.description or "",
        parameters=function.parameters,
        strict=function.strict,
    )


def _text(message: ChatMessageIn, index: int) -> str:
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return text_of_parts(content, TEXT_PARTS, f"messages[{index}].content")


def _items(message: ChatMessageIn, index: int, names: dict[str, str]) -> list[transcript.Item]:
    role = message.role
    if role == "user":
        return [transcript.UserMessage(_text(message, index))]
    if role in ("system", "developer"):
        return [transcript.DeveloperMessage(_text(message, index))]
    if role == "tool":
        return [_tool_result(message, index, names)]
    return _assistant_items(message, index, names)


def _assistant_items(
    message: ChatMessageIn, index: int, names: dict[str, str]
) -> list[transcript.Item]:
    items: list[transcript.Item] = []
    reasoning = _previous_reasoning(message)
    if reasoning:
        items.append(transcript.Reasoning(reasoning))
    text = _text(message, index)
    calls = message.tool_calls or []
    if text:
        items.append(transcript.AssistantMessage(text, channel="commentary" if calls else "final"))
    for call in calls:
        names[call.id] = call.function.name
        items.append(
            transcript.ToolCall(
                call_id=call.id, name=call.function.name, arguments=call.function.arguments
            )
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


def _tool_result(
    message: ChatMessageIn, index: int, names: dict[str, str]
) -> transcript.ToolResult:
    call_id = message.tool_call_id
    if not call_id:
        raise InvalidRequest(
            "a tool message needs tool_call_id", param=f"messages[{index}].tool_call_id"
        )
    name = names.get(call_id)
    if name is None:
        raise InvalidRequest(
            f"tool_call_id {call_id!r} matches no earlier assistant tool call",
            param=f"messages[{index}].tool_call_id",
        )
    return transcript.ToolResult(call_id=call_id, name=name, output=_text(message, index))
