"""MCP servers as server-run tools: the operator's config file, listing, calling.

The config file is the one people keep for Claude Desktop and Claude Code:

    {"mcpServers": {
        "files": {"command": "uvx", "args": ["mcp-server-filesystem", "/srv/docs"], "env": {}},
        "search": {"type": "http", "url": "http://127.0.0.1:8931/mcp", "headers": {...}}}}

A session (the official `mcp` SDK's client) is keyed by its connection only
(`McpServer.connection`: a stdio server's command, args, env and cwd; an HTTP server's URL and
headers), never by what else a request says (its label, its `server_description`). A stdio
server is started once (with the SDK's small default environment plus the entry's `env`) and
keeps its state across calls; the configured servers' sessions stay open until the app stops
(`McpServers.close`). A request names a server by its label (the key); a `server_url` a request
gives is used only when the operator listed that exact URL (`--mcp-allowed-urls`): a server that
connects wherever a request says would be an SSRF hole. The sessions of an allowed URL (one per
set of headers a request sends) are at most SESSIONS_PER_URL, the least recently used idle one
closed first, and each closes after IDLE_CLOSE_S unused.

A listing is kept on its session (`LIST_TTL_S`), so it is only ever shown to a request with the
same connection (the same credentials). A JSON-RPC error reply or a call's timeout keeps the
session; a transport failure (the connection closed, the process exited, the open timed out)
closes it, and the next call opens a new one. A failing or hanging server ends that listing or
call with an error, never the response: `McpTools.call` never raises, and an error's content is
cut to the response's max output chars like any result.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client, MCPError
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent

from server.contracts.transcript import ToolSpec
from server.tools.base import ToolContext, ToolNamespace, ToolResult, truncate

log = logging.getLogger(__name__)

LIST_TTL_S = 300.0  # a listing is asked again after this long
LIST_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
OPEN_TIMEOUT_S = 60.0  # starting a stdio server (npx, uvx) and the MCP handshake
CLOSE_TIMEOUT_S = 10.0
SESSIONS_PER_URL = 4  # open sessions (one per set of headers) of one allowed URL
IDLE_CLOSE_S = 300.0  # a session of an allowed URL closes after this long unused


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

    @property
    def connection(self) -> tuple[object, ...]:
        """What a session is opened with, and so its key: a stdio server's command, args, env
        and cwd, or an HTTP server's URL and headers (names in lower case); never the label or
        the description."""
        if self.command is not None:
            env = tuple(sorted(self.env.items()))
            return ("stdio", self.command, self.args, env, self.cwd)
        headers = tuple(sorted((name.lower(), value) for name, value in self.headers.items()))
        return ("http", self.url, headers)


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
        """As the `mcp_list_tools` item shows it: every field."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Listing:
    """A server's tools, or why they could not be listed."""

    tools: tuple[McpTool, ...] = ()
    error: str | None = None


