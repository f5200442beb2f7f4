"""A job container as the node asks an engine for it: its name, its confinement, its spec
and what its labels are written from (`runtime.labels`).

Plain data, read by every runtime's `ContainerRuntime.run`; what a runtime says back of
a container is `runtime.base.ContainerState`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath
from typing import NamedTuple

from tuneplane_node.wire.values import (
    LaunchContainer,
)

DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
"""Which cards the NVIDIA container runtime shows a container: the node alone sets it."""
RDMA_DIR = "/dev/infiniband"  # where a job finds its RDMA devices, wherever the host's are
RDMA_CAPABILITY = "IPC_LOCK"
UNLIMITED = 2**64 - 1  # RLIM_INFINITY


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
class ContainerSpec(LaunchContainer):
    """One job container: the console's container (`LaunchContainer`, every field of
    it by its name) and the node's decisions.

    ``gpus`` are the cards the node chose; every runtime writes them in the
    ``tuneplane.gpus`` label itself (`runtime.labels.job_labels`), so the label never disagrees with
    the devices.
    """

    gpus: tuple[int, ...] = ()
    # The node's decision: the host's RDMA devices, each handed in at RDMA_DIR/<name>,
    # with memlock unlimited and RDMA_CAPABILITY (verbs pin the memory they register).
    rdma_devices: tuple[str, ...] = ()
    rdma_memlock: int | None = None  # bytes; None: unlimited
    # The node's decision (TUNEPLANE_CPU_AFFINITY): the CPUs and memory nodes of the
    # job's cards, set at create only; () for none (every CPU, every node).
    cpuset_cpus: tuple[int, ...] = ()
    cpuset_mems: tuple[int, ...] = ()
    tmpfs: tuple[Tmpfs, ...] = ()  # a read-only root's writable places
    # The node's decision (TUNEPLANE_JOB_DISK_LIMIT): the bytes it may write to the
    # engine's disk, written in its LABEL_DISK_LIMIT; None: no limit.
    disk_limit_bytes: int | None = None
    confinement: Confinement = field(default_factory=Confinement)
    # The node's decisions (`jobs.rules.isolation`): a user namespace of the job's own (why
    # not, where the host's is kept), and the OCI runtime asked for (None: the default).
    own_userns: bool = False
    userns_note: str = ""
    # Its writable mounts handed to its range (podman's U), where the runtime cannot id-map.
    chown_mounts: bool = False
    runtime: str | None = None

    @classmethod
    def of(cls, container: LaunchContainer) -> ContainerSpec:
        """The spec of the console's container, before any decision of the node's. The
        names are `LaunchContainer`'s own fields, which the spec has by inheritance:
        none to miss or misspell (a spec handed in loses its decisions)."""
        asked = {each.name: getattr(container, each.name) for each in fields(LaunchContainer)}
        return cls(**asked)

    def cpuset(self) -> tuple[str | None, str | None]:
        """(cpus, mems) in the kernel's list format, None for each not set."""
        cpus, mems = self.cpuset_cpus, self.cpuset_mems
        return (format_cpulist(cpus) if cpus else None, format_cpulist(mems) if mems else None)

    def rdma_mappings(self) -> list[str]:
        """``host:container:rwm`` for each RDMA device, as both engines take devices."""
        return [f"{d}:{RDMA_DIR}/{PurePosixPath(d).name}:rwm" for d in self.rdma_devices]
