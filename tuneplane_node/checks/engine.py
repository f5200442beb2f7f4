"""The check's engine steps: which engine answers, and what every job gets on it (the
confinement, the host network, user namespaces, the sandboxed runtimes, the init, the
jobs' parent cgroup, podman's seccomp profile)."""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from tuneplane_node.checks.findings import FAIL, OK, WARN, Finding
from tuneplane_node.errors import ConfigError, NodeError
from tuneplane_node.settings import NodeSettings, env_name

if TYPE_CHECKING:
    from tuneplane_node.jobs.rules.confinement import JobRules
    from tuneplane_node.runtime.engines.cgroupparent import ParentReport
    from tuneplane_node.runtime.engines.engine import EngineRuntime


def check_engine(settings: NodeSettings) -> list[Finding]:
    return [asyncio.run(_engine_finding(settings))]


async def _engine_finding(settings: NodeSettings) -> Finding:
    from tuneplane_node.runtime import detect_runtime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError as exc:  # auto: no engine answered, or the given docker did not
        return FAIL, f"engine: {exc.message}"
    try:
        health = await runtime.health()
    finally:
        await runtime.close()
    where = engine_address(settings, health.engine)
    if not health.ok:
        return FAIL, f"engine: {health.engine} at {where} does not answer: {health.error}"
    if health.engine == "process":
        return WARN, "engine: process runtime: jobs run as bare processes (development only)"
    return OK, f"engine: {health.engine} {health.version or '(version unknown)'} at {where}"


def engine_address(settings: NodeSettings, engine: str) -> str:
    return settings.engine_address(engine) or "this host"


def check_jobs(settings: NodeSettings) -> list[Finding]:
    """What every job gets, and what it still shares with the host or the node."""
    from tuneplane_node.jobs.rules.confinement import JobRules

    try:
        rules = JobRules(settings)
    except ConfigError as exc:
        return [(FAIL, f"jobs: {exc.message}")]
    found = [(OK, f"jobs: {describe_confinement(rules)}")]
    found.extend(host_network_findings(settings))
    return [*found, *asyncio.run(_isolation_findings(settings))]


def host_network_findings(settings: NodeSettings) -> list[Finding]:
    """Which network a job asking for ``host`` gets, and where jobs of different tenants
    would share the host's."""
    from tuneplane_node.jobs.rules.network import PORT_NOT_HELD

    mode, plain = settings.job_host_network, settings.tls_cert_file is None
    if mode == "allow":
        tls = "; the API is plain HTTP: a job on the host network reaches it" if plain else ""
        return [(WARN, (
            "jobs: host-network jobs are allowed beside each other: jobs of different tenants "
            f"share the host's network and its loopback services{tls}; set "
            f"{env_name('job_host_network')}=whole-node"
        ))]  # fmt: skip
    if mode != "whole-node":
        done = "refused" if mode == "refuse" else "bridged"
        return [(OK, f"jobs: a launch asking for the host network is {done}")]
    whole = (
        "jobs: a launch asking for the host network gets it only holding every card with no "
        "other job on the machine (a job beside it, or on fewer cards, is bridged)"
    )
    if plain:
        return [(OK, f"{whole}, and only under systemd's socket unit: under a plain serve, "
                     f"{PORT_NOT_HELD}")]  # fmt: skip
    return [(OK, f"{whole}; the API is served over TLS")]


