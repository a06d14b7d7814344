"""The browser's address rule: which addresses it never connects to, and why.

An explicit table (`REFUSED`), the same on every Python version (the standard library's
`ipaddress` flags differ between versions); fetch.py checks every address a host resolves to
against it before connecting.
"""

from __future__ import annotations

import ipaddress

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


# The addresses the browser never connects to: the blocks of IANA's IPv4 and IPv6
# special-purpose address registries (RFC 6890 and its updates) that are not globally reachable,
# 192.0.0.0/24 and 2001::/23 whole, and the blocks whose addresses stand for other ones (6to4,
# Teredo, NAT64: refused whole). An IPv6 address outside 2000::/3 (global unicast) is refused
# too; an IPv4-mapped one is checked as the IPv4 address it maps.
_REFUSED_ROWS = (
    ("0.0.0.0/8", "this network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "NAT64 (local use)"),
    ("100::/64", "discard-only"),
    ("2001::/23", "IETF protocol assignments"),
    ("2001::/32", "Teredo"),
    ("2001:2::/48", "benchmarking"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "segment routing"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
)
REFUSED: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(network), why) for network, why in _REFUSED_ROWS
)
GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


def address_refused(address: str) -> str | None:
    """Why `address` may not be connected to (None: it may): the most specific row of
    `REFUSED` that holds it."""
    ip = ipaddress.ip_address(address)  # an IPv6 scope id (`fe80::1%eth0`) is read, not checked
    if isinstance(ip, ipaddress.IPv6Address) and ip in MAPPED:
        mapped = address_refused(str(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)))
        return None if mapped is None else f"IPv4-mapped, {mapped}"
    holding = [(net, why) for net, why in REFUSED if net.version == ip.version and ip in net]
    if holding:
        return max(holding, key=lambda row: row[0].prefixlen)[1]
    if isinstance(ip, ipaddress.IPv6Address) and ip not in GLOBAL_UNICAST:
        return "not global unicast"
    return None
