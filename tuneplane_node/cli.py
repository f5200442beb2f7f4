"""The command line: ``serve`` runs the daemon, ``inventory`` prints what the machine has,
``check`` says whether the settings and the machine are usable, ``ctl`` talks to a
running node's API (it reads no settings: it is a client). Settings are read once."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tuneplane_node import __version__, ctl, inventory, logformat
from tuneplane_node.errors import ConfigError, NodeError
from tuneplane_node.settings import DEFAULT_STORAGE, NodeSettings, env_name, load_settings

NET_SYSFS = Path("/sys/class/net")

if TYPE_CHECKING:
    from tuneplane_node.gpu.probe import GpuProbe, GpuSnapshot
    from tuneplane_node.jobs.confinement import JobRules
    from tuneplane_node.runtime.base import ContainerRuntime
    from tuneplane_node.runtime.cgroupparent import ParentReport
    from tuneplane_node.runtime.engine import EngineRuntime

log = logging.getLogger("tuneplane_node")
T = TypeVar("T")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="tuneplane-node",
        description="Node daemon of the TunePlane fine-tuning platform. "
        "Settings come from TUNEPLANE_* variables and .env (see docs/operating.md).",
    )
    top.add_argument(
        "--version",
        action=VersionAction,
        help="print the versions of the node, Python, the engine SDKs and NVML, and exit",
    )
    top.add_argument(
        "--log-level",
        type=str.upper,
        choices=logformat.LEVELS,
        help="least severe lines written (default TUNEPLANE_LOG_LEVEL, INFO)",
    )
    top.add_argument(
        "--log-format",
        type=str.lower,
        choices=logformat.FORMATS,
        help="text, or one JSON object per line (default TUNEPLANE_LOG_FORMAT, text)",
    )
    verbs = top.add_subparsers(dest="verb", metavar="COMMAND")
    serve = verbs.add_parser("serve", help="run the daemon's HTTP API")
    serve.add_argument("--host", help="listen address (default TUNEPLANE_NODE_HOST, 0.0.0.0)")
    serve.add_argument("--port", type=int, help="listen port (default TUNEPLANE_NODE_PORT, 8470)")
    verbs.add_parser("inventory", help="print what this machine has, as JSON")
    verbs.add_parser(
        "check",
        help="check the settings, the engine, the cards and the disks",
        description="One line per fact, starting ok, warn or FAIL; exit 1 on any FAIL.",
    )
    ctl.add_parser(verbs)
    return top


class VersionAction(argparse.Action):
    """``--version``: what a bug report needs, as node agents print it; asked only when
    given (NVML is started for it)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **options: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(options.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print("\n".join(versions()))
        parser.exit()


def versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    try:
        from tuneplane_node.gpu.nvml import library_version

        nvml = library_version()
    except ImportError as exc:  # no nvidia-ml-py: the node runs without cards
        nvml = f"unavailable ({exc})"
    return [
        f"tuneplane-node {__version__}",
        f"Python {platform.python_version()} ({platform.python_implementation()})",
        f"docker SDK {of('docker')}",
        f"podman SDK {of('podman')}",
        f"nvidia-ml-py {of('nvidia-ml-py')}, NVML {nvml}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb is None:
        parser().print_help()
        return 2
    if args.verb == "ctl":
        return ctl.run(args)
    try:
        settings = load_settings()
        logformat.configure(
            args.log_level or settings.log_level, args.log_format or settings.log_format
        )
        if args.verb == "serve":
            return serve(settings, host=args.host, port=args.port)
        if args.verb == "inventory":
            return asyncio.run(print_inventory(settings))
        return check(settings)
    except ConfigError as exc:
        print(f"tuneplane-node: {exc.message}", file=sys.stderr)
        return 2


def serve(settings: NodeSettings, *, host: str | None, port: int | None) -> int:
    from tuneplane_node.daemon.enginelock import EngineTaken
    from tuneplane_node.daemon.listener import CannotListen
    from tuneplane_node.daemon.server import serve as run

    # SIGTERM/SIGINT stop it gracefully: no new connections, requests in flight finish,
    # then the app's cleanup cancels pulls and closes the engine's pool.
    try:
        asyncio.run(run(settings, host=host or settings.node_host, port=port or settings.node_port))
    except (CannotListen, EngineTaken) as exc:
        # Exit 1, not 2 (a configuration error, never restarted): a taken port may free
        # up, the other daemon may be on its way out.
        log.error("%s", exc)
        return 1
    return 0


async def print_inventory(settings: NodeSettings) -> int:
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.jobs import read_inventory
    from tuneplane_node.jobs.nodestate import NodeStateFile
    from tuneplane_node.runtime import detect_runtime

    runtime = await detect_runtime(settings, cache=False)
    allocator = GpuAllocator(runtime, settings)
    try:
        node = await asyncio.to_thread(NodeStateFile(settings.state_dir).load, "")
        facts = await read_inventory(runtime, allocator, settings, node)
    finally:
        await allocator.close()
        await runtime.close()
    from tuneplane_node.daemon import machine
    from tuneplane_node.daemon.routes import features  # what a daemon of this build serves

    print(json.dumps(machine.inventory_json(facts, features=features()), indent=2))
    return 0


# --- check ---------------------------------------------------------------------------

OK, WARN, FAIL = "ok", "warn", "FAIL"
Finding = tuple[str, str]  # (level, "subject: what was found")


def check(settings: NodeSettings) -> int:
    """One line per fact, as each is learnt; 1 when any is a FAIL. Starts no daemon."""
    steps: tuple[Callable[[NodeSettings], list[Finding]], ...] = (
        check_token,
        check_tls,
        check_registry_auth,
        check_engine,
        check_jobs,
        check_gpus,
        check_disk,
        check_storage,
        check_mount_roots,
        check_mounts,
        check_state_dir,
        check_fabrics,
        check_fabric_network,
        check_rdma,
        check_port,
    )
    failed = False
    base, settings = path_base(settings)
    if base is not None:
        print(f"{base[0]:<4} {base[1]}", flush=True)
    for step in steps:
        for level, text in step(settings):
            print(f"{level:<4} {text}", flush=True)
            failed |= level == FAIL
    return 1 if failed else 0


def path_base(settings: NodeSettings) -> tuple[Finding | None, NodeSettings]:
    """Where relative paths start, as serve resolves them: a node serving on the port
    resolves them (and read its ``.env``) in its own working directory, so check moves
    there and reads the settings again; else in this one, as a serve started here would.
    The finding is None when every path setting is absolute."""
    serving = _serving_pid(settings)
    if serving is not None:
        try:
            directory = Path(os.readlink(f"/proc/{serving}/cwd"))
            os.chdir(directory)
        except OSError as exc:
            here = Path.cwd()
            return (
                WARN,
                f"paths: relative ones from {here}: the serving node's (pid "
                f"{serving}) working directory is unreadable: {exc.strerror}",
            ), settings
        settings = load_settings()
        if _relative_paths(settings):
            return (
                OK,
                f"paths: relative ones from {directory}, the working directory of "
                f"the serving node (pid {serving})",
            ), settings
        return None, settings
    if _relative_paths(settings):
        return (
            OK,
            f"paths: relative ones from {Path.cwd()}, the working directory "
            "(a serve started elsewhere resolves them there)",
        ), settings
    return None, settings


def _relative_paths(settings: NodeSettings) -> list[Path]:
    paths = [settings.storage, settings.state_dir, settings.scratch_dir, *settings.model_dirs]
    paths += settings.allowed_mount_roots or []
    for name in ("node_token_file", "tls_cert_file", "tls_key_file", "tls_client_ca_file",
                 "registry_auth_file", "gpu_simulation_file"):  # fmt: skip
        path = getattr(settings, name)
        paths += [path] if path is not None else []
    return [path for path in paths if not path.expanduser().is_absolute()]


def _serving_pid(settings: NodeSettings) -> int | None:
    """The pid of the tuneplane-node serving on the node's port, if one is."""
    from tuneplane_node.daemon.listener import port_holders

    pids = port_holders(settings.node_port)
    if not pids or serving_node(settings) is None:
        return None
    # Under the socket unit systemd (pid 1) holds the port too: the node is the one named.
    named = [pid for pid in pids if b"tuneplane" in _cmdline(pid)]
    return (named or pids)[0]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def check_token(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.daemon.tokens import TokenSet

    try:
        tokens = TokenSet.from_settings(settings)
    except ConfigError as exc:
        return [(FAIL, f"token: {exc.message}")]
    sources = [env_name("node_token")] if settings.node_token else []
    if settings.node_token_file is not None:
        sources.append(f"{env_name('node_token_file')} {settings.node_token_file}")
    scopes = ", ".join(f"{scope} {n}" for scope, n in tokens.scopes().items())
    text = f"token: {len(tokens)} accepted ({scopes}), from {' and '.join(sources)}"
    return [(OK, text)]


def check_tls(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.daemon.server import tls_context

    if settings.tls_cert_file is None:
        return [(WARN, f"tls: off, the API is plain HTTP ({env_name('tls_cert_file')} is unset)")]
    try:
        tls_context(settings)  # the daemon's own loading: chain, key, client CA
    except ConfigError as exc:
        return [(FAIL, f"tls: {exc.message}")]
    text = f"tls: {settings.tls_cert_file} matches its key {settings.tls_key_file}"
    if settings.tls_client_ca_file is not None:
        text += f"; clients need a certificate of {settings.tls_client_ca_file}"
    return [(OK, text)]


def check_registry_auth(settings: NodeSettings) -> list[Finding]:
    """The auth file as the daemon reads it; its registries, never a credential."""
    from tuneplane_node.runtime.dockerauth import AuthFile

    try:
        auth_file = AuthFile.from_settings(settings)
    except ConfigError as exc:
        return [(FAIL, f"registry auth: {exc.message}")]
    if auth_file is None:
        return []  # anonymous pulls, or the launch's own credentials
    return [(OK, f"registry auth: {auth_file.path}: {auth_file.described()}")]


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
    if engine == "podman":
        return settings.podman_url
    if engine == "process":
        return "this host"
    return settings.docker_host or os.environ.get("DOCKER_HOST") or "the default docker socket"


def check_jobs(settings: NodeSettings) -> list[Finding]:
    """What every job gets, and what it still shares with the host or the node."""
    from tuneplane_node.jobs.confinement import JobRules

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
    from tuneplane_node.jobs.network import PORT_NOT_HELD

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
    from tuneplane_node.runtime.engine import EngineRuntime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return []  # the engine step has said so
    try:
        if not isinstance(runtime, EngineRuntime):
            return [(WARN, "jobs: the process runtime applies none of these bounds")]
        found = [*await _remap_finding(runtime), *await _seccomp_findings(runtime)]
        found += await _runtime_findings(runtime, settings)
        return [*found, _init_finding(runtime, settings), *await _parent_finding(runtime)]
    finally:
        await runtime.close()


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
    from tuneplane_node.jobs.isolation import IsolationRules, findings

    support = await runtime.isolation_support()  # an engine that cannot say is a warning
    rules = IsolationRules(settings)
    said = findings(rules, support, engine=runtime.name, local=runtime._local())
    return [({True: OK, None: WARN, False: FAIL}[fine], text) for fine, text in said]


async def _remap_finding(runtime: EngineRuntime) -> list[Finding]:
    from tuneplane_node.errors import EngineUnavailable, NodeError

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
    from tuneplane_node.errors import EngineUnavailable, NodeError
    from tuneplane_node.runtime.cgroupparent import describe_parent

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
    from tuneplane_node.runtime import seccomp
    from tuneplane_node.runtime.podman import PodmanRuntime

    if not isinstance(runtime, PodmanRuntime):
        return []  # docker's default profile refuses user namespaces itself
    derived = None if runtime.remote else await asyncio.to_thread(seccomp.derive_profile)
    if derived is None:
        return [(WARN, "jobs: podman's own seccomp profile: jobs may create user namespaces")]
    profile = runtime.settings.state_dir / seccomp.PROFILE_NAME  # serve writes it, check never
    return [(OK, f"jobs: podman seccomp profile {profile} from {derived[0]} (no user namespaces)")]


def check_gpus(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.gpu.factory import make_probe

    probe = make_probe(settings)
    try:
        snapshot = probe.snapshot()
        found = [_cards_finding(settings, snapshot)]
        if snapshot.ok and snapshot.source != "none":
            found.append(check_affinity(settings, snapshot))
        return [*found, *asyncio.run(_ready_finding(settings, probe))]
    finally:
        probe.close()


def _cards_finding(settings: NodeSettings, snapshot: GpuSnapshot) -> Finding:
    if snapshot.source == "none":
        count = settings.local_gpu_count
        cards = f"{count} card(s) from {env_name('local_gpu_count')}" if count else "no cards"
        return (WARN, f"gpu: no driver ({snapshot.error}); {cards}")
    if not snapshot.ok:
        return (FAIL, f"gpu: {snapshot.source}: {snapshot.error}")
    names = Counter(card.name or "unnamed" for card in snapshot.cards)
    listed = ", ".join(f"{n} x {name}" for name, n in names.items()) or "no cards"
    where = snapshot.source
    if settings.gpu_simulation_file is not None:
        where = f"simulation file {settings.gpu_simulation_file}"
    return (OK, f"gpu: {where}, driver {snapshot.driver or 'unknown'}: {listed}")


def check_affinity(settings: NodeSettings, snapshot: GpuSnapshot) -> Finding:
    """Where a one-card job of each card would run, as a launch would decide it."""
    from tuneplane_node.jobs.affinity import CpuAffinity

    if settings.cpu_affinity == "off":
        return (OK, f"cpu affinity: off ({env_name('cpu_affinity')}): jobs run on every CPU")
    affinity = CpuAffinity(settings)
    placed = {card.index: affinity.place((card.index,), snapshot) for card in snapshot.cards}
    where = "; ".join(f"gpu {index}: {place}" for index, place in placed.items()) or "no cards"
    return (OK, f"cpu affinity: numa: {where}")  # an unknown node says so, and runs anywhere


async def _ready_finding(settings: NodeSettings, probe: GpuProbe) -> list[Finding]:
    """Whether a GPU job can run, as health's ``gpu_ready`` says it (the same reader)."""
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.runtime import detect_runtime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return []  # the engine step has said so
    try:
        readiness = await GpuAllocator(runtime, settings, probe=probe).ready()
    finally:
        await runtime.close()
    if readiness.ready is None:
        return [(OK, "gpu jobs: none here (no cards)")]
    if not readiness.ready:
        return [(FAIL, f"gpu jobs: cannot run: {readiness.reason}")]
    if not settings.local_gpu_passthrough:
        setting = f"{env_name('local_gpu_passthrough')}=false"
        return [(WARN, f"gpu jobs: {setting}: jobs are labelled with cards but see none")]
    return [(OK, f"gpu jobs: ready, {runtime.name} can hand the cards to containers")]


def check_disk(settings: NodeSettings) -> list[Finding]:
    return [asyncio.run(_disk_finding(settings))]


async def _disk_finding(settings: NodeSettings) -> Finding:
    """What bounds a job's disk: project quotas, the monitor, or nothing (a remote store)."""
    from tuneplane_node.runtime import detect_runtime

    limit = f"{env_name('job_disk_limit')}={settings.job_disk_limit}"
    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return WARN, f"job disk: {limit}; the engine does not answer (see engine)"
    try:
        root = await runtime.data_root()
    except NodeError as exc:
        return WARN, f"job disk: {limit}; the engine's store unknown: {exc.message}"
    finally:
        await runtime.close()
    if root is None or root.space is None:
        where = "no store" if root is None else f"{root.path} is not on this machine"
        return WARN, f"job disk: {limit} is held by nothing ({where}): no job is measured"
    every = f"every {settings.job_disk_check_s:g} s"
    if root.project_quotas:
        return OK, f"job disk: {limit}, held by project quotas on {root.path} (monitor {every})"
    return OK, (
        f"job disk: {limit}, held by the disk monitor {every} ({root.path} has no project "
        "quotas: a job may write past its limit until the next pass)"
    )


def check_storage(settings: NodeSettings) -> list[Finding]:
    mounts = inventory.read_mounts()
    # Unset, the storage root is a default under the working directory: absent is no fault.
    explicit = settings.storage_root is not None
    found = [_directory("storage root", settings.storage, mounts, required=explicit)]
    return found + [_directory("model dir", d, mounts, required=True) for d in settings.model_dirs]


def _directory(what: str, path: Path, mounts: list[inventory.Mount], *, required: bool) -> Finding:
    try:
        resolved = path.expanduser().resolve()
        space = inventory.space(resolved) if resolved.is_dir() else None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (3.11)
        return FAIL, f"{what}: {path}: {exc}"
    if space is None:
        return (FAIL if required else WARN), f"{what}: {resolved} is not a directory"
    fs_type = inventory.filesystem_type(resolved, mounts)
    shared = ", shared" if fs_type in inventory.SHARED_FILESYSTEMS else ""
    free = f"{space.available / 2**30:.1f} GiB free"
    return OK, f"{what}: {resolved} on {fs_type or 'an unknown filesystem'}{shared}, {free}"


def check_mount_roots(settings: NodeSettings) -> list[Finding]:
    roots = settings.mount_roots
    missing = [root for root in roots if not root.is_dir()]
    listed = ", ".join(str(root) for root in roots) or "none"
    if not missing:
        return [(OK, f"mount roots: {listed}")]
    # The unset storage root's default is no operator's promise: its absence only warns.
    default = settings.storage_root is None and missing == [DEFAULT_STORAGE.resolve()]
    named = ", ".join(str(root) for root in missing)
    return [(WARN if default else FAIL, f"mount roots: {named} missing; mounts from it fail")]


def check_mounts(settings: NodeSettings) -> list[Finding]:
    """How the engine takes host mounts, as a launch would: the start-up's refusal of a
    root holding the engine's own directories, and whether this process can stage."""
    return asyncio.run(_mount_findings(settings))


async def _mount_findings(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.jobs.mounts import MountPolicy
    from tuneplane_node.runtime.base import DIRECT, REMOTE

    answer = await _engine_answer(settings, lambda runtime: runtime.mount_support())
    if answer is None:
        return []  # the engine step has said why
    engine, support = answer
    policy = MountPolicy(settings.mount_roots, never_a_root=settings.never_a_root)
    problem = policy.root_holding(support.engine_dirs, engine=engine)
    if problem is not None:
        return [(FAIL, f"mounts: {problem}")]
    if support.mode == REMOTE:
        return [
            (WARN, f"mounts: {engine} is on another machine: host mounts are refused"),
            (WARN, f"scratch: {engine} is on another machine: container.scratch is refused"),
        ]
    if support.mode == DIRECT:
        return [
            (WARN, "mounts: the process runtime mounts nothing; jobs see host paths as given"),
            (WARN, "scratch: the process runtime mounts nothing: container.scratch is refused"),
        ]
    return [_staging_finding(settings), _scratch_finding(settings)]


def _scratch_finding(settings: NodeSettings) -> Finding:
    """Whether a launch's scratch can be made here: the tools it runs, and where."""
    from tuneplane_node.jobs.scratch import missing_tools

    missing = missing_tools()
    if missing:
        found = f"{', '.join(missing)} not found"
        return WARN, f"scratch: {found}: launches with container.scratch fail (422)"
    most = f"{env_name('job_scratch_max')}={settings.job_scratch_max}"
    return OK, f"scratch: sparse ext4 files in {settings.scratch_dir}, up to {most} a job"


async def _engine_answer(
    settings: NodeSettings, ask: Callable[[ContainerRuntime], Awaitable[T]]
) -> tuple[str, T] | None:
    """The engine's name and its answer to ``ask``; None when there is no engine or it
    did not answer (the engine step says which)."""
    from tuneplane_node.errors import NodeError
    from tuneplane_node.runtime import detect_runtime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return None
    try:
        return runtime.name, await ask(runtime)
    except NodeError:
        return None
    finally:
        await runtime.close()


def _staging_finding(settings: NodeSettings) -> Finding:
    """Whether this process can stage a mount, tried in a temporary directory: check
    creates nothing of the node's (the privilege is the process's, wherever it mounts)."""
    from tuneplane_node.jobs.staging import MountStaging

    root = MountStaging(settings.state_dir).root
    with tempfile.TemporaryDirectory(prefix=".tuneplane-check-") as scratch:
        try:
            reason = MountStaging(Path(scratch)).probe()
        except OSError as exc:
            reason = f"cannot make a staging directory: {exc.strerror}"
    if reason is not None:
        return (FAIL, f"mounts: {reason}")
    return (OK, f"mounts: opened without links, bound by descriptor under {root}")


def check_state_dir(settings: NodeSettings) -> list[Finding]:
    directory = settings.state_dir
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the daemon creates the rest
    try:
        with tempfile.TemporaryFile(dir=existing):  # the only honest test: write
            pass
    except OSError as exc:
        return [(FAIL, f"state dir: {directory}: cannot write in {existing}: {exc.strerror}")]
    created = "" if existing == directory else " (created at start)"
    return [(OK, f"state dir: {directory} writable{created}")]


def check_fabrics(settings: NodeSettings) -> list[Finding]:
    if not settings.fabrics:
        return [(OK, "fabrics: none configured")]
    try:
        inventory.check_fabrics(settings.fabrics)
    except ConfigError as exc:
        return [(FAIL, f"fabrics: {exc.message}")]
    return [
        (WARN, f"fabric {fact.fabric}: {', '.join(fact.hcas)}: no active port")
        if fact.rate_gbps is None
        else (OK, f"fabric {fact.fabric}: {', '.join(fact.hcas)} at {fact.rate_gbps:g} Gb/s")
        for fact in inventory.fabrics(settings.fabrics)
    ]


def check_fabric_network(settings: NodeSettings, *, net: Path = NET_SYSFS) -> list[Finding]:
    """Where the jobs asking for the host network without the whole machine run, and
    whether the fabric network's interface is here (else their launch is a 502)."""
    fabric = settings.fabric_network
    if fabric is None:
        return []
    where = f"fabric network {fabric.name}: {fabric.network} on {fabric.interface}"
    if not (net / str(fabric.interface)).exists():
        return [(FAIL, f"{where}: no interface {fabric.interface} on this machine ({net})")]
    count = fabric.range.num_addresses if fabric.range is not None else 0
    return [(OK, f"{where}, range {fabric.range} ({count} addresses): jobs asking for host "
                 "that do not get it run there")]  # fmt: skip


def check_rdma(settings: NodeSettings) -> list[Finding]:
    """Whether a job given RDMA devices can have its memlock: the engine's process's own
    hard limit bounds it (`runtime.memlock`)."""
    from tuneplane_node.runtime import memlock

    devices = inventory.rdma_devices(settings.rdma_device_dir) if settings.rdma != "off" else ()
    if not devices:
        why = "off" if settings.rdma == "off" else f"no devices under {settings.rdma_device_dir}"
        return [(OK, f"rdma: {why}")]
    wanted = settings.rdma_memlock_bytes
    engine = settings.local_runtime
    found = memlock.read(settings, "docker" if engine == "auto" else engine)
    if engine == "auto" and not found.known:  # auto: docker, else podman
        engine = "podman"
        found = memlock.read(settings, engine)
    asked = f"{env_name('rdma_memlock')}={settings.rdma_memlock}"
    if not found.known:
        return [(WARN, f"rdma: {len(devices)} devices; the engine's locked-memory limit is "
                       f"unknown ({found.source}): {asked} may be refused")]  # fmt: skip
    refused = found.refusal(wanted)
    if refused is not None:
        return [(FAIL, (
            f"rdma: {len(devices)} devices, and the {engine} engine cannot give "
            f"a job {asked}: {refused}; every card job would be refused (memlock_unavailable): "
            f"set LimitMEMLOCK=infinity in the engine's unit, or {env_name('rdma_memlock')} "
            f"to at most {found.hard}"
        ))]  # fmt: skip
    return [(OK, f"rdma: {len(devices)} devices; {asked} within the engine's hard limit")]


def serving_node(settings: NodeSettings) -> str | None:
    """``pid 1234, port 8470`` when a tuneplane-node answers ``/healthz`` on the node's
    port (a check on a serving node: no fault); None when what holds it is not one."""
    import ssl
    import urllib.request

    from tuneplane_node.daemon.listener import port_holders

    host, port = settings.node_host, settings.node_port
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    scheme = "https" if settings.tls_cert_file else "http"
    context = None
    if scheme == "https":  # who answers, not a secret sent: its certificate is not checked
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    url = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as answer:
            if json.loads(answer.read()) != {"ok": True}:
                return None
    except (OSError, ValueError):
        return None
    pids = ", ".join(str(pid) for pid in port_holders(port)) or "unknown"
    return f"pid {pids}, port {port}"


def check_port(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.daemon.listener import CannotListen, bind, describe

    host, port = settings.node_host, settings.node_port
    try:
        sockets = bind(host, port, backlog=1)  # as serve binds: both families for 0.0.0.0
    except CannotListen as exc:
        serving = serving_node(settings)
        if serving is not None:
            return [(OK, f"port: {exc.address}: served by a running tuneplane-node ({serving})")]
        return [(FAIL, f"port: {exc.address}: {exc.reason} (a node already serving?)")]
    named = " and ".join(describe(sock) for sock in sockets)
    for sock in sockets:
        sock.close()
    return [(OK, f"port: {named} free")]
