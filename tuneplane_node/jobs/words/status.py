"""What the node says of itself: its state (ready, cordoned, draining), its status as
health reads it, its inventory."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from tuneplane_node.gpu.probe import GpuSnapshot, Occupancy
from tuneplane_node.gpu.readiness import NO_CARDS, GpuReadiness
from tuneplane_node.inventory import DiskReading, MachineFacts
from tuneplane_node.jobs.words.images import ImageStore
from tuneplane_node.jobs.words.notices import Standing
from tuneplane_node.jobs.words.views import PendingView
from tuneplane_node.jobs.words.volumes import StoreView
from tuneplane_node.runtime.base import CacheStatus
from tuneplane_node.runtime.facts import RuntimeHealth
from tuneplane_node.wire.values import READY


@dataclass(frozen=True)
class NodeState:
    """``since``: RFC 3339 UTC of the last change of ``state``; ``grace_s`` and the
    warning (``warn_signal``, ``warn_s``): a drain's, which a resumed drain stops with;
    ``notice``: the key of the cloud's (or the OS's) notice that made this state, which
    its withdrawal undoes, None where the operator made it; ``stopping_as``: what a
    drain's stops are noted as (None: ``drain: <reason>``)."""

    state: str = READY
    reason: str | None = None
    since: str | None = None
    grace_s: float | None = None
    warn_signal: str | None = None
    warn_s: float | None = None
    notice: str | None = None
    stopping_as: str | None = None
    stop_reasons: Mapping[str, str] = field(default_factory=dict)  # container id (or name) -> why
    disk_used: Mapping[str, int] = field(default_factory=dict)  # id -> bytes when stopped for them
    disk_deleted_open: Mapping[str, int] = field(default_factory=dict)  # id -> the deleted part
    disk_inodes: Mapping[str, int] = field(default_factory=dict)  # id -> its inodes then

    @property
    def open(self) -> bool:
        """Whether new launches are taken."""
        return self.state == READY

    def to(
        self, state: str, reason: str | None, since: str, *, notice: str | None = None
    ) -> NodeState:
        """The next state, made by the operator or by ``notice``; ``since`` moves only
        when the state itself changes."""
        moved = since if state != self.state else self.since
        return replace(self, state=state, reason=reason, since=moved, notice=notice)

    def stopped(
        self,
        container_ids: Iterable[str],
        reason: str,
        *,
        disk_used: int | None = None,
        deleted_open: int | None = None,
        inodes: int | None = None,
    ) -> NodeState:
        """Why the node stops these containers; ``disk_used``: the bytes they had written,
        when their disk is why (``deleted_open``: of which deleted files they held open;
        ``inodes``: the inodes they had made)."""
        ids = list(container_ids)
        reasons = {**self.stop_reasons, **dict.fromkeys(ids, reason)}
        if disk_used is None:
            return replace(self, stop_reasons=reasons)
        return replace(
            self,
            stop_reasons=reasons,
            disk_used=_with(self.disk_used, ids, disk_used),
            disk_deleted_open=_with(self.disk_deleted_open, ids, deleted_open),
            disk_inodes=_with(self.disk_inodes, ids, inodes),
        )

    def forgetting(self, container_id: str) -> NodeState:
        return self._only(cid for cid in self.stop_reasons if cid != container_id)

    def keeping(self, container_ids: Iterable[str]) -> NodeState:
        """Forget the stop reasons of containers that are gone."""
        alive = set(container_ids)
        kept = self._only(cid for cid in self.stop_reasons if cid in alive)
        return self if len(kept.stop_reasons) == len(self.stop_reasons) else kept

    def _only(self, ids: Iterable[str]) -> NodeState:
        kept = set(ids)
        return replace(
            self,
            stop_reasons={cid: why for cid, why in self.stop_reasons.items() if cid in kept},
            disk_used={cid: used for cid, used in self.disk_used.items() if cid in kept},
            disk_deleted_open={c: n for c, n in self.disk_deleted_open.items() if c in kept},
            disk_inodes={c: n for c, n in self.disk_inodes.items() if c in kept},
        )


