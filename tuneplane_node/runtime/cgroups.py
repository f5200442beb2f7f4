"""A container's CPU time, memory and pids from the kernel's own cgroup files.

Located from one process of the container (``/proc/<pid>/cgroup``), under cgroup v2
(one unified tree: ``cpu.stat``, ``memory.current``, ``memory.max``, ``pids.current``) or
v1 (a tree per controller: ``cpuacct.usage``, ``memory.usage_in_bytes``,
``memory.limit_in_bytes``, ``pids.current``). A few small file reads per container,
where the engine's stats endpoint samples for a second or more per call. Nothing here
asks an engine.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from tuneplane_node.errors import ConfigError
from tuneplane_node.fabrics import read_ascii
from tuneplane_node.runtime.facts import Usage
from tuneplane_node.settings import NodeSettings, env_name

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_ROOT = Path("/proc")
PID_MAX = Path("/proc/sys/kernel/pid_max")
LEAST_PIDS = 64
"""Fewer PIDs than this left to all jobs by the host's reserve is a refused setting."""
V1_UNLIMITED = 2**62
"""v1 says "no limit" with LONG_MAX rounded down to a page: anything this big is none."""
V1_CONTROLLERS = ("cpuacct", "memory", "pids")


@dataclass(frozen=True)
class CgroupDirs:
    """Where one container's figures are: the unified directory (v2), or one per
    controller (v1; a controller the kernel does not mount is None)."""

    unified: bool
    cpu: Path | None
    memory: Path | None
    pids: Path | None


