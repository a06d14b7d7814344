"""Transcript: the API-neutral request side. Chat and Responses adapters build it; render reads it.

A transcript is the developer's instructions, the tools offered, the reasoning effort, and the
conversation as an ordered list of items. Items that this server generated may carry the exact
token ids the model sampled, so rendering can replay them instead of re-encoding text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

ReasoningEffort = Literal["low", "medium", "high"]
AssistantChannel = Literal["final", "commentary"]
ToolKind = Literal["function", "custom"]

FUNCTIONS_NAMESPACE = "functions"
JSON_CONTENT_TYPE = "<|constrain|>json"
BARE_TOOLS = frozenset({"python"})  # built-in tools the model addresses by the bare name


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    """A custom tool's input language: `format: {type: grammar, syntax, definition}`."""

    syntax: Literal["lark", "regex"]
    definition: str


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool offered to the model, rendered in the developer message's `# Tools` section.

    A `custom` (freeform) tool takes raw text; the model sees it as a function with a single
    string parameter `input`.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments; None = no arguments
    namespace: str = FUNCTIONS_NAMESPACE
    namespace_description: str = ""
    kind: ToolKind = "function"
    strict: bool | None = None  # arguments must follow `parameters`; None: the server decides
    grammar: ToolGrammar | None = None  # a custom tool's input language; None: free text

    @property
    def recipient(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class BuiltinTool:
    """One of harmony's built-in tools (`python`, `browser`), rendered in the system message
    as gpt-oss was trained with it; `description` replaces harmony's default text when given
    (the server's own facts: timeout, network)."""

    name: Literal["python", "browser"]
    description: str = ""


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """Structured output for the final answer: `json_object`, or `json_schema` with a schema."""

    kind: Literal["json_object", "json_schema"]
    name: str = "response"
    schema: dict[str, Any] | None = None
    description: str = ""
    strict: bool = False


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """Whether the model may, must, or must not call a tool (`named`: that one tool)."""

    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None
    namespace: str = FUNCTIONS_NAMESPACE


@dataclass(frozen=True, slots=True)
class UserMessage:
    text: str


@dataclass(frozen=True, slots=True)
class DeveloperMessage:
    """A developer or system message in the middle of a conversation."""

    text: str


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Chain of thought the model wrote earlier (harmony channel analysis)."""

    text: str
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class AssistantMessage:
    """Assistant text: a final answer, or a commentary preamble shown to the user."""

    text: str
    channel: AssistantChannel = "final"
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made: commentary message addressed to `namespace.name`."""

    call_id: str
    name: str
    arguments: str
    namespace: str = FUNCTIONS_NAMESPACE
    content_type: str | None = JSON_CONTENT_TYPE
    tokens: tuple[int, ...] | None = None

    @property
    def recipient(self) -> str:
        return address(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The output of a tool call, authored by the tool."""

    call_id: str
    output: str
    name: str
    namespace: str = FUNCTIONS_NAMESPACE
    channel: str = "commentary"  # a built-in tool answers on its call's channel (python: analysis)

    @property
    def author(self) -> str:
        return address(self.namespace, self.name)


def address(namespace: str, name: str) -> str:
    """How harmony names a tool: `namespace.name`; harmony's `python`, addressed by the bare
    name (its namespace and its only tool share it), keeps the bare name."""
    return name if namespace == name and name in BARE_TOOLS else f"{namespace}.{name}"


Item = UserMessage | DeveloperMessage | Reasoning | AssistantMessage | ToolCall | ToolResult


@dataclass(frozen=True, slots=True)
class Transcript:
    """Everything the prompt is rendered from."""

    items: tuple[Item, ...]
    instructions: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    reasoning_effort: ReasoningEffort = "medium"
    conversation_date: str | None = None  # YYYY-MM-DD in the system message
    response_format: ResponseFormat | None = None
    builtin_tools: tuple[BuiltinTool, ...] = ()  # harmony's python / browser, server-run
