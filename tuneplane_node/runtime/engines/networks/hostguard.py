"""The rules that keep the jobs of the node's job networks off this machine's own ports
(issue 38).

Inter-container traffic off (docker) or a network of each job's own (podman) keeps a job
from another's ports, but not from the host's: through its bridge's gateway a job opens
any port the host serves on all its addresses (the node's API on 0.0.0.0, a registry, a
metrics agent). The guard is a rule in the INPUT chain of the engine's own network
namespace (the process on its socket's), where the engine keeps its rules: a new
connection that comes in from a job network's bridge is rejected. Replies to what the
host opened (established, related), and a job's traffic to the outside world (FORWARD),
are untouched.

Docker: one rule for its shared network, kept only where docker manages the firewall
(its DOCKER-USER chain exists): an engine run with ``--iptables=false`` isolates nothing
between jobs either. Podman (`BridgeGuard`): per job network, that rule and two in
FORWARD, for what podman's ``isolate`` leaves open: the engine's other containers on
networks that are not isolated (the default one), by their address (a new connection
out to a bridge of the engine's naming) or by a port they publish on the host (a
connection whose destination was translated, DNAT). All three are commented with the
bridge (`GUARD_PREFIX`), removed with the network, and swept where the bridge is gone,
no network's and no interface of the engine's namespace (a killed daemon's). Its
networks are made without podman's DNS (`dns_enabled` false), so no port of the gateway
is kept open. Blocking: on the engine's pool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from tuneplane_node.runtime import memlock

log = logging.getLogger(__name__)

COMMENT = "tuneplane-node: the jobs of this network reach no port of this machine"
GUARD_PREFIX = "tuneplane-guard:"
"""The comment of a podman job network's rule, before its bridge's name."""
PODMAN_CHAINS = ("CNI-FORWARD", "NETAVARK_FORWARD")
"""Chains podman's firewall (CNI's plugin, netavark) makes: which iptables holds them."""
TIMEOUT_S = 10.0
NO_FIREWALL = "the engine keeps no firewall rules (--iptables=false): it isolates nothing"
"""Docker without its DOCKER-USER chain: neither inter-container traffic nor any rule of
the node's holds."""
PROC = Path("/proc")
_GUARDED = re.compile(rf'--comment "?{GUARD_PREFIX}(\S+?)"?(?:\s|$)')


def bridge_interface(network: Mapping[str, Any]) -> str:
    """The bridge interface docker made for a network: its option, or ``br-<id12>``."""
    named = (network.get("Options") or {}).get("com.docker.network.bridge.name")
    return str(named or f"br-{str(network.get('Id') or '')[:12]}")


def rule(interface: str) -> list[str]:
    """Docker's rule for its network's bridge ``interface``."""
    return [
        "INPUT", "-i", interface, "-m", "conntrack", "--ctstate", "NEW",
        "-m", "comment", "--comment", COMMENT, "-j", "REJECT",
    ]  # fmt: skip


def podman_rules(interface: str) -> list[list[str]]:
    """A podman job network's rules: the host's ports, the engine's other containers by
    address (``cni-podman3`` -> any ``cni-podman+``) and by published port."""
    tag = ["-m", "comment", "--comment", f"{GUARD_PREFIX}{interface}", "-j", "REJECT"]
    new = ["-m", "conntrack", "--ctstate", "NEW", *tag]
    engines = f"{interface.rstrip('0123456789')}+"
    return [
        ["INPUT", "-i", interface, *new],
        ["FORWARD", "-i", interface, "-o", engines, *new],
        ["FORWARD", "-i", interface, "-m", "conntrack", "--ctstate", "DNAT", *tag],
    ]


def tools_missing() -> str | None:
    """Why no guard can hold on this machine, or None."""
    if shutil.which("iptables") and shutil.which("nsenter"):
        return None
    return "iptables or nsenter is not on this machine"


def engine_pid(socket_path: str | None) -> tuple[int, str | None]:
    """The process whose network namespace the engine's rules live in: the listener on
    its socket; (0, why) where there is none to find."""
    if socket_path is None:
        return 0, "the engine is another machine's"
    try:
        pid = memlock.listener_pid(socket_path)
    except OSError as exc:
        return 0, f"no listener found on {socket_path}: {exc.strerror or exc}"
    # systemd holds a socket-activated engine's socket: the engine is then in the
    # machine's namespace, which is the node's own under its unit.
    return (os.getpid() if pid == 1 else pid), None


def enter(pid: int, tool: str = "iptables") -> list[str]:
    """An iptables command line in the namespace of process ``pid``."""
    return ["nsenter", f"--net=/proc/{pid}/ns/net", tool, "-w", "5"]


def guard(pid: int, interface: str) -> str | None:
    """Hold docker's rule for ``interface`` in the namespace of the engine's process; None
    once it holds (already, or now), else why it does not."""
    if (missing := tools_missing() or firewall_missing(pid)) is not None:
        return missing
    return _hold(enter(pid), rule(interface))


def firewall_missing(pid: int) -> str | None:
    """`NO_FIREWALL` where docker, as the process ``pid``, keeps no firewall rules in its
    namespace (no DOCKER-USER chain); None where it does."""
    return NO_FIREWALL if run([*enter(pid), "-S", "DOCKER-USER"]).returncode else None


def _hold(iptables: list[str], wanted: list[str]) -> str | None:
    if run([*iptables, "-C", *wanted]).returncode == 0:
        return None
    added = run([*iptables, "-I", *wanted])
    return None if added.returncode == 0 else (added.stderr.strip() or "iptables refused")


