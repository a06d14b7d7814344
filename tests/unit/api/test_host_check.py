"""The Host and Origin check as an ASGI middleware, without the engine: which Host names and
which Origins reach the app, and the refusal each other request gets (status, envelope, headers).
The same rules through the whole app and a real engine: tests/api/test_host_check.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from server.api.host_check import HostCheckMiddleware

SERVED = 200
BODY = b'{"model": "m"}'


class Recorder:
    """The app behind the check: answers 200 and counts the requests that reached it."""

    def __init__(self) -> None:
        self.reached = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.reached += 1
        if scope["type"] == "http":
            assert (await receive())["body"] == BODY  # the request's own channel, passed on
            await send({"type": "http.response.start", "status": SERVED, "headers": []})
            await send({"type": "http.response.body", "body": b""})


def call(
    check: HostCheckMiddleware,
    host: str | None,
    origin: str | None = None,
    *,
    scheme: str | None = "http",
    path: str = "/v1/chat/completions",
    kind: str = "http",
    server: tuple[str, int] | None = ("127.0.0.1", 8000),
) -> list[Message]:
    """What `check` sends for a request; `scheme` None: a scope without one (ASGI: "http")."""
    headers = []
    if host is not None:
        headers.append((b"host", host.encode("latin-1")))
    if origin is not None:
        headers.append((b"origin", origin.encode("latin-1")))
    scope: dict[str, Any] = {"type": kind, "scheme": scheme, "path": path, "headers": headers}
    if scheme is None:
        del scope["scheme"]
    if not headers:
        del scope["headers"]  # optional in ASGI: none
    if server is not None:
        scope["server"] = server
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(check(scope, receive, send))
    return sent


def status(
    check: HostCheckMiddleware, host: str | None, origin: str | None = None, **kw: Any
) -> int:
    start = call(check, host, origin, **kw)[0]
    assert start["type"] == "http.response.start"
    return int(start["status"])


def middleware(bound: str = "127.0.0.1", allowed: Iterable[str] = ()) -> HostCheckMiddleware:
    return HostCheckMiddleware(Recorder(), bound, allowed)


def body(messages: list[Message]) -> dict[str, Any]:
    start, end = messages
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(end["body"])).encode()
    assert end["type"] == "http.response.body"
    parsed: dict[str, Any] = json.loads(end["body"])
    return parsed


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "LocalHost:8000",
        "127.0.0.1",
        "127.9.9.9:1",
        "[::1]:8000",
        "[::1]",
        "10.1.2.3",
        None,  # HTTP/1.0 sends no Host: nothing to check
    ],
)
def test_loopback_names_and_addresses_reach_the_app(host: str | None) -> None:
    check = middleware()
    assert status(check, host) == SERVED
    assert isinstance(check.app, Recorder)
    assert check.app.reached == 1


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8000",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "localhost:notaport",
        "localhost:70000",
        "user@localhost",  # a user part: not a Host
        "localhost/path",
        "localhost?query",
        "",
        ":8000",
    ],
)
def test_a_foreign_or_malformed_host_is_refused_in_the_openai_envelope(host: str) -> None:
    check = middleware()
    sent = call(check, host)
    assert sent[0]["status"] == 400
    error = body(sent)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_host"
    assert error["param"] is None
    assert error["message"] == (
        f"Host {host!r} is not a name of this server: it answers to localhost, IP addresses and "
        "the name it is bound to (a guard against DNS rebinding); to reach it by another name "
        "(a reverse proxy, a LAN name) start it with --allowed-hosts NAME"
    )
    assert isinstance(check.app, Recorder)
    assert check.app.reached == 0


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_refusals_on_the_messages_api_are_in_its_envelope(path: str) -> None:
    check = middleware()
    refused = body(call(check, "evil.example", path=path))
    assert refused["type"] == "error"
    assert refused["error"]["type"] == "invalid_request_error"
    assert "DNS rebinding" in refused["error"]["message"]
    foreign = body(call(check, "localhost", "http://evil.example", path=path))
    assert foreign["error"]["type"] == "permission_error"
    assert "http://evil.example" in foreign["error"]["message"]
    other = body(call(check, "evil.example", path="/v1/messagesx"))  # not the messages API
    assert other["error"]["code"] == "invalid_host"


def test_the_bound_name_and_the_address_reached_are_known() -> None:
    check = middleware(bound=" [MyServer.LAN] ")
    assert status(check, "myserver.lan:8000") == SERVED
    assert status(check, "other.lan") == 400
    assert status(middleware(bound="Xbox.X"), "xbox.x") == SERVED  # only brackets are stripped
    reached = middleware()
    assert status(reached, "box.local:8000", server=("Box.Local", 8000)) == SERVED
    assert status(reached, "xbox.x", server=("Xbox.X", 8000)) == SERVED
    assert status(reached, "box.local:8000", server=("[box.local]", 8000)) == SERVED
    assert status(reached, "box.local:8000", server=None) == 400
    assert status(reached, "box.local:8000", server=("other.local", 8000)) == 400


def test_allowed_hosts_name_hosts_exactly_or_by_suffix() -> None:
    check = middleware(allowed=["chat.example", " *.Lan ", "Box.Example:8000", "odd/name"])
    for host in ("chat.example", "chat.example:443", "a.lan", "a.b.lan:1", "box.example:9"):
        assert status(check, host) == SERVED, host
    for host in ("other.example", "lan", "evillan", "chat.example.evil", "odd"):
        assert status(check, host) == 400, host
    assert check.allowed == ("chat.example", "*.lan", "box.example", "odd/name")


def test_a_port_in_an_allowed_pattern_is_dropped_as_in_a_name() -> None:
    check = middleware(allowed=["*.Lan:8000", "Box.Example:8000"])
    assert check.allowed == ("*.lan", "box.example")
    assert status(check, "a.lan:9") == SERVED
    assert status(check, "box.example") == SERVED


def test_a_star_pattern_needs_its_dot() -> None:
    check = middleware(allowed=["*lan"])
    assert status(check, "xlan") == 400
    assert status(check, "a.lan") == 400


@pytest.mark.parametrize(
    ("host", "origin", "scheme"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000", "http"),
        ("localhost", "http://localhost", "http"),
        ("localhost", "http://localhost:80", "http"),
        ("localhost:80", "http://LOCALHOST", "http"),
        ("localhost:443", "https://localhost", "https"),
        ("localhost", "https://localhost:443", "https"),  # a Host without port: the scheme's
        ("localhost:80", "http://localhost", None),  # a scope without scheme is http's
        ("[::1]:8000", "http://[::1]:8000", "http"),
    ],
)
def test_the_servers_own_origin_is_served(host: str, origin: str, scheme: str) -> None:
    assert status(middleware(), host, origin, scheme=scheme) == SERVED


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "http://localhost:3000",  # another port of this machine
        "https://127.0.0.1:8000",  # another scheme
        "http://127.0.0.1",  # port 80, not 8000
        "null",  # sandboxed frames, file:// pages
        "chrome-extension://abcdef",
        "ftp://127.0.0.1:8000",
        "http://user@127.0.0.1:8000",
    ],
)
def test_a_foreign_origin_is_refused_with_403(origin: str) -> None:
    check = middleware()
    sent = call(check, "127.0.0.1:8000", origin)
    assert sent[0]["status"] == 403
    error = body(sent)["error"]
    assert error["type"] == "permission_error"
    assert error["code"] == "cross_origin_request"
    assert error["message"] == (
        f"requests from web pages of another origin ({origin}) are refused: the server answers "
        "browsers only on its own pages; allow a page's host with --allowed-hosts"
    )
    assert isinstance(check.app, Recorder)
    assert check.app.reached == 0


def test_an_origin_of_an_allowed_host_is_served() -> None:
    check = middleware(allowed=["chat.example", "*.lan"])
    assert status(check, "127.0.0.1:8000", "https://chat.example") == SERVED
    assert status(check, "127.0.0.1:8000", "http://a.lan:3000") == SERVED
    assert status(check, "127.0.0.1:8000", "https://evil.example") == 403
    assert status(check, "127.0.0.1:8000", "ftp://chat.example") == 403


def test_without_a_host_an_origin_is_foreign() -> None:
    assert status(middleware(), None, "http://127.0.0.1:8000") == 403


def test_star_allows_any_host_and_origin() -> None:
    check = middleware(allowed=["chat.example", "*"])
    assert check.allow_any
    assert status(check, "anything.example", "https://page.example") == SERVED
    assert not middleware(allowed=["*.lan"]).allow_any


def test_a_websocket_of_a_foreign_host_is_closed_before_the_handshake() -> None:
    check = middleware()
    assert call(check, "evil.example", kind="websocket") == [
        {"type": "websocket.close", "code": 1008}
    ]
    assert call(check, "localhost", "http://evil.example", kind="websocket") == [
        {"type": "websocket.close", "code": 1008}
    ]
    assert call(check, "localhost", kind="websocket") == []
    assert isinstance(check.app, Recorder)
    assert check.app.reached == 1


def test_lifespan_messages_pass_unchecked() -> None:
    check = middleware()
    assert call(check, "evil.example", kind="lifespan") == []
    assert isinstance(check.app, Recorder)
    assert check.app.reached == 1
