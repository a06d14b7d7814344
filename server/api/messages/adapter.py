"""Anthropic Messages request -> the neutral Transcript and GenerationOptions.

The steps every API adapter has, by the same names: `reasoning_view`, `to_transcript`,
`generation_options`, and `WIRE_NAMES` for the core's errors.

`system` (a string or text blocks) becomes the developer instructions; a message of role `system`
(Claude Code sends them mid-conversation) a developer message in place. Each message's content
blocks become transcript items in order: user `text` (consecutive blocks joined) and
`tool_result` (matched to an earlier `tool_use` by id; `is_error` marks the output); assistant
`thinking` (its signature may restore the exact sampled tokens, see signature.py), `text`
(a commentary preamble when a `tool_use` follows it in the same message, else a final answer) and
`tool_use`. Images and documents are refused (gpt-oss reads text); `redacted_thinking` carries
nothing this server can read and is skipped.

Tool-use ids: the core names calls `call_<hex>`, this API `toolu_<hex>`; the two are mapped both
ways, so the history finds a call (and the reasoning before it) by the id the client sends back.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal, cast

from pydantic import BaseModel

from server.api.messages.schemas import (
    BlockIn,
    CountTokensRequest,
    MessageIn,
    MessagesRequest,
    RedactedThinkingBlockIn,
    TextBlockIn,
    ThinkingBlockIn,
    ToolIn,
    ToolResultBlockIn,
    ToolUseBlockIn,
)
from server.api.messages.signature import ThinkingSigner
from server.api.request_fields import clamp_effort, effort_for_budget, parse_as, to_response_format
from server.contracts.errors import InvalidRequest, RequestField
from server.contracts.transcript import (
    AssistantChannel,
    AssistantMessage,
    DeveloperMessage,
    Item,
    Reasoning,
    ReasoningEffort,
    ToolCall,
    ToolChoice,
    ToolResult,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.core.generation import GenerationOptions
from server.core.visibility import ReasoningView, ReasoningVisibility, SummaryStyle, resolve_view

log = logging.getLogger(__name__)

WIRE_NAMES = {
    RequestField.CONVERSATION: "messages",
    RequestField.MAX_TOKENS: "max_tokens",
    RequestField.TOOL_CHOICE: "tool_choice",
    RequestField.RESPONSE_FORMAT: "output_config.format",
    RequestField.REASONING: "thinking.budget_tokens",
}
TOOL_USE_PREFIX = "toolu_"
CALL_PREFIX = "call_"
_BLOCK_MODELS: dict[str, type[BaseModel]] = {
    "text": TextBlockIn,
    "tool_use": ToolUseBlockIn,
    "tool_result": ToolResultBlockIn,
    "thinking": ThinkingBlockIn,
    "redacted_thinking": RedactedThinkingBlockIn,
}
_ROLE_BLOCKS = {
    "system": frozenset({"text"}),
    "user": frozenset({"text", "tool_result"}),
    "assistant": frozenset({"text", "tool_use", "thinking", "redacted_thinking"}),
}
_NOT_TEXT = frozenset({"image", "document", "search_result", "container_upload"})


def tool_use_id(call_id: str) -> str:
    """The id a generated call carries on this API: `call_<hex>` -> `toolu_<hex>`."""
    if call_id.startswith(CALL_PREFIX):
        return TOOL_USE_PREFIX + call_id[len(CALL_PREFIX) :]
    return call_id


def call_id(tool_use: str) -> str:
    """The core's call id of a tool-use id (the reverse of `tool_use_id`)."""
    if tool_use.startswith(TOOL_USE_PREFIX):
        return CALL_PREFIX + tool_use[len(TOOL_USE_PREFIX) :]
    return tool_use


def thinking_requested(request: CountTokensRequest) -> bool:
    """Whether the client asked for thinking blocks (`thinking` enabled or adaptive)."""
    return request.thinking is not None and request.thinking.type != "disabled"


def thinking_text_shown(request: CountTokensRequest) -> bool:
    """False when the client asked for thinking blocks without their text (`display: omitted`)."""
    return request.thinking is None or request.thinking.display != "omitted"