def podman_iptables(pid: int) -> str | None:
    """The iptables podman's rules are in (its firewall plugins run the one on their
    PATH, nft or legacy): the one whose rules show podman's chains; None before any.
    Legacy tables are listed only where they exist: listing them makes them."""
    tools = ["iptables", "iptables-nft"]
    with contextlib.suppress(OSError):
        if (PROC / str(pid) / "net" / "ip_tables_names").read_text().strip():
            tools.append("iptables-legacy")
    for tool in tools:
        listed = run([*enter(pid, tool), "-S", "FORWARD"]) if shutil.which(tool) else None
        if listed is not None and any(chain in listed.stdout for chain in PODMAN_CHAINS):
            return tool
    return None


def interfaces(pid: int) -> set[str]:
    """The network interfaces of process ``pid``'s namespace; none where unreadable."""
    try:
        listed = (PROC / str(pid) / "net" / "dev").read_text().splitlines()[2:]
    except OSError:
        return set()
    return {line.split(":", 1)[0].strip() for line in listed if ":" in line}


def guarded_bridges(listing: str) -> list[str]:
    """The bridges of the podman rules in an ``iptables -S`` listing, once each."""
    return list(dict.fromkeys(bridge for bridge, _ in guarded_rules(listing)))


def guarded_rules(listing: str) -> list[tuple[str, list[str]]]:
    """The podman rules in an ``iptables -S`` listing: each one's bridge and its rule as
    ``-D`` takes it."""
    return [
        (found.group(1), shlex.split(line)[1:])
        for line in listing.splitlines()
        if line.startswith("-A ") and (found := _GUARDED.search(line))
    ]


class BridgeGuard:
    """The rules of one podman engine's job networks (`podman_rules` of each network's
    bridge), in the engine's namespace. They are added after their network is made
    (`hold`, or with the egress rule's jump in one write: `EgressRule.begin_fresh`) and removed
    where its bridge is no network's any more (`sweep`: after a removal, at start); one
    lock orders them, so a sweep never takes a rule added after its look at the networks.
    Where the guard cannot hold, the log says why once."""

    def __init__(self, socket_path: str | None) -> None:
        self.socket_path = socket_path
        self.lock = threading.Lock()  # also taken by `EgressRule.begin_fresh`'s one write
        self._said: set[str] = set()
        self._tools: dict[int, str] = {}  # engine pid -> the iptables found holding its rules

    def hold(self, interface: str) -> None:
        """The rules for a network's bridge ``interface``, each added unless it is there."""
        with self.lock:
            iptables: list[str] = []
            why: str | None = "the engine named no bridge for a job network"
            if interface:
                _, iptables, why = self._iptables()
            for wanted in podman_rules(interface) if iptables else ():
                why = why or _hold(iptables, wanted)
            if why is not None and why not in self._said:
                self._said.add(why)
                log.warning(
                    "podman's job networks can open this machine's ports and the engine's "
                    "other containers: %s",
                    why,
                )

    def sweep(self, bridges: Callable[[], Collection[str]]) -> int:
        """Remove the rules whose bridge is none of ``bridges()`` (the engine's networks')
        nor an interface of the engine's namespace (another service's there may keep
        its networks elsewhere); how many. The rules are read first: one seen was added
        after its network was made, so the networks listed next name its bridge unless
        it is gone."""
        with self.lock:
            pid, iptables, _ = self._iptables()
            found = guarded_rules(run([*iptables, "-S"]).stdout if iptables else "")
            live = {*bridges(), *interfaces(pid)} if found else set()
            stale = [(bridge, spec) for bridge, spec in found if bridge not in live]
            for _, spec in stale:
                run([*iptables, "-D", *spec])
            if stale:
                gone = sorted({bridge for bridge, _ in stale})
                log.info("removed the host guard's rules of %s: their networks are gone", gone)
            return len(stale)

    def _iptables(self) -> tuple[int, list[str], str | None]:
        """The engine's pid and its iptables command; else why there is none."""
        if (missing := tools_missing()) is not None:
            return 0, [], missing
        pid, why = engine_pid(self.socket_path)
        if not pid:
            return 0, [], why
        return pid, enter(pid, self.tool(pid)), None

    def tool(self, pid: int) -> str:
        """The iptables holding podman's rules in the namespace of ``pid`` (the node's
        own rules go there too): ``iptables`` until podman's chains are seen."""
        if pid not in self._tools and (found := podman_iptables(pid)):
            self._tools[pid] = found  # podman's own chains seen there: asked no more
        return self._tools.get(pid, "iptables")


class Begun:
    """An iptables command started with its input written, its end waited for later
    (`done`): a launch makes its container meanwhile. A failure to start it is a failed
    run at `done`, never an exception."""

    def __init__(self, command: list[str], stdin: str) -> None:
        self.command = command
        self.process: subprocess.Popen[str] | None = None
        self.failed = ""
        try:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        except OSError as exc:
            self.failed = str(exc)
            return
        pipe, self.process.stdin = self.process.stdin, None  # communicate() must not touch it
        assert pipe is not None
        # A restore's few lines fit the pipe's buffer; one that ended before reading them
        # (a broken pipe) says why by its exit.
        with contextlib.suppress(OSError), pipe:
            pipe.write(stdin)

    def done(self) -> subprocess.CompletedProcess[str]:
        if self.process is None:
            return subprocess.CompletedProcess(self.command, 1, "", self.failed)
        try:
            out, err = self.process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            self.process.kill()
            self.process.communicate()
            return subprocess.CompletedProcess(self.command, 1, "", str(exc))
        return subprocess.CompletedProcess(self.command, self.process.returncode, out, err)


def run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """An iptables command (``stdin``: a restore's input); a failure to run it is a
    failed run, never an exception."""
    try:
        return subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(command, 1, "", str(exc))
