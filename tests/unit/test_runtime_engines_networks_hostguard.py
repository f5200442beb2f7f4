"""The host guard's decisions (`runtime.engines.networks.hostguard`); the rule itself is
tested from inside jobs on an engine of its own (tests/engines/test_daemon_jobnet.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tuneplane_node.runtime.engines.networks import hostguard


def test_the_bridge_is_the_networks_named_one_or_docker_s_own_name_for_it() -> None:
    named = {"Id": "f" * 64, "Options": {"com.docker.network.bridge.name": "tp-jobs"}}
    assert hostguard.bridge_interface(named) == "tp-jobs"
    assert (
        hostguard.bridge_interface({"Id": "0123456789abcdef", "Options": {}}) == "br-0123456789ab"
    )


def answers(monkeypatch: pytest.MonkeyPatch, *codes: int) -> list[list[str]]:
    """Fake iptables runs answering ``codes`` in turn; the commands asked, in order."""
    asked: list[list[str]] = []
    left = list(codes)

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(command)
        return subprocess.CompletedProcess(command, left.pop(0), "", "refused")

    monkeypatch.setattr(hostguard, "run", run)
    return asked


@pytest.fixture(autouse=True)
def tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/sbin/{name}")


def test_an_engine_without_firewall_rules_gets_none_of_the_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = answers(monkeypatch, 1)
    assert "--iptables=false" in (hostguard.guard(42, "br-x") or "")
    assert len(asked) == 1 and asked[0][-2:] == ["-S", "DOCKER-USER"]
    assert asked[0][:2] == ["nsenter", "--net=/proc/42/ns/net"]  # the engine's namespace


def test_the_rule_is_added_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = answers(monkeypatch, 0, 1, 0)  # the chain is there; the rule is not; added
    assert hostguard.guard(42, "br-x") is None
    assert [command[5] for command in asked[1:]] == ["-C", "-I"]
    assert asked[2][6:] == hostguard.rule("br-x") and "REJECT" in asked[2]
    again = answers(monkeypatch, 0, 0)  # already held: nothing added
    assert hostguard.guard(42, "br-x") is None and len(again) == 2


def test_a_refused_rule_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    answers(monkeypatch, 0, 1, 1)
    assert hostguard.guard(42, "br-x") == "refused"


# --- podman: rules per job network's bridge, swept where the bridge is gone ----------------

LISTED = """-P INPUT ACCEPT
-A INPUT -i cni-podman2 -m conntrack --ctstate NEW -m comment --comment "tuneplane-guard:cni-podman2" -j REJECT --reject-with icmp-port-unreachable
-A FORWARD -i cni-podman2 -m conntrack --ctstate DNAT -m comment --comment "tuneplane-guard:cni-podman2" -j REJECT --reject-with icmp-port-unreachable
-A INPUT -i br-1 -m conntrack --ctstate NEW -m comment --comment "tuneplane-node: the jobs of this network reach no port of this machine" -j REJECT --reject-with icmp-port-unreachable
-A INPUT -i cni-podman5 -m comment --comment tuneplane-guard:cni-podman5 -j REJECT
"""  # noqa: E501  # iptables -S, as it prints them


def test_the_podman_rules_are_found_by_their_comment_and_dockers_is_not() -> None:
    assert hostguard.guarded_bridges(LISTED) == ["cni-podman2", "cni-podman5"]


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An engine whose socket's listener is pid 42, and podman's chains in `iptables`;
    its namespace's interfaces unreadable (a test writes them in ``tmp_path``)."""
    monkeypatch.setattr(hostguard, "PROC", tmp_path)
    monkeypatch.setattr(hostguard, "engine_pid", lambda socket_path: (42, None))
    monkeypatch.setattr(hostguard, "podman_iptables", lambda pid: "iptables")


def listing(monkeypatch: pytest.MonkeyPatch, text: str) -> list[list[str]]:
    """Fake iptables runs: ``-S`` lists ``text``, ``-C`` finds nothing, the rest succeed."""
    asked: list[list[str]] = []

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(command)
        found = "-S" in command
        return subprocess.CompletedProcess(command, int("-C" in command), text if found else "")

    monkeypatch.setattr(hostguard, "run", run)
    return asked


