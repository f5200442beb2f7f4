"""The host guard's and the egress rule's rules as the kernel reads them back (issue 52).

The other rule tests compare what the node asks iptables with the generator's own
output; these write the rules into a network namespace of the test's own (``unshare
--net``: no engine, no change to this machine's tables) and read them with ``iptables
-S``, which prints what the kernel holds (the matches it added, ``-m udp``; its quoting).
What the node reads back (its sweeps, its ``-C`` look before adding) must understand that
form: a parser written against the generator's form finds nothing to sweep and adds a
rule twice.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from ipaddress import ip_network

import pytest

from tests.support.engines import under_ci
from tuneplane_node.runtime.engines.networks import egress, hostguard

pytestmark = pytest.mark.slow  # real processes: a namespace and iptables in it

UPLINK = "tpup0"  # the namespace's default route's interface (a bridge: no dummy here)
ALLOW, LAN = "198.51.100.64/26", "203.0.113.0/24"  # TEST-NET-2 and -3
GUARD_COMMENT = '"tuneplane-node: the jobs of this network reach no port of this machine"'
PORT_REJECT = "-j REJECT --reject-with icmp-port-unreachable"


class Namespace:
    """A network namespace held by a ``sleep`` of the test's own, with a default route."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(["unshare", "--net", "sleep", "600"])
        self.pid = self.process.pid  # unshare execs sleep: the same process
        # Until unshare(2) has run, the process is in this machine's namespace: a command
        # entered then would change the host's links and routes (seen in CI, a bridge
        # made on the host). Waited for: the process's namespace is another than ours.
        ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 30
        while os.readlink(f"/proc/{self.pid}/ns/net") == ours:
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError("unshare --net made no namespace in 30 s")
            time.sleep(0.01)

    def run(self, *command: str, check: bool = True) -> str:
        done = subprocess.run(
            ["nsenter", f"--net=/proc/{self.pid}/ns/net", *command],
            check=check,
            capture_output=True,
            text=True,
        )
        return done.stdout

    def listed(self, tool: str = "iptables") -> list[str]:
        """The filter table's rules as the kernel holds them, ``-A`` lines only."""
        return [line for line in self.run(tool, "-w", "5", "-S").splitlines() if line[:3] == "-A "]


@pytest.fixture
def namespace(monkeypatch: pytest.MonkeyPatch) -> Iterator[Namespace]:
    missing = [tool for tool in ("unshare", "nsenter", "iptables", "ip6tables", "ip")
               if shutil.which(tool) is None]  # fmt: skip
    if missing:
        message = f"{', '.join(missing)} missing: no namespace to read rules back from"
        pytest.fail(message) if under_ci() else pytest.skip(message)
    made = Namespace()
    try:
        made.run("ip", "link", "set", "lo", "up")
        made.run("ip", "link", "add", UPLINK, "type", "bridge")
        made.run("ip", "addr", "add", "198.51.100.2/26", "dev", UPLINK)
        made.run("ip", "link", "set", UPLINK, "up")
        made.run("ip", "route", "add", "default", "via", "198.51.100.1")
        for module in (hostguard, egress):  # the engine is the namespace's process
            monkeypatch.setattr(module, "engine_pid", lambda socket_path: (made.pid, None))
        monkeypatch.setattr(hostguard, "podman_iptables", lambda pid: "iptables")
        yield made
    finally:
        made.process.kill()
        made.process.wait()


def rule(parent: str, ipv6: bool = False) -> egress.EgressRule:
    policy = egress.EgressPolicy(
        allow=(ip_network(ALLOW),), deny=(*egress.METADATA, ip_network(LAN))
    )
    return egress.EgressRule(
        policy, address=f"unix:///{parent}", parent=lambda: parent, socket_path="/s",
        tool=lambda pid: "iptables", ipv6=ipv6,
    )  # fmt: skip


def test_dockers_guard_is_held_once_and_reads_back_as_written(namespace: Namespace) -> None:
    namespace.run("iptables", "-N", "DOCKER-USER")  # docker manages this firewall
    assert hostguard.guard(namespace.pid, "br-tptest") is None
    assert hostguard.guard(namespace.pid, "br-tptest") is None  # -C finds the kernel's form
    assert namespace.listed() == [
        f"-A INPUT -i br-tptest -m conntrack --ctstate NEW -m comment --comment "
        f"{GUARD_COMMENT} {PORT_REJECT}"
    ]


