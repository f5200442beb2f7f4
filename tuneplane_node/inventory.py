"""What this machine has (its disks, fabrics, memory, CPUs and identity), for
``GET /node/v1/inventory``, ``tuneplane-node inventory`` and health's ``disk``.

The cards are the GPU probe's to tell and the engine the runtime's: the job service
puts the three together, and the daemon gives the whole the JSON shape `wire` declares.

Collecting the inventory never raises: each part is guarded, and a fact the machine
cannot answer stays empty (None, [] or {}), which the console reads as unknown, never as
0 or "none". Storage is reported per filesystem, not per directory, so space reached
through two directories is counted once, and space on a filer (which every node mounting
it shares) is kept out of ``local_disk``.

Everything here does blocking file-system I/O (a hung filer can stall ``os.stat``):
the daemon calls ``collect`` in its thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tuneplane_node import __version__
from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.durable import create_once
from tuneplane_node.fabrics import IB_SYSFS, FabricFacts, fabrics, rdma_devices, read_ascii
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")

MOUNTINFO = Path("/proc/self/mountinfo")
MEMINFO = Path("/proc/meminfo")
LOADAVG = Path("/proc/loadavg")
PID_MAX = Path("/proc/sys/kernel/pid_max")
MEMORY_AVAILABLE_LOW = 100 * 2**20
"""memory_pressure below this much MemAvailable: kubelet's default (memory.available<100Mi)."""
PIDS_AVAILABLE_LOW = 0.10
"""pid_pressure below this share of pid_max left (threads count: each takes a PID)."""
NODE_ID_FILE = "node-id"

# Network and cluster filesystems: their space belongs to every node that mounts them.
SHARED_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "afs",
        "lustre", "gpfs", "beegfs", "wekafs", "panfs", "orangefs",
        "ceph", "cephfs", "fuse.ceph-fuse", "glusterfs", "fuse.glusterfs",
        "ocfs2", "gfs2", "fuse.juicefs", "fuse.sshfs", "fuse.s3fs", "fuse.rclone",
    }
)  # fmt: skip

Mount = tuple[Path, str]  # (mount point, filesystem type)


@dataclass(frozen=True)
class Space:
    """A filesystem's size in bytes: ``free`` as root sees it, ``available`` to others."""

    total: int
    free: int
    available: int
    inodes: int | None = None  # f_files; None: the filesystem has no fixed count (btrfs)
    inodes_available: int | None = None  # f_favail: to others than root


@dataclass(frozen=True)
class Filesystem:
    """One filesystem holding the storage root or a model dir."""

    paths: tuple[str, ...]
    fs_type: str | None
    shared: bool  # a network or cluster filesystem: its space is every node's
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class LocalDisk:
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class MachineFacts:
    """Everything `collect` learnt; None or empty means unknown, never zero."""

    series: str | None
    storage_root_visible: bool | None
    disk_free_bytes: int | None
    cpu_count: int | None
    memory_bytes: int | None
    node_id: str | None
    hostname: str | None
    agent_version: str
    storage: tuple[Filesystem, ...]
    local_disk: LocalDisk | None
    fabrics: tuple[FabricFacts, ...]


def same_filesystem(path: Path, other: Path) -> bool | None:
    """Whether ``path`` (or, not made yet, its nearest existing parent) lies on the
    filesystem of ``other``; None when either cannot be read."""
    try:
        device = os.stat(other).st_dev
    except OSError:
        return None
    for where in (path, *path.parents):
        try:
            return os.stat(where).st_dev == device
        except FileNotFoundError:
            continue
        except OSError:
            return None
    return None


def space(path: Path) -> Space | None:
    """The size of the filesystem holding ``path``; None when the path does not exist.

    The one statvfs reader: every figure the node reports about a disk comes from it.
    """
    try:
        stat = os.statvfs(path)
    except FileNotFoundError:
        return None
    return Space(
        total=stat.f_blocks * stat.f_frsize,
        free=stat.f_bfree * stat.f_frsize,
        available=stat.f_bavail * stat.f_frsize,
        inodes=stat.f_files or None,
        inodes_available=stat.f_favail if stat.f_files else None,
    )


@dataclass(frozen=True)
class DiskReading:
    path: str
    space: Space


