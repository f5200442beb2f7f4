"""The egress rule's decisions (`runtime.engines.networks.egress`); the rule itself is
tested from inside jobs on engines of their own, with a cloud's metadata address behind
their default route (tests/engines/test_daemon_egress.py)."""

from __future__ import annotations

import shlex
import subprocess
from ipaddress import ip_network
from pathlib import Path

import pytest

from tuneplane_node.runtime.engines.networks import egress, hostguard
from tuneplane_node.runtime.engines.networks.egress import EgressPolicy, EgressRule
from tuneplane_node.settings import NodeSettings


def settings(**values: object) -> NodeSettings:
    return NodeSettings(**values)  # type: ignore[arg-type]


def test_the_metadata_service_is_denied_whatever_the_operator_lists() -> None:
    policy = EgressPolicy.of(settings(job_egress_deny=["10.0.0.0/8", "169.254.0.0/16"]))
    assert policy is not None
    allowed, denied = policy.networks(4)
    assert allowed == []
    assert denied == ["169.254.0.0/16", "100.100.100.200/32", "10.0.0.0/8"]  # once each
    assert EgressPolicy.of(settings(job_egress_rule=False)) is None


def test_ipv6_denies_link_local_aws_and_the_ipv4_mapped_forms() -> None:
    policy = EgressPolicy.of(settings(job_egress_allow=["203.0.113.7"]))
    assert policy is not None
    allowed, denied = policy.networks(6)
    assert allowed == ["::ffff:203.0.113.7/128"]
    assert denied == [
        "fe80::/10", "fd00:ec2::254/128", "::ffff:169.254.0.0/112", "::ffff:100.100.100.200/128",
    ]  # fmt: skip
    for mapped in denied[2:]:  # each a valid network of the address it maps
        assert ip_network(mapped).prefixlen >= 96


def rules_of(text: str) -> list[str]:
    return [line.split(" ", 2)[2] for line in text.splitlines() if line.startswith("-A ")]


def test_the_chain_allows_then_lets_names_through_then_denies_then_holds_to_the_uplink() -> None:
    policy = EgressPolicy(
        allow=(ip_network("203.0.113.7/32"),), deny=(ip_network("169.254.0.0/16"),)
    )
    text = egress.chain_text("TP-EGRESS-x", policy, ["eth0"], family=4)
    assert text.splitlines()[:2] == ["*filter", ":TP-EGRESS-x - [0:0]"]  # flushed, then filled
    assert text.endswith("COMMIT\n")
    assert rules_of(text) == [
        "-d 203.0.113.7/32 -j RETURN",
        "-o eth0 -p udp --dport 53 -j RETURN",
        "-o eth0 -p tcp --dport 53 -j RETURN",
        "-d 169.254.0.0/16 -j REJECT --reject-with icmp-admin-prohibited",
        "-o eth0 -j RETURN",  # the outside world
        "-j REJECT --reject-with icmp-admin-prohibited",  # any other interface: a bridge
    ]


def test_without_a_default_route_a_job_reaches_only_what_is_allowed() -> None:
    policy = EgressPolicy(allow=(ip_network("203.0.113.7/32"),), deny=())
    assert rules_of(egress.chain_text("C", policy, [], family=4)) == [
        "-d 203.0.113.7/32 -j RETURN",
        "-j REJECT --reject-with icmp-admin-prohibited",
    ]


def test_host_network_jobs_are_held_to_the_addresses_not_the_interfaces() -> None:
    policy = EgressPolicy(allow=(), deny=(ip_network("fe80::/10"),))
    text = egress.chain_text("C", policy, ["eth0"], family=6, bridged=False)
    assert rules_of(text) == [
        "-p udp --dport 53 -j RETURN",
        "-p tcp --dport 53 -j RETURN",
        "-d fe80::/10 -j REJECT --reject-with icmp6-adm-prohibited",
    ]


def test_each_engine_has_a_chain_of_its_own_within_iptables_length() -> None:
    docker, podman = egress.chain_name("unix:///d.sock"), egress.chain_name("unix:///p.sock")
    assert docker != podman and docker.startswith(egress.CHAIN_PREFIX)
    assert egress.chain_name("unix:///d.sock", host=True) not in (docker, podman)
    assert max(len(docker), len(egress.chain_name("x", host=True))) <= 28


def test_the_iptables_of_each_family_and_its_restore() -> None:
    assert egress.family_tool("iptables", 4, restore=True) == "iptables-restore"
    assert egress.family_tool("iptables-nft", 6) == "ip6tables-nft"
    assert egress.family_tool("iptables-legacy", 6, restore=True) == "ip6tables-legacy-restore"


