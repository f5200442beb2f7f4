"""The host guard's decisions (`runtime.engines.hostguard`); the rule itself is tested from inside
jobs on an engine of its own (tests/test_daemon_jobnet.py)."""

from __future__ import annotations

import subprocess

import pytest

from tuneplane_node.runtime.engines import hostguard


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

    monkeypatch.setattr(hostguard, "_run", run)
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