def _with(figures: Mapping[str, int], ids: list[str], value: int | None) -> Mapping[str, int]:
    return figures if value is None else {**figures, **dict.fromkeys(ids, value)}


@dataclass(frozen=True)
class Conditions:
    """What the console may schedule by, each None when unknown: the engine's store at or
    above its high threshold (``disk_pressure``), less than a tenth of the host's PIDs
    left (``pid_pressure``), less than 100 MiB of memory available
    (``memory_pressure``)."""

    disk_pressure: bool | None = None
    pid_pressure: bool | None = None
    memory_pressure: bool | None = None
    inode_pressure: bool | None = None  # the store's inodes at or above their threshold
    # Under disk pressure, whether something other than the jobs, their scratches, the
    # volume store and the images made it (`jobs.disk.accounting`); false without.
    disk_pressure_unexplained: bool | None = None


@dataclass(frozen=True)
class DiskRule:
    """How jobs' disk is bounded here: ``TUNEPLANE_JOB_DISK_LIMIT`` as set, and what
    holds a job to it: ``project_quotas`` (the kernel), ``monitor``, or None (not known
    yet, or a store not on this machine: nothing does)."""

    limit: str = ""
    held_by: str | None = None


@dataclass(frozen=True)
class NodeStatus:
    """Everything health says. ``occupancy`` None: the cards' state is unknown."""

    engine: RuntimeHealth
    series: str | None
    disk: DiskReading | None
    pending: Mapping[str, PendingView]
    cache: CacheStatus | None
    occupancy: Occupancy | None
    error: str | None
    node: NodeState
    gpu: GpuReadiness = NO_CARDS  # whether a GPU job can run here
    image_store: ImageStore = ImageStore()  # noqa: RUF009 (frozen: one default is safe)
    conditions: Conditions = Conditions()
    job_disk: DiskRule = DiskRule()
    volume_store: StoreView | None = None  # None: not known (the CLI's inventory)
    notices: tuple[Standing, ...] = ()  # the cloud's (or the OS's), most urgent first

    @property
    def ok(self) -> bool:
        """The engine answered, the cards' occupancy was read, and a launch is taken
        (no disk or inode pressure refuses it)."""
        return self.engine.ok and self.occupancy is not None and self.launch_refused is None

    @property
    def launch_refused(self) -> str | None:
        """The condition every launch is refused for now (a `507`): ``disk_pressure``,
        ``inode_pressure``; None: none."""
        if self.conditions.disk_pressure:
            return "disk_pressure"
        return "inode_pressure" if self.conditions.inode_pressure else None

    def why_not_ok(self) -> str:
        if not self.engine.ok or self.occupancy is None:
            return self.error or "the cards' occupancy could not be read"
        what = "store" if self.launch_refused == "disk_pressure" else "store's inodes"
        return (
            f"{self.launch_refused}: the engine's {what} at or above the high threshold; "
            "every launch is refused (507) until it is below"
        )


@dataclass(frozen=True)
class IsolationRule:
    """The operator's isolation rules, and what the engine makes of them: whether its jobs
    get a user namespace of their own, whether the sandbox runtime is registered in it,
    and the runtimes it has (None and empty: the engine could not say)."""

    userns: str = "auto"
    sandbox: str = "off"
    sandbox_runtime: str = "runsc"
    own_userns: bool | None = None
    sandbox_available: bool | None = None
    runtimes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inventory:
    """What the machine has: its own facts, the cards, and the engine."""

    machine: MachineFacts
    gpus: GpuSnapshot | None
    accelerator_count: int | None
    runtime: str | None
    node: NodeState
    cpu_affinity: str = "numa"  # TUNEPLANE_CPU_AFFINITY: numa or off
    image_store: ImageStore = ImageStore()  # noqa: RUF009 (frozen: one default is safe)
    conditions: Conditions = Conditions()
    job_disk: DiskRule = DiskRule()
    isolation: IsolationRule = IsolationRule()
    volume_store: StoreView | None = None  # None: not known (the CLI's inventory)
    draining: Mapping[int, str] | None = None  # cards draining, and why; None: not known