def test_podmans_guard_rules_are_found_by_their_sweep_as_the_kernel_lists_them(
    namespace: Namespace,
) -> None:
    guard = hostguard.BridgeGuard("/s")
    guard.hold("cni-podman7")
    guard.hold("cni-podman7")  # held: nothing added again
    tag = '-m comment --comment "tuneplane-guard:cni-podman7"'
    assert sorted(namespace.listed()) == sorted([
        f"-A INPUT -i cni-podman7 -m conntrack --ctstate NEW {tag} {PORT_REJECT}",
        f"-A FORWARD -i cni-podman7 -o cni-podman+ -m conntrack --ctstate NEW {tag} {PORT_REJECT}",
        f"-A FORWARD -i cni-podman7 -m conntrack --ctstate DNAT {tag} {PORT_REJECT}",
    ])  # fmt: skip
    listing = namespace.run("iptables", "-S")
    assert hostguard.guarded_bridges(listing) == ["cni-podman7"]
    assert guard.sweep(lambda: {"cni-podman7"}) == 0  # its network is there: kept
    assert len(namespace.listed()) == 3
    assert guard.sweep(lambda: set()) == 3
    assert namespace.listed() == []


def test_the_egress_chain_and_jump_read_back_and_the_sweep_takes_the_jump(
    namespace: Namespace,
) -> None:
    namespace.run("iptables", "-N", "DOCKER-USER")
    docker = rule("DOCKER-USER")
    assert docker.hold("br-tptest") is None
    assert docker.hold("br-tptest") is None  # the jump's -C matches the kernel's form
    chain, reject = docker.chain, "-j REJECT --reject-with icmp-admin-prohibited"
    assert namespace.listed() == [
        f"-A DOCKER-USER -i br-tptest -m conntrack --ctstate NEW -m comment --comment "
        f'"tuneplane-egress:br-tptest" -j {chain}',
        f"-A {chain} -d {ALLOW} -j RETURN",
        f"-A {chain} -o {UPLINK} -p udp -m udp --dport 53 -j RETURN",  # -m udp: the kernel's
        f"-A {chain} -o {UPLINK} -p tcp -m tcp --dport 53 -j RETURN",
        f"-A {chain} -d 169.254.0.0/16 {reject}",
        f"-A {chain} -d 100.100.100.200/32 {reject}",
        f"-A {chain} -d {LAN} {reject}",
        f"-A {chain} -o {UPLINK} -j RETURN",
        f"-A {chain} {reject}",
    ]
    listing = namespace.run("iptables", "-S")
    assert [(bridge, to) for bridge, to, _ in egress.jumps(listing)] == [("br-tptest", chain)]
    assert docker.sweep(lambda: set()) == 1
    assert not any("-j TP-EGRESS-" in line for line in namespace.listed())
    assert sum(line.startswith(f"-A {chain} ") for line in namespace.listed()) == 8  # kept


def test_the_ipv6_rule_reads_back_with_the_mapped_metadata_addresses(
    namespace: Namespace,
) -> None:
    namespace.run("ip6tables", "-N", "DOCKER-USER")
    namespace.run("iptables", "-N", "DOCKER-USER")
    docker = rule("DOCKER-USER", ipv6=True)
    assert docker.hold("br-tpsix", ipv6=True) is None
    listed = namespace.listed("ip6tables")
    reject = "-j REJECT --reject-with icmp6-adm-prohibited"
    for denied in ("fe80::/10", "fd00:ec2::254/128", "::ffff:169.254.0.0/112"):
        assert f"-A {docker.chain} -d {denied} {reject}" in listed, listed
    assert docker.sweep(lambda: set()) == 2  # one jump in each family
    assert not any("tuneplane-egress:" in line for line in namespace.listed("ip6tables"))


def test_a_fresh_podman_bridges_rules_in_one_restore_read_back_for_both_sweeps(
    namespace: Namespace,
) -> None:
    namespace.run("iptables", "-N", "CNI-ADMIN")
    podman, guard = rule("CNI-ADMIN"), hostguard.BridgeGuard("/s")
    assert podman.hold_fresh(guard, "cni-podman8") is True
    listing = namespace.run("iptables", "-S")
    assert hostguard.guarded_bridges(listing) == ["cni-podman8"]
    assert [bridge for bridge, _, _ in egress.jumps(listing)] == ["cni-podman8"]
    assert guard.sweep(lambda: set()) == 3 and podman.sweep(lambda: set()) == 1
    assert not any("cni-podman8" in line for line in namespace.listed())
