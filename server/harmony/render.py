"""Render a Transcript into the harmony prompt token ids. Pure: same transcript, same tokens.

The prompt is the system and developer messages (rendered together so harmony adds its
conversation-level lines), then each conversation item as its own harmony message, then
`<|start|>assistant`. Items that carry the exact tokens the model sampled are replayed as those
tokens. Chain of thought follows harmony's rule: analysis written before the last final answer
is dropped; the analysis of the current, unfinished tool-call chain is kept.

`head_key` names what the system and developer messages are rendered from, for renderer.py,
which remembers renders across requests.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from itertools import groupby

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from server.contracts.transcript import (
    FUNCTIONS_NAMESPACE,
    AssistantMessage,
    BuiltinTool,
    DeveloperMessage,
    Item,
    Reasoning,
    ResponseFormat,
    ToolCall,
    ToolSpec,
    Transcript,
    UserMessage,
)
from server.harmony.tokens import MESSAGE

_NO_AUTO_DROP = RenderConversationConfig(auto_drop_analysis=False)

# A freeform (custom) tool takes raw text; harmony only knows JSON-argument functions, so the
# model sees one string parameter and its calls carry {"input": "..."}.
FREEFORM_PARAMETERS = {
    "type": "object",
    "properties": {
        "input": {
            "type": "string",
            "description": "The tool's raw text input, exactly as its description asks for it "
            "(passed on unchanged, never parsed as JSON).",
        }
    },
    "required": ["input"],
}
_EFFORTS = {
    "low": ReasoningEffort.LOW,
    "medium": ReasoningEffort.MEDIUM,
    "high": ReasoningEffort.HIGH,
}


def render(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
    """The prompt token ids for the assistant's next message."""
    prompt_tokens = head_tokens(encoding, transcript)
    for item in visible_items(transcript.items):
        prompt_tokens.extend(item_tokens(encoding, item))
    prompt_tokens.extend(assistant_start_tokens(encoding))
    return prompt_tokens


