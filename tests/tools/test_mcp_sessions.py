"""The MCP client's sessions on real MCP servers (tests/support/mcp_server.py): how long they
live, how many an allowed URL may have, which failures close them."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.tools.mcp import McpServers, load_config
from tests.support.mcp_server import connections_to, http_server, write_config


@pytest.fixture(scope="module")
def web_url() -> Iterator[str]:
    with http_server() as url:
        yield url


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    with http_server(keyed=True) as url:
        yield url


def test_a_session_of_an_allowed_url_closes_when_idle(keyed_url: str) -> None:
    async def scenario() -> tuple[int, int, list[str]]:
        servers = McpServers({}, [keyed_url], idle_s=0.5)
        try:
            server = servers.resolve("k", keyed_url, {"Authorization": "Bearer idle"})
            assert server is not None
            listing = await servers.listing(server)
            open_after_listing = connections_to(keyed_url)
            for _ in range(100):  # closed after 0.5 s unused; a busy machine may take longer
                await asyncio.sleep(0.1)
                if not connections_to(keyed_url):
                    break
            return open_after_listing, connections_to(keyed_url), [t.name for t in listing.tools]
        finally:
            await servers.close()

    opened, later, names = asyncio.run(scenario())
    assert names == ["for_idle"]
    assert (opened, later) == (1, 0)


def test_a_session_in_use_is_never_closed_to_make_room(web_url: str) -> None:
    async def scenario() -> tuple[str | None, str]:
        servers = McpServers({}, [web_url], sessions_per_url=1)
        try:
            busy = servers.resolve("w", web_url, {"X-Test": "busy"})
            other = servers.resolve("w", web_url, {"X-Test": "other"})
            assert busy is not None
            assert other is not None
            assert (await servers.listing(busy)).error is None
            hanging = asyncio.create_task(servers.call(busy, "hang", "{}", 60))
            await asyncio.sleep(0.5)
            refused = (await servers.listing(other)).error
            hanging.cancel()
            await asyncio.gather(hanging, return_exceptions=True)
            answered = await servers.call(other, "whoami", "{}", 10)
            return refused, answered.text
        finally:
            await servers.close()

    refused, answered = asyncio.run(scenario())
    assert refused is not None
    assert "sessions in use" in refused
    assert answered == "other"  # once the call ended, its session made room


def test_a_stdio_server_that_died_is_started_again(tmp_path: Path, web_url: str) -> None:
    async def scenario() -> tuple[str, str]:
        servers = McpServers(load_config(write_config(tmp_path, web_url)))
        calc = servers.servers["calc"]
        try:
            pid = (await servers.call(calc, "pid", "{}", 10)).text
            os.kill(int(pid), signal.SIGKILL)
            await asyncio.sleep(0.5)
            await servers.call(calc, "pid", "{}", 10)  # may fail: the connection is gone
            return pid, (await servers.call(calc, "pid", "{}", 10)).text
        finally:
            await servers.close()

    pid, again = asyncio.run(scenario())
    assert again.isdigit()
    assert again != pid
