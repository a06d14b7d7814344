"""A Responses request's MCP tools: which servers, which of their tools, what needs approval.

`{"type": "mcp", "server_label", "server_url", "allowed_tools", "require_approval",
"headers"}` names one of the operator's servers by label (`--mcp-config`); a `server_url` is
refused unless it is that server's own URL or one the operator allowed (`--mcp-allowed-urls`).
The server's tools are listed (cached per server), filtered by `allowed_tools`, and offered to the
model as a function namespace named after the label; the response shows the listing as an
`mcp_list_tools` item unless the conversation already holds one for that label.

`require_approval` is OpenAI's: "always" (the default), "never", or `{"always": {"tool_names"},
"never": {"tool_names"}}`. A call that needs approval ends the response with an
`mcp_approval_request` item whose id this server signs (`ApprovalIds`); the client's
`mcp_approval_response` (with previous_response_id, or with the request item sent back as input)
is honoured only for an id that verifies against the call it names: the call, approved, runs in
the next response's first tool round, after admission (server.core.tool_loop); refused, the
model is told so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import secrets
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from server.api.request_fields import parse_as
from server.api.response_fields import new_id
from server.api.responses.adapter import approval_request_id, call_id_of
from server.api.responses.items import ItemKind
from server.api.responses.schemas import (
    McpListedTool,
    McpListToolsItem,
    ResponsesRequest,
)
from server.contracts.errors import InvalidRequest
from server.contracts.events import ToolTarget
from server.contracts.transcript import Item, ToolCall, ToolResult, ToolSpec
from server.tools.mcp import Listing, McpServers, McpTool, McpTools

log = logging.getLogger(__name__)

DENIED = "The user did not approve this call{reason}; it was not run."


class _ToolFilter(BaseModel, extra="allow"):
    tool_names: list[str] | None = None
    read_only: bool | None = None


class _Approval(BaseModel, extra="allow"):
    always: _ToolFilter | None = None
    never: _ToolFilter | None = None


class McpToolIn(BaseModel, extra="allow"):
    type: str = "mcp"
    server_label: str = Field(min_length=1)
    server_url: str | None = None
    server_description: str | None = None
    allowed_tools: list[str] | _ToolFilter | None = None
    require_approval: str | _Approval | None = None
    headers: dict[str, str] | None = None


class ApprovalResponseIn(BaseModel, extra="allow"):
    type: str = "mcp_approval_response"
    approval_request_id: str
    approve: bool
    reason: str | None = None


@dataclass(frozen=True)
class Approval:
    """Which of a server's tools need the user's approval before a call runs."""

    default: bool = True  # OpenAI's default: every call waits for approval
    always: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()
    never_read_only: bool = False

    def needs(self, tool: McpTool | None, name: str) -> bool:
        if name in self.always:
            return True
        if name in self.never or (self.never_read_only and tool is not None and tool.read_only):
            return False
        return self.default

    @classmethod
    def of(cls, value: str | _Approval | None, param: str) -> Approval:
        if value is None or value == "always":
            return cls()
        if value == "never":
            return cls(default=False)
        if isinstance(value, str):
            raise InvalidRequest(
                f"{param} must be 'always', 'never' or an object with `always` / `never`",
                param=param,
            )
        always = value.always.tool_names or [] if value.always else []
        never = value.never.tool_names or [] if value.never else []
        never_read_only = bool(value.never and value.never.read_only)
        return cls(True, frozenset(always), frozenset(never), never_read_only)


@dataclass
class McpSetup:
    """This request's MCP servers: the ServerTools, the specs to offer, what to show first."""

    tools: dict[str, McpTools] = field(default_factory=dict)
    approvals: dict[str, Approval] = field(default_factory=dict)
    listings: list[McpListToolsItem] = field(default_factory=list)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(spec for tools in self.tools.values() for spec in tools.description().tools)

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self.approvals)

    def needs_approval(self, target: ToolTarget) -> bool:
        tools = self.tools.get(target.namespace)
        approval = self.approvals.get(target.namespace)
        if tools is None or approval is None:
            return False
        known = next((t for t in tools.tools if t.name == target.name), None)
        return approval.needs(known, target.name)

    def call_kind(self, target: ToolTarget) -> ItemKind | None:
        """The output item of a call to `target`: an MCP call, or its approval request."""
        if target.namespace not in self.tools:
            return None
        return "mcp_approval_request" if self.needs_approval(target) else "mcp_call"


