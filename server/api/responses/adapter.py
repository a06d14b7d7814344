"""Responses request -> Transcript + GenerationOptions, and generated calls -> Responses shapes.

The steps every API adapter has, by the same names: `reasoning_view`, `to_transcript`,
`generation_options`, and `WIRE_NAMES` for the core's errors; `to_conversation` is this API's
own (the conversation is stored for previous_response_id).

Input items become transcript items one for one: messages by role, one Reasoning per reasoning
item that carries raw text (summary-only items carry no chain of thought and are skipped),
function and custom tool calls, and their outputs. The developer and system messages at the
start of the conversation join `instructions` in harmony's single developer message; later ones
stay in place. Items of OpenAI's other types (hosted tool calls, item references) and hosted
tools are skipped with a log line; an item type OpenAI's API does not know is a 400.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any, cast

from pydantic import BaseModel

from server.api.request_fields import (
    clamp_effort,
    effort_for_budget,
    parse_as,
    text_of_parts,
    to_response_format,
    to_summary_style,
    to_tool_choice,
)
from server.api.responses.compact import summary_message
from server.api.responses.schemas import (
    CompactionIn,
    ContentPartIn,
    CustomToolCallIn,
    CustomToolIn,
    FunctionCallIn,
    FunctionToolIn,
    InputItem,
    McpApprovalRequestIn,
    McpCallIn,
    MessageIn,
    NamespaceToolIn,
    ReasoningIn,
    ResponsesRequest,
    ToolOutputIn,
)
from server.contracts.errors import InvalidRequest, RequestField
from server.contracts.events import SegmentEnd, SegmentKind, ToolOutput, ToolTarget
from server.contracts.transcript import (
    FUNCTIONS_NAMESPACE,
    AssistantChannel,
    AssistantMessage,
    DeveloperMessage,
    Item,
    Reasoning,
    ReasoningEffort,
    ToolCall,
    ToolGrammar,
    ToolResult,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.core.generation import GenerationOptions
from server.core.history import prompt_tokens
from server.core.visibility import ReasoningView, ReasoningVisibility, SummaryStyle, resolve_view

log = logging.getLogger(__name__)

_ITEM_MODELS: dict[str, type[BaseModel]] = {
    "message": MessageIn,
    "reasoning": ReasoningIn,
    "function_call": FunctionCallIn,
    "custom_tool_call": CustomToolCallIn,
    "function_call_output": ToolOutputIn,
    "custom_tool_call_output": ToolOutputIn,
    "mcp_call": McpCallIn,
    "mcp_approval_request": McpApprovalRequestIn,
    "compaction": CompactionIn,
}
# Every input item type of OpenAI's Responses API: those without a model above are skipped.
OPENAI_ITEM_TYPES = frozenset(
    {
        *_ITEM_MODELS,
        *("additional_tools", "apply_patch_call", "apply_patch_call_output"),
        *("code_interpreter_call", "compaction", "compaction_trigger", "computer_call"),
        *("computer_call_output", "configuration_update", "file_search_call"),
        *("image_generation_call", "item_reference", "local_shell_call"),
        *("local_shell_call_output", "mcp_approval_request", "mcp_approval_response"),
        *("mcp_call", "mcp_list_tools", "program", "program_output", "shell_call"),
        *("shell_call_output", "tool_search_call", "tool_search_output", "web_search_call"),
    }
)
USER_PARTS = ("input_text", "text", "output_text")
REASONING_PARTS = ("reasoning_text", "text")


WIRE_NAMES = {
    RequestField.CONVERSATION: "input",
    RequestField.MAX_TOKENS: "max_output_tokens",
    RequestField.TOOL_CHOICE: "tool_choice",
    RequestField.RESPONSE_FORMAT: "text.format",
    RequestField.REASONING: "reasoning",
}


def to_conversation(request: ResponsesRequest, earlier: Sequence[Item]) -> tuple[Item, ...]:
    """The `earlier` conversation (of previous_response_id) followed by this request's input.

    Leading developer messages included: this is what is stored with the response.
    """
    return (*earlier, *to_items(request.input, earlier))


def to_transcript(
    request: ResponsesRequest,
    conversation: Sequence[Item],
    default_effort: ReasoningEffort,
    date: str,
) -> Transcript:
    """The transcript of a conversation (see to_conversation) under this request's settings."""
    n_lead = next(
        (i for i, item in enumerate(conversation) if not isinstance(item, DeveloperMessage)),
        len(conversation),
    )
    lead = [item.text for item in conversation[:n_lead] if isinstance(item, DeveloperMessage)]
    instructions = "\n\n".join(text for text in (request.instructions, *lead) if text)
    text_format = request.text.format if request.text else None
    return Transcript(
        items=tuple(conversation[n_lead:]),
        instructions=instructions or None,
        tools=to_tools(request.tools or []),
        reasoning_effort=requested_effort(request) or default_effort,
        conversation_date=date,
        response_format=to_response_format(text_format, "text.format"),
    )


