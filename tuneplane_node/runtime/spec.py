"""A job container as the node asks an engine for it: its name, its confinement, its spec
and what its labels are written from (`runtime.labels`).

Plain data, read by every runtime's `ContainerRuntime.run`; what a runtime says back of
a container is `runtime.base.ContainerState`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import NamedTuple

from tuneplane_node.wire.values import (
    Mount,
    Scratch,
    Volume,
)

DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
"""Which cards the NVIDIA container runtime shows a container: the node alone sets it."""
RDMA_DIR = "/dev/infiniband"  # where a job finds its RDMA devices, wherever the host's are
RDMA_CAPABILITY = "IPC_LOCK"
UNLIMITED = 2**64 - 1  # RLIM_INFINITY

NAME_PREFIX = "tuneplane-"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")
_MAX_NAME = 120


def container_name(run_id: str) -> str:
    """``tuneplane-<safe id>``; ids that had to be changed get a hash so two never collide."""
    safe = _UNSAFE.sub("-", run_id)
    if safe == run_id and len(safe) <= _MAX_NAME:
        return NAME_PREFIX + safe
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{NAME_PREFIX}{safe[:_MAX_NAME]}-{digest}"


def format_gpus(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(set(gpus)))


def format_cpulist(numbers: Iterable[int]) -> str:
    """Sorted numbers in the kernel's list format, runs joined: ``0-3,8``."""
    runs: list[list[int]] = []
    for number in sorted(set(numbers)):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


class Tmpfs(NamedTuple):
    """A tmpfs a job writes in, of at most ``size_bytes`` (its pages are charged to the
    job's memory cgroup, as any page cache of the job's)."""

    path: str
    size_bytes: int

    def options(self) -> str:
        """The mount options both engines take: writable, programs may run from it (a
        compiler's cache does), no setuid or devices, a sticky /tmp as on any host."""
        return f"rw,exec,nosuid,nodev,size={self.size_bytes},mode=1777"


LINUX_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
    "SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN",
    "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE",
    "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME",
    "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ",
    "PERFMON", "BPF", "CHECKPOINT_RESTORE",
)  # fmt: skip
"""Every capability of Linux 5.9 and later, in the kernel's order (bits 0 to 40)."""
KEPT_CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "SYS_CHROOT",
)  # fmt: skip
"""What a job keeps by default: the engines' default set less NET_RAW (a sniffer),
NET_BIND_SERVICE (a privileged host port), MKNOD, AUDIT_WRITE and SETFCAP; what package
managers in a training image need stays."""


@dataclass(frozen=True)
class Confinement:
    """What the node imposes on every job, whatever the console asked: the operator's
    settings decide it (`jobs.rules.confinement`), the console never can. Every runtime starts
    from no capability at all and adds ``capabilities``, so an engine configured with a
    wider default set hands a job nothing more. The defaults are the node's own."""

    capabilities: tuple[str, ...] = KEPT_CAPABILITIES
    no_new_privileges: bool = True
    pids_limit: int = 16384
    log_max_bytes: int = 10 * 2**20
    log_max_files: int = 5
    oom_score_adj: int = 500
    init: bool = True  # the engine's init as PID 1: signals reach the command, zombies reaped

    @property
    def dropped(self) -> tuple[str, ...]:
        """Every capability but those kept."""
        return tuple(cap for cap in LINUX_CAPABILITIES if cap not in self.capabilities)

    @property
    def log_budget(self) -> int:
        """The most bytes of log one job keeps on the engine's disk."""
        return self.log_max_bytes * self.log_max_files


FABRIC = "fabric"
"""A spec's network for the node's fabric network (``TUNEPLANE_FABRICS``); its address is
its `LABEL_FABRIC_ADDRESS`."""


@dataclass(frozen=True)
class ContainerSpec:
    """One job container. ``command`` is the entry argv: it replaces the image ENTRYPOINT.

    ``gpus`` are the cards the node chose; every runtime writes them in the
    ``tuneplane.gpus`` label itself (`runtime.labels.job_labels`), so the label never disagrees with
    the devices.
    """

    name: str
    image: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    mounts: tuple[Mount, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    shm_size: str | None = None
    cpu_limit: float | None = None
    memory_limit: str | None = None
    network: str = "host"
    user: str | None = None
    stop_signal: str | None = None  # None: the image's STOPSIGNAL, else SIGTERM
    # The console's word for the node's own stops (labels LABEL_WARN_*); None: the operator's.
    warn_signal: str | None = None
    warn_s: float | None = None
    rdma: bool | None = None  # the console's word: None for the node's rule (TUNEPLANE_RDMA)
    # The node's decision: the host's RDMA devices, each handed in at RDMA_DIR/<name>,
    # with memlock unlimited and RDMA_CAPABILITY (verbs pin the memory they register).
    rdma_devices: tuple[str, ...] = ()
    rdma_memlock: int | None = None  # bytes; None: unlimited
    # The node's decision (TUNEPLANE_CPU_AFFINITY): the CPUs and memory nodes of the
    # job's cards, set at create only; () for none (every CPU, every node).
    cpuset_cpus: tuple[int, ...] = ()
    cpuset_mems: tuple[int, ...] = ()
    # The console's word (None: not asked), then the node's decision (the operator's
    # TUNEPLANE_JOB_READ_ONLY_ROOT or the console's true): the image's filesystem
    # read-only, the job writing only in its tmpfs (and mounts).
    read_only_root: bool | None = None
    tmpfs: tuple[Tmpfs, ...] = ()
    disk_limit: str | None = None  # the console's word; None: the node's default
    scratch: Scratch | None = None  # the console's word; None: no scratch space
    volumes: tuple[Volume, ...] = ()  # the console's word; bound read-only at start
    # The node's decision (TUNEPLANE_JOB_DISK_LIMIT): the bytes it may write to the
    # engine's disk, written in its LABEL_DISK_LIMIT; None: no limit.
    disk_limit_bytes: int | None = None
    # The console's word, then the node's decision (TUNEPLANE_JOB_INODE_LIMIT): the
    # inodes it may make there, written in its LABEL_INODE_LIMIT; None: no limit.
    inode_limit: int | None = None
    confinement: Confinement = field(default_factory=Confinement)
    isolation: str = ""  # the console's word: "sandbox", or "" for the node's rule
    # The node's decisions (`jobs.rules.isolation`): a user namespace of the job's own (why
    # not, where the host's is kept), and the OCI runtime asked for (None: the default).
    own_userns: bool = False
    userns_note: str = ""
    # Its writable mounts handed to its range (podman's U), where the runtime cannot id-map.
    chown_mounts: bool = False
    runtime: str | None = None

    def cpuset(self) -> tuple[str | None, str | None]:
        """(cpus, mems) in the kernel's list format, None for each not set."""
        cpus, mems = self.cpuset_cpus, self.cpuset_mems
        return (format_cpulist(cpus) if cpus else None, format_cpulist(mems) if mems else None)

    def rdma_mappings(self) -> list[str]:
        """``host:container:rwm`` for each RDMA device, as both engines take devices."""
        return [f"{d}:{RDMA_DIR}/{PurePosixPath(d).name}:rwm" for d in self.rdma_devices]
