"""Render a Transcript into the harmony prompt token ids. Pure: same transcript, same tokens.

The prompt is the system and developer messages (rendered together so harmony adds its
conversation-level lines), then each conversation item as its own harmony message, then
`<|start|>assistant`. Items that carry the exact tokens the model sampled are replayed as those
tokens. Chain of thought follows harmony's rule: analysis written before the last final answer
is dropped; the analysis of the current, unfinished tool-call chain is kept.

Renders are remembered (least recently used dropped): the system and developer messages, which a
client sends the same on every turn (Codex's instructions and tools take ≈ 6 ms to render), and
each rendered item, so a turn renders only what is new.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
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


# Tokens remembered per encoding (items keep their text too: some tens of MB in all)
HEADS_KEPT = 1 << 20  # of system + developer renders
ITEMS_KEPT = 1 << 21  # of item renders


class _Renders:
    """Least recently used renders of one encoding, up to a number of tokens in all; any
    thread may use it."""

    def __init__(self, max_tokens: int) -> None:
        self._max_tokens = max_tokens
        self._n_tokens = 0
        self._tokens: OrderedDict[Hashable, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], list[int]]) -> tuple[int, ...]:
        with self._lock:
            tokens = self._tokens.get(key)
            if tokens is not None:
                self._tokens.move_to_end(key)
                return tokens
        tokens = tuple(make())
        with self._lock:
            if key not in self._tokens and len(tokens) <= self._max_tokens:
                self._tokens[key] = tokens
                self._n_tokens += len(tokens)
            while self._n_tokens > self._max_tokens:
                self._n_tokens -= len(self._tokens.popitem(last=False)[1])
        return tokens


@dataclass(frozen=True, slots=True)
class _Memory:
    """What is remembered for one encoding."""

    heads: _Renders
    items: _Renders
    assistant_start: tuple[int, ...]  # encoding it costs ≈ 0.1 ms (the specials are looked up)


_MEMORY: weakref.WeakKeyDictionary[HarmonyEncoding, _Memory] = weakref.WeakKeyDictionary()


def _memory(encoding: HarmonyEncoding) -> _Memory:
    memory = _MEMORY.get(encoding)
    if memory is None:
        start = encoding.encode("<|start|>assistant", allowed_special="all")
        fresh = _Memory(_Renders(HEADS_KEPT), _Renders(ITEMS_KEPT), tuple(start))
        memory = _MEMORY.setdefault(encoding, fresh)
    return memory


def render(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
    """The prompt token ids for the assistant's next message."""
    memory = _memory(encoding)
    head = memory.heads.get(_head_key(transcript), lambda: _head(encoding, transcript))
    prompt_tokens = list(head)
    for item in visible_items(transcript.items):
        prompt_tokens.extend(item_tokens(encoding, item))
    prompt_tokens.extend(memory.assistant_start)
    return prompt_tokens


def _head(encoding: HarmonyEncoding, transcript: Transcript) -> list[int]:
    """The system and developer messages (with the response format section)."""
    head = [_system_message(transcript)]
    developer = _developer_message(transcript)
    if developer is not None:
        head.append(developer)
    tokens = encoding.render_conversation(Conversation.from_messages(head), _NO_AUTO_DROP)
    if transcript.response_format is not None:
        tokens = _with_response_format(encoding, tokens, transcript.response_format)
    return tokens


def _head_key(transcript: Transcript) -> Hashable:
    """What the system and developer messages are rendered from (tool schemas as JSON, in
    their own key order: the render follows it)."""
    tools = [
        (s.name, s.description, s.parameters, s.namespace, s.namespace_description, s.kind)
        for s in transcript.tools
    ]
    response_format = transcript.response_format
    return (
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
    return list(_memory(encoding).assistant_start)


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
    if isinstance(item, (Reasoning, AssistantMessage, ToolCall)) and item.tokens:
        return list(item.tokens)
    return list(_memory(encoding).items.get(item, lambda: _rendered_item(encoding, item)))


def _rendered_item(encoding: HarmonyEncoding, item: Item) -> list[int]:
    return encoding.render(_item_message(item))


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
    result = Message.from_author_and_content(Author.new(Role.TOOL, item.author), item.output)
    return result.with_channel("commentary").with_recipient("assistant")


def _system_message(transcript: Transcript) -> Message:
    content = SystemContent.new().with_reasoning_effort(_EFFORTS[transcript.reasoning_effort])
    if transcript.conversation_date:
        content = content.with_conversation_start_date(transcript.conversation_date)
    return Message.from_role_and_content(Role.SYSTEM, content)


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
    encoding: HarmonyEncoding, head_tokens: list[int], response_format: ResponseFormat
) -> list[int]:
    """Append harmony's `# Response Formats` section to the developer message.

    openai-harmony has no API for it, so the developer message's content is re-encoded with the
    section at its end, as ordinary text (exactly as harmony encodes message content).
    """
    start = len(head_tokens) - 1 - head_tokens[::-1].index(MESSAGE)
    content = encoding.decode_utf8(head_tokens[start + 1 : -1])
    schema = response_format.schema if response_format.kind == "json_schema" else {"type": "object"}
    description = response_format.description or "Respond with JSON that matches this schema."
    section = (
        f"# Response Formats\n\n## {response_format.name}\n\n// {description}\n"
        f"{json.dumps(schema, separators=(',', ':'))}"
    )
    text = f"{content}\n\n{section}" if content else section
    body = encoding.encode(text, disallowed_special=())
    return [*head_tokens[: start + 1], *body, head_tokens[-1]]


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
