"""The browser's address guard with the rule ON, against real listeners on 127.0.0.1 and ::1.

There is no internet here, so "the internet" is a network backend that carries connections to
one public address to a local listener (the public site), and the names the tests use resolve
through a resolver the test gives the guard (the rest through the system's). Every other
connection is a real one: a guard that let a private address through would reach the private
listener, which records every request it gets; each test asserts it got none.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpcore
import pytest

from server.tools.base import ToolContext
from server.tools.browser.fetch import PageFetcher, system_resolver
from server.tools.browser.tool import BrowserTool
from tests.support.local_http import send, serve_handler

PUBLIC = "93.184.215.14"  # what the public names resolve to: carried to the public site
CTX = ToolContext(response_id="resp_1", conversation_id="conv_1")


class Recorder(BaseHTTPRequestHandler):
    """Records every request; answers a page, or a redirect to `?to=`."""

    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        target = parse_qs(urlsplit(self.path).query).get("to")
        if target:
            send(self, 302, "text/plain", b"", {"Location": target[0]})
        else:
            send(self, 200, "text/html", b"<title>Here</title><p>A page.</p>")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def listener() -> Iterator[tuple[int, list[str]]]:
    """A recording site on 127.0.0.1: its port and the paths it was asked for."""
    seen: list[str] = []
    handler = type("Site", (Recorder,), {"seen": seen})
    with serve_handler(handler) as root:
        yield int(root.rsplit(":", 1)[1]), seen


@contextmanager
def listener_v6(port: int) -> Iterator[list[str] | None]:
    """A recording site on [::1]:`port` (None where this machine has no IPv6 loopback)."""
    seen: list[str] = []

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6

    try:
        server = Server(("::1", port), type("Site6", (Recorder,), {"seen": seen}))
    except OSError:
        yield None
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


class Internet(httpcore.AsyncNetworkBackend):
    """Connections to PUBLIC go to the public site on 127.0.0.1; every other one is made as
    asked (a private address reaches what listens there)."""

    def __init__(self, public_port: int) -> None:
        self._real = httpcore.AnyIOBackend()
        self._public_port = public_port
        self.connected: list[tuple[str, int]] = []

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, *args: Any, **kwargs: Any
    ) -> httpcore.AsyncNetworkStream:
        self.connected.append((host, port))
        if host == PUBLIC:
            host, port = "127.0.0.1", self._public_port
        return await self._real.connect_tcp(host, port, timeout, *args, **kwargs)

    async def sleep(self, seconds: float) -> None:
        await self._real.sleep(seconds)


class Names:
    """A resolver: each name's answers in turn (the last one kept); others as the system
    answers them."""

    def __init__(self, **answers: list[list[str]]) -> None:
        self.answers = {name + ".test": list(a) for name, a in answers.items()}
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host in self.answers:
            queue = self.answers[host]
            return queue.pop(0) if len(queue) > 1 else queue[0]
        return await system_resolver(host, port)


def open_urls(names: Names, internet: Internet, *urls: str) -> list[tuple[bool, str]]:
    """Each URL opened by `browser.open` in one conversation, guard on: (is_error, text)."""

    async def main() -> list[tuple[bool, str]]:
        fetcher = PageFetcher(timeout_s=10, resolver=names, network=internet)
        tool = BrowserTool(None, fetcher)
        try:
            results = []
            for url in urls:
                result = await tool.call("browser.open", json.dumps({"id": url}), CTX)
                results.append((result.is_error, result.text))
            return results
        finally:
            await tool.close()

    return asyncio.run(main())


@pytest.fixture
def sites() -> Iterator[tuple[int, list[str], int, list[str], list[str] | None]]:
    """The public site (its port, what it saw), the private one on 127.0.0.1 and on ::1."""
    with (
        listener() as (public_port, public_seen),
        listener() as (port, private_seen),
        listener_v6(port) as private_v6_seen,
    ):
        yield public_port, public_seen, port, private_seen, private_v6_seen


def private_forms(port: int) -> list[str]:
    """127.0.0.1 and ::1 written every way a URL can write them, and names for them."""
    return [
        f"http://127.0.0.1:{port}/a",
        f"http://localhost:{port}/a",
        f"http://2130706433:{port}/a",  # one decimal number
        f"http://0x7f.1:{port}/a",  # hex, two parts
        f"http://127.1:{port}/a",  # two parts
        f"http://0177.0.0.1:{port}/a",  # octal (httpx refuses the URL itself)
        f"http://0x7f000001:{port}/a",  # one hex number
        f"http://[::ffff:127.0.0.1]:{port}/a",  # IPv4-mapped IPv6
        f"http://[::1]:{port}/a",
        f"http://private.test:{port}/a",  # a name for 127.0.0.1
        f"http://private6.test:{port}/a",  # a name for ::1
    ]


def assert_never_reached(
    private_seen: list[str], private_v6_seen: list[str] | None, internet: Internet
) -> None:
    """No request reached a private listener; every connection went to the public address."""
    assert private_seen == []
    assert private_v6_seen in (None, [])
    assert all(host == PUBLIC for host, _ in internet.connected)


def refused_as(url: str) -> str:
    if "0177" in url:
        return "is not a URL"
    return "is not a public host: the browser only opens public addresses"


def test_a_public_name_is_opened_and_every_private_form_is_refused_without_its_address(
    sites: tuple[int, list[str], int, list[str], list[str] | None],
) -> None:
    public_port, public_seen, port, private_seen, private_v6_seen = sites
    names = Names(
        www=[[PUBLIC]], private=[["127.0.0.1"]], private6=[["::1"]], intranet=[["10.1.2.3"]]
    )
    internet = Internet(public_port)
    forms = private_forms(port)
    results = open_urls(
        names, internet, f"http://www.test:{port}/page", *forms, f"http://intranet.test:{port}/"
    )
    (public_error, public_text), *refused = results
    assert not public_error, public_text
    assert "A page." in public_text
    assert public_seen == ["/page"]
    for url, (is_error, text) in zip([*forms, "intranet"], refused, strict=True):
        assert is_error, (url, text)
        assert refused_as(url) in text, (url, text)
        # the refusal names the host as the URL wrote it, never the address it resolved to
        for address in ("127.0.0.1", "::1", "10.1.2.3"):
            if address not in url:
                assert address not in text, (url, text)
    assert_never_reached(private_seen, private_v6_seen, internet)


def test_a_redirect_from_a_public_host_to_a_private_one_is_refused(
    sites: tuple[int, list[str], int, list[str], list[str] | None],
) -> None:
    public_port, public_seen, port, private_seen, private_v6_seen = sites
    names = Names(www=[[PUBLIC]], private=[["127.0.0.1"]], private6=[["::1"]])
    internet = Internet(public_port)
    forms = private_forms(port)
    redirects = [f"http://www.test:{port}/go?to={quote(target, safe='')}" for target in forms]
    for url, (is_error, text) in zip(forms, open_urls(names, internet, *redirects), strict=True):
        assert is_error, (url, text)
        assert "is not a public host" in text or "0177" in url, (url, text)
    assert len(public_seen) == len(forms)  # each redirect was asked for, and not one followed
    assert_never_reached(private_seen, private_v6_seen, internet)


def test_a_name_that_rebinds_to_loopback_after_its_first_answer_is_refused(
    sites: tuple[int, list[str], int, list[str], list[str] | None],
) -> None:
    public_port, public_seen, port, private_seen, _ = sites
    names = Names(rebind=[[PUBLIC], ["127.0.0.1"]])
    internet = Internet(public_port)
    url = f"http://rebind.test:{port}/page"
    (first_error, first), (second_error, second) = open_urls(names, internet, url, url)
    assert not first_error, first
    assert "A page." in first
    assert second_error
    assert "rebind.test is not a public host" in second
    assert "127.0.0.1" not in second
    assert names.asked == ["rebind.test", "rebind.test"]  # resolved at each connection
    assert public_seen == ["/page"]
    assert private_seen == []


def test_a_name_with_a_public_and_a_private_address_is_refused(
    sites: tuple[int, list[str], int, list[str], list[str] | None],
) -> None:
    public_port, public_seen, port, private_seen, _ = sites
    for answer in ([PUBLIC, "127.0.0.1"], ["127.0.0.1", PUBLIC], [PUBLIC, "::ffff:10.0.0.1"]):
        names = Names(both=[answer])
        internet = Internet(public_port)
        ((is_error, text),) = open_urls(names, internet, f"http://both.test:{port}/page")
        assert is_error, answer
        assert "both.test is not a public host" in text
        assert internet.connected == []
    assert public_seen == []
    assert private_seen == []