LISTED = """-P FORWARD ACCEPT
-N TP-EGRESS-abc
-A FORWARD -i cni-podman2 -m conntrack --ctstate NEW -m comment --comment "tuneplane-egress:cni-podman2" -j TP-EGRESS-abc
-A FORWARD -i cni-podman3 -m conntrack --ctstate NEW -m comment --comment tuneplane-egress:cni-podman3 -j TP-EGRESS-abc
-A FORWARD -i cni-podman4 -m conntrack --ctstate NEW -m comment --comment "tuneplane-egress:cni-podman4" -j TP-EGRESS-other
-A OUTPUT -m cgroup --path "/tuneplane-jobs" -m conntrack --ctstate NEW -m comment --comment "tuneplane-egress-host:/tuneplane-jobs" -j TP-EGRESS-Habc
-A INPUT -i cni-podman2 -m comment --comment "tuneplane-guard:cni-podman2" -j REJECT
"""  # noqa: E501  # iptables -S, as it prints them


def test_the_jumps_are_found_by_their_comment_with_the_chain_they_go_to() -> None:
    found = egress.jumps(LISTED)
    assert [(name, chain) for name, chain, _ in found] == [
        ("cni-podman2", "TP-EGRESS-abc"),
        ("cni-podman3", "TP-EGRESS-abc"),
        ("cni-podman4", "TP-EGRESS-other"),  # another engine's: never this one's to judge
        ("host:/tuneplane-jobs", "TP-EGRESS-Habc"),
    ]
    assert found[0][2][:3] == ["FORWARD", "-i", "cni-podman2"]  # as -D takes it


