"""Chat Completions wire shapes: pydantic request models, TypedDict response shapes.

Requests are lenient: unknown fields are accepted and ignored, as OpenAI clients send many.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import Field

from server.api.logprobs import TokenLogprobOut
from server.api.request_fields import Lenient


class ContentPart(Lenient):
    type: str
    text: str | None = None


class FunctionCallIn(Lenient):
    name: str
    arguments: str = ""


class ToolCallIn(Lenient):
    id: str
    type: str = "function"
    function: FunctionCallIn


class ReasoningDetail(Lenient):
    type: str
    text: str | None = None


class ChatMessageIn(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    reasoning_details: list[ReasoningDetail] | None = None
    thinking: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class ReasoningConfig(Lenient):
    effort: str | None = None
    exclude: bool = False
    max_tokens: int | None = Field(None, ge=1)
    enabled: bool | None = None
    summary: str | None = None  # auto | concise | detailed | none: an extension


class StreamOptions(Lenient):
    include_usage: bool = False


class FunctionDefinition(Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolIn(Lenient):
    type: str
    function: FunctionDefinition | None = None


class ChatCompletionRequest(Lenient):
    model: str = ""
    messages: list[ChatMessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int | None = Field(None, ge=1)
    reasoning: ReasoningConfig | None = None
    reasoning_effort: str | None = None
    include_reasoning: bool | None = None
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    reasoning_logprobs: bool | None = None  # an extension: the reasoning tokens' logprobs too


class FunctionDelta(TypedDict, total=False):
    name: str
    arguments: str


class ToolCallDelta(TypedDict, total=False):
    index: int
    id: str
    type: Literal["function"]
    function: FunctionDelta


class ReasoningDetailOut(TypedDict, total=False):
    """OpenRouter's `reasoning_details` entry: `reasoning.text` or `reasoning.summary`."""

    type: Literal["reasoning.text", "reasoning.summary"]
    text: str
    summary: str
    format: str
    index: int


class Delta(TypedDict, total=False):
    role: str
    content: str
    reasoning: str
    reasoning_content: str
    reasoning_details: list[ReasoningDetailOut]
    tool_calls: list[ToolCallDelta]


class ToolCallOut(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionDelta


class _ChoiceLogprobs(TypedDict):
    content: list[TokenLogprobOut] | None
    refusal: None


class ChoiceLogprobs(_ChoiceLogprobs, total=False):
    reasoning: list[TokenLogprobOut]  # with `reasoning_logprobs`: the reasoning tokens'


class ChunkChoice(TypedDict):
    index: int
    delta: Delta
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None


class SummaryUsageOut(TypedDict):
    """The reasoning summaries' own tokens, not counted in the completion's usage."""

    summaries: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]
    completion_tokens_details: dict[str, int]


class _Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int]
    completion_tokens_details: dict[str, int]


class UsageOut(_Usage, total=False):
    summary_usage: SummaryUsageOut  # only when summaries were asked for


class ChatCompletionChunk(TypedDict, total=False):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageOut | None
    timings: dict[str, float]


class MessageOut(TypedDict, total=False):
    role: Literal["assistant"]
    content: str | None
    reasoning: str
    reasoning_content: str
    reasoning_details: list[ReasoningDetailOut]
    tool_calls: list[ToolCallOut]
    refusal: None


class ChoiceOut(TypedDict):
    index: int
    message: MessageOut
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None


class ChatCompletion(TypedDict, total=False):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChoiceOut]
    usage: UsageOut
    timings: dict[str, float]
