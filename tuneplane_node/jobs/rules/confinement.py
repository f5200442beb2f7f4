"""What the node imposes on a job, from the operator's settings: the console never can.

A job is a customer's code. It gets the capabilities a trainer needs and no more, runs
with no-new-privileges, a pids limit, a rotated log, an OOM score above the node's, a
memory limit even when the console gave none, and (where the operator says so) no host
network, on which it could sniff loopback or take the node's port, and a read-only root
whose only writable places are bounded tmpfs.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from dataclasses import replace

from tuneplane_node import fabrics, inventory
from tuneplane_node.errors import ConfigError, MemlockUnavailable, NoRdma
from tuneplane_node.jobs.rules.network import NetworkRule
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime import cgroups, memlock
from tuneplane_node.runtime.memlock import EngineMemlock
from tuneplane_node.runtime.spec import (
    DEVICES_ENV,
    KEPT_CAPABILITIES,
    Confinement,
    ContainerSpec,
    Tmpfs,
)
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.sizes import size_in_bytes

log = logging.getLogger(__name__)
LEAST_JOB_MEMORY = 64 * 2**20
"""Below this, what the reserve leaves jobs is a mistake in the settings, not a limit."""
RDMA = env_name("rdma")
NCCL_IB_HCA = "NCCL_IB_HCA"
RUN_TMPFS_MAX = 64 * 2**20
"""A read-only-root job's /run: pid files and sockets, never data."""


def confinement(settings: NodeSettings) -> Confinement:
    kept = KEPT_CAPABILITIES if settings.job_capabilities == "default" else ()
    return Confinement(
        capabilities=kept,
        no_new_privileges=settings.job_no_new_privileges,
        pids_limit=settings.job_pids_limit,
        log_max_bytes=settings.job_log_max_bytes,
        log_max_files=settings.job_log_max_files,
        oom_score_adj=settings.job_oom_score_adj,
        init=settings.job_init,
    )


def default_memory_limit(settings: NodeSettings, machine_bytes: int | None) -> int | None:
    """A job's memory limit when the console gave none: the machine's memory less the
    reserve. None only when the machine's memory cannot be read (said once)."""
    if machine_bytes is None:
        log.error("the machine's memory is unknown: jobs without memory_limit get none")
        return None
    limit = machine_bytes - settings.reserved_memory(machine_bytes)
    if limit < LEAST_JOB_MEMORY:
        raise ConfigError(
            f"{env_name('system_reserved_memory')}: reserving {settings.system_reserved_memory} "
            f"of this machine's {machine_bytes} bytes leaves jobs {max(limit, 0)} bytes"
        )
    return limit