def reasoning_view(request: CountTokensRequest, visibility: ReasoningVisibility) -> ReasoningView:
    """What of the reasoning this message shows: the server's policy, then `thinking`.

    Without thinking asked for (absent or disabled), no thinking blocks are sent, as Anthropic's
    API does; the reasoning is still kept server-side for the tool loop.
    """
    return resolve_view(visibility, None, exclude=not thinking_requested(request))


def to_transcript(
    request: CountTokensRequest,
    default_effort: ReasoningEffort,
    date: str,
    signer: ThinkingSigner,
) -> Transcript:
    """The neutral transcript of a Messages request."""
    items: list[Item] = []
    calls: dict[str, ToolCall] = {}
    for index, message in enumerate(request.messages):
        items.extend(_items(message, f"messages.{index}", calls, signer))
    output_format = request.output_config.format if request.output_config else None
    return Transcript(
        items=tuple(items),
        instructions=_system(request.system) or None,
        tools=to_tools(request.tools or []),
        reasoning_effort=requested_effort(request) or default_effort,
        conversation_date=date,
        response_format=to_response_format(output_format, "output_config.format"),
    )


def generation_options(
    request: MessagesRequest, summary: SummaryStyle | None = None
) -> GenerationOptions:
    thinking = request.thinking
    budget = thinking.budget_tokens if thinking and thinking.type == "enabled" else None
    return GenerationOptions(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        tool_choice=to_tool_choice(request.tool_choice),
        reasoning_budget=budget,
        stop=tuple(request.stop_sequences or ()),
        summary=summary,
    )


def requested_effort(request: CountTokensRequest) -> ReasoningEffort | None:
    """`output_config.effort` first; else `thinking`: a budget's effort, `disabled` -> low."""
    config = request.output_config
    if config is not None and config.effort is not None:
        return clamp_effort(config.effort, "output_config.effort")
    thinking = request.thinking
    if thinking is None:
        return None
    if thinking.type == "disabled":
        return "low"
    if thinking.type == "enabled" and thinking.budget_tokens is not None:
        return effort_for_budget(thinking.budget_tokens)
    return None


def to_tool_choice(value: dict[str, Any] | None) -> ToolChoice:
    """`auto | any | tool (name) | none`; `disable_parallel_tool_use` is accepted (gpt-oss makes
    one call per turn)."""
    if value is None:
        return ToolChoice()
    kind = value.get("type")
    if kind in ("auto", "none"):
        return ToolChoice(mode="auto" if kind == "auto" else "none")
    if kind == "any":
        return ToolChoice(mode="required")
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("tool_choice of type tool needs a `name`", param="tool_choice")
        return ToolChoice(mode="named", name=name)
    raise InvalidRequest(
        f"tool_choice.type must be one of auto, any, tool, none, not {kind!r}",
        param="tool_choice.type",
    )


def to_tools(tools: list[dict[str, Any]]) -> tuple[ToolSpec, ...]:
    """Client tools (with `input_schema`); Anthropic's server and built-in tools are not offered."""
    specs: list[ToolSpec] = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind not in (None, "custom") or "input_schema" not in tool:
            log.info(
                "tools.%d of type %r is not offered to the model (no input_schema)", index, kind
            )
            continue
        parsed: ToolIn = parse_as(ToolIn, tool, f"tools.{index}")
        specs.append(
            ToolSpec(
                name=parsed.name,
                description=parsed.description or "",
                parameters=parsed.input_schema,
            )
        )
    return tuple(specs)


