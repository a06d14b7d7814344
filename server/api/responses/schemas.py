"""Responses API wire shapes: lenient request models, typed output items, stream events.

Requests accept and ignore unknown fields (Codex sends `client_metadata`, ids on every item, ...).
Input items and tools are kept as raw dicts in the request and parsed one by one by the adapter,
so an unknown item or tool type is skipped instead of failing the whole request.
Everything the server sends is a pydantic model with a `type: Literal[...]`; unions are
discriminated on `type`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from server.api.request_fields import Lenient

# ---------------------------------------------------------------------------- request side


class ContentPartIn(Lenient):
    type: str
    text: str | None = None
    refusal: str | None = None


class MessageIn(Lenient):
    """`message` (or an EasyInputMessage without `type`)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPartIn]
    phase: str | None = None


class ReasoningContentIn(Lenient):
    type: str = "reasoning_text"
    text: str = ""


class ReasoningIn(Lenient):
    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningContentIn] | None = None
    encrypted_content: str | None = None


class FunctionCallIn(Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = ""
    namespace: str | None = None


class CustomToolCallIn(Lenient):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str = ""
    namespace: str | None = None


class ToolOutputIn(Lenient):
    """`function_call_output` and `custom_tool_call_output`."""

    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPartIn]
    name: str | None = None
    namespace: str | None = None


class McpCallIn(Lenient):
    """An `mcp_call` output item sent back (a client that keeps the conversation itself)."""

    type: Literal["mcp_call"]
    id: str
    server_label: str
    name: str
    arguments: str = ""
    output: str | None = None
    error: Any = None


class McpApprovalRequestIn(Lenient):
    type: Literal["mcp_approval_request"]
    id: str
    server_label: str
    name: str
    arguments: str = ""


class CompactionIn(Lenient):
    """A `compaction` item from /v1/responses/compact, sent back as input."""

    type: Literal["compaction"]
    encrypted_content: str


InputItem = (
    MessageIn
    | ReasoningIn
    | FunctionCallIn
    | CustomToolCallIn
    | ToolOutputIn
    | McpCallIn
    | McpApprovalRequestIn
    | CompactionIn
)


class FunctionToolIn(Lenient):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomToolIn(Lenient):
    type: Literal["custom"]
    name: str = Field(min_length=1)
    description: str | None = None
    format: dict[str, Any] | None = None


class NamespaceToolIn(Lenient):
    type: Literal["namespace"]
    name: str = Field(min_length=1)
    description: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)


class ReasoningParam(Lenient):
    effort: str | None = None
    summary: str | None = None
    max_tokens: int | None = Field(None, ge=1)  # OpenRouter-style budget, an extension


class TextParam(Lenient):
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class ResponsesRequest(Lenient):
    model: str = ""
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningParam | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None  # an extension: not in OpenAI's Responses API
    text: TextParam | None = None
    store: bool | None = None  # OpenAI's default is true
    stream: bool = False
    previous_response_id: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    truncation: str | None = None
    user: str | None = None
    max_tool_calls: int | None = Field(None, ge=1)  # server-run tool calls in one response
    background: bool | None = None  # only false: every response runs in its request
    service_tier: str | None = None  # one tier here: echoed as "default"
    safety_identifier: str | None = Field(None, max_length=64)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)


# --------------------------------------------------------------------------- output items

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ReasoningTextPart(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class OutputTextPart(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class SummaryTextPart(BaseModel):
    type: Literal["summary_text"] = "summary_text"
    text: str = ""


ReasoningEventNames = Literal["openai", "open-responses"]

ContentPart = Annotated[ReasoningTextPart | OutputTextPart, Field(discriminator="type")]


class ReasoningItem(BaseModel):
    """Chain of thought: raw `content` and/or `summary` (as the visibility policy allows).

    `summary` is always present: Codex drops the item without it.
    """

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryTextPart] = Field(default_factory=list)
    content: list[ReasoningTextPart] = Field(default_factory=list)
    status: ItemStatus = "in_progress"


class MessageItem(BaseModel):
    """Assistant text: the final answer, or a commentary preamble (`phase`)."""

    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputTextPart] = Field(default_factory=list)
    phase: Literal["commentary", "final_answer"] = "final_answer"