def requested_effort(request: ResponsesRequest) -> ReasoningEffort | None:
    reasoning = request.reasoning
    if reasoning is None:
        return None
    if reasoning.effort is not None:
        return clamp_effort(reasoning.effort, "reasoning.effort")
    if reasoning.max_tokens is not None:
        return effort_for_budget(reasoning.max_tokens)
    return None


def reasoning_view(request: ResponsesRequest, visibility: ReasoningVisibility) -> ReasoningView:
    """What of the reasoning this response shows: the server's policy, then `reasoning.summary`
    (auto | concise | detailed, or none / absent)."""
    summary = request.reasoning.summary if request.reasoning else None
    return resolve_view(visibility, to_summary_style(summary, "reasoning.summary"))


def generation_options(
    request: ResponsesRequest, summary: SummaryStyle | None = None
) -> GenerationOptions:
    return GenerationOptions(
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        tool_choice=to_tool_choice(request.tool_choice),
        reasoning_budget=request.reasoning.max_tokens if request.reasoning else None,
        summary=summary,
        logprobs=(request.top_logprobs or 0) if wants_logprobs(request) else None,
    )


LOGPROBS_INCLUDE = "message.output_text.logprobs"


def wants_logprobs(request: ResponsesRequest) -> bool:
    """`include: ["message.output_text.logprobs"]`, or `top_logprobs` given."""
    return LOGPROBS_INCLUDE in (request.include or []) or request.top_logprobs is not None


# ---------------------------------------------------------------------------------- tools


def to_tools(tools: Sequence[dict[str, Any]]) -> tuple[ToolSpec, ...]:
    """Function, custom and namespace tools; hosted tools are accepted and not offered."""
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "namespace":
            group = parse_as(NamespaceToolIn, tool, f"tools[{index}]")
            for inner_index, inner in enumerate(group.tools):
                param = f"tools[{index}].tools[{inner_index}]"
                spec = _tool_spec(inner, param, group.name, group.description or "")
                if spec is not None:
                    specs.append(spec)
            continue
        spec = _tool_spec(tool, f"tools[{index}]")
        if spec is not None:
            specs.append(spec)
    return tuple(specs)


def _tool_spec(
    tool: dict[str, Any], param: str, namespace: str = FUNCTIONS_NAMESPACE, group: str = ""
) -> ToolSpec | None:
    kind = tool.get("type")
    if kind == "function":
        function = parse_as(FunctionToolIn, tool, param)
        return ToolSpec(
            name=function.name,
            description=function.description or "",
            parameters=function.parameters,
            namespace=namespace,
            namespace_description=group,
            strict=function.strict,
        )
    if kind == "custom":
        custom = parse_as(CustomToolIn, tool, param)
        return ToolSpec(
            name=custom.name,
            description=custom.description or "",
            namespace=namespace,
            namespace_description=group,
            kind="custom",
            grammar=_tool_grammar(custom.format, param),
        )
    log.info("tool %s of type %r is not offered to the model (hosted or unknown)", param, kind)
    return None


def _tool_grammar(fmt: dict[str, Any] | None, param: str) -> ToolGrammar | None:
    """A custom tool's `format`: a Lark or regex grammar, or None for free text."""
    if not fmt or fmt.get("type", "text") == "text":
        return None
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if fmt.get("type") != "grammar" or syntax not in ("lark", "regex") or not definition:
        log.warning("%s.format %r is not a lark or regex grammar; the input is free text", param,
                    fmt.get("type"))  # fmt: skip
        return None
    if not isinstance(definition, str):
        raise InvalidRequest("the grammar's definition must be a string", param=f"{param}.format")
    return ToolGrammar(syntax=syntax, definition=definition)