def job_tmpfs(tmp_bytes: int, memory_limit: str | None) -> tuple[Tmpfs, Tmpfs]:
    """/tmp and /run of a read-only-root job: /tmp at most ``tmp_bytes`` and half its
    memory limit (its pages are charged to the job's memory: a full /tmp is ENOSPC, not
    the OOM killer), /run at most 64 MiB of the same. Without a memory limit, the
    tmpfs' own size is the bound."""
    memory = size_in_bytes(memory_limit) if memory_limit else None
    tmp = tmp_bytes if memory is None else min(tmp_bytes, int(memory) // 2)
    return Tmpfs("/tmp", tmp), Tmpfs("/run", min(RUN_TMPFS_MAX, tmp))


class JobRules:
    """The operator's rules applied to each launch's spec, decided once at start-up."""

    def __init__(
        self,
        settings: NodeSettings,
        *,
        machine_bytes: int | None = None,
        port_held: bool = False,
    ) -> None:
        self.confinement = confinement(settings)
        if machine_bytes is None:
            machine_bytes = inventory.memory_total()
        self.memory_limit = default_memory_limit(settings, machine_bytes)
        # All jobs together (their parent cgroup's), refused at start when a reserve
        # leaves them next to nothing.
        self.parent_bounds = cgroups.wanted(
            settings, pids=cgroups.pid_max(), machine_bytes=machine_bytes
        )
        self.network = NetworkRule(settings, port_held=port_held)
        self.rdma = settings.rdma
        self.rdma_dir = settings.rdma_device_dir
        self.rdma_memlock = settings.rdma_memlock_bytes
        self.settings = settings
        self.engine = ""  # and the next two: `engine_limits`, at start
        self.memlock_refused: str | None = None
        self.rdma_present = False
        self.hcas = ",".join(hca for fabric in settings.fabrics for hca in fabric.hcas)
        self.read_only_root = settings.job_read_only_root
        self.tmpfs_bytes = settings.job_tmpfs_bytes

    async def vet(self, plan: LaunchRequest) -> LaunchRequest:
        """The vet step: a console's `DEVICES_ENV` dropped (the node chooses the cards,
        logged), then `apply` for the cards it asks, on a thread."""
        spec, env = plan.spec, dict(plan.spec.env)
        if env.pop(DEVICES_ENV, None) is not None:
            log.warning(
                "launch %s: dropped %s from env: the node chooses", spec.name, DEVICES_ENV,
                extra=job_fields(spec.name, plan.run_id, image=spec.image),
            )  # fmt: skip
        cards = plan.requested_gpus
        spec = await asyncio.to_thread(self.apply, replace(spec, env=env), cards=cards)
        return replace(plan, spec=spec)

    def apply(self, spec: ContainerSpec, *, cards: int = 0) -> ContainerSpec:
        """The spec confined, for a job of that many cards; InvalidField when the
        operator refuses what it asks. Blocking (it lists the RDMA devices): a thread's."""
        spec = replace(spec, confinement=self.confinement)
        if spec.memory_limit is None and self.memory_limit is not None:
            spec = replace(spec, memory_limit=str(self.memory_limit))
        return self._root(self._rdma(self.network.vetted(spec), cards))

    def _root(self, spec: ContainerSpec) -> ContainerSpec:
        """Read-only when the operator says so or the launch asks (a launch's false is
        not asked: it never undoes the operator's true), with its tmpfs; a console's own
        mount or scratch on /tmp or /run is where the job writes there instead."""
        if not (self.read_only_root or spec.read_only_root):
            return replace(spec, read_only_root=False, tmpfs=())
        targets = [mount.container for mount in spec.mounts]
        targets += [spec.scratch.path] if spec.scratch is not None else []
        mounted = {posixpath.normpath(target) for target in targets}
        tmpfs = job_tmpfs(self.tmpfs_bytes, spec.memory_limit)
        kept = tuple(each for each in tmpfs if each.path not in mounted)
        return replace(spec, read_only_root=True, tmpfs=kept)

    def engine_limits(self, engine: str, memlock: EngineMemlock) -> str | None:
        """What the engine's process allows, read at start: why a job given RDMA devices
        cannot get its memlock there (then each such launch is `MemlockUnavailable`), or
        None when it can or the limit is unknown. Blocking (it lists the devices)."""
        self.engine, self.memlock_refused = engine, memlock.refusal(self.rdma_memlock)
        self.rdma_present = self.rdma != "off" and bool(fabrics.rdma_devices(self.rdma_dir))
        return self.memlock_refused

    def read_engine(self, engine: str) -> None:
        """The engine's hard memlock, read at start (`engine_limits`), an error logged
        when it refuses what RDMA jobs get here. Blocking."""
        self.engine_limits(engine, memlock.read(self.settings, engine))
        refused = self.card_jobs_refused()
        if refused is not None:
            log.error("launches given RDMA devices will be refused: %s", refused)

    def card_jobs_refused(self) -> str | None:
        """Why no card job can start here (each would get RDMA devices the engine cannot
        lock memory for: `MemlockUnavailable`); None when they can. Health's GPU readiness."""
        if self.memlock_refused is None or not self.rdma_present:
            return None
        return (
            f"card jobs get RDMA devices and the {self.engine} engine cannot lock their "
            f"memory: {self.memlock_refused}; set LimitMEMLOCK=infinity in the engine's "
            "unit, or TUNEPLANE_RDMA_MEMLOCK to a size within the limit"
        )

    def _rdma(self, spec: ContainerSpec, cards: int) -> ContainerSpec:
        """The RDMA devices when the rule (or the launch) says so, and what NCCL needs."""
        if spec.rdma is False or (spec.rdma is None and self.rdma == "off"):
            return spec
        devices = fabrics.rdma_devices(self.rdma_dir) if self.rdma != "off" else ()
        if spec.rdma and not devices:
            why = f"{RDMA}=off" if self.rdma == "off" else f"none under {self.rdma_dir}"
            raise NoRdma(why=why)
        if not devices or (spec.rdma is None and self.rdma == "auto" and cards == 0):
            return spec
        if self.memlock_refused is not None:  # the engine would refuse it: a 502 in runc's words
            raise MemlockUnavailable(engine=self.engine, why=self.memlock_refused)
        env = dict(spec.env)
        if self.hcas:
            env.setdefault(NCCL_IB_HCA, self.hcas)  # the console's own wins
        handed = tuple(map(str, devices))
        return replace(spec, rdma_devices=handed, rdma_memlock=self.rdma_memlock, env=env)
