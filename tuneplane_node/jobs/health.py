"""What the node reports of itself: health (the engine, the cards, the pending launches,
the disk, the node state) and inventory (the machine, its cards, its engine)."""

from __future__ import annotations

import asyncio

from tuneplane_node import inventory
from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.nodestate import NodeState
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.results import Inventory, NodeStatus
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.settings import NodeSettings


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
    ) -> None:
        self.runtime = runtime
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
        now = self.clock.monotonic()
        return NodeStatus(
            engine=engine,
            series=self.settings.cluster_profile.lower() or None,
            disk=await self.disk.read(),
            pending={record.ref: record.view(now) for record in pending.records()},
            cache=self.runtime.status(),
            occupancy=occupancy,
            error=error,
            node=node,
        )

    async def inventory(self, node: NodeState) -> Inventory:
        return await read_inventory(self.runtime, self.allocator, self.settings, node)

    async def close(self) -> None:
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
    )
