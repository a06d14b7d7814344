"""The browser's HTTP: pages fetched with httpx, never from an address the operator did not mean.

A page's host is resolved, every address it resolves to is checked, and the connection goes to
a checked address: the check happens in the connection itself (an httpcore network backend),
so a name that resolves to a public address at check time and to 127.0.0.1 a moment later
(DNS rebinding) cannot slip through, and each redirect's new host is checked the same way.
Private, loopback, link-local, shared, reserved and multicast addresses are refused unless the
operator relaxes the rule (`allow_private`, meant for tests on 127.0.0.1). No proxy from the
environment is used; pages are read up to `max_bytes`.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

import anyio
import httpcore
import httpx

USER_AGENT = "gpt-oss-server-browser/0.1"
TEXT_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "application/json", "text/")


class FetchError(Exception):
    """A page that could not be fetched; the message is what the model reads."""


def address_refused(address: str) -> str | None:
    """Why `address` may not be connected to (None: it may)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private:
        return "a private address"
    if ip.is_multicast or ip.is_reserved or ip.is_unspecified or not ip.is_global:
        return "not a public address"
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks every address, connects to a checked one."""

    def __init__(self, allow_private: bool = False) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._allow_private = allow_private

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            with anyio.fail_after(timeout):
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"{host} could not be resolved: {exc}") from exc
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise httpcore.ConnectError(f"{host} has no address")
        if not self._allow_private:
            for address in addresses:
                why = address_refused(address)
                if why is not None:
                    raise httpcore.ConnectError(
                        f"{host} resolves to {address}, {why}: the browser only opens public "
                        "addresses"
                    )
        error: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address, port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                error = exc
        raise httpcore.ConnectError(f"could not connect to {host}: {error}")

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the browser opens no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _GuardedTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport over a connection pool that connects through GuardedBackend (httpx
    takes no network backend of its own, so the pool it made is replaced)."""

    def __init__(self, allow_private: bool) -> None:
        super().__init__(trust_env=False, retries=0)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            network_backend=GuardedBackend(allow_private),
        )


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str  # after redirects
    content_type: str
    text: str


class PageFetcher:
    """GETs http(s) pages through the guard."""

    def __init__(
        self, *, allow_private: bool = False, timeout_s: float = 20.0, max_bytes: int = 4 << 20
    ) -> None:
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self._client = httpx.AsyncClient(
            transport=_GuardedTransport(allow_private),
            timeout=timeout_s,
            follow_redirects=True,
            max_redirects=5,
            trust_env=False,
            headers={"User-Agent": USER_AGENT},
        )

    async def get(self, url: str) -> Fetched:
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise FetchError(f"`{url}` is not a URL: {exc}") from exc
        if parsed.scheme not in ("http", "https"):
            raise FetchError(f"`{url}`: the browser opens only http and https URLs")
        try:
            async with self._client.stream("GET", parsed) as response:
                if response.status_code >= 400:
                    raise FetchError(f"`{url}` answered HTTP {response.status_code}")
                content_type = response.headers.get("content-type", "text/html")
                kind = content_type.split(";", 1)[0].strip().lower()
                if not kind.startswith(TEXT_TYPES):
                    raise FetchError(f"`{url}` is {kind}, not a page of text")
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > self.max_bytes:
                        del body[self.max_bytes :]
                        break
                encoding = response.charset_encoding or "utf-8"
                text = bytes(body).decode(encoding, errors="replace")
                return Fetched(url=str(response.url), content_type=kind, text=text)
        except httpx.TooManyRedirects as exc:
            raise FetchError(f"`{url}` redirected too many times") from exc
        except httpx.HTTPError as exc:
            raise FetchError(f"`{url}` could not be fetched: {exc}") from exc

    async def close(self) -> None:
        await self._client.aclose()
