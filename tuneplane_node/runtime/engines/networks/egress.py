"""The rule that keeps the jobs of the node's job networks off the cloud's metadata
service, the networks the operator denies and this machine's other bridges (issue 51).

The host guard (`hostguard`) keeps a job off this machine's own ports; where a job may go
*out* is this rule's. On a cloud machine the metadata address is routed through the
default gateway, so a bridged job reaches it, and with IMDSv1 takes the instance's
credentials; a podman job reached a docker job's port on the same machine, since each
engine's isolation covers its own bridges only.

A chain of the node's in the engine's network namespace (`chain_name`: one per engine
address, so a docker node and a podman node in one namespace keep their own settings),
jumped to by a job network's new connections (docker: from its ``DOCKER-USER`` chain;
podman: from the chain its firewall runs before accepting a container's traffic,
`PODMAN_PARENTS`), each jump commented with its bridge (`JUMP_PREFIX`)::

    -d <TUNEPLANE_JOB_EGRESS_ALLOW>              RETURN   the engine's rules decide
    -o <uplink> -p udp|tcp --dport 53            RETURN   name servers (`DNS`)
    -d 169.254.0.0/16, 100.100.100.200, <DENY>   REJECT
    -o <uplink: an interface of a default route> RETURN   the outside world
    (any other: another bridge, another engine's
     containers, a VPN's interface, a VM's)      REJECT

IPv6 (a network with IPv6 only: the node makes none) the same in ip6tables, with
``fe80::/10``, ``fd00:ec2::254`` and the IPv4-mapped forms of the IPv4 entries.
Host-network jobs (`EgressRule.hold_host`): the address rules alone, jumped to from
``OUTPUT`` by a cgroup match on the jobs' parent (``-m cgroup --path``, which matches a
socket's cgroup v2 and its descendants: cgroup v2, or a hybrid host's v2 tree, which
runc fills too); where there is no v2 tree the match is impossible, and that is said.

A refusal is ICMP "administratively prohibited" (``EHOSTUNREACH``: "No route to host"),
which `check`'s probe tells from a host that answers. The chain is written (flushed and
filled, one ``iptables-restore``) at the first hold of a daemon's life and whenever the
default route's interfaces moved; the jumps go with their network (`EgressRule.sweep`,
like the guard's rules), and all of them and the chain go at the start of a daemon whose
rule is off (``TUNEPLANE_JOB_EGRESS_RULE=false``). The node's own requests (pulls, fills,
notices) are no job network's: untouched. Blocking: on the engine's pool.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Any

from tuneplane_node.runtime.engines.cgroupparent import JobParent
from tuneplane_node.runtime.engines.networks.hostguard import (
    PROC,
    Begun,
    BridgeGuard,
    engine_pid,
    enter,
    firewall_missing,
    interfaces,
    podman_rules,
    run,
    tools_missing,
)
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings, env_name

log = logging.getLogger(__name__)
Network = IPv4Network | IPv6Network
METADATA = tuple(
    ip_network(net)
    for net in ("169.254.0.0/16", "100.100.100.200/32", "fe80::/10", "fd00:ec2::254/128")
)
"""Denied whatever the operator says: link-local (AWS, Azure, GCP, Oracle at
169.254.169.254) and the clouds' metadata addresses outside it (Alibaba, AWS's IPv6)."""
JUMP_PREFIX = "tuneplane-egress:"
"""The comment of a job network's jump, before its bridge's name."""
HOST_PREFIX = "tuneplane-egress-host:"
"""The comment of the host-network jobs' jump, before their parent cgroup's path."""
CHAIN_PREFIX = "TP-EGRESS-"
DOCKER_USER = "DOCKER-USER"
"""Docker's chain for its users' rules, first in FORWARD: absent, docker keeps no rules."""
PODMAN_PARENTS = {"cni": "CNI-ADMIN", "netavark": "NETAVARK_FORWARD"}
"""Where a podman job network's jump goes, by podman's network backend: the chain its
firewall runs before accepting a container's traffic (CNI's "admin overrides", first in
CNI-FORWARD; netavark's forward chain, at its top). A jump in FORWARD itself would come
after the backend's own jump, which it inserts first whenever it makes its chains."""
MADE_PARENTS = frozenset(PODMAN_PARENTS.values())
"""Made by the node where its backend has not yet (each backend keeps a chain it finds)."""
REFUSALS = {4: "icmp-admin-prohibited", 6: "icmp6-adm-prohibited"}
DNS = ("udp", "tcp")
"""Port 53 of these passes the denials: a cloud's resolver is often its metadata address
(GCP's 169.254.169.254, AWS's 169.254.169.253), and a job without names fails at its
first download. Only the metadata service's HTTP is its credentials'."""
ALLOW, DENY = env_name("job_egress_allow"), env_name("job_egress_deny")
_JUMP = re.compile(rf'--comment "?({JUMP_PREFIX}|{HOST_PREFIX})(\S+?)"?\s.*-j (\S+)')
_CHAIN = re.compile(rf"^-N ({CHAIN_PREFIX}\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class EgressPolicy:
    """What the rule lets through (``allow``) and refuses (``deny``: the metadata
    addresses and the operator's), both families."""

    allow: tuple[Network, ...]
    deny: tuple[Network, ...]

    @classmethod
    def of(cls, settings: NodeSettings) -> EgressPolicy | None:
        """The settings' policy; None where the rule is off."""
        if not settings.job_egress_rule:
            return None
        deny = (*METADATA, *settings.job_egress_deny)
        return cls(allow=tuple(settings.job_egress_allow), deny=tuple(dict.fromkeys(deny)))

    def networks(self, family: int) -> tuple[list[str], list[str]]:
        """(allowed, denied) as iptables of that family takes them; IPv6's with the
        IPv4-mapped forms of the IPv4 entries (``::ffff:169.254.0.0/112``)."""
        return _of_family(self.allow, family), _of_family(self.deny, family)


def _of_family(networks: Collection[Network], family: int) -> list[str]:
    found = [str(net) for net in networks if net.version == family]
    if family == 6:
        mapped = (net for net in networks if net.version == 4)
        found += [f"::ffff:{net.network_address}/{96 + net.prefixlen}" for net in mapped]
    return found


def chain_name(address: str, *, host: bool = False) -> str:
    """The node's chain for the engine at ``address`` (``H`` for host-network jobs'):
    within iptables' 28 characters."""
    digest = hashlib.sha256(address.encode()).hexdigest()[:8]
    return f"{CHAIN_PREFIX}{'H' if host else ''}{digest}"


def chain_text(
    chain: str, policy: EgressPolicy, uplinks: Collection[str], *, family: int,
    bridged: bool = True,
) -> str:  # fmt: skip
    """``iptables-restore --noflush`` input that writes the chain whole (its declaration
    flushes it first): atomic, one process. ``bridged``: the interface rules too, which a
    host-network job (it has every interface of the machine) is not held to."""
    allowed, denied = policy.networks(family)
    reject = ["-j", "REJECT", "--reject-with", REFUSALS[family]]
    rules = [["-d", net, "-j", "RETURN"] for net in allowed]
    outs = [["-o", uplink] for uplink in sorted(uplinks)] if bridged else [[]]
    rules += [[*out, "-p", proto, "--dport", "53", "-j", "RETURN"] for out in outs for proto in DNS]
    rules += [["-d", net, *reject] for net in denied]
    if bridged:
        rules += [[*out, "-j", "RETURN"] for out in outs]
        rules.append(reject)
    lines = ["*filter", f":{chain} - [0:0]"]
    lines += [shlex.join(["-A", chain, *rule]) for rule in rules]
    return "\n".join([*lines, "COMMIT", ""])


def jump(parent: str, bridge: str, chain: str) -> list[str]:
    """The jump of a job network's new connections, in ``parent`` (`DOCKER_USER`,
    `PODMAN_PARENTS`)."""
    return [
        parent, "-i", bridge, "-m", "conntrack", "--ctstate", "NEW",
        "-m", "comment", "--comment", f"{JUMP_PREFIX}{bridge}", "-j", chain,
    ]  # fmt: skip


def host_jump(path: str, chain: str) -> list[str]:
    """The jump of the new connections of a process under the cgroup ``path`` (v2)."""
    return [
        "OUTPUT", "-m", "cgroup", "--path", path, "-m", "conntrack", "--ctstate", "NEW",
        "-m", "comment", "--comment", f"{HOST_PREFIX}{path}", "-j", chain,
    ]  # fmt: skip


def jumps(listing: str) -> list[tuple[str, str, list[str]]]:
    """The node's jumps in an ``iptables -S`` listing: (the bridge, or ``host:<path>``;
    the chain jumped to; the rule as ``-D`` takes it)."""
    found = []
    for line in listing.splitlines():
        if line.startswith("-A ") and (match := _JUMP.search(line)):
            kind, name, chain = match.groups()
            found.append(
                (f"host:{name}" if kind == HOST_PREFIX else name, chain, shlex.split(line)[1:])
            )
    return found


def default_interfaces(pid: int, family: int = 4) -> tuple[str, ...]:
    """The interfaces of the default routes (main table) of ``pid``'s namespace, from
    ``/proc`` (no process started); none where unreadable."""
    name = "route" if family == 4 else "ipv6_route"
    try:
        lines = (PROC / str(pid) / "net" / name).read_text().splitlines()
    except OSError:
        return ()
    found = _default_v4(lines[1:]) if family == 4 else _default_v6(lines)
    return tuple(sorted(set(found)))


def _default_v4(lines: list[str]) -> list[str]:
    """``Iface Destination Gateway Flags ... Mask``: up (flag 1), 0.0.0.0/0."""
    fields = (line.split() for line in lines)
    return [f[0] for f in fields if len(f) > 7 and f[1] == f[7] == "00000000" and int(f[3], 16) & 1]


def _default_v6(lines: list[str]) -> list[str]:
    """``dest plen src plen nexthop metric refcnt use flags iface``: up, ::/0, not the
    kernel's unreachable default on ``lo``."""
    fields = (line.split() for line in lines)
    return [
        f[9] for f in fields
        if len(f) > 9 and f[1] == "00" and not int(f[0], 16) and int(f[8], 16) & 1 and f[9] != "lo"
    ]  # fmt: skip


def family_tool(tool: str, family: int, *, restore: bool = False) -> str:
    """``iptables``, ``iptables-nft``, ``iptables-legacy`` as that family's command (and
    its restore)."""
    named = tool if family == 4 else tool.replace("iptables", "ip6tables", 1)
    if not restore:
        return named
    base, _, variant = named.partition("-")
    return f"{base}-{variant}-restore" if variant else f"{base}-restore"


class EgressRule:
    """The node's egress rule on one engine: the chains of its `EgressPolicy` and a jump
    for each job network's bridge, in the engine's namespace, through the iptables
    ``tool(pid)`` names (the one holding the engine's own rules); ``policy`` None: off.
    ``ipv6``: whether its networks may have IPv6 (docker's may; the node makes podman's
    without). One lock orders holds and sweeps, so a sweep never takes a jump added
    after its look at the bridges. Where the rule cannot hold, the log says why once."""

    def __init__(
        self, policy: EgressPolicy | None, *, address: str, parent: Callable[[], str],
        socket_path: str | None, tool: Callable[[int], str], ipv6: bool = False,
    ) -> None:  # fmt: skip
        self.policy = policy
        self.chain, self.host_chain = chain_name(address), chain_name(address, host=True)
        self.parent, self.socket_path, self.tool = parent, socket_path, tool
        self.families = (4, 6) if ipv6 else (4,)
        self._lock = threading.Lock()
        self._written: dict[tuple[int, int, str], tuple[str, ...]] = {}  # -> its uplinks
        self._said: set[str] = set()

    def hold(self, bridge: str, *, ipv6: bool = False, fresh: bool = False) -> str | None:
        """The jump for a job network's ``bridge`` (its chain written first); None once
        it holds (or the rule is off), else why not. ``fresh``: a bridge just made (a
        podman job's network), whose jump is added without a look first: a leftover of
        an earlier bridge of its name is the same rule, and goes with it at the sweep."""
        if self.policy is None:
            return None
        with self._lock:
            pid, why = self._engine()
            parent = self.parent()
            if why is None and parent == DOCKER_USER:
                why = firewall_missing(pid)
            for family in (4, 6) if ipv6 else (4,):
                wanted = jump(parent, bridge, self.chain)
                why = why or self._hold(pid, family, wanted, look=not fresh)
            return self._once(why)

    def hold_host(self, path: str, *, make: bool) -> str | None:
        """The jump for the host-network jobs under the jobs' parent cgroup ``path``,
        matched in the cgroup v2 tree (its directory made there where the node owns the
        parent, ``make``: a hybrid host's engine makes it only with its first job); None
        once it holds (or the rule is off), else why not."""
        if self.policy is None:
            return None
        why = v2_parent(path, make=make)
        with self._lock:
            pid, engine_why = self._engine()
            why = why or engine_why
            return why or self._hold(pid, 4, host_jump(path, self.host_chain))

    def hold_fresh(self, guard: BridgeGuard, bridge: str) -> bool:
        """A podman bridge just made: the host guard's rules (`hostguard.podman_rules`)
        and this rule's jump (where it is on) in one ``iptables-restore --noflush``, one
        process instead of one per rule; each with its comment, which their sweeps read.
        Whether they hold; where not (a tool or the engine missing, the chain jumped from
        not made yet: nothing was written then), ``guard.hold`` and `hold` each hold their
        own and say why. No look first, as ``hold(fresh=True)``'s."""
        begun = self.begin_fresh(guard, bridge)
        return begun is not None and begun.done().returncode == 0

    def begin_fresh(self, guard: BridgeGuard, bridge: str) -> Begun | None:
        """`hold_fresh`'s restore started, its end for the caller to wait for (a launch
        makes its container meanwhile, and waits before the start); None where it cannot
        run (nothing written). Both locks are let go once it runs: a sweep meanwhile
        lists the bridges after the rules, and this bridge is made, so it takes none of
        them (as ``hold_fresh``'s sweeps never did)."""
        if not bridge:
            return None
        with guard.lock, self._lock:
            pid, why = self._engine()
            if why is None and self.policy is not None:
                why = self._write(pid, 4, self.chain)
            if why is not None:
                return None
            rules = podman_rules(bridge)
            if self.policy is not None:
                rules.append(jump(self.parent(), bridge, self.chain))
            lines = [shlex.join(["-I", *each]) for each in rules]
            restore = family_tool(self.tool(pid), 4, restore=True)
            text = "\n".join(["*filter", *lines, "COMMIT", ""])
            return Begun([*enter(pid, restore), "--noflush"], text)

    def _engine(self) -> tuple[int, str | None]:
        if (missing := tools_missing()) is not None:
            return 0, missing
        if not shutil.which("iptables-restore"):
            return 0, "iptables-restore is not on this machine"
        return engine_pid(self.socket_path)

    def _hold(self, pid: int, family: int, wanted: list[str], *, look: bool = True) -> str | None:
        """``wanted`` added (after its chain) unless it is there (``look``); a chain gone
        behind the node's back (a firewall's reload) is written again, and the jump with
        it."""
        iptables = enter(pid, family_tool(self.tool(pid), family))
        chain = wanted[-1]
        why = self._write(pid, family, chain)
        if why is not None or (look and run([*iptables, "-C", *wanted]).returncode == 0):
            return why
        added = run([*iptables, "-I", *wanted])
        if added.returncode != 0:  # the chain gone, or the one jumped from not made yet
            why = self._write(pid, family, chain, again=True)
            if why is None and wanted[0] in MADE_PARENTS:
                run([*iptables, "-N", wanted[0]])  # there already: refused, harmlessly
            added = added if why is not None else run([*iptables, "-I", *wanted])
        return why or (None if added.returncode == 0 else refusal(added))

    def _write(self, pid: int, family: int, chain: str, *, again: bool = False) -> str | None:
        """The chain written whole where this daemon has not yet, or the default routes
        moved (a host chain has no interface rules)."""
        assert self.policy is not None
        bridged = chain == self.chain
        uplinks = default_interfaces(pid, family) if bridged else ()
        key = (pid, family, chain)
        if not again and self._written.get(key) == uplinks:
            return None
        if bridged and not uplinks:
            self._once(f"no default route in the engine's namespace: its jobs reach only {ALLOW}")
        text = chain_text(chain, self.policy, uplinks, family=family, bridged=bridged)
        why = self._restore(pid, family, text)
        if why is None:
            self._written[key] = uplinks
        return why

    def _restore(self, pid: int, family: int, text: str) -> str | None:
        restore = family_tool(self.tool(pid), family, restore=True)
        done = run([*enter(pid, restore), "--noflush"], stdin=text)
        return None if done.returncode == 0 else refusal(done)

    def sweep(self, bridges: Callable[[], Collection[str]]) -> int:
        """Remove the jumps to this engine's chains whose bridge is none of ``bridges()``
        nor an interface of the engine's namespace; with the rule off, every jump and
        the chains. A chain still jumped to is written again (this start's settings).
        The rules are read first, as the guard's. How many jumps went."""
        with self._lock:
            pid, why = self._engine()
            gone = 0
            for family in self.families if why is None else ():
                gone += self._sweep(pid, family, bridges)
            return gone

    def _sweep(self, pid: int, family: int, bridges: Callable[[], Collection[str]]) -> int:
        listed = run([*enter(pid, family_tool(self.tool(pid), family)), "-S"]).stdout
        ours = [each for each in jumps(listed) if each[1] in (self.chain, self.host_chain)]
        bridged = [each for each in ours if each[1] == self.chain]
        live = {*bridges(), *interfaces(pid)} if bridged and self.policy else set()
        stale = ours if self.policy is None else [j for j in bridged if j[0] not in live]
        lines = [shlex.join(["-D", *spec]) for _, _, spec in stale]
        if self.policy is None:  # off: the chains too, where they are
            chains = {self.chain, self.host_chain} & set(_CHAIN.findall(listed))
            lines += [f"{flag} {chain}" for chain in sorted(chains) for flag in ("-F", "-X")]
        if lines and self._restore(pid, family, "\n".join(["*filter", *lines, "COMMIT", ""])):
            return 0
        if stale:
            log.info("removed the egress rule's jumps of %s", sorted({j[0] for j in stale}))
        for key in [key for key in self._written if key[1] == family]:
            del self._written[key]  # written again now, or at the next hold
        # Written again now where it is still jumped to or still there: a sweep runs at a
        # removal, off any launch's path, where the next launch's write was the whole
        # chain again (15 ms of a podman launch's 270, each launch after a removal).
        kept = {j[1] for j in ours if j not in stale}
        if self.policy is not None:
            kept |= {self.chain, self.host_chain} & set(_CHAIN.findall(listed))
        for chain in kept:
            self._write(pid, family, chain)
        return len(stale)

    def _once(self, why: str | None) -> str | None:
        """``why`` the rule does not hold, logged the first time it is met."""
        if why is not None and why not in self._said:
            self._said.add(why)
            log.warning("the egress rule of the jobs' networks: %s", why)
        return why


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """iptables' last word on a refusal."""
    said = done.stderr.strip().splitlines()
    return said[-1] if said else f"iptables exited {done.returncode}"


def cgroup2_root(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where this machine's cgroup v2 tree is mounted (``/sys/fs/cgroup``, or a hybrid
    host's ``/sys/fs/cgroup/unified``); None where there is none."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(" - ", 1)
        if len(fields) == 2 and fields[1].split()[0] == "cgroup2":
            return Path(fields[0].split()[4])
    return None


def v2_parent(path: str, *, make: bool) -> str | None:
    """Why the parent ``path`` cannot be matched in the cgroup v2 tree (none mounted:
    cgroup v1; not there and not the node's to make), None where it is (made now)."""
    root = cgroup2_root()
    if root is None:
        return "this machine has no cgroup v2 tree (cgroup v1): no rule can match a job's sockets"
    directory = root / path.lstrip("/")
    if directory.is_dir():
        return None
    if not make:
        return f"the jobs' parent {path} is not in the cgroup v2 tree ({root}) yet"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot make {directory}: {exc.strerror or exc}"
    return None


def hold_host_job(spec: ContainerSpec, parent: JobParent | None, rule: EgressRule) -> None:
    """A host-network job held to the egress rule by the jobs' parent cgroup before it
    starts (`EngineRuntime.run` calls it between create and start); where its
    connections cannot be held, its launch's log says what it reaches."""
    if spec.network != "host" or parent is None or rule.policy is None:
        return
    why = rule.hold_host(parent.path, make=parent.owned)
    if why is not None:
        log.warning(
            "launch %s: a host-network job reaches the cloud's metadata service and %s: %s",
            spec.name, DENY, why,
        )  # fmt: skip


def podman_parent(info: Mapping[str, Any]) -> str:
    """`PODMAN_PARENTS`' chain for the network backend podman's info names (CNI alone
    before podman 4.0)."""
    backend = str((info.get("host") or {}).get("networkBackend") or "cni")
    return PODMAN_PARENTS.get(backend, PODMAN_PARENTS["cni"])
