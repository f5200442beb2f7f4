"""`check`'s egress step judged from what its throwaway job said
(`tuneplane_node.checks.egress`); the job itself runs on engines of their own, with a
metadata address behind their default route (tests/engines/test_daemon_egress.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneplane_node.checks import egress as egress_check
from tuneplane_node.checks.findings import FAIL, OK, WARN
from tuneplane_node.runtime.engines.networks import egress
from tuneplane_node.settings import NodeSettings

TRIED = {"the cloud's metadata service": "169.254.169.254 80", "the LAN": "10.0.0.1 80"}
REFUSED = "nc: can't connect to remote host (169.254.169.254): No route to host"


def settings(**values: object) -> NodeSettings:
    return NodeSettings(**values)  # type: ignore[arg-type]


def said(*words: str) -> str:
    """A job's log as the engine answers it: each line after its timestamp."""
    return "".join(f"2026-01-01T00:00:00Z {n}={word}\n" for n, word in enumerate(words))


def test_the_metadata_service_answering_a_job_fails_the_check() -> None:
    level, line = egress_check.verdict(TRIED, said("open", REFUSED), kind="isolated", rule=False)
    assert level == FAIL
    assert line.startswith("egress: a job on the isolated network reaches the cloud's metadata")
    assert "(169.254.169.254:80): open" in line and line.endswith("TUNEPLANE_JOB_EGRESS_RULE=true")


def test_a_host_that_resets_the_connection_answered_it() -> None:
    refused = "nc: can't connect to remote host (10.0.0.1): Connection refused"
    level, line = egress_check.verdict(TRIED, said(REFUSED, refused), kind="isolated", rule=True)
    assert level == FAIL and "the LAN (10.0.0.1:80): nc: " in line
    assert line.endswith("the node's rule does not hold here (its log says why)")


def test_places_refused_by_the_rule_or_silent_pass() -> None:
    silent = "nc: timed out"
    level, line = egress_check.verdict(TRIED, said(REFUSED, silent), kind="isolated", rule=True)
    assert (level, line) == (OK, (
        "egress: a job on the isolated network reaches none of the cloud's metadata service "
        "(169.254.169.254:80): refused; the LAN (10.0.0.1:80): no answer"
    ))  # fmt: skip
    level, line = egress_check.verdict(TRIED, said(silent, silent), kind="isolated", rule=False)
    assert level == WARN and line.endswith("on a cloud it would answer")


def test_the_job_tries_the_metadata_service_and_the_first_denied_networks() -> None:
    denied = ["10.0.0.0/8", "fd00::/8", "192.168.7.7/32", "172.16.0.0/12", "100.64.0.0/10"]
    tried = egress_check.places(settings(job_egress_deny=denied))
    assert list(tried.values()) == [
        "169.254.169.254 80", "10.0.0.1 80", "192.168.7.7 80", "172.16.0.1 80",
    ]  # fmt: skip  # IPv4 only (the job networks have no IPv6), three at most
    assert "open" in egress_check.script(tried) and "nc -w 3 10.0.0.1 80" in egress_check.script(
        tried
    )


def test_host_network_jobs_without_a_v2_tree_are_said_to_reach_the_metadata_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(egress, "cgroup2_root", lambda: None)
    ((level, line),) = egress_check.host_network_finding(settings(), local=True)
    assert level == WARN and "reaches the cloud's metadata service" in line
    assert "cgroup v1" in line
    monkeypatch.setattr(egress, "cgroup2_root", lambda: Path("/sys/fs/cgroup/unified"))
    ((level, line),) = egress_check.host_network_finding(settings(), local=True)
    assert level == OK and line.endswith("(/sys/fs/cgroup/unified)")
    assert egress_check.host_network_finding(settings(job_host_network="refuse"), local=True) == []