def custom_input(arguments: str) -> str:
    """The raw input of a custom tool call: `{"input": "..."}` unwrapped, other text as is.

    A call cut short (by the output limit) is unwrapped as far as it was written, so the
    client sees the start of the input, not the JSON around it.
    """
    try:
        value = json.loads(arguments)
    except ValueError:
        return _written_input(arguments)
    if isinstance(value, dict) and isinstance(value.get("input"), str):
        return str(value["input"])
    return arguments


_INPUT_START = re.compile(r'\s*\{\s*"input"\s*:\s*"')
_LONGEST_ESCAPE = 6  # \uXXXX


def _written_input(arguments: str) -> str:
    """The input string of `{"input":"...` cut anywhere (an escape cut in half is dropped)."""
    start = _INPUT_START.match(arguments)
    if start is None:
        return arguments
    body = arguments[start.end() :]
    for end in range(len(body), max(len(body) - _LONGEST_ESCAPE, 0) - 1, -1):
        try:
            value = json.loads(f'"{body[:end]}"')
        except ValueError:
            continue
        return str(value)
    return arguments


def custom_arguments(raw_input: str) -> str:
    """What the model writes for a custom tool call with this input (the reverse of the above)."""
    return json.dumps({"input": raw_input}, ensure_ascii=False, separators=(",", ":"))


def output_items(
    ends: Sequence[SegmentEnd | ToolOutput], message_start: Sequence[int]
) -> list[Item]:
    """The generated messages as transcript items with their exact tokens (for the store), and
    the results of the tools the server ran between them.

    `message_start` is `<|start|>assistant`, which the first message of a completion lacks
    (the prompt ended with it); a final `<|return|>` becomes `<|end|>`, as in any later prompt.
    """
    items: list[Item] = []
    for end in ends:
        if isinstance(end, ToolOutput):
            target = end.target
            items.append(
                ToolResult(end.call_id, end.text, target.name, target.namespace, end.channel)
            )
            continue
        tokens = prompt_tokens(end.tokens, message_start) if end.complete else None
        if end.kind is SegmentKind.REASONING:
            items.append(Reasoning(end.text, tokens=tokens))
        elif end.kind is SegmentKind.TOOL_CALL:
            target = end.target or ToolTarget("")
            call_id = end.call_id or ""
            call = ToolCall(
                call_id, target.name, end.text, target.namespace, end.content_type, tokens
            )
            items.append(call)
        else:
            channel: AssistantChannel = (
                "commentary" if end.kind is SegmentKind.PREAMBLE else "final"
            )
            items.append(AssistantMessage(end.text, channel=channel, tokens=tokens))
    return items


# ---------------------------------------------------------------------------------- input


def to_items(value: str | list[dict[str, Any]], earlier: Sequence[Item] = ()) -> list[Item]:
    """Input items -> transcript items; tool outputs find their call in `earlier` or the input."""
    if isinstance(value, str):
        return [UserMessage(value)] if value else []
    calls = {item.call_id: item for item in earlier if isinstance(item, ToolCall)}
    items: list[Item] = []
    for index, parsed in _parsed_items(value):
        if isinstance(parsed, McpCallIn):  # a call the server ran, and its result
            call_id = call_id_of(parsed.id)
            call = ToolCall(call_id, parsed.name, parsed.arguments, parsed.server_label)
            items += [call, _mcp_result(parsed)]
            continue
        if isinstance(parsed, CompactionIn):  # a summary from /v1/responses/compact
            items.append(summary_message(parsed.encrypted_content, f"input[{index}]"))
            continue
        item = _item(parsed, f"input[{index}]", calls)
        if item is None:
            continue
        if isinstance(item, ToolCall):
            calls[item.call_id] = item
        items.append(item)
    return items


def _parsed_items(raw_items: list[dict[str, Any]]) -> list[tuple[int, InputItem]]:
    parsed: list[tuple[int, InputItem]] = []
    for index, raw in enumerate(raw_items):
        kind = raw.get("type", "message" if "role" in raw else None)
        model = _ITEM_MODELS.get(str(kind))
        if model is None:
            _check_known(kind, index)
            log.info("skipping input[%d]: items of type %r are not supported", index, kind)
            continue
        item = cast(InputItem, parse_as(model, raw, f"input[{index}]"))  # one of _ITEM_MODELS
        parsed.append((index, item))
    return parsed


