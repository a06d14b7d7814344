"""The protocol of a server-run tool: what the generation core calls, what every backend offers.

A server-run tool is a harmony namespace the model addresses (`<server_label>.<tool>` for an
MCP server, `python`, `browser.search`). When a generation ends at a call to one, the core
runs it (`ServerTool.call`) and appends the result to the same generation as a harmony tool
message, then sampling goes on: one response, several tool rounds, one KV cache.

A backend imports only the contracts and this module (never the core, the API or the engine);
the API layer builds the tools a request may use and hands them to the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from server.contracts.transcript import ToolSpec

TRUNCATION_NOTE = "\n\n[output truncated by the server: {omitted} of {total} characters omitted]"


@dataclass(frozen=True, slots=True)
class ToolNamespace:
    """How a server-run tool is shown to the model.

    `tools` are rendered as a function namespace in the developer message (an MCP server's
    tools, under the server's label). `builtin` names one of harmony's built-in tools
    (`"python"` or `"browser"`), rendered in the system message as the model was trained with
    it; its `tools` are then empty.
    """

    name: str
    description: str = ""
    tools: tuple[ToolSpec, ...] = ()
    builtin: str | None = None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What one call may use and how far it may go.

    `conversation_id` keys state a tool keeps across calls (the python kernel); `timeout_s` is
    the most one call may take (the core also cancels it past that); `max_output_chars` is the
    most text the model gets back (`truncate`).
    """

    response_id: str
    conversation_id: str | None = None
    timeout_s: float = 60.0
    max_output_chars: int = 20_000


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a call returned.

    `text` is what the model reads (the harmony tool message's content); `is_error` marks a
    failed call (the model still reads `text`: the error); `item` holds the fields of the API's
    output item that the backend knows (an MCP call's `output` or `error`, a code interpreter's
    `outputs`), merged into the item the API layer builds.
    """

    text: str
    is_error: bool = False
    item: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class ServerTool(Protocol):
    """A namespace of tools the server runs itself."""

    @property
    def namespace(self) -> str:
        """The namespace the model addresses (an MCP server's label, `python`, `browser`)."""
        ...

    def description(self) -> ToolNamespace:
        """The namespace as the model sees it (after any listing the backend needed)."""
        ...

    async def call(self, name: str, arguments: str, ctx: ToolContext) -> ToolResult:
        """Run tool `name` of this namespace with the model's `arguments` (raw text, usually
        JSON). Never raises for a failing tool: a failure is a ToolResult with is_error."""
        ...


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to `max_chars` with a note the model reads; and whether it was cut."""
    if len(text) <= max_chars:
        return text, False
    note = TRUNCATION_NOTE.format(omitted=len(text) - max_chars, total=len(text))
    return text[:max_chars] + note, True
