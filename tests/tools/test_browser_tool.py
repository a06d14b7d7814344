"""The browser tool against pages and a SearXNG-shaped JSON endpoint served on 127.0.0.1 (the
private-address rule relaxed for these only), its refusals by default, its per-conversation
cookies and page stack, and its page work's time limit (the guard itself:
test_browser_guard.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest

from server.tools.base import ServerTool, ToolContext
from server.tools.browser.fetch import PageFetcher
from server.tools.browser.search import SearxngSearch
from server.tools.browser.tool import BrowserTool
from server.tools.browser.worker import NICENESS
from tests.support.local_http import send, serve_handler
from tests.support.local_site import serve_site

ARTICLE = """<html><head><title>Tides of the Moon</title><style>p{color:red}</style></head>
<body><h1>Tides</h1>
<p>The <b>tide</b> rises twice a day. See <a href="/moon.html">the Moon page</a> and
<a href="https://example.org/sea">the sea</a>.</p>
<table><tr><td>High</td><td>06:12</td></tr><tr><td>Low</td><td>12:30</td></tr></table>
<script>document.write('hidden')</script>
<p>%s</p>
<p>The spring tide comes at the full moon.</p>
</body></html>""" % ("filler words " * 200)


PAGES = {
    "/tides.html": ("text/html; charset=utf-8", ARTICLE),
    "/moon.html": ("text/html", "<title>Moon</title><p>The Moon orbits the Earth.</p>"),
    "/plain.txt": ("text/plain", "line one\nline two"),
    "/image.png": ("image/png", "PNG"),
}
RESULTS = [
    {
        "title": "Tides of the Moon",
        "url": "/tides.html",
        "content": "Why the tide rises twice a day.",
    },
    {"title": "Moon", "url": "/moon.html"},
    {"title": "not a web page", "url": "file:///etc/passwd"},
]


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    with serve_site(PAGES, RESULTS, redirects={"/moved": "/moon.html"}) as root:
        yield root


def run_with(
    site: str, body: Callable[[BrowserTool], Awaitable[None]], *, allow_private: bool = True
) -> None:
    async def main() -> None:
        tool = BrowserTool(
            SearxngSearch(f"{site}/search"),
            PageFetcher(allow_private=allow_private, timeout_s=10),
            view_chars=1200,
        )
        try:
            await body(tool)
        finally:
            await tool.close()

    asyncio.run(main())


CTX = ToolContext(response_id="resp_1", conversation_id="conv_1")


def test_is_a_server_tool_with_harmonys_browser_namespace() -> None:
    tool = BrowserTool(None, PageFetcher())
    assert isinstance(tool, ServerTool)
    described = tool.description()
    assert (described.name, described.builtin) == ("browser", "browser")
    assert described.description.startswith("Tool for browsing.\nThe `cursor` appears")
    asyncio.run(tool.close())


def test_search_open_find_and_scroll(site: str) -> None:
    port = site.rsplit(":", 1)[1]

    async def body(tool: BrowserTool) -> None:
        found = await tool.call("browser.search", '{"query": "tides", "topn": 5}', CTX)
        assert not found.is_error
        assert found.text == (
            "[0] tides\n**viewing lines [0 - 1] of 1**\n\n"
            f"L0: * 【0†Tides of the Moon†127.0.0.1:{port}】 Why the tide rises twice a day.\n"
            f"L1: * 【1†Moon†127.0.0.1:{port}】"
        )
        assert found.item["action"] == {
            "type": "search",
            "query": "tides",
            "sources": [
                {"type": "url", "url": f"{site}/tides.html"},
                {"type": "url", "url": f"{site}/moon.html"},
            ],
        }

        opened = await tool.call("browser.open", '{"id": 0}', CTX)
        assert not opened.is_error
        lines = opened.text.split("\n")
        assert lines[0] == f"[1] Tides of the Moon ({site}/tides.html)"
        assert lines[1].startswith("**viewing lines [0 - ")
        assert lines[3] == f"L0: URL: {site}/tides.html"
        assert lines[4] == "L1: Tides"
        page = "\n".join(lines)
        assert "【0†the Moon page】" in page  # a link on the same site
        assert "【1†the sea†example.org】" in page  # one elsewhere
        assert "High" in page
        assert "06:12" in page
        assert "hidden" not in page
        assert "color:red" not in page
        assert "spring tide" not in page  # past the view
        assert opened.item["action"] == {"type": "open_page", "url": f"{site}/tides.html"}

        find = await tool.call("browser.find", '{"pattern": "SPRING tide"}', CTX)
        assert find.text.startswith(
            f"[2] Find results for text: `SPRING tide` in `Tides of the Moon` ({site}/tides.html/"
            "find?pattern=SPRING tide)\n**viewing lines [0 - 1] of 1**\n\nL0: # 【0†match at L"
        )
        assert "L1: The spring tide comes at the full moon." in find.text
        match_line = int(find.text.split("match at L")[1].split("】")[0])
        assert find.item["action"] == {
            "type": "find_in_page",
            "pattern": "SPRING tide",
            "url": f"{site}/tides.html",
        }

        at_match = await tool.call("browser.open", '{"id": 0}', CTX)  # the match, in context
        assert at_match.text.startswith(f"[3] Tides of the Moon ({site}/tides.html)\n")
        assert f"**viewing lines [{match_line - 4} - " in at_match.text
        assert f"L{match_line}: The spring tide comes at the full moon." in at_match.text

        scrolled = await tool.call("browser.open", '{"cursor": 1, "loc": 2, "num_lines": 2}', CTX)
        assert scrolled.text.split("\n")[1] == "**viewing lines [2 - 3] of 43**"
        assert scrolled.text.startswith("[4] ")
        assert scrolled.text.count("\nL") == 2

        moon = await tool.call("browser.open", '{"cursor": 1, "id": 0}', CTX)  # a page's link
        assert moon.text.startswith(f"[5] Moon ({site}/moon.html)\n")
        assert "L1: The Moon orbits the Earth." in moon.text

    run_with(site, body)


def test_urls_redirects_and_plain_text(site: str) -> None:
    async def body(tool: BrowserTool) -> None:
        moved = await tool.call("browser.open", json.dumps({"id": f"{site}/moved"}), CTX)
        assert moved.text.startswith(f"[0] Moon ({site}/moon.html)\n")
        plain = await tool.call("browser.open", json.dumps({"id": f"{site}/plain.txt"}), CTX)
        assert plain.text.endswith("L1: line one\nL2: line two")

    run_with(site, body)


def test_mistakes_are_told_to_the_model(site: str) -> None:
    async def body(tool: BrowserTool) -> None:
        cases = {
            ("browser.open", '{"id": 3}'): "No pages to access!",
            ("browser.find", '{"pattern": "x"}'): "No pages to access!",
            ("browser.open", json.dumps({"id": f"{site}/missing"})): "answered HTTP 404",
            ("browser.open", json.dumps({"id": f"{site}/image.png"})): "is image/png",
            ("browser.open", '{"id": "file:///etc/passwd"}'): "only http and https",
            ("browser.open", "{not json"): "Invalid function arguments",
            ("browser.fly", "{}"): "Unknown function: fly",
        }
        for (name, arguments), said in cases.items():
            result = await tool.call(name, arguments, CTX)
            assert result.is_error, (name, arguments)
            assert said in result.text, (name, arguments, result.text)
        await tool.call("browser.search", '{"query": "tides"}', CTX)
        assert "Invalid link id `9`" in (await tool.call("browser.open", '{"id": 9}', CTX)).text
        assert (
            "Cursor `7` is out of range"
            in (await tool.call("browser.open", '{"cursor": 7}', CTX)).text
        )
        assert (
            "Cannot run `find` on search results"
            in (await tool.call("browser.find", '{"pattern": "x"}', CTX)).text
        )
        assert (
            "Invalid location parameter: `99`"
            in (await tool.call("browser.open", '{"loc": 99}', CTX)).text
        )

    run_with(site, body)


def test_loopback_and_private_addresses_are_refused_by_default(site: str) -> None:
    port = site.rsplit(":", 1)[1]

    async def body(tool: BrowserTool) -> None:
        for url in (f"{site}/tides.html", f"http://localhost:{port}/tides.html"):
            result = await tool.call("browser.open", json.dumps({"id": url}), CTX)
            assert result.is_error
            assert "is not a public host: the browser only opens public addresses" in result.text
        named = await tool.call(
            "browser.open", json.dumps({"id": f"http://localhost:{port}/tides.html"}), CTX
        )
        assert "localhost is not a public host" in named.text
        assert "127.0.0.1" not in named.text  # the address a name resolves to is not told
        # the operator's search endpoint is reached; the loopback pages it found are not
        await tool.call("browser.search", '{"query": "tides"}', CTX)
        refused = await tool.call("browser.open", '{"id": 0}', CTX)
        assert refused.is_error
        assert "127.0.0.1 is not a public host" in refused.text

    run_with(site, body, allow_private=False)


class CookieSite(BaseHTTPRequestHandler):
    """`/set?v=VALUE` sets the cookie `session=VALUE`; every page shows the cookies it got."""

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        got = self.headers.get("Cookie") or "none"
        body = f"<title>Cookies</title><p>cookies sent: {got}</p>".encode()
        headers = {}
        if parts.path == "/set":
            headers["Set-Cookie"] = f"session={parse_qs(parts.query)['v'][0]}; Path=/"
        send(self, 200, "text/html", body, headers)

    def log_message(self, *args: object) -> None:
        pass


def test_conversations_never_share_a_cookie() -> None:
    alice = ToolContext(response_id="resp_a", conversation_id="conv_a")
    bob = ToolContext(response_id="resp_b", conversation_id="conv_b")

    async def body(tool: BrowserTool, root: str) -> None:
        async def open_(ctx: ToolContext, path: str) -> str:
            result = await tool.call("browser.open", json.dumps({"id": root + path}), ctx)
            assert not result.is_error, result.text
            return result.text

        assert "cookies sent: none" in await open_(alice, "/set?v=alice")
        assert "cookies sent: session=alice" in await open_(alice, "/echo")  # kept for alice
        assert "cookies sent: none" in await open_(bob, "/echo")  # never sent for bob
        assert "cookies sent: none" in await open_(bob, "/set?v=bob")
        assert "cookies sent: session=bob" in await open_(bob, "/echo")
        assert "cookies sent: session=alice" in await open_(alice, "/echo")

    with serve_handler(CookieSite) as root:
        run_with(root, lambda tool: body(tool, root))


def test_the_page_stack_keeps_the_last_pages_within_its_budget(site: str) -> None:
    async def main() -> None:
        tool = BrowserTool(
            None, PageFetcher(allow_private=True, timeout_s=10), max_pages=4, view_chars=200
        )
        try:
            url = json.dumps({"id": f"{site}/tides.html"})
            first = await tool.call("browser.open", url, CTX)
            assert first.text.startswith("[0] Tides of the Moon")
            for _ in range(5):
                await tool.call("browser.open", '{"loc": 1}', CTX)  # a scroll is a page too
            state = tool.state("conv_1")
            assert list(state.stack) == [2, 3, 4, 5]  # the oldest dropped; cursors keep numbers
            dropped = await tool.call("browser.open", '{"cursor": 1, "loc": 2}', CTX)
            assert dropped.is_error
            assert "Cursor `1` is no longer kept" in dropped.text
            assert "Available cursor indices: [2 - 5]" in dropped.text
            kept = await tool.call("browser.open", '{"cursor": 2, "loc": 2}', CTX)
            assert kept.text.startswith("[6] Tides of the Moon")
            assert (
                "Cursor `9` is out of range"
                in (await tool.call("browser.open", '{"cursor": 9}', CTX)).text
            )

            # the text budget: a second conversation that holds about one page of text
            size = state.stack[6].size
            small = ToolContext(response_id="r", conversation_id="small")
            tool.max_page_bytes = size + size // 2
            await tool.call("browser.open", url, small)
            await tool.call("browser.open", json.dumps({"id": f"{site}/moon.html"}), small)
            assert list(tool.state("small").stack) == [0, 1]  # the moon page is small
            await tool.call("browser.open", url, small)
            held = tool.state("small")
            assert list(held.stack) == [1, 2]  # the first tides page went
            assert held.size <= tool.max_page_bytes
            assert set(held.fetched) == {f"{site}/tides.html", f"{site}/moon.html"}
        finally:
            await tool.close()

    asyncio.run(main())


def test_a_page_that_overruns_the_time_limit_has_its_worker_killed(site: str) -> None:
    big = "<html><title>Big</title><body>" + "<p>Lots <a href='/x'>of</a> words.</p>" * 60_000

    async def main(root: str) -> None:
        tool = BrowserTool(None, PageFetcher(allow_private=True, timeout_s=10))
        try:
            warm = await tool.call("browser.open", json.dumps({"id": f"{root}/small"}), CTX)
            assert not warm.is_error, warm.text
            here = psutil.Process()
            workers = [p for p in here.children() if "spawn_main" in " ".join(p.cmdline())]
            started = time.monotonic()
            with pytest.raises(TimeoutError):  # the tool's timeout, as the core applies it
                await asyncio.wait_for(
                    tool.call("browser.open", json.dumps({"id": f"{root}/big"}), CTX), 0.5
                )
            assert time.monotonic() - started < 2  # the event loop was free to time it out
            assert len(workers) == 2
            # below the server's priority
            assert {p.nice() for p in workers} == {min(19, here.nice() + NICENESS)}
            deadline = time.monotonic() + 5
            while all(worker.is_running() for worker in workers):
                assert time.monotonic() < deadline, "no worker was killed"
                await asyncio.sleep(0.05)
            # a limit of its own (ToolContext.timeout_s) ends the call with an error
            short = ToolContext(response_id="r", conversation_id="c", timeout_s=0.3)
            late = await tool.call("browser.open", json.dumps({"id": f"{root}/big"}), short)
            assert late.is_error
            assert "Reading the page took longer than 0.3 s." in late.text
            # and the tool goes on with fresh workers
            again = await tool.call("browser.open", json.dumps({"id": f"{root}/small"}), CTX)
            assert not again.is_error, again.text
            assert "Small page." in again.text
        finally:
            await tool.close()

    pages = {"/big": ("text/html", big), "/small": ("text/html", "<p>Small page.</p>")}
    with serve_site(pages) as root:
        asyncio.run(main(root))