def _check_known(kind: object, index: int) -> None:
    """Items of OpenAI's other types are skipped (hosted tools, references); others are errors."""
    if not isinstance(kind, str) or kind not in OPENAI_ITEM_TYPES:
        raise InvalidRequest(
            f"input[{index}]: unknown item type {kind!r}"
            if kind is not None
            else f"input[{index}] has neither a `type` nor a `role`",
            param=f"input[{index}].type",
            code="invalid_value",
        )


def _item(parsed: InputItem, param: str, calls: dict[str, ToolCall]) -> Item | None:
    if isinstance(parsed, MessageIn):
        return _message(parsed, param)
    if isinstance(parsed, ReasoningIn):
        texts = [part.text for part in parsed.content or [] if part.type in REASONING_PARTS]
        return Reasoning("\n".join(texts)) if texts else None  # summary only: no CoT
    if isinstance(parsed, FunctionCallIn):
        namespace = parsed.namespace or FUNCTIONS_NAMESPACE
        return ToolCall(parsed.call_id, parsed.name, parsed.arguments, namespace=namespace)
    if isinstance(parsed, CustomToolCallIn):
        namespace = parsed.namespace or FUNCTIONS_NAMESPACE
        arguments = custom_arguments(parsed.input)
        return ToolCall(parsed.call_id, parsed.name, arguments, namespace=namespace)
    if isinstance(parsed, McpApprovalRequestIn):  # the call that waits for approval
        call_id = call_id_of(parsed.id)
        return ToolCall(call_id, parsed.name, parsed.arguments, namespace=parsed.server_label)
    assert isinstance(parsed, ToolOutputIn)
    return _tool_result(parsed, param, calls)


def approval_request_id(call_id: str) -> str:
    """The unsigned head of the id of call `call_id`'s approval request (`call_X` ->
    `mcpr_X`; the signature follows it: api/responses/mcp.py's ApprovalIds)."""
    return "mcpr_" + call_id.removeprefix("call_")


def call_id_of(item_id: str) -> str:
    """The call an approval request's (`mcpr_X_<signature>`, api/responses/mcp.py's
    ApprovalIds) or an MCP call's (`mcp_X`) id names."""
    if item_id.startswith("mcpr_"):
        return "call_" + item_id.removeprefix("mcpr_").partition("_")[0]
    if item_id.startswith("mcp_"):
        return "call_" + item_id.removeprefix("mcp_")
    return item_id


def mcp_call_id(call_id: str) -> str:
    """The id of the `mcp_call` item of a call the server ran (`call_X` -> `mcp_X`)."""
    return "mcp_" + call_id.removeprefix("call_")


def _mcp_result(call: McpCallIn) -> ToolResult:
    """What the model read of an MCP call's result: its output, or its error."""
    if call.output is not None:
        text = call.output
    elif isinstance(call.error, dict) and isinstance(call.error.get("message"), str):
        text = call.error["message"]
    else:
        text = json.dumps(call.error) if call.error is not None else ""
    return ToolResult(call_id_of(call.id), text, call.name, call.server_label)


def _message(message: MessageIn, param: str) -> Item:
    if message.role == "assistant":
        channel: AssistantChannel = "commentary" if message.phase == "commentary" else "final"
        return AssistantMessage(_assistant_text(message.content), channel=channel)
    content = message.content
    text = content if isinstance(content, str) else text_of_parts(content, USER_PARTS, param)
    if message.role == "user":
        return UserMessage(text)
    return DeveloperMessage(text)


def _assistant_text(content: str | list[ContentPartIn]) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.text or part.refusal or "" for part in content)


def _tool_result(output: ToolOutputIn, param: str, calls: dict[str, ToolCall]) -> ToolResult:
    call = calls.get(output.call_id)
    name = call.name if call is not None else output.name
    if name is None:
        raise InvalidRequest(
            f"{output.type} {output.call_id!r} matches no earlier tool call",
            param=f"{param}.call_id",
        )
    namespace = call.namespace if call is not None else output.namespace or FUNCTIONS_NAMESPACE
    return ToolResult(output.call_id, _output_text(output.output), name, namespace=namespace)


def _output_text(output: str | list[ContentPartIn]) -> str:
    if isinstance(output, str):
        return output
    texts = []
    for part in output:
        if part.text is not None:
            texts.append(part.text)
        else:
            log.info("a tool output part of type %r was left out: gpt-oss reads text", part.type)
            texts.append(f"[{part.type} omitted]")
    return "\n".join(texts)
