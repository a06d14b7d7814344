"""Host and Origin checks: web pages elsewhere cannot drive the server through the browser.

DNS rebinding: a page at http://evil.example:8000 whose name is then re-pointed at 127.0.0.1 is
same-origin with this server in the browser, and could use the API and read its answers. Its
requests still name the attacker's host in the `Host` header, so a request is served only when
`Host` names this machine by a name no web page can re-point: `localhost`, an IP address
literal (a page at an address is served by whoever has that address: no DNS is asked), the
name the server is bound to (--host), the address the connection reached, or a name the user
allows (--allowed-hosts; `*`: any, for a reverse proxy that checks the Host itself). Anything
else gets 400.

Cross-origin requests: a browser sends `Origin` with every POST (and with cross-origin
requests); a request carrying one is served only when it comes from this server's own origin
(its scheme, and the host and port of `Host`) or its host is among --allowed-hosts. A page
elsewhere (another port of localhost included) gets 403 before any body is read, also for the
"simple" requests a browser sends without a CORS preflight. The server sends no CORS headers.
Clients that are not browsers send no `Origin` and are not affected. A WebSocket handshake (the
Responses socket) is checked the same way (a browser always sends its page's `Origin` with one,
and no CORS protects a socket) and refused with the same HTTP answer.

Starlette's TrustedHostMiddleware fits only in part: it ignores the port and keeps IPv6
brackets, so `localhost`, `127.0.0.1`, `[::1]` and the bound name could be listed, but it
compares names as strings (and `*.suffix`): no 127.0.0.0/8, no IP literal in general, not the
address the connection reached (an all-interfaces bind); it knows nothing of `Origin`, and it
answers in plain text, not in the APIs' error envelopes. Hence this middleware.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from server.api.messages.errors import anthropic_envelope, is_messages_path
from server.contracts.errors import error_envelope

DEFAULT_PORTS = {"http": 80, "https": 443}
WEB_SCHEMES = {"ws": "http", "wss": "https"}


def _split(authority: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of "host[:port]" (host lower-case, IPv6 without brackets); None if invalid."""
    try:
        parts = urlsplit(f"//{authority}")
        port = parts.port  # ValueError: not a port
    except ValueError:
        return None
    if not parts.hostname or parts.username is not None or parts.path or parts.query:
        return None
    return parts.hostname, port if port is not None else DEFAULT_PORTS.get(scheme, 80)


def _pattern(name: str) -> str:
    """An --allowed-hosts entry as a lower-case host name, without the port a Host header's
    name is compared without: "Box.lan:8000" -> "box.lan", "*.Lan:8000" -> "*.lan"."""
    name = name.strip().lower()
    split = _split(name, "http")
    return split[0] if split is not None else name


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _matches(host: str, patterns: Iterable[str]) -> bool:
    return any(
        host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))
        for pattern in patterns
    )


class HostCheckMiddleware:
    """Refuses requests addressed by a foreign host name (400) or from a foreign origin (403)."""

    def __init__(self, app: ASGIApp, bound_host: str, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.bound_host = bound_host.strip().strip("[]").lower()
        self.allowed = tuple(_pattern(name) for name in allowed_hosts)
        self.allow_any = "*" in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allow_any:
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, error_type, code = refusal
        if is_messages_path(str(scope.get("path", ""))):
            body = anthropic_envelope(status, message)
        else:
            body = error_envelope(message, error_type, code=code)
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        kind = "http"
        if scope["type"] == "websocket":  # refused before the handshake: its HTTP answer
            if "websocket.http.response" not in scope.get("extensions", {}):
                await send({"type": "websocket.close", "code": 1008})  # a bare 403
                return
            kind = "websocket.http"
        await send({"type": f"{kind}.response.start", "status": status, "headers": headers})
        await send({"type": f"{kind}.response.body", "body": payload})

    def _refusal(self, scope: Scope) -> tuple[int, str, str, str] | None:
        headers = dict(scope.get("headers", ()))
        scheme = str(scope.get("scheme", "http"))
        scheme = WEB_SCHEMES.get(scheme, scheme)  # a socket's page is http(s) in its Origin
        raw_host = headers.get(b"host")
        host = _split(raw_host.decode("latin-1"), scheme) if raw_host is not None else None
        if raw_host is not None and (host is None or not self._known_host(host[0], scope)):
            shown = raw_host.decode("latin-1")
            return (
                400,
                f"Host {shown!r} is not a name of this server: it answers to localhost, IP "
                "addresses and the name it is bound to (a guard against DNS rebinding); to "
                "reach it by another name (a reverse proxy, a LAN name) start it with "
                "--allowed-hosts NAME",
                "invalid_request_error",
                "invalid_host",
            )
        origin = headers.get(b"origin")
        if origin is None:
            return None
        shown = origin.decode("latin-1")
        parts = urlsplit(shown)
        source = _split(parts.netloc, parts.scheme) if parts.scheme in DEFAULT_PORTS else None
        same_origin = source is not None and (parts.scheme, source) == (scheme, host)
        if same_origin or (source is not None and _matches(source[0], self.allowed)):
            return None
        return (
            403,
            f"requests from web pages of another origin ({shown}) are refused: the server "
            "answers browsers only on its own pages; allow a page's host with --allowed-hosts",
            "permission_error",
            "cross_origin_request",
        )

    def _known_host(self, host: str, scope: Scope) -> bool:
        server = scope.get("server")
        reached = str(server[0]).strip("[]").lower() if server else None
        return (
            host == "localhost"
            or _is_ip(host)
            or host in (self.bound_host, reached)
            or _matches(host, self.allowed)
        )
