"""RPC hosts as addresses: parsing HOST:PORT, the loopback rule, resolving a name once, a bounded
TCP reachability check.

Pure socket code (no llama.cpp), so the settings can validate `--rpc` and the engine can name a
host that stopped answering. A host name is resolved once, at start-up (`resolve()`), and ggml is
given the address that was checked: it would resolve the name again at every (re)connection.
The loopback rule is the server's one rule for "this machine only":
RPC endpoints, the RPC worker's bind address and the HTTP server's bind address all use it.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Sequence


class RpcError(Exception):
    """An RPC endpoint cannot be used; the message names it and says why."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """("host", port) of "host:port"; ValueError otherwise.

    The host is an IPv4 address or a name: llama.cpp's RPC client splits at the first colon, so
    it takes no IPv6 literal.
    """
    host, sep, port = endpoint.strip().partition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"{endpoint!r} is not HOST:PORT (HOST: an IPv4 address or a name; llama.cpp's RPC "
            "client takes no IPv6 literal)"
        )
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True when `host` names this machine by its spelling: `localhost`, or a loopback address
    literal (127/8, ::1, with or without brackets).

    Names are never resolved: what a name resolves to may change between this check and the
    connection or bind, and a check must not wait on DNS. Any other name counts as another
    machine (the RPC options then ask for --rpc-trust-network / --trust-network).
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def resolve(endpoint: str, loopback_only: bool) -> str:
    """`endpoint` as IPV4:PORT, a name resolved now (the first IPv4 address it has).

    With `loopback_only` (no --rpc-trust-network), the address must be this machine's too: a
    `localhost` that resolves elsewhere is refused. RpcError names the endpoint and the reason.
    """
    host, port = split_endpoint(endpoint)
    try:
        found = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise RpcError(f"RPC host {endpoint}: cannot resolve {host!r} ({reason})") from exc
    if not found:
        raise RpcError(f"RPC host {endpoint}: {host!r} has no IPv4 address")
    address = str(found[0][4][0])
    if loopback_only and not ipaddress.ip_address(address).is_loopback:
        raise RpcError(
            f"RPC host {endpoint}: {host!r} resolves to {address}, which is not this machine; "
            "add --rpc-trust-network if that network is trusted"
        )
    return f"{address}:{port}"


def reachable(endpoint: str, timeout_s: float) -> None:
    """A TCP connection to `endpoint` within `timeout_s`, closed at once; RpcError if none."""
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except ConnectionRefusedError as exc:
        message = f"RPC host {endpoint} refused the connection (is its rpc-server running?)"
        raise RpcError(message) from exc
    except TimeoutError as exc:
        raise RpcError(f"RPC host {endpoint} did not answer within {timeout_s:g} s") from exc
    except OSError as exc:
        raise RpcError(f"RPC host {endpoint} cannot be reached: {exc.strerror or exc}") from exc


def unreachable(endpoints: Sequence[str], timeout_s: float = 2.0, attempts: int = 1) -> list[str]:
    """The endpoints that no longer accept a TCP connection.

    With several attempts, asks again (0.3 s apart) while every endpoint still answers: a host
    whose process is ending may accept a connection for a moment after its peers saw it drop.
    """
    down: list[str] = []
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.3)
        for endpoint in endpoints:
            try:
                reachable(endpoint, timeout_s)
            except RpcError:
                down.append(endpoint)
        if down:
            break
    return down
