"""What the node reports of itself: health (the engine, the cards and whether a GPU job
can run, the pending launches, the disk, the engine's image store, the node state) and
inventory (the machine, its cards, its engine)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from tuneplane_node import inventory
from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.readiness import GpuReadiness
from tuneplane_node.jobs.images.gc import ImageCollector
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.words.images import ImageStore
from tuneplane_node.jobs.words.notices import Standing
from tuneplane_node.jobs.words.status import (
    Conditions,
    DiskRule,
    Inventory,
    IsolationRule,
    NodeState,
    NodeStatus,
)
from tuneplane_node.jobs.words.volumes import StoreView
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks, KeptReading

log = logging.getLogger(__name__)
HOST_TTL_S = 1.0
"""How long the host's PIDs and memory readings are answered again (/proc, a thread hop)."""


class HealthReader:
    """Assembles `NodeStatus`: one engine health call, then the cards only if the engine
    answered (their occupancy is read from its labels)."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        allocator: GpuAllocator,
        settings: NodeSettings,
        *,
        clock: Clock,
        gc: ImageCollector,
        held_by: Callable[[], str | None],
        unexplained: Callable[[], bool | None],
        cards_refused: Callable[[], str | None],
        volume_store: Callable[[], Awaitable[StoreView | None]],
        notices: Callable[[], tuple[Standing, ...]],
    ) -> None:
        self.runtime = runtime
        self.gc = gc
        self.held_by = held_by  # what holds a job's disk, as the disk monitor learnt it
        # Whether the store's pressure is one nobody explains (the disk monitor says).
        self.unexplained = unexplained
        # Why no card job can start though the engine hands out cards (the job rules').
        self.cards_refused = cards_refused
        self.volume_store = volume_store  # the volume store now; None: not known
        self.notices = notices  # the cloud's, the OS's
        self._tasks = BackgroundTasks(log)
        self._host = KeptReading(
            lambda: conditions(ImageStore()),  # the pressure is the caller's store's
            ttl_s=HOST_TTL_S,
            clock=clock,
            tasks=self._tasks,
            name="host conditions",
        )
        self._pressed: tuple[Conditions, Conditions] | None = None  # (read, with the pressure)
        self._rule: DiskRule | None = None
        self.allocator = allocator
        self.settings = settings
        self.clock = clock
        self.disk = inventory.DiskGauge(settings.storage, clock=clock)

    async def status(self, *, pending: PendingTable, node: NodeState) -> NodeStatus:
        """What health reports; ``occupancy`` None when the cards' state is unknown."""
        engine = await self.runtime.health()
        occupancy, error = None, engine.error
        if engine.ok:
            try:
                occupancy = await self.allocator.occupancy()
            except NodeError as exc:
                error = exc.message
        gpu = await self.allocator.ready(occupancy.gpus if occupancy is not None else None)
        refused = self.cards_refused()
        if gpu.ready and refused is not None:
            gpu = GpuReadiness(False, refused)
        now = self.clock.monotonic()
        store = await self.gc.reading()
        return NodeStatus(
            engine=engine,
            series=self.settings.cluster_profile.lower() or None,
            disk=await self.disk.read(),
            pending={record.ref: record.view(now) for record in pending.records()},
            cache=self.runtime.status(),
            occupancy=occupancy,
            error=error,
            node=node,
            gpu=gpu,
            image_store=store,
            conditions=await self.conditions(store),
            job_disk=self.disk_rule(),
            volume_store=await self.volume_store(),
            notices=self.notices(),
        )

    async def conditions(self, store: ImageStore) -> Conditions:
        """The store's pressure now beside the host's PIDs and memory, read at most once
        a second (/proc, a thread hop: `KeptReading`)."""
        host = await self._host.get()
        now = replace(
            host,
            disk_pressure=store.pressure,
            inode_pressure=store.inode_pressure,
            disk_pressure_unexplained=self.unexplained() if store.pressure else store.pressure,
        )
        if now == host:
            return host
        pressed = self._pressed
        if pressed is None or pressed[0] is not host or pressed[1] != now:
            # kept: the pressure changes rarely, and health's part is made once per object
            pressed = self._pressed = (host, now)
        return pressed[1]

    def disk_rule(self) -> DiskRule:
        """The same object until what holds the limit changes (health's part is made
        once per object)."""
        held_by = self.held_by()
        if self._rule is None or self._rule.held_by != held_by:
            self._rule = DiskRule(self.settings.job_disk_limit, held_by)
        return self._rule

    async def job_counts(self, pending: PendingTable) -> collections.Counter[str]:
        """The node's containers by status, and its pending launches by phase."""
        counts = collections.Counter(record.phase for record in pending.records())
        counts.update(state.status for state in await self.runtime.ps())
        return counts

    async def inventory(self, node: NodeState) -> Inventory:
        facts = await read_inventory(self.runtime, self.allocator, self.settings, node)
        store = await self.gc.reading()
        facts = replace(facts, image_store=store, conditions=await self.conditions(store))
        facts = replace(facts, job_disk=self.disk_rule(), isolation=await self.isolation())
        try:
            draining = dict((await self.allocator.occupancy()).draining)
        except NodeError:
            draining = None  # the engine down: which cards drain is not known
        return replace(facts, volume_store=await self.volume_store(), draining=draining)

    async def isolation(self) -> IsolationRule:
        """The isolation rules beside the engine's word on them (asked now)."""
        settings = self.settings
        rule = IsolationRule(settings.job_userns, settings.job_sandbox, settings.sandbox_runtime)
        support = await self.runtime.isolation_support()
        if support.error is not None or not support.default_runtime:
            return rule  # unknown: an engine that cannot say, the process runtime
        own = support.per_job_userns and settings.job_userns != "off"
        available = settings.sandbox_runtime in support.runtimes
        return replace(
            rule, own_userns=own, sandbox_available=available, runtimes=tuple(support.runtimes)
        )

    async def close(self) -> None:
        await self._tasks.close()
        await self.disk.close()