@pytest.mark.usefixtures("engine")
def test_a_job_networks_rules_name_its_bridge(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = listing(monkeypatch, "")
    hostguard.BridgeGuard("/s").hold("cni-podman7")
    assert [command[5] for command in asked] == ["-C", "-I"] * 3
    added = [command[6:] for command in asked if command[5] == "-I"]
    assert added == hostguard.podman_rules("cni-podman7")
    assert all(command[:2] == ["nsenter", "--net=/proc/42/ns/net"] for command in asked)


def test_a_job_network_is_kept_off_the_hosts_ports_and_the_engines_containers() -> None:
    host, others, published = hostguard.podman_rules("cni-podman7")
    assert host[:3] == ["INPUT", "-i", "cni-podman7"] and "NEW" in host
    assert others[:5] == ["FORWARD", "-i", "cni-podman7", "-o", "cni-podman+"]  # any of podman's
    assert published[:3] == ["FORWARD", "-i", "cni-podman7"] and "DNAT" in published
    assert all(
        rule[-3:] == ["tuneplane-guard:cni-podman7", "-j", "REJECT"]
        for rule in (host, others, published)
    )


@pytest.mark.usefixtures("engine")
def test_the_sweep_removes_only_the_rules_of_bridges_no_network_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = listing(monkeypatch, LISTED)
    assert hostguard.BridgeGuard("/s").sweep(lambda: {"cni-podman0", "cni-podman5"}) == 2
    removed = [command[6:] for command in asked if "-D" in command]
    assert [rule[:3] for rule in removed] == [
        ["INPUT", "-i", "cni-podman2"],
        ["FORWARD", "-i", "cni-podman2"],
    ]
    assert all("tuneplane-guard:cni-podman2" in rule for rule in removed)  # as listed, unquoted


@pytest.mark.usefixtures("engine")
def test_the_networks_are_listed_after_the_rules_and_only_where_there_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rule seen was added after its network was made: listed next, it is kept."""
    asked = listing(monkeypatch, "-P INPUT ACCEPT\n")

    def networks() -> set[str]:
        asked.append(["networks"])
        return set()

    hostguard.BridgeGuard("/s").sweep(networks)
    assert len(asked) == 1  # no rule of the node's: no network asked for
    asked = listing(monkeypatch, LISTED)
    hostguard.BridgeGuard("/s").sweep(networks)
    assert asked[:2] == [asked[0], ["networks"]] and "-S" in asked[0]


def test_a_guard_that_cannot_hold_says_why_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(hostguard, "engine_pid", lambda socket_path: (0, "another machine's"))
    guard = hostguard.BridgeGuard(None)
    guard.hold("cni-podman1")
    guard.hold("cni-podman2")
    said = [r.getMessage() for r in caplog.records if "this machine's ports" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("other containers: another machine's"), said


def test_podmans_iptables_is_the_one_holding_its_chains(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Legacy tables are never listed where none exist: listing them makes them."""
    asked: list[str] = []

    def run(command: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(command[2])
        chains = "-N CNI-FORWARD\n" if command[2] == "iptables-legacy" else "-P FORWARD ACCEPT\n"
        return subprocess.CompletedProcess(command, 0, chains, "")

    monkeypatch.setattr(hostguard, "run", run)
    monkeypatch.setattr(hostguard, "PROC", tmp_path)
    (tmp_path / "42" / "net").mkdir(parents=True)
    (tmp_path / "42" / "net" / "ip_tables_names").write_text("")
    assert hostguard.podman_iptables(42) is None
    assert "iptables-legacy" not in asked
    (tmp_path / "42" / "net" / "ip_tables_names").write_text("filter\n")
    assert hostguard.podman_iptables(42) == "iptables-legacy"


@pytest.mark.usefixtures("engine")
def test_a_network_without_a_bridge_gets_no_rule_and_the_log_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    asked = listing(monkeypatch, "")
    hostguard.BridgeGuard("/s").hold("")
    assert not [command for command in asked if "-I" in command]
    assert "named no bridge" in caplog.text


@pytest.mark.usefixtures("engine")
def test_the_sweep_keeps_a_rule_whose_bridge_is_still_an_interface_of_the_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another podman service in the namespace may keep its networks in a directory of
    its own: its bridge is there, and its rules stay."""
    (tmp_path / "42" / "net").mkdir(parents=True)
    (tmp_path / "42" / "net" / "dev").write_text(
        "Inter-|   Receive\n face |bytes\n    lo: 1 2 3\ncni-podman2: 4 5 6\n"
    )
    asked = listing(monkeypatch, LISTED)
    assert hostguard.BridgeGuard("/s").sweep(lambda: set()) == 1
    (removed,) = [command[6:] for command in asked if "-D" in command]
    assert removed[:3] == ["INPUT", "-i", "cni-podman5"]


# --- a restore begun, waited for later (a podman launch makes its container meanwhile) ---


@pytest.mark.slow  # real processes
def test_a_begun_command_reads_its_input_and_says_how_it_ended() -> None:
    begun = hostguard.Begun(["sh", "-c", "cat; echo refused >&2; exit 3"], "*filter\nCOMMIT\n")
    done = begun.done()
    assert (done.returncode, done.stdout, done.stderr) == (3, "*filter\nCOMMIT\n", "refused\n")
    assert hostguard.Begun(["true"], "").done().returncode == 0


@pytest.mark.slow  # a real process, waited for
def test_a_begun_command_that_cannot_start_or_hangs_is_a_failed_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = hostguard.Begun([str(tmp_path / "no-such-iptables")], "x")
    assert missing.done().returncode == 1 and "no-such-iptables" in missing.done().stderr
    monkeypatch.setattr(hostguard, "TIMEOUT_S", 0.2)
    hung = hostguard.Begun(["sleep", "30"], "")
    assert hung.done().returncode == 1
    assert hung.process is not None and hung.process.returncode is not None  # killed


@pytest.mark.slow  # a real process
def test_a_begun_command_that_ends_before_reading_its_input_says_how_it_ended() -> None:
    """Its input's pipe broken (the process gone first) is no exception: its exit says."""
    begun = hostguard.Begun(["sh", "-c", "exec 0<&-; exit 4"], "x" * 200_000)
    assert begun.done().returncode == 4
