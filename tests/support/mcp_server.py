"""An MCP server for the tests, written with the official `mcp` SDK.

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http PORT
    python -m tests.support.mcp_server keyed PORT

Its tools: `add` (a normal tool), `count` (how often it was called in this process), `fail`
(raises: an error result), `hang` (never answers), `huge` (a result of HUGE_CHARS characters),
`huge_error` (an error result of HUGE_CHARS characters), `pid` (its process id), `rpc_error`
(answers with a JSON-RPC error), `whoami` (the request's X-Test header, over HTTP).
`http_server()` runs it on 127.0.0.1 for a test; `write_config()` writes the `mcpServers` file
that names it over stdio (`calc`), over HTTP (`web`, with an X-Test header) and a server that
exits at once (`broken`).

`keyed` is another server over streamable HTTP (`http_server(keyed=True)`): its listing depends
on the request's Authorization header (`Bearer NAME` lists one tool, `for_NAME`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import mcp_types
import psutil
import uvicorn
from mcp import MCPError
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import INVALID_PARAMS

HUGE_CHARS = 200_000
ROOT = Path(__file__).resolve().parents[2]
X_TEST = "from-the-config"

server = MCPServer("test-tools", instructions="Arithmetic and test tools.")


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


_calls = itertools.count(1)


@server.tool(description="How often it was called in this process.")
def count() -> str:
    return str(next(_calls))


@server.tool(description="Always fails.")
def fail(reason: str = "broken") -> str:
    raise RuntimeError(f"the tool failed on purpose: {reason}")


@server.tool(description="Never answers.")
async def hang() -> str:
    await asyncio.sleep(3600)
    return "late"


@server.tool(description="Returns a very long text.")
def huge() -> str:
    line = "0123456789abcdefghijklmnopqrstuvwxyz" * 2 + "\n"
    return (line * (HUGE_CHARS // len(line) + 1))[:HUGE_CHARS]


@server.tool(description="An error result of a very long text.")
def huge_error() -> str:
    raise ToolError(huge())


@server.tool(description="The server's process id.")
def pid() -> str:
    return str(os.getpid())


@server.tool(description="Answers with a JSON-RPC error.")
def rpc_error() -> str:
    raise MCPError(code=INVALID_PARAMS, message="refused on purpose")


@server.tool(description="Echoes the X-Test request header.")
def whoami(ctx: Context) -> str:
    request = getattr(ctx.request_context, "request", None)
    headers = getattr(request, "headers", None) or {}
    return str(headers.get("x-test", "none"))


async def _keyed_tools(
    ctx: ServerRequestContext[Any, Any], _params: mcp_types.PaginatedRequestParams | None
) -> mcp_types.ListToolsResult:
    headers = getattr(ctx.request, "headers", None) or {}
    name = str(headers.get("authorization", "")).removeprefix("Bearer ").strip()
    tool = mcp_types.Tool(
        name=f"for_{name}", description=f"Only {name} sees this.", input_schema={"type": "object"}
    )
    return mcp_types.ListToolsResult(tools=[tool])


keyed_server = Server("keyed-tools", on_list_tools=_keyed_tools)


@contextmanager
def http_server(keyed: bool = False) -> Iterator[str]:
    """This server (or `keyed`) over streamable HTTP on 127.0.0.1, in a child process; yields
    its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_server", "keyed" if keyed else "http", str(port)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None, "the MCP server exited"
                assert time.monotonic() < deadline, "the MCP server did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)


def connections_to(url: str) -> int:
    """How many TCP sockets this process holds to `url`'s port (one per open HTTP client)."""
    port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    return sum(
        1
        for conn in psutil.Process().net_connections("tcp")
        if conn.raddr and conn.raddr.port == port
    )


def stdio_servers() -> int:
    """How many of this server's stdio processes run below this process."""
    count = 0
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            running = child.status() != psutil.STATUS_ZOMBIE
            count += running and child.cmdline()[-2:] == ["tests.support.mcp_server", "stdio"]
    return count


def write_config(directory: Path, http_url: str) -> Path:
    """The `mcpServers` file: `calc` (stdio), `web` (HTTP at `http_url`), `broken`."""
    stdio = {
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_server", "stdio"],
        "env": {"PYTHONPATH": str(ROOT)},
        "cwd": str(ROOT),
    }
    broken = {"command": sys.executable, "args": ["-c", "raise SystemExit(3)"]}
    web = {"type": "http", "url": http_url, "headers": {"X-Test": X_TEST}}
    path = directory / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"calc": stdio, "web": web, "broken": broken}}))
    return path


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    elif argv[:1] == ["keyed"]:
        uvicorn.run(keyed_server.streamable_http_app(), host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