def head_tokens(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
    """The system and developer messages (with the response format section)."""
    head = [_system_message(transcript)]
    developer = _developer_message(transcript)
    if developer is not None:
        head.append(developer)
    tokens = encoding.render_conversation(Conversation.from_messages(head), _NO_AUTO_DROP)
    if transcript.response_format is not None:
        tokens = _with_response_format(encoding, tokens, transcript.response_format)
    return tokens


def head_key(transcript: Transcript) -> Hashable:
    """What the system and developer messages are rendered from (tool schemas as JSON, in
    their own key order: the render follows it)."""
    tools = [
        (s.name, s.description, s.parameters, s.namespace, s.namespace_description, s.kind)
        for s in transcript.tools
    ]
    response_format = transcript.response_format
    return (
        transcript.builtin_tools,
        transcript.reasoning_effort,
        transcript.conversation_date,
        transcript.instructions,
        json.dumps(tools),
        None
        if response_format is None
        else json.dumps(
            [
                response_format.kind,
                response_format.name,
                response_format.schema,
                response_format.description,
            ]
        ),
    )


def assistant_start_tokens(encoding: HarmonyEncoding) -> list[int]:
    """`<|start|>assistant`: the prompt's last tokens, after which the model writes."""
    return encoding.encode("<|start|>assistant", allowed_special="all")


def visible_items(items: Sequence[Item]) -> list[Item]:
    """Apply harmony's CoT rule: drop reasoning that precedes the last final answer."""
    last_final = max(
        (i for i, item in enumerate(items) if _is_final(item)),
        default=-1,
    )
    return [
        item for i, item in enumerate(items) if not (isinstance(item, Reasoning) and i < last_final)
    ]


def item_tokens(encoding: HarmonyEncoding, item: Item) -> list[int]:
    """One conversation item as harmony tokens: its exact sampled tokens, or its render."""
    replayed = exact_tokens(item)
    return list(replayed) if replayed is not None else encoding.render(_item_message(item))


def exact_tokens(item: Item) -> tuple[int, ...] | None:
    """The tokens the model sampled for an item, when it carries them."""
    if isinstance(item, (Reasoning, AssistantMessage, ToolCall)) and item.tokens:
        return item.tokens
    return None


def _is_final(item: Item) -> bool:
    return isinstance(item, AssistantMessage) and item.channel == "final"


def _item_message(item: Item) -> Message:
    if isinstance(item, UserMessage):
        return Message.from_role_and_content(Role.USER, item.text)
    if isinstance(item, DeveloperMessage):
        return Message.from_role_and_content(Role.DEVELOPER, item.text)
    if isinstance(item, Reasoning):
        return Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel("analysis")
    if isinstance(item, AssistantMessage):
        return Message.from_role_and_content(Role.ASSISTANT, item.text).with_channel(item.channel)
    if isinstance(item, ToolCall):
        call = Message.from_role_and_content(Role.ASSISTANT, item.arguments)
        call = call.with_channel("commentary").with_recipient(item.recipient)
        return call.with_content_type(item.content_type) if item.content_type else call
    return _tool_message(item.author, item.output, item.channel)


def tool_message_tokens(
    encoding: HarmonyEncoding, author: str, text: str, channel: str = "commentary"
) -> list[int]:
    """A tool's result message (`<|start|>{author} to=assistant<|channel|>{channel}...`), as
    a ToolResult item of that author renders: what a server-run tool's output appends. A
    built-in tool answers on its call's channel (python's calls are on analysis), as gpt-oss's
    reference tools do."""
    return encoding.render(_tool_message(author, text, channel))


def _tool_message(author: str, text: str, channel: str = "commentary") -> Message:
    result = Message.from_author_and_content(Author.new(Role.TOOL, author), text)
    return result.with_channel(channel).with_recipient("assistant")


def _system_message(transcript: Transcript) -> Message:
    content = SystemContent.new().with_reasoning_effort(_EFFORTS[transcript.reasoning_effort])
    if transcript.conversation_date:
        content = content.with_conversation_start_date(transcript.conversation_date)
    for builtin in transcript.builtin_tools:
        content = content.with_tools(_builtin_namespace(builtin))
    return Message.from_role_and_content(Role.SYSTEM, content)


def _builtin_namespace(builtin: BuiltinTool) -> ToolNamespaceConfig:
    """harmony's own namespace of a built-in tool (its functions, for the browser), with the
    server's description when it has one."""
    if builtin.name == "python":
        config = ToolNamespaceConfig.python()
    else:
        config = ToolNamespaceConfig.browser()
    if not builtin.description:
        return config
    return config.model_copy(update={"description": builtin.description})


def _developer_message(transcript: Transcript) -> Message | None:
    if not transcript.instructions and not transcript.tools and not transcript.response_format:
        return None
    content = DeveloperContent.new()
    if transcript.instructions:
        content = content.with_instructions(transcript.instructions)
    for namespace, specs in _by_namespace(transcript.tools):
        tools = [_tool_description(spec) for spec in specs]
        if namespace == FUNCTIONS_NAMESPACE:
            content = content.with_function_tools(tools)
        else:
            config = ToolNamespaceConfig(
                name=namespace, description=specs[0].namespace_description or None, tools=tools
            )
            content = content.with_tools(config)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _with_response_format(
    encoding: HarmonyEncoding, head: list[int], response_format: ResponseFormat
) -> list[int]:
    """Append harmony's `# Response Formats` section to the developer message.

    openai-harmony has no API for it, so the developer message's content is re-encoded with the
    section at its end, as ordinary text (exactly as harmony encodes message content).
    """
    start = len(head) - 1 - head[::-1].index(MESSAGE)
    content = encoding.decode_utf8(head[start + 1 : -1])
    schema = response_format.schema if response_format.kind == "json_schema" else {"type": "object"}
    description = response_format.description or "Respond with JSON that matches this schema."
    section = (
        f"# Response Formats\n\n## {response_format.name}\n\n// {description}\n"
        f"{json.dumps(schema, separators=(',', ':'))}"
    )
    text = f"{content}\n\n{section}" if content else section
    body = encoding.encode(text, disallowed_special=())
    return [*head[: start + 1], *body, head[-1]]


def _by_namespace(tools: Sequence[ToolSpec]) -> list[tuple[str, list[ToolSpec]]]:
    """Tools grouped by namespace, `functions` first, other namespaces in order of appearance."""
    order = {FUNCTIONS_NAMESPACE: -1}
    for spec in tools:
        order.setdefault(spec.namespace, len(order))
    ranked = sorted(tools, key=lambda spec: order[spec.namespace])
    return [(ns, list(group)) for ns, group in groupby(ranked, key=lambda spec: spec.namespace)]


def _tool_description(spec: ToolSpec) -> ToolDescription:
    parameters = spec.parameters if spec.kind == "function" else FREEFORM_PARAMETERS
    return ToolDescription.new(spec.name, spec.description, parameters=parameters)