class DiskGauge:
    """The storage root's filesystem, for health, measured at most once per ``ttl`` s.

    statvfs runs on a worker thread (a hung filer must not stall the loop). Health never
    waits for it but the first time: a reading older than ``ttl`` is answered as it is
    while one refresh runs behind it, so a burst of health calls costs one thread hop,
    not one each.
    """

    def __init__(self, path: Path, *, ttl: float = 1.0, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.ttl = ttl
        self.clock = clock
        self._value: DiskReading | None = None
        self._read_at = -math.inf
        self._refresh: asyncio.Task[None] | None = None
        self._tasks = BackgroundTasks(log)

    async def read(self) -> DiskReading | None:
        if self.clock.monotonic() - self._read_at > self.ttl and self._refresh is None:
            self._refresh = self._tasks.spawn(self._measure_now(), name="disk measure")
        if self._read_at == -math.inf and self._refresh is not None:
            await asyncio.shield(self._refresh)  # never measured: nothing to answer yet
        return self._value

    async def _measure_now(self) -> None:
        try:
            self._value = await asyncio.to_thread(self._measure)
            self._read_at = self.clock.monotonic()
        finally:
            self._refresh = None

    async def close(self) -> None:
        """Cancel a refresh in flight (shutdown); its thread's statvfs ends on its own."""
        await self._tasks.close()

    def _measure(self) -> DiskReading | None:
        try:
            measured = space(self.path)
        except OSError as exc:
            log.warning("storage root %s: cannot measure: %s", self.path, exc)
            return None
        return None if measured is None else DiskReading(str(self.path.resolve()), measured)


# --- node identity ---------------------------------------------------------------------


def node_id(state_dir: Path) -> str | None:
    """This node's UUID, minted once in ``<state_dir>/node-id`` and the same after restarts.

    None (logged) when the file cannot be read or written, or holds no UUID: a damaged
    file is left for the operator, since a new id would look like a new node.
    """
    path = state_dir / NODE_ID_FILE
    try:
        return str(uuid.UUID(_read_or_create(path).strip()))
    except (OSError, ValueError) as exc:
        log.warning("no node id: %s: %s", path, exc)
        return None


def _read_or_create(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except FileNotFoundError:
        return _create_node_id(path)


def _create_node_id(path: Path) -> str:
    """A new id in place, fsynced; unless another process made one first: then its id
    (`durable.create_once`), so two processes starting at once agree on one."""
    new_id = f"{uuid.uuid4()}\n".encode("ascii")
    return create_once(path, new_id, mode=0o644).decode("ascii")


# --- storage ---------------------------------------------------------------------------


def storage_entries(paths: Sequence[Path], *, mountinfo: Path = MOUNTINFO) -> list[Filesystem]:
    """One entry per filesystem holding any of ``paths``, in the order first seen.

    Directories are grouped by device, so two on one disk count once. A missing
    directory (say, an unmounted filer) is skipped, never reported as a full disk.
    """
    mounts = read_mounts(mountinfo)
    entries = []
    for group in _by_device(paths).values():
        entry = _storage_entry(group, mounts)
        if entry is not None:
            entries.append(entry)
    return entries


def _by_device(paths: Iterable[Path]) -> dict[int, list[Path]]:
    groups: dict[int, list[Path]] = {}
    for path in paths:
        try:
            resolved = path.resolve()
            device = os.stat(resolved).st_dev
        except FileNotFoundError:
            log.debug("storage: %s does not exist; skipped", path)
            continue
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (3.11)
            log.warning("storage: cannot read %s; skipped: %s", path, exc)
            continue
        group = groups.setdefault(device, [])
        if resolved not in group:
            group.append(resolved)
    return groups


def _storage_entry(paths: Sequence[Path], mounts: Sequence[Mount]) -> Filesystem | None:
    try:
        measured = space(paths[0])
    except OSError as exc:  # stale since it was stat'ed
        measured, problem = None, str(exc)
    else:
        problem = "gone since it was found"
    if measured is None:
        log.warning("storage: cannot measure %s; skipped: %s", paths[0], problem)
        return None
    fs_type = filesystem_type(paths[0], mounts)
    return Filesystem(
        paths=tuple(str(path) for path in paths),
        fs_type=fs_type,
        # An unknown type counts as local: /proc/self/mountinfo is readable on any Linux.
        shared=fs_type in SHARED_FILESYSTEMS,
        free_bytes=measured.available,
        total_bytes=measured.total,
    )


def local_disk(entries: Sequence[Filesystem]) -> LocalDisk | None:
    """Free and total bytes summed over the non-shared filesystems; None if there are none.

    Space on a filer belongs to every node mounting it, so it is not this node's disk.
    """
    local = [entry for entry in entries if not entry.shared]
    if not local:
        return None
    return LocalDisk(
        free_bytes=sum(entry.free_bytes for entry in local),
        total_bytes=sum(entry.total_bytes for entry in local),
    )


def read_mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    """(mount point, filesystem type) for each line of a mountinfo file; [] if unreadable."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError as exc:
        log.warning("cannot read %s; filesystem types unknown: %s", mountinfo, exc)
        return []
    return [mount for line in text.splitlines() if (mount := _parse_mount(line)) is not None]


def _parse_mount(line: str) -> Mount | None:
    """``id parent maj:min root point options [optional...] - fstype source superoptions``."""
    fields = line.split()
    try:
        separator = fields.index("-", 6)
    except ValueError:
        return None
    if separator + 1 >= len(fields):
        return None
    return Path(_unescape(fields[4])), fields[separator + 1]


def _unescape(field: str) -> str:
    """The kernel writes space, tab, newline and backslash as octal: ``\\040`` and so on."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def filesystem_type(path: Path, mounts: Sequence[Mount]) -> str | None:
    """Type of the mount holding ``path`` (absolute, resolved): the longest mount point
    that contains it; of mounts stacked on one point, the last (the one on top)."""
    best: Mount | None = None
    for point, fs_type in mounts:
        if path.is_relative_to(point) and (best is None or len(point.parts) >= len(best[0].parts)):
            best = (point, fs_type)
    return best[1] if best is not None else None


# --- host ------------------------------------------------------------------------------


def cpu_count() -> int | None:
    """CPUs this process may run on."""
    # sched_getaffinity, not os.cpu_count(): under a cpuset (a container, taskset,
    # systemd CPUAffinity=) the node was handed fewer CPUs than the host has.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def memory_total(meminfo: Path = MEMINFO) -> int | None:
    """MemTotal in bytes (the kernel's "kB" is KiB); None if unreadable."""
    text = read_ascii(meminfo) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal" and value.split():
            return int(value.split()[0]) * 1024
    return None


def memory_pressure(meminfo: Path = MEMINFO) -> bool | None:
    """Whether MemAvailable is below `MEMORY_AVAILABLE_LOW`; None if unreadable."""
    for line in (read_ascii(meminfo) or "").splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable" and value.split() and value.split()[0].isdigit():
            return int(value.split()[0]) * 1024 < MEMORY_AVAILABLE_LOW
    return None


def pid_pressure(loadavg: Path = LOADAVG, pid_max: Path = PID_MAX) -> bool | None:
    """Whether less than `PIDS_AVAILABLE_LOW` of pid_max is left: the kernel's count
    of tasks (every thread holds a PID) is loadavg's fourth field, after its slash."""
    fields = (read_ascii(loadavg) or "").split()
    tasks = fields[3].partition("/")[2] if len(fields) > 3 else ""
    most = (read_ascii(pid_max) or "").strip()
    if not (tasks.isdigit() and most.isdigit() and int(most) > 0):
        return None
    return (int(most) - int(tasks)) / int(most) < PIDS_AVAILABLE_LOW


def superoptions(path: Path, mountinfo: Path = MOUNTINFO) -> str | None:
    """The filesystem options (``rw,prjquota``) of the mount holding ``path``; None if
    unknown. Of mounts stacked on one point, the last (the one on top)."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None
    best: tuple[Path, str] | None = None
    for fields in (line.split() for line in text.splitlines()):
        if "-" not in fields[6:] or len(fields) < fields.index("-", 6) + 4:
            continue
        point, options = Path(_unescape(fields[4])), fields[fields.index("-", 6) + 3]
        if path.is_relative_to(point) and (best is None or len(point.parts) >= len(best[0].parts)):
            best = (point, options)
    return best[1] if best is not None else None


# --- the whole -------------------------------------------------------------------------


def collect(
    settings: NodeSettings,
    *,
    sysfs: Path = IB_SYSFS,
    mountinfo: Path = MOUNTINFO,
    meminfo: Path = MEMINFO,
) -> MachineFacts:
    """The machine's facts. Never raises: a part that fails is logged and left unknown,
    so one bad filer does not hide everything else."""
    root = _guarded("storage_root", settings.storage.resolve, settings.storage)
    paths = [root, *settings.model_dirs]
    storage = tuple(_guarded("storage", lambda: storage_entries(paths, mountinfo=mountinfo), []))
    free = _guarded("disk_free_bytes", lambda: space(root), None)
    return MachineFacts(
        series=settings.cluster_profile.lower() or None,
        storage_root_visible=_guarded("storage_root_visible", root.is_dir, None),
        disk_free_bytes=free.available if free is not None else None,
        cpu_count=_guarded("cpu_count", cpu_count, None),
        memory_bytes=_guarded("memory_bytes", lambda: memory_total(meminfo), None),
        node_id=_guarded("node_id", lambda: node_id(settings.state_dir), None),
        hostname=_guarded("hostname", socket.gethostname, None),
        agent_version=__version__,
        storage=storage,
        local_disk=_guarded("local_disk", lambda: local_disk(storage), None),
        fabrics=tuple(_guarded("fabrics", lambda: _fabrics(settings, sysfs), [])),
    )


def _fabrics(settings: NodeSettings, sysfs: Path) -> list[FabricFacts]:
    handed = settings.rdma != "off" and bool(rdma_devices(settings.rdma_device_dir))
    return fabrics(settings.fabrics, sysfs=sysfs, rdma_to_jobs=handed)


def _guarded(field: str, part: Callable[[], T], unknown: U) -> T | U:
    """Run one part of the inventory; on any failure log it and answer ``unknown``."""
    try:
        return part()
    except Exception:
        log.warning("inventory: %s unknown", field, exc_info=True)
        return unknown