def job_network_finding(settings: NodeSettings, firewall: str | None = None) -> Finding:
    """The network a job off the host's gets, and whether jobs there reach each other
    or this machine's ports; ``firewall``: why the engine holds no rule at all (docker
    under ``--iptables=false``)."""
    from tuneplane_node.runtime.engines.networks import hostguard

    kind = settings.job_network
    if firewall is not None and kind != "bridge":
        return (WARN, (
            f"jobs: isolation is off: a bridged job runs {kind} in name only, and reaches "
            f"other jobs, this machine's ports and the cloud's metadata service: {firewall}"
        ))  # fmt: skip
    if kind == "bridge":
        return (WARN, (
            "jobs: a bridged job runs on the engine's default bridge, where jobs reach each "
            f"other's ports; set {env_name('job_network')}=isolated"
        ))  # fmt: skip
    world = "and the outside world" if kind == "sealed" else "but reaches the outside world"
    where = (
        "docker: the node's network, inter-container traffic off and no new connection to "
        "this machine's ports, held by firewall rules (none under --iptables=false); "
        "podman: a network of each job's own, the same rule for its bridge and rules "
        "against the engine's other containers"
    )
    if (missing := hostguard.tools_missing()) is not None:
        return (
            WARN,
            f"jobs: a bridged job runs {kind}, but reaches this machine's ports: {missing}",
        )
    return (OK, f"jobs: a bridged job runs {kind}: it cannot reach another job {world} ({where})")


def describe_confinement(rules: JobRules) -> str:
    bounds = rules.confinement
    memory = "none (the machine's memory is unknown)"
    if rules.memory_limit is not None:
        memory = f"{rules.memory_limit / 2**30:.1f} GiB"
    facts = [
        f"capabilities {', '.join(bounds.capabilities) or 'none'}",
        f"no-new-privileges {'on' if bounds.no_new_privileges else 'OFF'}",
        f"pids {bounds.pids_limit}",
        f"log {bounds.log_max_bytes} bytes x {bounds.log_max_files}",
        f"oom_score_adj {bounds.oom_score_adj}",
        f"memory limit when the console gives none: {memory}",
        f"host network: {rules.network.mode}",
        _root(rules),
    ]
    return "; ".join(facts)


def _root(rules: JobRules) -> str:
    tmp = f"/tmp tmpfs of at most {rules.tmpfs_bytes / 2**20:g} MiB and half the job's memory"
    if rules.read_only_root:
        return f"root read-only ({tmp})"
    return f"root writable unless a launch asks read-only ({tmp})"