async def read_inventory(
    runtime: ContainerRuntime, allocator: GpuAllocator, settings: NodeSettings, node: NodeState
) -> Inventory:
    """The machine, its cards and its engine; for the API and `tuneplane-node inventory`."""
    engine = await runtime.health()
    gpus = await allocator.snapshot()
    machine = await asyncio.to_thread(inventory.collect, settings)
    return Inventory(
        machine=machine,
        gpus=gpus,
        accelerator_count=allocator.card_count(gpus),
        runtime=f"{engine.engine}://{engine.version}" if engine.version else None,
        node=node,
        cpu_affinity=settings.cpu_affinity,
        image_store=(store := await image_store(runtime, settings)),
        conditions=await conditions(store),
    )


async def conditions(store: ImageStore) -> Conditions:
    """The node's conditions: the store's pressure, the host's PIDs and memory (small
    /proc files, read off the loop)."""
    pids, memory = await asyncio.to_thread(
        lambda: (inventory.pid_pressure(), inventory.memory_pressure())
    )
    return Conditions(
        disk_pressure=store.pressure,
        pid_pressure=pids,
        memory_pressure=memory,
        inode_pressure=store.inode_pressure,
        disk_pressure_unexplained=None if store.pressure else store.pressure,
    )


async def image_store(runtime: ContainerRuntime, settings: NodeSettings) -> ImageStore:
    """The engine's image store asked once (`tuneplane-node inventory`); unknown when
    the engine cannot say."""
    try:
        root = await runtime.data_root()
    except NodeError:
        return ImageStore()
    if root is None:
        return ImageStore()
    return ImageStore.of(
        root.path,
        root.space,
        high_percent=settings.image_gc_high_percent,
        inode_percent=settings.inode_high_percent,
    )
