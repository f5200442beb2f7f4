"""Reach: the addresses the node may connect to when it fetches for a tenant.

A volume's source is a tenant's choice, and the node fetches it from the node's own
place in the network: inside the cloud's metadata service's reach, on the LAN, beside
its own API and the registries on loopback. So a fetch for a tenant goes only where the
tenant could go itself: public addresses. Refused (`REFUSED`): loopback, link-local,
private (RFC 1918, ULA), CGNAT, multicast, unspecified, reserved, documentation and
benchmark ranges, tunnel prefixes that carry another address, and every address of this
machine (read from the kernel's local routes at each check), unless the operator lists
the network (``TUNEPLANE_VOLUME_ALLOWED_NETWORKS``). An IPv4-mapped or NAT64 address is
judged by the IPv4 address it carries.

The check is made on the address a socket is about to connect to (`fetching.Fetcher`
hands it every address its resolver found, and connects only to one it passed): the name
is resolved once, and what was checked is what is used.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

REFUSED: tuple[tuple[Network, str], ...] = tuple(
    (ipaddress.ip_network(cidr), why)
    for cidr, why in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "local NAT64"),
        ("100::/64", "discard"),
        ("2001::/32", "Teredo tunnel"),
        ("2001:2::/48", "benchmarking"),
        ("2001:db8::/32", "documentation"),
        ("2002::/16", "6to4 tunnel"),
        ("fc00::/7", "private (unique local)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
FIB_TRIE = Path("/proc/net/fib_trie")  # IPv4: the kernel's local and broadcast routes
IF_INET6 = Path("/proc/net/if_inet6")  # IPv6: every interface's addresses


def carried(address: Address) -> Address:
    """The address a packet to ``address`` reaches: the IPv4 address an IPv4-mapped
    (``::ffff:a.b.c.d``) or NAT64 (``64:ff9b::a.b.c.d``) address carries, else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in MAPPED:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


class Reach:
    """Whether the node may connect to an address for a tenant: ``allowed``, the
    operator's networks (tried first: listed is allowed, whatever else it is)."""

    def __init__(
        self,
        allowed: Iterable[str] = (),
        *,
        fib_trie: Path = FIB_TRIE,
        if_inet6: Path = IF_INET6,
    ) -> None:
        self.allowed = tuple(ipaddress.ip_network(cidr) for cidr in allowed)
        self._fib_trie = fib_trie
        self._if_inet6 = if_inet6

    def refusal(self, address: str) -> str | None:
        """Why ``address`` (an IP address's text) is not one to fetch from for a
        tenant, or None when it may be."""
        try:
            found = ipaddress.ip_address(address.split("%", 1)[0])  # no IPv6 zone
        except ValueError:
            return "not an IP address"
        if any(found in network for network in self.allowed):
            return None
        target = carried(found)
        if target != found and any(target in network for network in self.allowed):
            return None
        for network, why in REFUSED:
            if target.version == network.version and target in network:
                return why
        if self._own(target):
            return "an address of this machine"
        return None

    def _own(self, address: Address) -> bool:
        """Whether ``address`` is one of this machine's (its network namespace's), as
        the kernel says now: a public address on an interface is still the node."""
        if isinstance(address, ipaddress.IPv4Address):
            number = int(address)
            return any(
                number >> (32 - prefix) == network >> (32 - prefix)
                for network, prefix in _local_ipv4(self._fib_trie)
            )
        return address in set(_local_ipv6(self._if_inet6))


def _local_ipv4(path: Path) -> Iterator[tuple[int, int]]:
    """The networks (as an integer and a prefix length) of the kernel's ``host LOCAL``
    and ``BROADCAST`` routes: each address of this machine (``127.0.0.0/8`` is one
    route), and the broadcast ones. Read as integers: `ipaddress` objects made the check
    cost a millisecond a connection."""
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError:
        return
    last = b""
    for line in lines:
        text = line.strip()
        if text.startswith(b"|-- "):
            last = text[4:]
        elif last and text.startswith(b"/") and (b" LOCAL" in text or b" BROADCAST" in text):
            packed = socket.inet_aton(last.decode("ascii"))
            yield int.from_bytes(packed, "big"), int(text[1:].split(b" ", 1)[0])


def _local_ipv6(path: Path) -> Iterator[ipaddress.IPv6Address]:
    """Every IPv6 address of this machine's interfaces."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    for line in lines:
        word = line.split(" ", 1)[0]
        if len(word) == 32:
            yield ipaddress.IPv6Address(int(word, 16))