def locate(
    pid: int, *, must_hold: str, root: Path = CGROUP_ROOT, proc: Path = PROC_ROOT
) -> CgroupDirs | None:
    """The cgroup directories of ``pid``; None when they cannot be read here.

    ``must_hold`` is the container's id: a path without it is not that container's
    cgroup (the pid is another machine's, behind a remote engine, or was reused).
    """
    try:
        text = (proc / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    paths = _paths(text)
    unified = (root / "cgroup.controllers").exists()  # v2 only; a hybrid host counts as v1
    dirs = _v2(paths, root) if unified else _v1(paths, root)
    if dirs is None or not _holds(dirs, must_hold):
        return None
    return dirs


def _paths(text: str) -> dict[str, str]:
    """``controller -> path`` from /proc/<pid>/cgroup; the v2 entry is ``""``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(","):
            paths[controller] = parts[2]
    return paths


def _v2(paths: dict[str, str], root: Path) -> CgroupDirs | None:
    if "" not in paths:
        return None
    where = root / paths[""].lstrip("/")
    return CgroupDirs(unified=True, cpu=where, memory=where, pids=where)


def _v1(paths: dict[str, str], root: Path) -> CgroupDirs | None:
    found = {c: root / c / paths[c].lstrip("/") for c in V1_CONTROLLERS if c in paths}
    if "cpuacct" not in found and "memory" not in found:
        return None
    return CgroupDirs(
        unified=False,
        cpu=found.get("cpuacct"),
        memory=found.get("memory"),
        pids=found.get("pids"),
    )


def _holds(dirs: CgroupDirs, container_id: str) -> bool:
    where = [path for path in (dirs.cpu, dirs.memory, dirs.pids) if path is not None]
    return bool(where) and all(container_id in str(path) for path in where)


@dataclass(frozen=True)
class _Files:
    """Where a cgroup version keeps each figure, and the CPU counter's unit per second."""

    cpu: str
    cpu_key: str | None  # the line of a keyed file; None: the whole file is the number
    cpu_per_second: float
    charged: str
    inactive: str  # the key in memory.stat
    limit: str


V2 = _Files("cpu.stat", "usage_usec", 1e6, "memory.current", "inactive_file", "memory.max")
V1 = _Files(
    "cpuacct.usage", None, 1e9, "memory.usage_in_bytes", "total_inactive_file",
    "memory.limit_in_bytes",
)  # fmt: skip


def read(dirs: CgroupDirs) -> Usage | None:
    """The figures now; None when the cgroup is gone (the container has ended)."""
    files = V2 if dirs.unified else V1
    if files.cpu_key is None:
        cpu = _number(dirs.cpu, files.cpu)
    else:
        cpu = _keyed(dirs.cpu, files.cpu, files.cpu_key)
    charged = _number(dirs.memory, files.charged)
    if cpu is None and charged is None:
        return None
    limit = _number(dirs.memory, files.limit)  # v2's "max" reads as no number: none
    return Usage(
        cpu_seconds=cpu / files.cpu_per_second if cpu is not None else None,
        memory_bytes=_working_set(charged, _keyed(dirs.memory, "memory.stat", files.inactive)),
        memory_limit_bytes=None if limit is None or limit >= V1_UNLIMITED else limit,
        pids=_number(dirs.pids, "pids.current"),
    )


def _working_set(charged: int | None, inactive: int | None) -> int | None:
    """What `docker stats` and the kubelet show: the page cache the kernel can drop at
    once is not the job's memory."""
    if charged is None:
        return None
    return max(0, charged - (inactive or 0))


def _text(directory: Path | None, name: str) -> str | None:
    # a str path: no Path object made per file (1,500 files a sample of 300 jobs)
    return read_ascii(f"{directory}/{name}") if directory is not None else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _number(directory: Path | None, name: str) -> int | None:
    return _int(_text(directory, name))


def _keyed(directory: Path | None, name: str, key: str) -> int | None:
    """``key``'s number in a flat-keyed file (``key value`` lines); None if not one."""
    for line in (_text(directory, name) or "").splitlines():
        found, _, value = line.partition(" ")
        if found == key:
            return _int(value.strip()) if value.strip().isdigit() else None
    return None


# --- which container a process belongs to ---------------------------------------------

# A 64-hex id as a whole path component (/docker/<id>, /kubepods/.../<id>) or a systemd
# scope (docker-<id>.scope, libpod-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope).
_CONTAINER_ID = re.compile(
    r"(?:^|/)(?:docker-|libpod-|cri-containerd-|crio-)?([0-9a-f]{64})(?:\.scope)?(?=/|$)"
)


def container_id_of_pid(pid: int, *, proc_root: Path = PROC_ROOT) -> str | None:
    """The id of the container holding ``pid``, from its cgroup; None if none or unknown.

    The outermost id wins: for a container nested in a container, the host's engine
    knows the outer one.
    """
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _CONTAINER_ID.search(path)
        if match:
            return match.group(1)
    return None


# --- the bounds of all jobs together (their parent cgroup's) ---------------------------


@dataclass(frozen=True)
class Bounds:
    """PIDs and memory of the parent; None: no bound (or, wanted, unknown)."""

    pids: int | None
    memory_bytes: int | None

    def within(self, wanted: Bounds) -> bool:
        """Whether every bound wanted is held, at that figure or below."""
        pairs = ((self.pids, wanted.pids), (self.memory_bytes, wanted.memory_bytes))
        return all(want is None or (held is not None and held <= want) for held, want in pairs)

    def described(self) -> str:
        pids = "unbounded" if self.pids is None else str(self.pids)
        memory = "unbounded"
        if self.memory_bytes is not None:
            memory = f"{self.memory_bytes / 2**30:.1f} GiB ({self.memory_bytes} bytes)"
        return f"pids {pids}, memory {memory}"


def pid_max(path: Path = PID_MAX) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def wanted(settings: NodeSettings, *, pids: int | None, machine_bytes: int | None) -> Bounds:
    """What the node may give all jobs together: ``pids`` (the kernel's pid_max) and
    the machine's memory, each less its reserve. ConfigError when a reserve leaves jobs
    next to nothing."""
    left = None if pids is None else pids - settings.reserved_pids(pids)
    if left is not None and left < LEAST_PIDS:
        raise ConfigError(
            f"{env_name('system_reserved_pids')}: reserving {settings.reserved_pids(pids or 0)} "
            f"of pid_max {pids} leaves all jobs {max(left, 0)} PIDs"
        )
    memory = None
    if machine_bytes is not None:
        memory = machine_bytes - settings.reserved_memory(machine_bytes)
    return Bounds(pids=left, memory_bytes=memory if memory is None or memory > 0 else None)
