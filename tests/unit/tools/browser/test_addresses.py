"""The browser's address rule on plain addresses: every block of the table, its edges, the
most specific row winning, IPv4-mapped addresses read as the IPv4 address, scope ids, and the
public addresses around the refused blocks."""

from __future__ import annotations

import pytest

from server.tools.browser.addresses import address_refused

# The rule, pinned: the same answers on every Python version (its ipaddress tables differ).
RULE = [
    # IPv4
    ("0.0.0.0", "this network"),
    ("0.1.2.3", "this network"),
    ("10.1.2.3", "private"),
    ("100.64.0.1", "shared address space (carrier-grade NAT)"),
    ("100.127.255.254", "shared address space (carrier-grade NAT)"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("169.254.169.254", "link-local"),
    ("172.16.5.5", "private"),
    ("172.31.255.255", "private"),
    ("192.0.0.8", "IETF protocol assignments"),
    ("192.0.0.9", "IETF protocol assignments"),
    ("192.0.2.1", "documentation"),
    ("192.88.99.1", "6to4 relay anycast"),
    ("192.168.0.1", "private"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.254", "reserved"),
    ("255.255.255.255", "broadcast"),
    # IPv6
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::7f00:1", "IPv4-compatible"),
    ("::ffff:127.0.0.1", "IPv4-mapped, loopback"),
    ("::ffff:10.0.0.1", "IPv4-mapped, private"),
    ("::ffff:169.254.169.254", "IPv4-mapped, link-local"),
    ("::ffff:0:7f00:1", "not global unicast"),  # IPv4-translated
    ("64:ff9b::7f00:1", "NAT64"),
    ("64:ff9b::5db8:d70e", "NAT64"),  # even of a public IPv4 address
    ("64:ff9b:1::a00:1", "NAT64 (local use)"),
    ("100::1", "discard-only"),
    ("2001::1", "Teredo"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ("2001:2::1", "benchmarking"),
    ("2001:10::1", "IETF protocol assignments"),
    ("2001:db8::1", "documentation"),
    ("2002:7f00:1::1", "6to4"),  # embeds 127.0.0.1
    ("2002:5db8:d70e::1", "6to4"),  # embeds a public address: refused all the same
    ("3fff::1", "documentation"),
    ("5f00::1", "segment routing"),
    ("fc00::1", "unique local"),
    ("fd00::1", "unique local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),  # a scope id, as getaddrinfo writes a link-local answer
    ("::ffff:127.0.0.1%2", "IPv4-mapped, loopback"),
    ("febf::1", "link-local"),
    ("fec0::1", "site-local"),
    ("feff::1", "site-local"),
    ("ff02::1", "multicast"),
    ("4000::1", "not global unicast"),
    ("1::1", "not global unicast"),
    # public
    ("93.184.215.14", None),
    ("1.1.1.1", None),
    ("8.8.8.8", None),
    ("100.63.255.255", None),
    ("100.128.0.0", None),
    ("172.15.255.255", None),
    ("172.32.0.0", None),
    ("192.31.196.1", None),  # AS112: globally reachable
    ("198.17.255.255", None),
    ("198.20.0.0", None),
    ("223.255.255.255", None),
    ("::ffff:93.184.215.14", None),
    ("2606:4700::1111", None),
    ("2001:4860:4860::8888", None),
    ("2a00:1450:4001::1", None),
    ("2a00:1450:4001::1%eth0", None),
]


@pytest.mark.parametrize(("address", "why"), RULE)
def test_address_rule(address: str, why: str | None) -> None:
    assert address_refused(address) == why
