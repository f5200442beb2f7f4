"""Where the node may connect when it fetches for a tenant (issue 49): public addresses
only, unless the operator lists the network; this machine's own addresses never, read
from the kernel's routes (here: files written as the kernel writes them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneplane_node.runtime.reach import Reach

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
     |-- 203.0.113.0
        /24 link UNICAST
     |-- 93.184.216.34
        /32 host LOCAL
     |-- 93.184.216.255
        /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
2606280000000000000000000000abcd 02 40 00 80     eth0
"""


@pytest.fixture
def reach(tmp_path: Path) -> Reach:
    """A machine whose public address is 93.184.216.34 (and 2606:2800::abcd)."""
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    (tmp_path / "if_inet6").write_text(IF_INET6)
    return Reach(fib_trie=tmp_path / "fib_trie", if_inet6=tmp_path / "if_inet6")


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("169.254.169.254", "link-local"),  # AWS, Azure, GCP, OpenStack, Oracle metadata
        ("100.100.100.200", "carrier-grade NAT"),  # Alibaba's metadata
        ("fd00:ec2::254", "private (unique local)"),  # AWS's IPv6 metadata
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("192.0.2.10", "documentation"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("fe80::1%eth0", "link-local"),
        ("::ffff:169.254.169.254", "link-local"),  # IPv4-mapped: the IPv4 it carries
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:a9fe:a9fe::1", "6to4 tunnel"),
        ("93.184.216.34", "an address of this machine"),  # public, but the node's own
        ("93.184.216.255", "an address of this machine"),  # its broadcast
        ("2606:2800::abcd", "an address of this machine"),
        ("not-an-address", "not an IP address"),
    ],
)
def test_internal_addresses_and_the_machines_own_are_refused(
    reach: Reach, address: str, why: str
) -> None:
    assert reach.refusal(address) == why


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_reached(reach: Reach, address: str) -> None:
    assert reach.refusal(address) is None


def test_the_operators_networks_are_reached_whatever_else_they_are(tmp_path: Path) -> None:
    (tmp_path / "fib_trie").write_text(FIB_TRIE)
    listed = Reach(
        ["10.20.0.0/16", "127.0.0.1/32"],
        fib_trie=tmp_path / "fib_trie",
        if_inet6=tmp_path / "none",
    )
    assert listed.refusal("10.20.5.5") is None
    assert listed.refusal("::ffff:10.20.5.5") is None
    assert listed.refusal("127.0.0.1") is None
    assert listed.refusal("10.21.0.1") == "private"  # only what is listed
    assert listed.refusal("127.0.0.2") == "loopback"


def test_this_machines_routes_are_read_as_they_are_now(reach: Reach, tmp_path: Path) -> None:
    """An address added after the start is the node's at once: nothing is kept."""
    assert reach.refusal("198.18.0.9") == "benchmarking"
    assert reach.refusal("8.8.4.4") is None
    (tmp_path / "fib_trie").write_text(FIB_TRIE + "     |-- 8.8.4.4\n        /32 host LOCAL\n")
    assert reach.refusal("8.8.4.4") == "an address of this machine"


def test_the_real_machines_loopback_and_addresses_are_its_own() -> None:
    """Read from this machine's /proc: 127.0.0.1 is loopback first, and an address on
    one of its interfaces (whatever it is) is refused."""
    reach = Reach()
    assert reach.refusal("127.0.0.1") == "loopback"
    assert reach.refusal("1.1.1.1") is None
