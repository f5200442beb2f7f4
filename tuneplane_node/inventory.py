"""What this machine has, for ``GET /node/v1/inventory`` and ``tuneplane-node inventory``.

Collecting the inventory never raises: each part is guarded, and a fact the machine
cannot answer stays empty (None, [] or {}), which the console reads as unknown, never as
0 or "none". Storage is reported per filesystem, not per directory, so space reached
through two directories is counted once, and space on a filer (which every node mounting
it shares) is kept out of ``local_disk``.

Everything here does blocking file-system I/O (a hung filer can stall ``os.stat``):
the daemon calls ``collect`` in its thread pool, never on the event loop.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tuneplane_node import __version__
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import Fabric, NodeSettings, env_name

if TYPE_CHECKING:
    from tuneplane_node.gpu.probe import GpuSnapshot

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")

IB_SYSFS = Path("/sys/class/infiniband")
MOUNTINFO = Path("/proc/self/mountinfo")
MEMINFO = Path("/proc/meminfo")
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
    """Write a new id beside ``path``, then hard-link it in place, fsynced.

    A link, not a rename: it fails if the name exists, so two processes starting at
    once agree on the first one's id instead of each keeping its own.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    new_id = f"{uuid.uuid4()}\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{NODE_ID_FILE}.")
    try:
        with os.fdopen(fd, "w", encoding="ascii") as file:
            os.fchmod(file.fileno(), 0o644)
            file.write(new_id)
            file.flush()
            os.fsync(file.fileno())
        os.link(tmp, path)
    except FileExistsError:
        return path.read_text(encoding="ascii")
    finally:
        os.unlink(tmp)
    _fsync_dir(path.parent)
    return new_id


def _fsync_dir(directory: Path) -> None:
    """Make the new name survive a power cut (else the next boot mints another id)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- storage ---------------------------------------------------------------------------


def storage_entries(
    paths: Sequence[Path], *, mountinfo: Path = MOUNTINFO
) -> list[dict[str, object]]:
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


def _storage_entry(paths: Sequence[Path], mounts: Sequence[Mount]) -> dict[str, object] | None:
    try:
        space = os.statvfs(paths[0])
    except OSError as exc:  # gone (or stale) since it was stat'ed
        log.warning("storage: cannot measure %s; skipped: %s", paths[0], exc)
        return None
    fs_type = filesystem_type(paths[0], mounts)
    return {
        "paths": [str(path) for path in paths],
        "fs_type": fs_type,
        # An unknown type counts as local: /proc/self/mountinfo is readable on any Linux.
        "shared": fs_type in SHARED_FILESYSTEMS,
        "free_bytes": space.f_bavail * space.f_frsize,
        "total_bytes": space.f_blocks * space.f_frsize,
    }


def local_disk(entries: Sequence[Mapping[str, object]]) -> dict[str, int] | None:
    """Free and total bytes summed over the non-shared filesystems; None if there are none.

    Space on a filer belongs to every node mounting it, so it is not this node's disk.
    """
    local = [entry for entry in entries if entry.get("shared") is False]
    if not local:
        return None
    return {
        "free_bytes": sum(_as_int(entry["free_bytes"]) for entry in local),
        "total_bytes": sum(_as_int(entry["total_bytes"]) for entry in local),
    }


def _as_int(value: object) -> int:
    if not isinstance(value, int):
        raise TypeError(f"expected a byte count, got {value!r}")
    return value


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


def disk_free(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``path``."""
    try:
        space = os.statvfs(path)
    except FileNotFoundError:
        return None
    return space.f_bavail * space.f_frsize


# --- fabrics ---------------------------------------------------------------------------


def fabrics(configured: Sequence[Fabric], *, sysfs: Path = IB_SYSFS) -> list[dict[str, object]]:
    """Each operator-named fabric with its HCAs and the slowest active port's rate in Gb/s.

    The slowest port bounds what a job spanning the fabric gets; no active port gives
    None. HCAs not named in the settings are not reported.
    """
    return [
        {
            "fabric": fabric.name,
            "hcas": list(fabric.hcas),
            "rate_gbps": min(
                (rate for hca in fabric.hcas for rate in active_rates(sysfs, hca)), default=None
            ),
        }
        for fabric in configured
    ]


def active_rates(sysfs: Path, hca: str) -> list[float]:
    """Rates in Gb/s of the HCA's ACTIVE ports; a missing HCA or unreadable port adds none."""
    directory = _hca_dir(sysfs, hca)
    if directory is None:
        return []
    rates = []
    for port in sorted((directory / "ports").glob("*")):
        state = _read(port / "state") or ""  # "4: ACTIVE"
        rate = _parse_rate(_read(port / "rate"))  # "200 Gb/sec (4X HDR)"
        if state.rsplit(":", 1)[-1].strip() == "ACTIVE" and rate is not None:
            rates.append(rate)
    return rates