class _Call(BaseModel):
    namespace: str | None = None

    @model_serializer(mode="wrap")
    def _without_empty_namespace(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("namespace") is None:
            data.pop("namespace", None)
        return data


class FunctionCallItem(_Call):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: ItemStatus = "in_progress"


class CustomToolCallItem(_Call):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str = ""
    status: ItemStatus = "in_progress"


class McpListedTool(BaseModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)
    annotations: dict[str, Any] | None = None


class McpListToolsItem(BaseModel):
    """The tools of an MCP server this response offered the model (or why none)."""

    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    id: str
    server_label: str
    tools: list[McpListedTool] = Field(default_factory=list)
    error: str | None = None


McpCallStatus = Literal["in_progress", "completed", "incomplete", "calling", "failed"]


class McpCallItem(BaseModel):
    """A call of an MCP server's tool the server ran: arguments, then output or error."""

    type: Literal["mcp_call"] = "mcp_call"
    id: str
    server_label: str
    name: str
    arguments: str = ""
    output: str | None = None
    error: dict[str, Any] | None = None
    status: McpCallStatus = "in_progress"
    approval_request_id: str | None = None


class McpApprovalRequestItem(BaseModel):
    """A call the model made that waits for the user's approval (`mcp_approval_response`)."""

    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    id: str
    server_label: str
    name: str
    arguments: str = ""


class CodeInterpreterCallItem(BaseModel):
    """A run of the python tool (`code_interpreter`): the code, then what it printed."""

    type: Literal["code_interpreter_call"] = "code_interpreter_call"
    id: str
    code: str | None = None
    container_id: str = ""
    outputs: list[dict[str, Any]] | None = None
    status: Literal["in_progress", "completed", "incomplete", "interpreting", "failed"] = (
        "in_progress"
    )


class WebSearchCallItem(BaseModel):
    """A browser call (`web_search`): search, open_page or find_in_page."""

    type: Literal["web_search_call"] = "web_search_call"
    id: str
    action: dict[str, Any] = Field(default_factory=lambda: {"type": "search"})
    status: Literal["in_progress", "searching", "completed", "failed", "incomplete"] = "in_progress"


OutputItem = Annotated[
    ReasoningItem
    | MessageItem
    | FunctionCallItem
    | CustomToolCallItem
    | McpListToolsItem
    | McpCallItem
    | McpApprovalRequestItem
    | CodeInterpreterCallItem
    | WebSearchCallItem,
    Field(discriminator="type"),
]


# ------------------------------------------------------------------------------ response

ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class SummaryUsage(BaseModel):
    """The reasoning summaries' own tokens (an extension), not counted in the usage above."""

    summaries: int
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int
    summary_usage: SummaryUsage | None = None  # only when summaries were asked for

    @model_serializer(mode="wrap")
    def _without_empty_summary_usage(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("summary_usage") is None:
            data.pop("summary_usage", None)
        return data


class ResponseError(BaseModel):
    code: Literal["server_error"] = "server_error"
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(BaseModel):
    """The Response: in lifecycle events, as the non-streaming body, and in the store."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus = "in_progress"
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    parallel_tool_calls: bool = True
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    temperature: float = 1.0  # as sampled: the request's, or the server's default
    top_p: float = 1.0
    truncation: str = "disabled"
    store: bool = True
    prompt_cache_key: str | None = None
    # what Open Responses requires of every response object (the sampler applies no penalty)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    max_tool_calls: int | None = None
    background: bool = False
    service_tier: str = "default"
    safety_identifier: str | None = None
    user: str | None = None


# -------------------------------------------------------------------------------- events


class _Event(BaseModel):
    sequence_number: int


class _Lifecycle(_Event):
    response: ResponseObject


class ResponseCreated(_Lifecycle):
    type: Literal["response.created"] = "response.created"


class ResponseInProgress(_Lifecycle):
    type: Literal["response.in_progress"] = "response.in_progress"


class ResponseCompleted(_Lifecycle):
    type: Literal["response.completed"] = "response.completed"


class ResponseIncomplete(_Lifecycle):
    type: Literal["response.incomplete"] = "response.incomplete"


class ResponseFailed(_Lifecycle):
    type: Literal["response.failed"] = "response.failed"


class OutputItemAdded(_Event):
    type: Literal["response.output_item.added"] = "response.output_item.added"
    output_index: int
    item: OutputItem


class OutputItemDone(_Event):
    type: Literal["response.output_item.done"] = "response.output_item.done"
    output_index: int
    item: OutputItem


class _ItemEvent(_Event):
    item_id: str
    output_index: int


class ContentPartAdded(_ItemEvent):
    type: Literal["response.content_part.added"] = "response.content_part.added"
    content_index: int
    part: ContentPart


class ContentPartDone(_ItemEvent):
    type: Literal["response.content_part.done"] = "response.content_part.done"
    content_index: int
    part: ContentPart


class OutputTextDelta(_ItemEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class OutputTextDone(_ItemEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningTextDelta(_ItemEvent):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    content_index: int
    delta: str


class ReasoningTextDone(_ItemEvent):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    content_index: int
    text: str


class ReasoningDelta(_ItemEvent):
    """Open Responses' name for `response.reasoning_text.delta` (--responses-reasoning-events)."""

    type: Literal["response.reasoning.delta"] = "response.reasoning.delta"
    content_index: int
    delta: str


class ReasoningDone(_ItemEvent):
    """Open Responses' name for `response.reasoning_text.done`."""

    type: Literal["response.reasoning.done"] = "response.reasoning.done"
    content_index: int
    text: str


class ReasoningSummaryPartAdded(_ItemEvent):
    type: Literal["response.reasoning_summary_part.added"] = "response.reasoning_summary_part.added"
    summary_index: int
    part: SummaryTextPart


class ReasoningSummaryPartDone(_ItemEvent):
    type: Literal["response.reasoning_summary_part.done"] = "response.reasoning_summary_part.done"
    summary_index: int
    part: SummaryTextPart
    status: Literal["incomplete"] | None = None  # the summary was cut short


class ReasoningSummaryTextDelta(_ItemEvent):
    type: Literal["response.reasoning_summary_text.delta"] = "response.reasoning_summary_text.delta"
    summary_index: int
    delta: str


class ReasoningSummaryTextDone(_ItemEvent):
    type: Literal["response.reasoning_summary_text.done"] = "response.reasoning_summary_text.done"
    summary_index: int
    text: str


class FunctionCallArgumentsDelta(_ItemEvent):
    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta"
    )
    delta: str


class FunctionCallArgumentsDone(_ItemEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str


class CustomToolCallInputDelta(_ItemEvent):
    type: Literal["response.custom_tool_call_input.delta"] = "response.custom_tool_call_input.delta"
    delta: str


class CustomToolCallInputDone(_ItemEvent):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    input: str


class McpListToolsInProgress(_ItemEvent):
    type: Literal["response.mcp_list_tools.in_progress"] = "response.mcp_list_tools.in_progress"


class McpListToolsCompleted(_ItemEvent):
    type: Literal["response.mcp_list_tools.completed"] = "response.mcp_list_tools.completed"


class McpListToolsFailed(_ItemEvent):
    type: Literal["response.mcp_list_tools.failed"] = "response.mcp_list_tools.failed"


class McpCallInProgress(_ItemEvent):
    type: Literal["response.mcp_call.in_progress"] = "response.mcp_call.in_progress"


class McpCallCompleted(_ItemEvent):
    type: Literal["response.mcp_call.completed"] = "response.mcp_call.completed"


class McpCallFailed(_ItemEvent):
    type: Literal["response.mcp_call.failed"] = "response.mcp_call.failed"


class McpCallArgumentsDelta(_ItemEvent):
    type: Literal["response.mcp_call_arguments.delta"] = "response.mcp_call_arguments.delta"
    delta: str


class McpCallArgumentsDone(_ItemEvent):
    type: Literal["response.mcp_call_arguments.done"] = "response.mcp_call_arguments.done"
    arguments: str


class CodeInterpreterCallInProgress(_ItemEvent):
    type: Literal["response.code_interpreter_call.in_progress"] = (
        "response.code_interpreter_call.in_progress"
    )


class CodeInterpreterCallInterpreting(_ItemEvent):
    type: Literal["response.code_interpreter_call.interpreting"] = (
        "response.code_interpreter_call.interpreting"
    )


class CodeInterpreterCallCompleted(_ItemEvent):
    type: Literal["response.code_interpreter_call.completed"] = (
        "response.code_interpreter_call.completed"
    )


class CodeInterpreterCallCodeDelta(_ItemEvent):
    type: Literal["response.code_interpreter_call_code.delta"] = (
        "response.code_interpreter_call_code.delta"
    )
    delta: str


class CodeInterpreterCallCodeDone(_ItemEvent):
    type: Literal["response.code_interpreter_call_code.done"] = (
        "response.code_interpreter_call_code.done"
    )
    code: str


class WebSearchCallInProgress(_ItemEvent):
    type: Literal["response.web_search_call.in_progress"] = "response.web_search_call.in_progress"


class WebSearchCallSearching(_ItemEvent):
    type: Literal["response.web_search_call.searching"] = "response.web_search_call.searching"


class WebSearchCallCompleted(_ItemEvent):
    type: Literal["response.web_search_call.completed"] = "response.web_search_call.completed"


TerminalEvent = ResponseCompleted | ResponseIncomplete | ResponseFailed

StreamEvent = Annotated[
    ResponseCreated
    | ResponseInProgress
    | ResponseCompleted
    | ResponseIncomplete
    | ResponseFailed
    | OutputItemAdded
    | OutputItemDone
    | ContentPartAdded
    | ContentPartDone
    | OutputTextDelta
    | OutputTextDone
    | ReasoningTextDelta
    | ReasoningTextDone
    | ReasoningDelta
    | ReasoningDone
    | ReasoningSummaryPartAdded
    | ReasoningSummaryPartDone
    | ReasoningSummaryTextDelta
    | ReasoningSummaryTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | CustomToolCallInputDelta
    | CustomToolCallInputDone
    | McpListToolsInProgress
    | McpListToolsCompleted
    | McpListToolsFailed
    | McpCallInProgress
    | McpCallCompleted
    | McpCallFailed
    | McpCallArgumentsDelta
    | McpCallArgumentsDone
    | CodeInterpreterCallInProgress
    | CodeInterpreterCallInterpreting
    | CodeInterpreterCallCompleted
    | CodeInterpreterCallCodeDelta
    | CodeInterpreterCallCodeDone
    | WebSearchCallInProgress
    | WebSearchCallSearching
    | WebSearchCallCompleted,
    Field(discriminator="type"),
]


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputTokens(BaseModel):
    """POST /v1/responses/input_tokens: the prompt's length in tokens."""

    object: Literal["response.input_tokens"] = "response.input_tokens"
    input_tokens: int


class InputTextPart(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class UserMessageItem(BaseModel):
    """A user message the compaction kept, as input for the next request."""

    type: Literal["message"] = "message"
    id: str
    role: Literal["user"] = "user"
    status: Literal["completed"] = "completed"
    content: list[InputTextPart]


class CompactionItem(BaseModel):
    """What the compaction replaced: the model's summary of the conversation, opaque to clients
    (server.api.responses.compact encodes it); sent back as input, it continues from there."""

    type: Literal["compaction"] = "compaction"
    id: str
    encrypted_content: str


class CompactedResponse(BaseModel):
    """POST /v1/responses/compact: the conversation as a shorter item list, usable as input."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int
    output: list[UserMessageItem | CompactionItem]
    usage: ResponseUsage
