"""MCP servers as server-run tools: the operator's config file, listing, calling.

The config file is the one people keep for Claude Desktop and Claude Code:

    {"mcpServers": {
        "files": {"command": "uvx", "args": ["mcp-server-filesystem", "/srv/docs"], "env": {}},
        "search": {"type": "http", "url": "http://127.0.0.1:8931/mcp", "headers": {...}}}}

Each server gets one session (the official `mcp` SDK's client), opened at its first listing or
call and kept for the next ones: a stdio server is started once (with the SDK's small default
environment plus the entry's `env`) and keeps its state across calls; a streamable-HTTP server
is reached at its `url` with its `headers`. A session that fails is closed, and the next call
opens a new one; all are closed when the app stops (`McpServers.close`). A request names a
server by its label (the key); a `server_url` a request gives is used only when the operator
listed that exact URL (`--mcp-allowed-urls`): a server that connects wherever a request says
would be an SSRF hole.

Listings are cached per server (`LIST_TTL_S`). A failing or hanging server ends that listing
or call with an error, never the response: `McpTools.call` never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from server.contracts.transcript import ToolSpec
from server.tools.base import ToolContext, ToolNamespace, ToolResult

log = logging.getLogger(__name__)

LIST_TTL_S = 300.0  # a listing is asked again after this long
LIST_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
OPEN_TIMEOUT_S = 60.0  # starting a stdio server (npx, uvx) and the MCP handshake
CLOSE_TIMEOUT_S = 10.0


class McpConfigError(ValueError):
    """The MCP config file cannot be used (the message says why and where)."""


@dataclass(frozen=True, slots=True)
class McpServer:
    """One server of the config: a stdio command or a streamable-HTTP URL."""

    label: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"


def load_config(path: Path) -> dict[str, McpServer]:
    """The servers of a Claude Desktop / Claude Code config file (`mcpServers`)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise McpConfigError(f"cannot read the MCP config {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise McpConfigError(f"the MCP config {path} is not JSON: {exc}") from exc
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f"the MCP config {path} has no `mcpServers` object")
    return {label: _server(label, entry, path) for label, entry in servers.items()}


def _server(label: str, entry: object, path: Path) -> McpServer:
    where = f"{path}: mcpServers.{label}"
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where} is not an object")
    kind = entry.get("type", "stdio" if "command" in entry else "http")
    description = str(entry.get("description", ""))
    if kind == "stdio":
        command = entry.get("command")
        args = entry.get("args", [])
        env = entry.get("env", {})
        if not isinstance(command, str) or not command:
            raise McpConfigError(f"{where}: a stdio server needs a `command`")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise McpConfigError(f"{where}: `args` must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise McpConfigError(f"{where}: `env` must map names to strings")
        cwd = entry.get("cwd")
        return McpServer(
            label,
            command=command,
            args=tuple(args),
            env=dict(env),
            cwd=cwd,
            description=description,
        )
    if kind in ("http", "streamable-http", "streamable_http"):
        url = entry.get("url")
        headers = entry.get("headers", {})
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise McpConfigError(f"{where}: an HTTP server needs an http(s) `url`")
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise McpConfigError(f"{where}: `headers` must map names to strings")
        return McpServer(label, url=url, headers=dict(headers), description=description)
    raise McpConfigError(
        f"{where}: servers of type {kind!r} are not supported (stdio and http are)"
    )


@dataclass(frozen=True, slots=True)
class McpTool:
    """A tool an MCP server lists."""

    name: str
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] | None = None

    @property
    def read_only(self) -> bool:
        return bool((self.annotations or {}).get("readOnlyHint"))

    def listed(self) -> dict[str, Any]:
        """As the `mcp_list_tools` item shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
            "annotations": self.annotations,
        }


@dataclass(frozen=True, slots=True)
class Listing:
    """A server's tools, or why they could not be listed."""

    tools: tuple[McpTool, ...] = ()
    error: str | None = None


