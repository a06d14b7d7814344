"""The MCP config file (Claude Desktop / Claude Code `mcpServers`), and which servers a request
may name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server.app import create_app
from server.contracts.errors import StartupError
from server.ops.settings import Settings
from server.tools.base import truncate
from server.tools.mcp import McpConfigError, McpServer, McpServers, load_config


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(data))
    return path


def test_claude_desktop_and_claude_code_entries(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "mcpServers": {
                "files": {"command": "npx", "args": ["-y", "fs", "/srv"], "env": {"A": "1"}},
                "search": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"K": "v"}},
                "plain": {"url": "https://example.org/mcp"},
            }
        },
    )
    servers = load_config(path)
    assert servers["files"] == McpServer("files", command="npx", args=("-y", "fs", "/srv"),
                                         env={"A": "1"})  # fmt: skip
    assert servers["files"].transport == "stdio"
    assert servers["search"].url == "http://127.0.0.1:9/mcp"
    assert servers["search"].headers == {"K": "v"}
    assert servers["plain"].transport == "http"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no `mcpServers` object"),
        ({"mcpServers": {"a": {"command": ""}}}, "needs a `command`"),
        ({"mcpServers": {"a": {"command": "x", "args": "y"}}}, "`args` must be a list"),
        ({"mcpServers": {"a": {"type": "http", "url": "ftp://x"}}}, "http(s) `url`"),
        ({"mcpServers": {"a": {"type": "sse", "url": "http://x/sse"}}}, "type 'sse'"),
        ({"mcpServers": {"a": 3}}, "is not an object"),
    ],
)
def test_bad_entries_say_what_is_wrong(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(McpConfigError) as caught:
        load_config(write(tmp_path, data))
    assert message in str(caught.value)


def test_an_unreadable_config_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    store = tmp_path / "state" / "responses.sqlite3"
    settings = Settings(mcp_config=tmp_path / "bad.json", responses_store_path=store)
    with pytest.raises(StartupError, match="not JSON"):
        create_app(settings)


def test_a_request_reaches_only_configured_or_allowed_servers() -> None:
    configured = McpServer("web", url="http://127.0.0.1:9/mcp", headers={"K": "config"})
    servers = McpServers({"web": configured}, allowed_urls=["https://tools.example/mcp"])
    assert servers.resolve("web", None, {}) == configured
    assert servers.resolve("web", "http://127.0.0.1:9/mcp", {"K": "request"}) == configured
    assert servers.resolve("web", "http://10.0.0.1/mcp", {}) is None
    assert servers.resolve("other", None, {}) is None
    assert servers.resolve("other", "http://169.254.169.254/", {}) is None
    allowed = servers.resolve("x", "https://tools.example/mcp", {"K": "request"})
    assert allowed == McpServer("x", url="https://tools.example/mcp", headers={"K": "request"})
    assert servers.resolve("x", "https://tools.example/mcp/", {}) is None  # exactly as listed


def test_truncate_keeps_the_start_and_says_how_much_is_gone() -> None:
    assert truncate("short", 10) == ("short", False)
    text, cut = truncate("x" * 100, 10)
    assert cut
    assert text.startswith("x" * 10)
    assert not text.startswith("x" * 11)
    assert "90 of 100 characters omitted" in text