class _Session:
    """One open client of one connection. The SDK's client must be entered and left in one
    task: a task of its own holds it open until `stop()`, or until it has been unused for
    `idle_s` (None: never); calls use it from any task, counted in `users`."""

    def __init__(self, server: McpServer, idle_s: float | None) -> None:
        self.server = server
        self.idle_s = idle_s
        self.client: Client | None = None
        self.listing: tuple[float, Listing] | None = None  # when listed, what
        self.users = 0
        self.last_used = time.monotonic()
        self._opened = asyncio.Event()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._hold(), name=f"mcp session {server.label}")

    @property
    def closed(self) -> bool:
        """It opened and closed again, or never opened."""
        return self._opened.is_set() and self.client is None

    @property
    def ended(self) -> bool:
        return self._task.done()

    async def opened(self) -> Client:
        await asyncio.wait_for(asyncio.shield(self._opened.wait()), OPEN_TIMEOUT_S)
        if self.client is None:
            raise ConnectionError(_reason(self._error) if self._error else "the session closed")
        return self.client

    def _idle_for(self) -> float | None:
        """Seconds until the session may close for being unused (<= 0: now; None: never)."""
        if self.idle_s is None:
            return None
        if self.users:
            return self.idle_s
        return self.idle_s - (time.monotonic() - self.last_used)

    async def _hold(self) -> None:
        try:
            async with _connect(self.server) as client:
                self.client = client
                self._opened.set()
                while not self._stop.is_set():
                    wait = self._idle_for()
                    if wait is not None and wait <= 0:
                        break
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), wait)
                self.client = None  # at once: no new user gets a closing client
        except Exception as exc:
            self._error = exc
        finally:
            self.client = None
            self._opened.set()

    def stop(self) -> None:
        """Close the session as soon as its task runs; no new user gets it."""
        self._stop.set()
        if not self._opened.is_set():
            self._task.cancel()

    async def close(self) -> None:
        self.stop()
        await asyncio.wait({self._task}, timeout=CLOSE_TIMEOUT_S)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class McpServers:
    """The operator's MCP servers; lives on the app: the open sessions, each keyed by its
    connection and holding its cached listing.

    The configured servers' sessions stay open; the sessions of the allowed URLs (whose
    headers a request gives) are at most `sessions_per_url` a URL and close after `idle_s`
    unused."""

    def __init__(
        self,
        servers: Mapping[str, McpServer],
        allowed_urls: Sequence[str] = (),
        *,
        sessions_per_url: int = SESSIONS_PER_URL,
        idle_s: float = IDLE_CLOSE_S,
    ) -> None:
        self.servers = dict(servers)
        self.allowed_urls = frozenset(allowed_urls)
        self.sessions_per_url = sessions_per_url
        self.idle_s = idle_s
        self._configured = frozenset(server.connection for server in self.servers.values())
        self._sessions: OrderedDict[tuple[object, ...], _Session] = OrderedDict()  # LRU first
        self._closing: set[_Session] = set()

    def _session(self, server: McpServer) -> _Session:
        """The connection's open session, or a new one (making room among the sessions of
        its allowed URL); ConnectionError when every one of those is in use."""
        key = server.connection
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            self._sessions.move_to_end(key)
            return session
        if session is not None:
            self._retire(session)
        configured = key in self._configured
        if not configured:
            self._make_room(server.url)
        session = self._sessions[key] = _Session(server, None if configured else self.idle_s)
        return session

    def _make_room(self, url: str | None) -> None:
        """Close the least recently used idle sessions of `url` until a new one fits."""
        same = [
            session
            for key, session in self._sessions.items()
            if key not in self._configured and session.server.url == url
        ]
        for session in same:
            if session.closed:
                self._retire(session)
        same = [session for session in same if not session.closed]
        idle = [session for session in same if not session.users]
        excess = len(same) - self.sessions_per_url + 1
        if excess > len(idle):
            raise ConnectionError(
                f"{url} has {len(same)} sessions in use (at most {self.sessions_per_url} "
                "a URL); try again when one is free"
            )
        for session in idle[:excess] if excess > 0 else ():
            self._retire(session)

    def _retire(self, session: _Session) -> None:
        """Take the session out of use and close it (its task ends on its own)."""
        key = session.server.connection
        if self._sessions.get(key) is session:
            del self._sessions[key]
        session.stop()
        self._closing = {s for s in self._closing if not s.ended}
        self._closing.add(session)

    @contextlib.asynccontextmanager
    async def _use(self, server: McpServer) -> AsyncIterator[tuple[_Session, Client]]:
        """The connection's session and its client, counted as in use until the block ends;
        a failure to open closes the session."""
        session = self._session(server)
        session.users += 1
        try:
            try:
                client = await session.opened()
            except BaseException:
                self._retire(session)
                raise
            yield session, client
        finally:
            session.users -= 1
            session.last_used = time.monotonic()

    def _failed(self, session: _Session, exc: BaseException) -> None:
        """After a failed request: a transport failure closes the session, a JSON-RPC error
        reply or a timeout keeps it."""
        if _transport_failure(exc):
            self._retire(session)

    async def close(self) -> None:
        """Close every session (stdio servers stop)."""
        sessions = [*self._sessions.values(), *self._closing]
        self._sessions, self._closing = OrderedDict(), set()
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
        """The server's tools, from its session's cache when listed in the last LIST_TTL_S
        seconds (a listing is kept with the connection, credentials included, that made it)."""
        try:
            async with self._use(server) as (session, client):
                if session.listing is not None:
                    listed_at, listing = session.listing
                    if time.monotonic() - listed_at < LIST_TTL_S:
                        return listing
                try:
                    result = await asyncio.wait_for(client.list_tools(), LIST_TIMEOUT_S)
                except Exception as exc:
                    self._failed(session, exc)
                    raise
                listing = Listing(tuple(_tool(tool) for tool in result.tools))
                session.listing = (time.monotonic(), listing)
                return listing
        except Exception as exc:
            log.warning("MCP server %s: listing its tools failed: %s", server.label, _reason(exc))
            return Listing(error=f"listing the tools of {server.label} failed: {_reason(exc)}")

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
            async with self._use(server) as (session, client):
                try:
                    result = await client.call_tool(name, parsed, read_timeout_seconds=timeout_s)
                except Exception as exc:
                    self._failed(session, exc)
                    raise
        except Exception as exc:
            if _tool_timeout(exc):
                message = f"the tool {name} did not answer within {timeout_s:g} s"
                return _error(message, "mcp_protocol_error", -32001)
            log.warning("MCP server %s: calling %s failed: %s", server.label, name, _reason(exc))
            inner = _innermost(exc)
            code = inner.code if isinstance(inner, MCPError) else -32603
            return _error(f"calling {name} failed: {_reason(exc)}", "mcp_protocol_error", code)
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
        result = await self.servers.call(self.server, name, arguments, ctx.timeout_s)
        return _cut_error(result, ctx.max_output_chars)


