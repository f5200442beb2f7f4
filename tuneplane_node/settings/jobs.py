"""`JobSettings`: the view of `NodeSettings` that says what every job gets and the bounds
of all of them together (``TUNEPLANE_JOB_*``, ``TUNEPLANE_SYSTEM_RESERVED_*``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, IPvAnyNetwork, field_validator
from pydantic_settings import BaseSettings

from tuneplane_node.settings.values import GIB, share_of, size_from
from tuneplane_node.sizes import MAX_SIZE, size_in_bytes

MIN_TMPFS = 2**20
MIN_SCRATCH = 2**20


class JobSettings(BaseSettings):
    """What every job gets, and the bounds of all of them together: its privileges, logs,
    PIDs, memory, disk, root filesystem and parent cgroup (a view of `NodeSettings`, whose
    environment names they keep: ``TUNEPLANE_JOB_*``, ``TUNEPLANE_SYSTEM_RESERVED_*``)."""

    job_capabilities: Literal["default", "restricted"] = "default"
    """A job's Linux capabilities: ``default`` keeps CHOWN, DAC_OVERRIDE, FOWNER, FSETID,
    KILL, SETGID, SETUID, SETPCAP and SYS_CHROOT (the engines' defaults less NET_RAW,
    NET_BIND_SERVICE, MKNOD, AUDIT_WRITE and SETFCAP); ``restricted``: none at all."""
    job_userns: Literal["auto", "always", "off"] = "auto"
    """A job's own user namespace (podman: ``userns=auto``, 65,536 ids of the
    ``containers`` ranges in /etc/subuid and /etc/subgid): ``auto`` for every job the
    engine can give one (a job whose writable host mounts its OCI runtime cannot id-map:
    ``TUNEPLANE_JOB_USERNS_WRITABLE``), ``always`` (a job it cannot is a 409,
    ``userns_unavailable``), ``off`` (the host's namespace, as before). Docker has no
    per-job namespaces: its ``userns-remap`` is the daemon's."""
    job_userns_writable: Literal["chown", "refuse", "host"] = "chown"
    """A job whose writable host mounts (or scratch) the engine's OCI runtime cannot
    id-map (runc before 1.2): ``chown`` gives it its own namespace all the same, and the
    node hands each such mount to the job's root before its start (where the top directory
    is not its already: every entry, by descriptor); ``refuse`` answers the launch a 409
    (``userns_unavailable``) naming the mount; ``host`` keeps it in the host's namespace
    (root in the job is root on those files). No field of a launch chooses."""
    job_userns_cards: bool = False
    """Card jobs get their own user namespace too (``false``: they keep the host's, as the
    NVIDIA stack under user namespaces is not dependable; check it on the driver first)."""
    job_sandbox: Literal["off", "cpu", "all"] = "off"
    """Which jobs run under ``TUNEPLANE_SANDBOX_RUNTIME``: none, the jobs without cards
    (``cpu``), or all (card jobs need the runtime's GPU proxy: refused otherwise). A
    launch may ask for it with ``container.isolation: "sandbox"``."""
    sandbox_runtime: str = Field("runsc", min_length=1, max_length=100, pattern=r"^[\w.-]+$")
    """The engine's OCI runtime for sandboxed jobs, by its registered name (gVisor's
    ``runsc``, registered with ``--network=host``; a Kata runtime works the same way)."""
    job_no_new_privileges: bool = True
    """Start every job with no-new-privileges: a setuid binary cannot regain what was dropped."""
    job_init: bool = True
    """Run the engine's init (docker-init, podman's catatonit) as PID 1 of every job, so a
    stop signal reaches the job's command (a shell entrypoint would ignore it as PID 1)
    and the zombies of its children are reaped."""
    job_host_network: Literal["whole-node", "allow", "bridge", "refuse"] = "whole-node"
    """A launch asking for ``network: host``: ``whole-node`` gives it the host network only
    when it holds every card of the machine and no other job of the node runs, and only
    where the node's port is held across restarts (systemd socket activation) or the API
    is served over TLS, else the node's job network (``TUNEPLANE_JOB_NETWORK``); ``allow``
    it (0.3.15's default), run it on the job network instead (``bridge``), or ``refuse``
    it (422)."""
    job_network: Literal["isolated", "sealed", "bridge"] = "isolated"
    """The network of a job not on the host's (one that asks for ``bridge``, or is
    bridged by ``TUNEPLANE_JOB_HOST_NETWORK``): ``isolated``, where it cannot reach
    another job (docker: the node's network ``tuneplane-jobs``, inter-container traffic
    off, held by the engine's firewall rules, so not under ``--iptables=false``, and a
    rule of the node's that rejects its jobs' new connections to this machine's own
    ports; podman: a bridge network of the job's own, ``isolate=true``, the same rule for
    its bridge and rules against the engine's other containers, removed with it),
    and reaches the outside world; ``sealed``, the same without the outside world (an
    internal network: docker's ``tuneplane-jobs-sealed``); ``bridge``, the engine's
    default bridge, shared with every other container there (0.3.15's). Observe's
    ``network`` says which."""
    job_egress_rule: bool = True
    """The node's egress rule for the jobs of its job networks (and host-network jobs,
    where the kernel can match them by cgroup): no new connection to the cloud's metadata
    service (``169.254.0.0/16``, ``100.100.100.200``, ``fe80::/10``, ``fd00:ec2::254``),
    to ``TUNEPLANE_JOB_EGRESS_DENY``, nor to this machine's other bridges (out only
    through the engine namespace's default route). ``false``: none (a job reaches
    whatever its engine lets it, the metadata service included)."""
    job_egress_deny: list[IPvAnyNetwork] = []
    """Networks (CIDRs, JSON list) no job of the node's job networks may open a new
    connection to, beside the metadata service: the machine's LAN, RFC 1918,
    ``100.64.0.0/10``."""
    job_egress_allow: list[IPvAnyNetwork] = []
    """Networks (CIDRs, JSON list) the jobs may reach before any denial of the egress
    rule: an internal mirror, a dataset server (also through another interface than the
    default route's)."""
    job_log_max_bytes: int = Field(10 * 2**20, ge=64 * 2**10, le=2**40)
    """Bytes of a job's log file before the engine rotates it (podman, which keeps one
    file, truncates at this times the file count)."""
    job_log_max_files: int = Field(5, ge=1, le=100)
    """Log files the engine keeps per job, the newest included."""
    job_pids_limit: int = Field(16384, ge=64, le=4194304)
    """Processes and threads one job may have at once."""
    system_reserved_memory: str | int | None = None
    """Memory kept from jobs without a ``memory_limit`` (a size such as ``4g`` or bytes):
    such a job's limit is the machine's memory less this. Unset: 5% of it, at least 1 GiB."""
    job_disk_limit: str = "50%"
    """What a job may write to the engine's disk, its writable layer and anonymous
    volumes together: a size (``100g``), a percentage of the engine's store (``50%``:
    of the size of its data root's filesystem), or ``unlimited``. The limit of a job
    whose launch gives no ``disk_limit``, and the most one may ask for. Held by the
    kernel where the store has project quotas, else by the disk monitor."""
    job_inode_limit: int = Field(1_000_000, ge=1000, le=2**32)
    """The files, directories and links (inodes) a job may make on the engine's disk,
    its writable layer and anonymous volumes together: the limit of a job whose launch
    gives no ``inode_limit``, and the most one may ask for. Held by the disk monitor,
    which stops a job past it (``stop_reason: "inode_limit"``)."""
    job_disk_check_s: float = Field(5.0, ge=0.1, le=3600, allow_inf_nan=False)
    """Seconds between two measures of the running jobs' writable layers and anonymous
    volumes by the disk monitor (which stops a job past its limit, and the filler of a
    store under pressure)."""
    job_oom_score_adj: int = Field(500, ge=-1000, le=1000)
    """Every job's ``oom_score_adj``: above the node's (its unit: -900) and the engine's
    (-500), so the kernel's OOM killer takes a job first."""
    job_read_only_root: bool = False
    """Every job's image filesystem read-only, with bounded tmpfs on /tmp and /run
    (``false``: only for launches that ask, ``container.read_only_root``)."""
    job_scratch_max: str | int = "100g"
    """The largest ``container.scratch`` a launch may ask for (a size such as ``100g`` or
    bytes, at least 1 MiB): the most one job's scratch adds to the scratch root's disk."""
    job_tmpfs_size: str | int = "1g"
    """The size of a read-only-root job's /tmp (a size such as ``1g`` or bytes), lowered
    to half its memory limit; its /run takes at most 64 MiB of the same."""
    # Dashes only between words: systemd nests a slice by them, and refuses "a--b.slice".
    job_cgroup_parent: str = Field(
        "tuneplane-jobs", max_length=100, pattern=r"^[a-zA-Z0-9_]+(-[a-zA-Z0-9_]+)*$"
    )
    """The cgroup every job is created under, the node's own (kubelet's kubepods): a
    directory at the root of the cgroup tree (``/<name>``), or the systemd slice
    ``<name>.slice`` where the engine's cgroup driver is systemd."""
    system_reserved_pids: int | None = Field(None, ge=0, le=4194304)
    """PIDs kept from all jobs together: the parent cgroup's pids limit is the kernel's
    pid_max less this. Unset: a tenth of pid_max, at least 1024."""

    @field_validator("job_disk_limit")
    @classmethod
    def _a_size_or_share(cls, limit: str) -> str:
        limit = limit.strip().lower()
        if limit == "unlimited" or share_of(limit) is not None:
            return limit
        bytes_ = size_in_bytes(limit)
        if bytes_ is None or not 0 < bytes_ <= MAX_SIZE:
            raise ValueError("must be a size like 100g, a percentage like 50%, or unlimited")
        return limit

    def job_disk_ceiling(self, store_bytes: int | None) -> int | None:
        """The most bytes a job may write to the engine's disk; None: no limit (or a
        percentage of a store whose size is unknown)."""
        limit = self.job_disk_limit
        share = share_of(limit)
        if share is not None:
            return None if store_bytes is None else int(store_bytes * share / 100)
        return None if limit == "unlimited" else int(size_in_bytes(limit) or 0)

    @field_validator("system_reserved_memory")
    @classmethod
    def _a_size(cls, size: str | int | None) -> str | int | None:
        bytes_ = size_in_bytes(size)
        if size is not None and (bytes_ is None or not 0 <= bytes_ <= MAX_SIZE):
            raise ValueError("must be a size like 4g or 512m, or a number of bytes")
        return size

    @field_validator("job_tmpfs_size")
    @classmethod
    def _a_tmpfs_size(cls, size: str | int) -> str | int:
        return size_from(size, MIN_TMPFS, example="1g")

    @field_validator("job_scratch_max")
    @classmethod
    def _a_scratch_max(cls, size: str | int) -> str | int:
        return size_from(size, MIN_SCRATCH, example="100g")

    @property
    def job_scratch_max_bytes(self) -> int:
        return int(size_in_bytes(self.job_scratch_max) or 0)

    @property
    def job_tmpfs_bytes(self) -> int:
        return int(size_in_bytes(self.job_tmpfs_size) or 0)

    def reserved_memory(self, machine_bytes: int) -> int:
        """Bytes of the machine's memory kept from jobs without a limit of their own."""
        if self.system_reserved_memory is not None:
            return int(size_in_bytes(self.system_reserved_memory) or 0)
        return max(GIB, machine_bytes // 20)

    def reserved_pids(self, pid_max: int) -> int:
        """PIDs of the machine kept from all jobs together."""
        if self.system_reserved_pids is not None:
            return self.system_reserved_pids
        return max(1024, pid_max // 10)