def check_fabrics(configured: Sequence[Fabric], *, sysfs: Path = IB_SYSFS) -> None:
    """Refuse to start on a configured HCA this machine does not have (a typo, or a
    card gone), rather than report a fabric the node is not on. Raises ConfigError."""
    missing = [
        f"{hca} (fabric {fabric.name})"
        for fabric in configured
        for hca in fabric.hcas
        if (directory := _hca_dir(sysfs, hca)) is None or not directory.is_dir()
    ]
    if missing:
        present = sorted(entry.name for entry in sysfs.glob("*"))
        found = ", ".join(present) if present else "no HCA at all"
        raise ConfigError(
            f"{env_name('fabrics')}: HCA not found in {sysfs}: {', '.join(missing)}; "
            f"this machine has {found}"
        )


def _hca_dir(sysfs: Path, hca: str) -> Path | None:
    """The HCA's sysfs directory; None for a name that is not a plain file name."""
    if hca in ("", ".", "..") or "/" in hca:
        return None
    return sysfs / hca


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, ValueError):
        return None


def _parse_rate(text: str | None) -> float | None:
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None


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
    text = _read(meminfo) or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "MemTotal" and value.split():
            return int(value.split()[0]) * 1024
    return None


# --- GPUs ------------------------------------------------------------------------------


def accelerator_name(gpus: GpuSnapshot | None) -> str | None:
    """The driver's card name; on a mixed machine, the most common (first seen on a tie)."""
    names = [card.name for card in gpus.cards if card.name] if gpus is not None else []
    return Counter(names).most_common(1)[0][0] if names else None


def card_count(gpus: GpuSnapshot | None, allocated: int | None) -> int | None:
    """The allocator's count wins; else the driver's, if the driver answered."""
    if allocated is not None:
        return allocated
    return len(gpus.cards) if gpus is not None and gpus.ok else None


def card_facts(gpus: GpuSnapshot | None) -> list[dict[str, object]]:
    """Each card's facts as the probe reports them; [] (unknown) without a snapshot."""
    return [] if gpus is None else [card.to_json() for card in gpus.cards]


# --- the whole -------------------------------------------------------------------------


def collect(
    settings: NodeSettings,
    *,
    gpus: GpuSnapshot | None,
    accelerator_count: int | None,
    runtime: str | None,
    sysfs: Path = IB_SYSFS,
    mountinfo: Path = MOUNTINFO,
    meminfo: Path = MEMINFO,
) -> dict[str, object]:
    """The inventory as JSON-ready data. Never raises: a part that fails is logged and
    left unknown, so one bad filer or driver does not hide everything else."""
    root = _guarded("storage_root", settings.storage.resolve, settings.storage)
    paths = [root, *settings.model_dirs]
    storage = _guarded("storage", lambda: storage_entries(paths, mountinfo=mountinfo), [])
    return {
        **_console_fields(
            settings,
            gpus=gpus,
            allocated=accelerator_count,
            runtime=runtime,
            root=root,
            meminfo=meminfo,
        ),
        "node_id": _guarded("node_id", lambda: node_id(settings.state_dir), None),
        "hostname": _guarded("hostname", socket.gethostname, None),
        "agent_version": __version__,
        "cuda_version": _guarded("cuda_version", lambda: None if gpus is None else gpus.cuda, None),
        "gpus": _guarded("gpus", lambda: card_facts(gpus), []),
        "storage": storage,
        "local_disk": _guarded("local_disk", lambda: local_disk(storage), None),
        "fabrics": _guarded("fabrics", lambda: fabrics(settings.fabrics, sysfs=sysfs), []),
    }


def _console_fields(
    settings: NodeSettings,
    *,
    gpus: GpuSnapshot | None,
    allocated: int | None,
    runtime: str | None,
    root: Path,
    meminfo: Path,
) -> dict[str, object]:
    """The fields consoles already read; their names and meanings are fixed."""
    return {
        "accelerator_series": settings.cluster_profile.lower() or None,
        "accelerator_name": _guarded("accelerator_name", lambda: accelerator_name(gpus), None),
        "accelerator_count": _guarded(
            "accelerator_count", lambda: card_count(gpus, allocated), None
        ),
        "driver": _guarded("driver", lambda: None if gpus is None else gpus.driver, None),
        "runtime": runtime,
        "storage_root_visible": _guarded("storage_root_visible", root.is_dir, None),
        "disk_free_bytes": _guarded("disk_free_bytes", lambda: disk_free(root), None),
        "cpu_count": _guarded("cpu_count", cpu_count, None),
        "memory_bytes": _guarded("memory_bytes", lambda: memory_total(meminfo), None),
    }


def _guarded(field: str, part: Callable[[], T], unknown: U) -> T | U:
    """Run one part of the inventory; on any failure log it and answer ``unknown``."""
    try:
        return part()
    except Exception:
        log.warning("inventory: %s unknown", field, exc_info=True)
        return unknown