@contextlib.asynccontextmanager
async def _connect(server: McpServer) -> AsyncIterator[Client]:
    """The SDK's client of `server`, entered (its HTTP client closed with it); each call sets
    its own read timeout."""
    if server.command is not None:
        params = StdioServerParameters(
            command=server.command, args=list(server.args), env=dict(server.env), cwd=server.cwd
        )
        async with Client(params, cache=None) as client:
            yield client
        return
    assert server.url is not None
    http = httpx2.AsyncClient(
        headers=dict(server.headers),
        timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=None),  # the calls time themselves
    )
    transport = streamable_http_client(server.url, http_client=http)
    async with http, Client(transport, cache=None) as client:
        yield client


def _tool(tool: Any) -> McpTool:
    """A listed tool (the SDK's `Tool`)."""
    annotations = tool.annotations
    return McpTool(
        name=tool.name,
        description=tool.description or "",
        input_schema=dict(tool.input_schema or {"type": "object"}),
        annotations=(
            annotations.model_dump(exclude_none=True, by_alias=True)
            if annotations is not None
            else None
        ),
    )


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio wraps failures in groups), else `exc`."""
    inner = getattr(exc, "exceptions", None)
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    return exc


def _tool_timeout(exc: BaseException) -> bool:
    """Whether a call failed only by taking longer than its read timeout."""
    exc = _innermost(exc)
    return isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or "timed out" in str(exc).lower()


def _transport_failure(exc: BaseException) -> bool:
    """Whether a failed request leaves its session unusable: everything but the server's
    JSON-RPC error reply (the SDK's MCPError, unless it stands for a closed connection) and a
    request's timeout."""
    inner = _innermost(exc)
    if isinstance(inner, MCPError):
        return inner.code == CONNECTION_CLOSED
    return not _tool_timeout(inner)


def _result(result: CallToolResult) -> ToolResult:
    texts = [
        part.text if isinstance(part, TextContent) else _other(part) for part in result.content
    ]
    if not texts and result.structured_content is not None:
        texts = [json.dumps(result.structured_content, ensure_ascii=False)]
    text = "\n".join(texts)
    if result.is_error:
        text = text or "the tool reported an error"
        error = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": text}]}
        return ToolResult(text, is_error=True, item={"error": error})
    return ToolResult(text)


def _cut_error(result: ToolResult, max_chars: int) -> ToolResult:
    """The result with its error item's text cut to `max_chars` as the model's text is: what the
    tool said (non-text parts named), never more than any result may give."""
    error = result.item.get("error")
    if not isinstance(error, dict):
        return result
    cut = dict(error)
    if "message" in cut:
        cut["message"] = truncate(str(cut["message"]), max_chars)[0]
    if "content" in cut:
        cut["content"] = [{"type": "text", "text": truncate(result.text, max_chars)[0]}]
    return ToolResult(result.text, result.is_error, {**result.item, "error": cut})


def _other(part: Any) -> str:
    """A content part gpt-oss cannot read (an image, audio): named, not passed on."""
    return f"[{getattr(part, 'type', 'content')} omitted]"


def _error(message: str, kind: str, code: int) -> ToolResult:
    return ToolResult(
        message, is_error=True, item={"error": {"type": kind, "code": code, "message": message}}
    )


def _reason(exc: BaseException) -> str:
    """An exception, group or not, in one line."""
    exc = _innermost(exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