ROUTES = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t0002A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
wg0\t00000000\t00000000\t0000\t0\t0\t0\t00000000\t0\t0\t0
"""
ROUTES6 = (
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eth1\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 "
    "00000000000000000000000000000000 ffffffff 00000001 00000000 00200200 lo\n"
)


def test_the_uplinks_are_the_interfaces_of_the_default_routes_that_are_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "42" / "net").mkdir(parents=True)
    (tmp_path / "42" / "net" / "route").write_text(ROUTES)
    (tmp_path / "42" / "net" / "ipv6_route").write_text(ROUTES6)
    monkeypatch.setattr(egress, "PROC", tmp_path)
    assert egress.default_interfaces(42, 4) == ("eth0",)  # wg0's is down
    assert egress.default_interfaces(42, 6) == ("eth1",)  # not the kernel's unreachable on lo
    assert egress.default_interfaces(43, 4) == ()  # unreadable: none


# --- holding and sweeping, against a fake iptables ----------------------------------------


class FakeIptables:
    """Answers iptables runs: ``-S`` lists ``listing``, ``-C`` finds what ``held`` says,
    restores and ``-I`` succeed unless ``refuse`` names them; records every run."""

    def __init__(self, listing: str = "", *, held: bool = False) -> None:
        self.listing, self.held = listing, held
        self.refuse: list[str] = []
        self.asked: list[tuple[list[str], str | None]] = []

    def __call__(
        self, command: list[str], stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        self.asked.append((command, stdin))
        verb = "restore" if command[2].endswith("-restore") else command[5]
        if verb in self.refuse:
            return subprocess.CompletedProcess(command, 1, "", "iptables: No chain by that name.\n")
        code = int(verb == "-C" and not self.held)
        return subprocess.CompletedProcess(command, code, self.listing if verb == "-S" else "", "")

    def verbs(self) -> list[str]:
        return ["restore" if c[2].endswith("-restore") else c[5] for c, _ in self.asked]

    def restored(self) -> list[str]:
        return [stdin for _, stdin in self.asked if stdin is not None]


class Ran:
    """A `hostguard.Begun` whose command ran at once, through the fake."""

    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self._done = done

    def done(self) -> subprocess.CompletedProcess[str]:
        return self._done


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeIptables:
    """An engine of pid 42 whose namespace routes its default through ``eth0``."""
    iptables = FakeIptables()
    monkeypatch.setattr(egress, "run", iptables)
    monkeypatch.setattr(hostguard, "run", iptables)
    monkeypatch.setattr(egress, "Begun", lambda command, stdin: Ran(iptables(command, stdin)))
    monkeypatch.setattr(egress, "PROC", tmp_path)
    monkeypatch.setattr(hostguard, "PROC", tmp_path)
    monkeypatch.setattr(egress, "engine_pid", lambda socket_path: (42, None))
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/sbin/{name}")
    (tmp_path / "42" / "net").mkdir(parents=True)
    (tmp_path / "42" / "net" / "route").write_text(ROUTES)
    return iptables


def rule(parent: str = "CNI-ADMIN", *, on: bool = True) -> EgressRule:
    policy = EgressPolicy.of(settings(job_egress_rule=on))
    return EgressRule(
        policy, address="unix:///p.sock", parent=lambda: parent, socket_path="/p.sock",
        tool=lambda pid: "iptables-nft",
    )  # fmt: skip


def test_a_hold_writes_the_chain_once_then_adds_the_bridges_jump(fake: FakeIptables) -> None:
    held = rule()
    assert held.hold("cni-podman7") is None
    assert fake.verbs() == ["restore", "-C", "-I"]
    command, text = fake.asked[0]
    assert command[:3] == ["nsenter", "--net=/proc/42/ns/net", "iptables-nft-restore"]
    assert "--noflush" in command and text is not None and "-o eth0 -j RETURN" in text
    assert fake.asked[2][0][6:] == egress.jump("CNI-ADMIN", "cni-podman7", held.chain)

    fake.asked.clear()
    assert held.hold("cni-podman8") is None
    assert fake.verbs() == ["-C", "-I"]  # the chain is written: the jump looked for, added
    fake.asked.clear()
    assert held.hold("cni-podman9", fresh=True) is None
    assert fake.verbs() == ["-I"]  # podman's bridge, just made: a launch costs one run


def test_a_fresh_podman_bridge_gets_the_guards_rules_and_its_jump_in_one_restore(
    fake: FakeIptables,
) -> None:
    held, guard = rule(), hostguard.BridgeGuard("/p.sock")
    assert held.hold_fresh(guard, "cni-podman7")
    assert fake.verbs() == ["restore", "restore"]  # the chain (once a daemon's life), the rules
    fake.asked.clear()
    assert held.hold_fresh(guard, "cni-podman8")
    assert fake.verbs() == ["restore"]  # a launch: one process, not one per rule
    (text,) = fake.restored()
    assert text.startswith("*filter\n") and text.endswith("COMMIT\n")
    assert fake.asked[0][0][:3] == ["nsenter", "--net=/proc/42/ns/net", "iptables-nft-restore"]
    # As `iptables -S` lists them: each sweep finds its own, by its bridge.
    listing = text.replace("-I ", "-A ")
    assert hostguard.guarded_rules(listing) == [
        ("cni-podman8", each) for each in hostguard.podman_rules("cni-podman8")
    ]
    jumped = egress.jump("CNI-ADMIN", "cni-podman8", held.chain)
    assert egress.jumps(listing) == [("cni-podman8", held.chain, jumped)]


def test_a_fresh_bridge_with_the_rule_off_gets_the_guards_rules_alone(fake: FakeIptables) -> None:
    assert rule(on=False).hold_fresh(hostguard.BridgeGuard("/p.sock"), "cni-podman7")
    (text,) = fake.restored()
    assert text.count("-I ") == len(hostguard.podman_rules("cni-podman7"))
    assert egress.JUMP_PREFIX not in text


def test_a_refused_one_restore_says_so_and_leaves_each_to_hold_its_own(
    fake: FakeIptables,
) -> None:
    held, guard = rule(), hostguard.BridgeGuard("/p.sock")
    held.hold("cni-podman6")  # the chain written
    fake.asked.clear()
    fake.refuse = ["restore"]  # the chain jumped from not made yet: nothing written
    assert not held.hold_fresh(guard, "cni-podman7")
    assert not held.hold_fresh(guard, "")  # the engine named no bridge: nothing tried
    assert fake.verbs() == ["restore"]


def test_a_moved_default_route_writes_the_chain_again(fake: FakeIptables, tmp_path: Path) -> None:
    held = rule()
    held.hold("cni-podman7")
    (tmp_path / "42" / "net" / "route").write_text(ROUTES.replace("eth0", "ens5"))
    fake.asked.clear()
    held.hold("cni-podman8")
    assert fake.verbs()[0] == "restore" and "-o ens5 -j RETURN" in fake.restored()[0]


def test_a_chain_gone_behind_the_nodes_back_is_written_again(fake: FakeIptables) -> None:
    held = rule()
    held.hold("cni-podman7")
    fake.asked.clear()
    fake.refuse = ["-I"]
    assert held.hold("cni-podman8") == "iptables: No chain by that name."
    # written, podman's chain made where its backend has not yet, then tried once more
    assert fake.verbs() == ["-C", "-I", "restore", "-N", "-I"]
    assert fake.asked[3][0][6:] == ["CNI-ADMIN"]


def test_docker_without_its_firewall_gets_no_rule_and_says_why(
    fake: FakeIptables, caplog: pytest.LogCaptureFixture
) -> None:
    fake.refuse = ["-S"]  # no DOCKER-USER chain: --iptables=false
    docker = rule(egress.DOCKER_USER)
    assert docker.hold("br-1") == hostguard.NO_FIREWALL
    assert docker.hold("br-2") == hostguard.NO_FIREWALL
    assert fake.verbs() == ["-S", "-S"]  # nothing written
    assert caplog.text.count("--iptables=false") == 1  # said once


def test_the_rule_off_holds_nothing(fake: FakeIptables) -> None:
    assert rule(on=False).hold("cni-podman7") is None
    assert fake.asked == []


def test_the_sweep_removes_the_jumps_of_bridges_gone_and_writes_the_chain_again(
    fake: FakeIptables,
) -> None:
    held = rule()
    fake.listing = LISTED.replace("TP-EGRESS-abc", held.chain)
    asked: list[str] = []

    def bridges() -> set[str]:
        asked.append("networks")
        return {"cni-podman3"}

    assert held.sweep(bridges) == 1
    assert fake.verbs()[0] == "-S" and asked == ["networks"]  # the rules read first
    removal, rewrite = fake.restored()
    assert removal.splitlines()[1].startswith("-D FORWARD -i cni-podman2 ")
    assert "cni-podman4" not in removal  # another engine's chain
    assert rewrite.splitlines()[1] == f":{held.chain} - [0:0]"  # this start's settings


def test_a_sweep_that_leaves_no_jump_writes_the_chain_so_the_next_launch_need_not(
    fake: FakeIptables,
) -> None:
    """Each launch after a removal wrote the whole chain on its path (15 ms of a podman
    launch's 270): the removal's sweep writes it, off any launch's path."""
    held, guard = rule(), hostguard.BridgeGuard("/p.sock")
    assert held.hold_fresh(guard, "cni-podman7")  # the chain written, then the rules
    jumped = shlex.join(["-A", *egress.jump("CNI-ADMIN", "cni-podman7", held.chain)])
    fake.listing = f"-N {held.chain}\n{jumped}\n"
    fake.asked.clear()
    assert held.sweep(set) == 1  # its bridge gone: its jump goes, the chain is written again
    removal, rewrite = (text.splitlines()[1] for text in fake.restored())
    assert removal.startswith("-D CNI-ADMIN -i cni-podman7 ")
    assert rewrite == f":{held.chain} - [0:0]"
    fake.asked.clear()
    assert held.hold_fresh(guard, "cni-podman8")
    assert fake.verbs() == ["restore"]  # the rules alone


def test_the_sweep_asks_no_network_where_it_holds_no_jump(fake: FakeIptables) -> None:
    fake.listing = "-P FORWARD ACCEPT\n"
    assert rule().sweep(lambda: pytest.fail("asked")) == 0
    assert fake.restored() == []


def test_the_rule_off_removes_every_jump_and_the_chains_at_start(fake: FakeIptables) -> None:
    off = rule(on=False)
    chain, host = off.chain, off.host_chain
    fake.listing = LISTED.replace("TP-EGRESS-Habc", host).replace("TP-EGRESS-abc", chain)
    fake.listing += f"-N {host}\n"
    assert off.sweep(set) == 3  # the two jumps of this engine's bridges, and the host one
    (removal,) = fake.restored()
    assert removal.count("-D ") == 3
    assert f"-F {chain}\n-X {chain}" in removal and f"-X {host}" in removal


def test_host_network_jobs_are_matched_by_their_parent_in_the_v2_tree(
    fake: FakeIptables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "unified"
    root.mkdir()
    monkeypatch.setattr(egress, "cgroup2_root", lambda: root)
    held = rule()
    assert "not in the cgroup v2 tree" in (held.hold_host("/tuneplane-jobs", make=False) or "")
    assert fake.asked == []  # a match of a path not there: nothing written
    assert held.hold_host("/tuneplane-jobs", make=True) is None
    assert (root / "tuneplane-jobs").is_dir()  # made: runc makes it only with its first job
    restored = fake.restored()[0]
    assert "-o " not in restored and "icmp-admin-prohibited" in restored  # addresses only
    assert fake.asked[-1][0][6:] == egress.host_jump("/tuneplane-jobs", held.host_chain)


def test_a_host_without_a_v2_tree_says_no_host_network_job_is_held(
    fake: FakeIptables, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(egress, "cgroup2_root", lambda: None)
    assert "cgroup v1" in (rule().hold_host("/tuneplane-jobs", make=True) or "")
    assert fake.asked == []


def test_without_a_v2_tree_no_job_socket_can_be_matched(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "30 23 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    )
    assert egress.cgroup2_root(mountinfo) is None
    mountinfo.write_text(
        mountinfo.read_text()
        + "31 23 0:27 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
    )
    assert egress.cgroup2_root(mountinfo) == Path("/sys/fs/cgroup/unified")
