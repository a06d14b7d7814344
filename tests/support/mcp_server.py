"""An MCP server for the tests, written with the official `mcp` SDK.

    python -m tests.support.mcp_server stdio
    python -m tests.support.mcp_server http PORT

Its tools: `add` (a normal tool), `fail` (raises: an error result), `hang` (never answers),
`huge` (a result of HUGE_CHARS characters), `whoami` (the request's X-Test header, over HTTP).
"""

from __future__ import annotations

import asyncio
import sys

from mcp.server.mcpserver import Context, MCPServer

HUGE_CHARS = 200_000

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


@server.tool(description="Echoes the X-Test request header.")
def whoami(ctx: Context) -> str:
    request = getattr(ctx.request_context, "request", None)
    headers = getattr(request, "headers", None) or {}
    return str(headers.get("x-test", "none"))


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]))
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