def mcp_tools_in(request: ResponsesRequest) -> list[tuple[int, McpToolIn]]:
    return [
        (index, parse_as(McpToolIn, tool, f"tools[{index}]"))
        for index, tool in enumerate(request.tools or [])
        if tool.get("type") == "mcp"
    ]


async def setup_mcp(
    request: ResponsesRequest,
    servers: McpServers,
    listed_before: frozenset[str],
) -> McpSetup:
    """Resolve, list and filter the request's MCP servers; a refused server is a 400.

    `listed_before`: labels whose listing the conversation already shows (no new item).
    """
    setup = McpSetup()
    for index, tool in mcp_tools_in(request):
        param = f"tools[{index}]"
        label = tool.server_label
        if label in setup.approvals:
            raise InvalidRequest(f"{param}: server_label {label!r} is given twice", param=param)
        server = servers.resolve(label, tool.server_url, tool.headers or {})
        if server is None:
            raise InvalidRequest(_refusal(tool, servers), param=f"{param}.server_url")
        if tool.server_description:
            server = dataclasses.replace(server, description=tool.server_description)
        setup.approvals[label] = Approval.of(tool.require_approval, f"{param}.require_approval")
        listing = await servers.listing(server)
        allowed = _allowed(listing, tool.allowed_tools)
        if listing.error is None:
            setup.tools[label] = McpTools(servers, server, allowed)
        if label not in listed_before or listing.error is not None:
            setup.listings.append(_listing_item(label, allowed, listing.error))
    return setup


def listed_labels(
    earlier_output: Sequence[Mapping[str, Any]], request: ResponsesRequest
) -> frozenset[str]:
    """Labels of the `mcp_list_tools` items the conversation holds (the previous response's
    output, or the input items a stateless client sends back)."""
    items = [*earlier_output, *(request.input if isinstance(request.input, list) else [])]
    return frozenset(
        str(item.get("server_label"))
        for item in items
        if item.get("type") == "mcp_list_tools" and not item.get("error")
    )


class ApprovalIds:
    """The ids of the approval requests this server issues, signed: `mcpr_<call>_<mac>`, the MAC
    an HMAC-SHA256 (under a key derived from the server's key in its private state directory,
    so ids outlive a restart) over the call's id, server label, tool name and arguments.

    A call runs on approval only if its request's id verifies: one this server issued, for
    exactly that call. The stored conversation of previous_response_id and a request item sent
    back as input are checked alike (a stored conversation also holds earlier input)."""

    def __init__(self, key: bytes | None = None) -> None:
        """`key`: the server's (without one: drawn for this instance only)."""
        secret = key if key is not None else secrets.token_bytes(32)
        self._key = hmac.new(secret, _APPROVAL_CONTEXT, hashlib.sha256).digest()

    def issue(self, call_id: str, target: ToolTarget, arguments: str) -> str:
        """The id of the approval request of this call."""
        fields = (call_id, target.namespace, target.name, arguments)
        message = b"".join(_framed(value.encode("utf-8", "surrogatepass")) for value in fields)
        mac = hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_BYTES]
        return f"{approval_request_id(call_id)}_{mac.hex()}"

    def verify(self, request_id: str, call: ToolCall) -> bool:
        """Whether `request_id` is the id this server issued for exactly this call."""
        target = ToolTarget(call.name, call.namespace)
        return hmac.compare_digest(
            request_id.encode("utf-8", "surrogatepass"),
            self.issue(call.call_id, target, call.arguments).encode("utf-8", "surrogatepass"),
        )


_APPROVAL_CONTEXT = b"gpt-oss-server mcp approval request v1"
_MAC_BYTES = 16


def _framed(value: bytes) -> bytes:
    return struct.pack("<Q", len(value)) + value