async def _isolation_findings(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.runtime import detect_runtime
    from tuneplane_node.runtime.engines.engine import EngineRuntime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return [job_network_finding(settings)]  # the engine step has said why
    try:
        if not isinstance(runtime, EngineRuntime):
            return [
                job_network_finding(settings),
                (WARN, "jobs: the process runtime applies none of these bounds"),
            ]
        found = [job_network_finding(settings, await _firewall(runtime))]
        found += [*await _remap_finding(runtime), *await _seccomp_findings(runtime)]
        found += await _runtime_findings(runtime, settings)
        return [*found, _init_finding(runtime, settings), *await _parent_finding(runtime)]
    finally:
        await runtime.close()


async def _firewall(runtime: EngineRuntime) -> str | None:
    """Why docker, on this machine, holds no rule for its jobs (``--iptables=false``);
    None where it does, for podman, or where it cannot be told (a remote engine)."""
    from tuneplane_node.runtime.engines.networks import hostguard
    from tuneplane_node.settings import unix_socket

    socket = unix_socket(runtime.settings.engine_address(runtime.name))
    if runtime.name != "docker" or socket is None or hostguard.tools_missing():
        return None
    pid, _ = hostguard.engine_pid(socket)
    return await asyncio.to_thread(hostguard.firewall_missing, pid) if pid else None


# Where podman looks for its init (containers.conf's init_path, distributions' packages).


PODMAN_INITS = (
    "/usr/libexec/podman/catatonit",
    "/usr/bin/catatonit",
    "/usr/local/libexec/podman/catatonit",
    "/usr/local/bin/catatonit",
)


def _init_finding(runtime: EngineRuntime, settings: NodeSettings) -> Finding:
    setting = env_name("job_init")
    if not settings.job_init:
        text = f"jobs: no init ({setting}=false): a shell entrypoint ignores SIGTERM"
        return (WARN, f"{text} and is killed after the grace period; zombies stay")
    local = settings.podman_url.startswith(("unix://", "http+unix://"))
    if runtime.name == "podman" and local and not any(map(os.path.exists, PODMAN_INITS)):
        text = "jobs: podman's init (catatonit) is not installed: every launch would fail"
        return (FAIL, f"{text} to start; install catatonit, or set {setting}=false")
    return (OK, f"jobs: {runtime.name}'s init is PID 1 of every job (signals reach the command)")


async def _runtime_findings(runtime: EngineRuntime, settings: NodeSettings) -> list[Finding]:
    """The engine's runtimes with their arguments, user namespaces and the sandbox."""
    from tuneplane_node.jobs.rules.isolation import IsolationRules, findings

    support = await runtime.isolation_support()  # an engine that cannot say is a warning
    rules = IsolationRules(settings)
    said = findings(rules, support, engine=runtime.name, local=runtime._local())
    return [({True: OK, None: WARN, False: FAIL}[fine], text) for fine, text in said]


async def _remap_finding(runtime: EngineRuntime) -> list[Finding]:
    from tuneplane_node.errors import EngineUnavailable

    try:
        remapped = await runtime.remaps_users()
    except EngineUnavailable:
        return []  # the engine step has said so
    except NodeError as exc:
        return [(WARN, f"jobs: cannot tell whether {runtime.name} remaps users: {exc.message}")]
    if remapped:
        return [(OK, f"jobs: {runtime.name} remaps users: uid 0 in a job is not the host's root")]
    fix = "docker's userns-remap"
    if runtime.name == "podman":
        fix = "TUNEPLANE_JOB_USERNS (each job a range of its own, below),"
    text = (
        f"jobs: {runtime.name} does not remap users: a root job shares the host root's "
        f"per-user kernel limits (inotify, keyrings); {fix} removes that"
    )
    return [(WARN, text)]


async def _parent_finding(runtime: EngineRuntime) -> list[Finding]:
    """The jobs' parent cgroup: what it holds against the node's figures, and who bounds
    it (the node under cgroupfs, systemd's slice under the systemd driver)."""
    from tuneplane_node.errors import EngineUnavailable
    from tuneplane_node.runtime.engines.cgroupparent import describe_parent

    try:
        report = await runtime.cgroup_parent()
    except EngineUnavailable:
        return []  # the engine step has said so
    except NodeError as exc:
        return [(WARN, f"jobs: cannot ask {runtime.name} its cgroup driver: {exc.message}")]
    text = f"jobs: parent cgroup {describe_parent(report)}"
    if report.bounded:
        return [(OK, text)]
    if report.parent.owned and report.error is None:
        return [(OK, f"{text}; the node makes and bounds it at its first launch")]
    return [(WARN, f"{text}; {parent_fix(report)}")]


def parent_fix(report: ParentReport) -> str:
    """What the operator does so that the parent holds the node's figures."""
    wanted, parent = report.wanted, report.parent
    if not parent.owned:
        lines = []
        if wanted.pids is not None:
            lines.append(f"TasksMax={wanted.pids}")
        if wanted.memory_bytes is not None:
            lines.append(f"MemoryMax={wanted.memory_bytes}")
        return (
            f"install contrib/systemd/{parent.engine_form}, or give it "
            f"{' and '.join(lines) or 'its bounds'} in a drop-in"
        )
    return (
        f"bound {parent.path} (pids.max and its memory limit) on the engine's host, or let "
        "the node write the cgroup tree there (a unit without ProtectControlGroups=yes)"
    )


async def _seccomp_findings(runtime: EngineRuntime) -> list[Finding]:
    from tuneplane_node.runtime.engines import seccomp
    from tuneplane_node.runtime.engines.podman import PodmanRuntime

    if not isinstance(runtime, PodmanRuntime):
        return []  # docker's default profile refuses user namespaces itself
    derived = None if runtime.remote else await asyncio.to_thread(seccomp.derive_profile)
    if derived is None:
        return [(WARN, "jobs: podman's own seccomp profile: jobs may create user namespaces")]
    profile = runtime.settings.state_dir / seccomp.PROFILE_NAME  # serve writes it, check never
    return [(OK, f"jobs: podman seccomp profile {profile} from {derived[0]} (no user namespaces)")]
