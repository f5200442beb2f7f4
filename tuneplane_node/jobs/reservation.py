"""A launch's cards (and fabric address), from its acceptance until its container's label
holds them."""

from __future__ import annotations

from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.rules.fabric import FabricAddresses
from tuneplane_node.jobs.words.launch import LaunchRequest


class Reservation:
    """A launch's cards (and fabric address), from its acceptance until its container's
    label holds them or the launch ends without one. The one place a launch claims cards
    (`claim`; again after a pull, which keeps them if they are still free) and the one
    place it lets them go (`release`, once: a second call does nothing). ``async with`` ties the
    release to a block; a pending launch's task ends in `launcher.Launcher._ended`, which
    releases it."""

    def __init__(
        self, allocator: GpuAllocator, request: LaunchRequest, fabric: FabricAddresses | None = None
    ) -> None:
        self.allocator = allocator
        self.request = request
        self.fabric = fabric  # its fabric address (the launcher's `_placed`), let go with the cards
        self._held = False

    async def claim(self) -> tuple[int, ...]:
        """The cards, or `NoCapacity`; a refusal leaves an earlier claim held."""
        request = self.request
        cards = await self.allocator.claim(
            request.ref, request.requested_gpus, run_id=request.run_id
        )
        self._held = True
        return cards

    def release(self) -> None:
        if self.fabric is not None:
            self.fabric.release(self.request.ref)
        if self._held:
            self._held = False
            self.allocator.release(self.request.ref)

    async def __aenter__(self) -> tuple[int, ...]:
        return await self.claim()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()