@dataclass(frozen=True)
class Approvals:
    """What a request's `mcp_approval_response` items decide: the conversation with a refused
    call's result after it, and the approved calls (call id -> approval request id), which
    the core runs first (they must end the conversation; server.core.tool_loop)."""

    conversation: tuple[Item, ...]
    approved: dict[str, str] = field(default_factory=dict)


def approvals(
    request: ResponsesRequest,
    conversation: Sequence[Item],
    setup: McpSetup,
    ids: ApprovalIds,
) -> Approvals:
    """Check the request's approval responses; runs nothing. Each must name a pending approval
    request this server issued (`ApprovalIds`; else a 400): a refused call's result tells the
    model so; an approved call is returned to be run after admission. The calls are found in
    the conversation: the stored one of previous_response_id, and `mcp_approval_request` items
    sent back as input."""
    if not isinstance(request.input, list):
        return Approvals(tuple(conversation))
    answered = {item.call_id for item in conversation if isinstance(item, ToolResult)}
    results: dict[str, ToolResult] = {}
    approved: dict[str, str] = {}
    for index, raw in enumerate(request.input):
        if raw.get("type") != "mcp_approval_response":
            continue
        param = f"input[{index}]"
        response = parse_as(ApprovalResponseIn, raw, param)
        request_id = response.approval_request_id
        call = _last_call(conversation, call_id_of(request_id))
        if call is None or call.call_id in answered:
            raise InvalidRequest(
                f"{param}: approval_request_id {request_id!r} matches no pending approval "
                "request of this conversation",
                param=f"{param}.approval_request_id",
            )
        if not ids.verify(request_id, call):
            raise InvalidRequest(
                f"{param}: approval_request_id {request_id!r} names no approval request this "
                "server issued for that call (an mcp_approval_request item sent back as input "
                "must be unchanged); nothing was run",
                param=f"{param}.approval_request_id",
            )
        answered.add(call.call_id)
        if response.approve and call.namespace in setup.tools:
            approved[call.call_id] = request_id
            continue
        reason = f" ({response.reason})" if response.reason else ""
        results[call.call_id] = _result(call, DENIED.format(reason=reason))
    if not results:
        return Approvals(tuple(conversation), approved)
    last = {item.call_id: i for i, item in enumerate(conversation) if isinstance(item, ToolCall)}
    merged: list[Item] = []
    for i, item in enumerate(conversation):
        merged.append(item)
        if isinstance(item, ToolCall) and item.call_id in results and last[item.call_id] == i:
            merged.append(results[item.call_id])
    return Approvals(tuple(merged), approved)


def _last_call(conversation: Sequence[Item], call_id: str) -> ToolCall | None:
    """The conversation's last call with this id (the one a result would follow)."""
    calls = (item for item in reversed(conversation) if isinstance(item, ToolCall))
    return next((call for call in calls if call.call_id == call_id), None)


def _result(call: ToolCall, text: str) -> ToolResult:
    return ToolResult(call.call_id, text, call.name, call.namespace)


def _allowed(listing: Listing, allowed: list[str] | _ToolFilter | None) -> tuple[McpTool, ...]:
    if allowed is None:
        return listing.tools
    if isinstance(allowed, list):
        names = set(allowed)
        return tuple(t for t in listing.tools if t.name in names)
    return tuple(
        t
        for t in listing.tools
        if (allowed.tool_names is None or t.name in allowed.tool_names)
        and (not allowed.read_only or t.read_only)
    )


def _listing_item(label: str, tools: Sequence[McpTool], error: str | None) -> McpListToolsItem:
    return McpListToolsItem(
        id=new_id("mcpl_"),
        server_label=label,
        tools=[McpListedTool(**tool.listed()) for tool in tools],
        error=error,
    )


def _refusal(tool: McpToolIn, servers: McpServers) -> str:
    if tool.server_url is None:
        known = ", ".join(sorted(servers.servers)) or "none (start the server with --mcp-config)"
        return (
            f"server_label {tool.server_label!r} names no MCP server of this server's "
            f"configuration; configured: {known}"
        )
    return (
        f"server_url {tool.server_url!r} is not allowed: this server connects only to the MCP "
        "servers its operator configured (--mcp-config) or allowed (--mcp-allowed-urls)"
    )
