"""Anthropic Messages API wire shapes: lenient request models, typed content blocks and events.

Requests accept and ignore unknown fields (Claude Code sends `context_management`, `metadata`,
`cache_control` on blocks, ...). Content blocks and tools are kept as raw dicts in the request and
parsed one by one by the adapter, so an error names the block it is about. Everything the server
sends is a pydantic model with a `type: Literal[...]`, dumped as Anthropic's JSON.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from server.api.request_fields import Lenient

# ---------------------------------------------------------------------------- request side


class MessageIn(Lenient):
    """A message; `system` ones (Claude Code's mid-conversation-tool-changes beta) hold text."""

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class TextBlockIn(Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlockIn(Lenient):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlockIn(Lenient):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ThinkingBlockIn(Lenient):
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlockIn(Lenient):
    type: Literal["redacted_thinking"]
    data: str = ""


BlockIn = (
    TextBlockIn | ToolUseBlockIn | ToolResultBlockIn | ThinkingBlockIn | RedactedThinkingBlockIn
)


class ToolIn(Lenient):
    """A client tool: `name`, `description`, `input_schema` (type absent or `custom`)."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any]


class ThinkingParam(Lenient):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=1)
    display: str | None = None  # summarized | omitted (others are tolerated: shown)


class OutputConfig(Lenient):
    effort: str | None = None
    format: dict[str, Any] | None = None  # {"type": "json_schema", "schema": {...}}


class CountTokensRequest(Lenient):
    """POST /v1/messages/count_tokens: everything a prompt is rendered from."""

    model: str = ""
    messages: list[MessageIn] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None


# --------------------------------------------------------------------------- output side

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str = ""


class ThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str = ""
    signature: str = ""


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock


class OutputTokensDetails(BaseModel):
    thinking_tokens: int = 0


class UsageOut(BaseModel):
    """Total input = input_tokens + cache_read_input_tokens (+ cache_creation, always 0 here)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)


class MessageOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: UsageOut = Field(default_factory=UsageOut)


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(BaseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class InputJsonDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


BlockDelta = TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class MessageStart(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: MessageOut


class ContentBlockStart(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class ContentBlockDelta(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: BlockDelta


class ContentBlockStop(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(BaseModel):
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class MessageDelta(BaseModel):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: UsageOut


class MessageStop(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class Ping(BaseModel):
    type: Literal["ping"] = "ping"


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorEvent(BaseModel):
    """An error, as a stream event and as the body of an error response."""

    type: Literal["error"] = "error"
    error: ErrorBody


StreamEvent = (
    MessageStart
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | Ping
    | ErrorEvent
)


class TokenCount(BaseModel):
    input_tokens: int
