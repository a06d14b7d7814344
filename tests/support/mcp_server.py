"""An MCP server for the tests, written with the official `mcp` SDK.

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http PORT

Its tools: `add` (a normal tool), `fail` (raises: an error result), `hang` (never answers),
`huge` (a result of HUGE_CHARS characters), `pid` (its process id), `whoami` (the request's
X-Test header, over HTTP).
`http_server()` runs it on 127.0.0.1 for a test; `write_config()` writes the `mcpServers` file
that names it over stdio (`calc`), over HTTP (`web`, with an X-Test header) and a server that
exits at once (`broken`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer

HUGE_CHARS = 200_000
ROOT = Path(__file__).resolve().parents[2]
X_TEST = "from-the-config"

server = MCPServer("test-tools", instructions="Arithmetic and test tools.")


@server.tool(description="Adds two integers.")
def add(a: int, b: int) -> str:
    return str(a + b)


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


@server.tool(description="The server's process id.")
def pid() -> str:
    return str(os.getpid())


@server.tool(description="Echoes the X-Test request header.")
def whoami(ctx: Context) -> str:
    request = getattr(ctx.request_context, "request", None)
    headers = getattr(request, "headers", None) or {}
    return str(headers.get("x-test", "none"))


@contextmanager
def http_server() -> Iterator[str]:
    """This server over streamable HTTP on 127.0.0.1, in a child process; yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.mcp_server", "http", str(port)],
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
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