class _Session:
    """One open client of one server. The SDK's client must be entered and left in one task:
    a task of its own holds it open until `close()`; calls use it from any task."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: Client | None = None
        self._opened = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._hold(), name=f"mcp session {server.label}")

    @property
    def failed(self) -> bool:
        """It opened and closed again, or never opened."""
        return self._opened.is_set() and self.client is None

    async def opened(self) -> Client:
        await asyncio.wait_for(asyncio.shield(self._opened.wait()), OPEN_TIMEOUT_S)
        if self.client is None:
            raise ConnectionError(_reason(self._error) if self._error else "the session closed")
        return self.client

    async def _hold(self) -> None:
        try:
            async with _client(self.server) as client:
                self.client = client
                self._opened.set()
                await self._stop.wait()
        except Exception as exc:
            self._error = exc
        finally:
            self.client = None
            self._opened.set()

    async def close(self) -> None:
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError):
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class McpServers:
    """The operator's MCP servers; lives on the app (a session and a cached listing per
    server)."""

    def __init__(self, servers: Mapping[str, McpServer], allowed_urls: Sequence[str] = ()) -> None:
        self.servers = dict(servers)
        self.allowed_urls = frozenset(allowed_urls)
        self._listings: dict[str, tuple[float, Listing]] = {}
        self._sessions: dict[str, _Session] = {}  # by repr(server): its whole configuration

    async def _client(self, server: McpServer) -> Client:
        """The server's open session's client, opening one when there is none (or it failed)."""
        key = repr(server)
        session = self._sessions.get(key)
        if session is None or session.failed:
            if session is not None:
                await session.close()
            session = self._sessions[key] = _Session(server)
        try:
            return await session.opened()
        except BaseException:
            if self._sessions.get(key) is session:
                del self._sessions[key]
            await session.close()
            raise

    async def _drop(self, server: McpServer) -> None:
        """Close the server's session after a failure: the next call opens a new one."""
        session = self._sessions.pop(repr(server), None)
        if session is not None:
            await session.close()

    async def close(self) -> None:
        """Close every session (stdio servers stop)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()

    def resolve(self, label: str, url: str | None, headers: Mapping[str, str]) -> McpServer | None:
        """The server a request's tool names: a configured label (a `server_url`, if given,
        must be the configured one), or an allowed URL. None: refused."""
        configured = self.servers.get(label)
        if configured is not None:
            if url is not None and url != configured.url:
                return None
            return configured
        if url is not None and url in self.allowed_urls:
            return McpServer(label, url=url, headers=dict(headers))
        return None

    async def listing(self, server: McpServer) -> Listing:
        """The server's tools, from the cache when listed in the last LIST_TTL_S seconds."""
        key = f"{server.label}\0{server.url or ''}"
        cached = self._listings.get(key)
        if cached is not None and time.monotonic() - cached[0] < LIST_TTL_S:
            return cached[1]
        try:
            client = await self._client(server)
            result = await asyncio.wait_for(client.list_tools(), LIST_TIMEOUT_S)
            tools = tuple(
                McpTool(
                    name=tool.name,
                    description=tool.description or "",
                    input_schema=dict(tool.input_schema or {"type": "object"}),
                    annotations=(
                        tool.annotations.model_dump(exclude_none=True, by_alias=True)
                        if tool.annotations is not None
                        else None
                    ),
                )
                for tool in result.tools
            )
            listing = Listing(tools)
        except Exception as exc:
            log.warning("MCP server %s: listing its tools failed: %s", server.label, _reason(exc))
            await self._drop(server)
            return Listing(error=f"listing the tools of {server.label} failed: {_reason(exc)}")
        self._listings[key] = (time.monotonic(), listing)
        return listing

    async def call(
        self, server: McpServer, name: str, arguments: str, timeout_s: float
    ) -> ToolResult:
        """Call tool `name`; a failure is an error result, never an exception."""
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return _error(f"the arguments are not JSON: {exc}", "mcp_protocol_error", -32602)
        if not isinstance(parsed, dict):
            return _error("the arguments must be a JSON object", "mcp_protocol_error", -32602)
        try:
            client = await self._client(server)
            result = await client.call_tool(name, parsed, read_timeout_seconds=timeout_s)
        except Exception as exc:
            if _tool_timeout(exc):  # the session stays usable
                message = f"the tool {name} did not answer within {timeout_s:g} s"
                return _error(message, "mcp_protocol_error", -32001)
            log.warning("MCP server %s: calling %s failed: %s", server.label, name, _reason(exc))
            await self._drop(server)
            return _error(f"calling {name} failed: {_reason(exc)}", "mcp_protocol_error", -32603)
        return _result(result)


@dataclass(frozen=True)
class McpTools:
    """One MCP server as a ServerTool of one request: its label is the harmony namespace."""

    servers: McpServers
    server: McpServer
    tools: tuple[McpTool, ...]

    @property
    def namespace(self) -> str:
        return self.server.label

    def description(self) -> ToolNamespace:
        specs = tuple(
            ToolSpec(
                name=tool.name,
                description=tool.description,
                parameters=tool.input_schema,
                namespace=self.server.label,
                namespace_description=self.server.description,
            )
            for tool in self.tools
        )
        return ToolNamespace(self.server.label, self.server.description, specs)

    async def call(self, name: str, arguments: str, ctx: ToolContext) -> ToolResult:
        if name not in {tool.name for tool in self.tools}:
            message = f"{self.server.label} has no tool {name!r} that this request allows"
            return _error(message, "mcp_protocol_error", -32601)
        return await self.servers.call(self.server, name, arguments, ctx.timeout_s)


def _client(server: McpServer) -> Client:
    """The SDK's client of `server` (not yet entered); each call sets its own read timeout."""
    if server.command is not None:
        params = StdioServerParameters(
            command=server.command, args=list(server.args), env=dict(server.env), cwd=server.cwd
        )
        return Client(params, cache=None)
    assert server.url is not None
    http = httpx2.AsyncClient(
        headers=dict(server.headers),
        timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=None),  # the calls time themselves
    )
    return Client(streamable_http_client(server.url, http_client=http), cache=None)


def _tool_timeout(exc: BaseException) -> bool:
    """Whether a call failed only by taking longer than its read timeout."""
    return isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or "timed out" in str(exc).lower()


def _result(result: CallToolResult) -> ToolResult:
    texts = [
        part.text if isinstance(part, TextContent) else _other(part) for part in result.content
    ]
    if not texts and result.structured_content is not None:
        texts = [json.dumps(result.structured_content, ensure_ascii=False)]
    text = "\n".join(texts)
    if result.is_error:
        content = [part.model_dump(mode="json", exclude_none=True) for part in result.content]
        error = {"type": "mcp_tool_execution_error", "content": content}
        return ToolResult(
            text or "the tool reported an error", is_error=True, item={"error": error}
        )
    return ToolResult(text)


def _other(part: Any) -> str:
    """A content part gpt-oss cannot read (an image, audio): named, not passed on."""
    return f"[{getattr(part, 'type', 'content')} omitted]"


def _error(message: str, kind: str, code: int) -> ToolResult:
    return ToolResult(
        message, is_error=True, item={"error": {"type": kind, "code": code, "message": message}}
    )


def _reason(exc: BaseException) -> str:
    """An exception, group or not, in one line (anyio wraps failures in groups)."""
    inner = getattr(exc, "exceptions", None)  # an exception group
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
