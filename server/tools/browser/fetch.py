"""The browser's HTTP: pages fetched with httpx, never from an address the operator did not mean.

A page's host is resolved, every address it resolves to is checked, and the connection goes to
a checked address: the check happens in the connection itself (an httpcore network backend),
so a name that resolves to a public address at check time and to 127.0.0.1 a moment later
(DNS rebinding) cannot slip through, and each redirect's new host is checked the same way. A
host with any refused address is refused whole. Which addresses are refused is the explicit
table of addresses.py, the same on every Python version, unless the operator relaxes the rule
(`allow_private`, meant for tests on 127.0.0.1). A refusal names the host, never the address it
resolved to. No proxy from the environment is used; pages are read up to `max_bytes`. Each
conversation has its own cookie jar (`get`'s `cookies`): a cookie one conversation was given is
never sent on another's fetches.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http.cookiejar import CookieJar
from typing import Any

import anyio
import httpcore
import httpx

from server.tools.browser.addresses import address_refused

USER_AGENT = "gpt-oss-server-browser/0.1"
TEXT_TYPES = ("text/html", "application/xhtml+xml", "text/plain", "application/json", "text/")
MAX_COOKIES = 256  # a conversation's jar past this is emptied

Resolver = Callable[[str, int], Awaitable[list[str]]]


class FetchError(Exception):
    """A page that could not be fetched; the message is what the model reads."""


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, as the system resolver answers (anyio.getaddrinfo)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves, checks every address, connects to a checked one. `resolver` answers a host's
    addresses (the system's by default); `network` makes the connections (httpcore's own)."""

    def __init__(
        self,
        allow_private: bool = False,
        *,
        resolver: Resolver = system_resolver,
        network: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self._inner = network or httpcore.AnyIOBackend()
        self._resolve = resolver
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
                resolved = await self._resolve(host, port)
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"{host} could not be resolved: {exc}") from exc
        addresses = list(dict.fromkeys(resolved))
        if not addresses:
            raise httpcore.ConnectError(f"{host} has no address")
        if not self._allow_private and any(address_refused(a) is not None for a in addresses):
            raise httpcore.ConnectError(
                f"{host} is not a public host: the browser only opens public addresses"
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
    """httpx's own transport over a connection pool that connects through `backend` (httpx
    takes no network backend of its own, so the pool it made is replaced)."""

    def __init__(self, backend: GuardedBackend) -> None:
        super().__init__(trust_env=False, retries=0)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), network_backend=backend
        )


@dataclass(frozen=True, slots=True)
class Fetched:
    url: str  # after redirects
    content_type: str
    body: bytes  # at most max_bytes
    encoding: str


class PageFetcher:
    """GETs http(s) pages through the guard, each with the cookie jar it is given. The
    connections are pooled across conversations (they carry no cookies); `resolver` and
    `network` go to GuardedBackend."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        timeout_s: float = 20.0,
        max_bytes: int = 4 << 20,
        resolver: Resolver = system_resolver,
        network: httpcore.AsyncNetworkBackend | None = None,
    ) -> None:
        self.allow_private = allow_private
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        backend = GuardedBackend(allow_private, resolver=resolver, network=network)
        self._transport = _GuardedTransport(backend)

    def _client(self, cookies: CookieJar) -> httpx.AsyncClient:
        """A client over the shared transport whose cookie jar is `cookies` itself (httpx keeps
        a CookieJar it is given, where it copies any other cookies). It is never closed:
        closing it would close the shared transport, and it holds nothing else."""
        return httpx.AsyncClient(
            transport=self._transport,
            cookies=cookies,
            timeout=self.timeout_s,
            follow_redirects=True,
            max_redirects=5,
            trust_env=False,
            headers={"User-Agent": USER_AGENT},
        )

    async def get(self, url: str, cookies: CookieJar) -> Fetched:
        """The page at `url`, sending and keeping the cookies of `cookies` (one conversation's
        jar; emptied once it holds more than MAX_COOKIES)."""
        try:
            parsed = httpx.URL(url)
        except httpx.InvalidURL as exc:
            raise FetchError(f"`{url}` is not a URL: {exc}") from exc
        if parsed.scheme not in ("http", "https"):
            raise FetchError(f"`{url}`: the browser opens only http and https URLs")
        try:
            async with self._client(cookies).stream("GET", parsed) as response:
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
                return Fetched(
                    url=str(response.url),
                    content_type=kind,
                    body=bytes(body),
                    encoding=response.charset_encoding or "utf-8",
                )
        except httpx.TooManyRedirects as exc:
            raise FetchError(f"`{url}` redirected too many times") from exc
        except httpx.HTTPError as exc:
            raise FetchError(f"`{url}` could not be fetched: {exc}") from exc
        finally:
            if len(cookies) > MAX_COOKIES:
                cookies.clear()

    async def close(self) -> None:
        await self._transport.aclose()
