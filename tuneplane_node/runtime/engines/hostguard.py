"""The rule that keeps the jobs of the node's docker job network off this machine's own
ports (issue 38).

Inter-container traffic off keeps a job from another's ports, but not from the host's:
through its bridge's gateway a job opens any port the host serves on all its addresses
(the node's API on 0.0.0.0, a registry, a metrics agent). The guard is one rule in the
INPUT chain of the engine's own network namespace, where docker keeps its rules: a new
connection that comes in from the job network's bridge is rejected. Replies to what the
host opened, and a job's traffic to the outside world (FORWARD), are untouched.

It is kept only where docker manages the firewall (its DOCKER-USER chain exists): an
engine run with ``--iptables=false`` isolates nothing between jobs either, and the node
adds no rule to such a machine. Blocking: on the engine's pool.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

COMMENT = "tuneplane-node: the jobs of this network reach no port of this machine"
TIMEOUT_S = 10.0


def bridge_interface(network: Mapping[str, Any]) -> str:
    """The bridge interface docker made for a network: its option, or ``br-<id12>``."""
    named = (network.get("Options") or {}).get("com.docker.network.bridge.name")
    return str(named or f"br-{str(network.get('Id') or '')[:12]}")


def rule(interface: str) -> list[str]:
    return [
        "INPUT", "-i", interface, "-m", "conntrack", "--ctstate", "NEW",
        "-m", "comment", "--comment", COMMENT, "-j", "REJECT",
    ]  # fmt: skip


def guard(engine_pid: int, interface: str) -> str | None:
    """Hold the rule for ``interface`` in the namespace of the engine's process; None once
    it holds (already, or now), else why it does not."""
    if not (shutil.which("iptables") and shutil.which("nsenter")):
        return "iptables or nsenter is not on this machine"
    iptables = ["nsenter", f"--net=/proc/{engine_pid}/ns/net", "iptables", "-w", "5"]
    if _run([*iptables, "-S", "DOCKER-USER"]).returncode != 0:
        return "the engine keeps no firewall rules (--iptables=false): it isolates nothing"
    if _run([*iptables, "-C", *rule(interface)]).returncode == 0:
        return None
    added = _run([*iptables, "-I", *rule(interface)])
    return None if added.returncode == 0 else (added.stderr.strip() or "iptables refused")


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(command, 1, "", str(exc))