def tool_arguments(value: dict[str, Any]) -> str:
    """A tool_use block's `input` as the JSON text the model writes (compact)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------- messages


def _system(system: str | list[dict[str, Any]] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for index, block in enumerate(system):
        if block.get("type") != "text":
            raise InvalidRequest(
                f"system.{index}: system blocks must be text blocks, not {block.get('type')!r}",
                param=f"system.{index}.type",
            )
        texts.append(parse_as(TextBlockIn, block, f"system.{index}").text)
    return "\n\n".join(texts)


def _items(
    message: MessageIn, param: str, calls: dict[str, ToolCall], signer: ThinkingSigner
) -> list[Item]:
    if isinstance(message.content, str):
        if message.role == "user":
            return [UserMessage(message.content)]
        if message.role == "system":
            return [DeveloperMessage(message.content)] if message.content else []
        return [AssistantMessage(message.content)] if message.content else []
    blocks = [
        (f"{param}.content.{i}", _block(raw, message.role, f"{param}.content.{i}"))
        for i, raw in enumerate(message.content)
    ]
    if message.role == "system":
        text = "\n".join(block.text for _, block in blocks if isinstance(block, TextBlockIn))
        return [DeveloperMessage(text)] if text else []
    if message.role == "user":
        return _user_items(blocks, calls)
    return _assistant_items(blocks, calls, signer)


def _block(
    raw: dict[str, Any], role: Literal["user", "assistant", "system"], param: str
) -> BlockIn:
    kind = raw.get("type")
    if kind in _NOT_TEXT:
        raise InvalidRequest(
            f"{param}: content blocks of type {kind!r} are not supported: gpt-oss reads text only",
            param=f"{param}.type",
        )
    model = _BLOCK_MODELS.get(str(kind))
    if model is None or kind not in _ROLE_BLOCKS[role]:
        where = "unknown content block type" if model is None else f"{role} messages cannot hold"
        raise InvalidRequest(f"{param}: {where} {kind!r}", param=f"{param}.type")
    return cast(BlockIn, parse_as(model, raw, param))  # one of _BLOCK_MODELS


def _user_items(blocks: list[tuple[str, BlockIn]], calls: dict[str, ToolCall]) -> list[Item]:
    items: list[Item] = []
    texts: list[str] = []
    for param, block in blocks:
        if isinstance(block, TextBlockIn):
            texts.append(block.text)
            continue
        if texts:
            items.append(UserMessage("\n".join(texts)))
            texts = []
        assert isinstance(block, ToolResultBlockIn)
        items.append(_tool_result(block, param, calls))
    if texts:
        items.append(UserMessage("\n".join(texts)))
    return items


def _assistant_items(
    blocks: list[tuple[str, BlockIn]], calls: dict[str, ToolCall], signer: ThinkingSigner
) -> list[Item]:
    items: list[Item] = []
    last_call = max(
        (i for i, (_, b) in enumerate(blocks) if isinstance(b, ToolUseBlockIn)), default=-1
    )
    for position, (_, block) in enumerate(blocks):
        if isinstance(block, ThinkingBlockIn):
            tokens = signer.tokens(block.thinking, block.signature)
            if block.thinking or tokens:  # an omitted text without tokens renders nothing
                items.append(Reasoning(block.thinking, tokens=tokens))
        elif isinstance(block, TextBlockIn):
            if block.text:
                channel: AssistantChannel = "commentary" if position < last_call else "final"
                items.append(AssistantMessage(block.text, channel=channel))
        elif isinstance(block, ToolUseBlockIn):
            call = ToolCall(call_id(block.id), block.name, tool_arguments(block.input))
            calls[block.id] = call
            items.append(call)
        else:
            log.info("a redacted_thinking block was skipped: it carries no readable reasoning")
    return items


def _tool_result(block: ToolResultBlockIn, param: str, calls: dict[str, ToolCall]) -> ToolResult:
    call = calls.get(block.tool_use_id)
    if call is None:
        raise InvalidRequest(
            f"{param}: tool_result {block.tool_use_id!r} matches no earlier tool_use block",
            param=f"{param}.tool_use_id",
        )
    output = _result_text(block.content)
    if block.is_error:
        output = f"Error: {output}" if output else "Error"
    return ToolResult(call.call_id, output, call.name, namespace=call.namespace)


def _result_text(content: str | list[dict[str, Any]] | None) -> str:
    """A tool result's text; parts that are not text are named, not sent (gpt-oss reads text)."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind = part.get("type")
        text = part.get("text")
        if kind == "text" and isinstance(text, str):
            texts.append(text)
        else:
            log.info("a tool_result part of type %r was left out: gpt-oss reads text", kind)
            texts.append(f"[{kind} omitted]")
    return "\n".join(texts)
