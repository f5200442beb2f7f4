"""A job's disk limit, decided at its launch, and the launch refused under disk pressure.

The limit bounds what a job writes to the engine's disk (its writable layer and its
anonymous volumes together): the launch's ``disk_limit``, else the operator's
``TUNEPLANE_JOB_DISK_LIMIT``, which is also the most a launch may ask for. A percentage
is of the engine's store as measured at the launch. The bytes are written on the
container (`LABEL_DISK_LIMIT`): what the disk monitor holds it to, after a restart too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from tuneplane_node.errors import OUT_OF_RANGE, DiskPressure, InodePressure, InvalidField
from tuneplane_node.jobs.words.images import ImageStore
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.sizes import size_in_bytes

FIELD = "container.disk_limit"
INODE_FIELD = "container.inode_limit"


class DiskLimits:
    """The operator's disk rules applied to a launch."""

    def __init__(
        self, settings: NodeSettings, *, store: Callable[[], Awaitable[ImageStore]]
    ) -> None:
        self.settings = settings
        self.high = settings.image_gc_high_percent
        self.store = store  # the engine's image store, read (the image GC's reading)

    async def vet(self, plan: LaunchRequest) -> LaunchRequest:
        """The vet step: the store read once for the launch (`LaunchRequest.store`: its
        room is checked from the same reading), the spec with its disk and inode limits."""
        store = await self.store()
        return replace(plan, spec=self.apply(plan.spec, store), store=store)

    def apply(self, spec: ContainerSpec, store: ImageStore) -> ContainerSpec:
        """The spec with the bytes it may write; InvalidField (422) when it asks for
        more than the node allows."""
        ceiling = self.settings.job_disk_ceiling(store.total_bytes)
        spec = self._inodes(spec)
        asked = size_in_bytes(spec.disk_limit) if spec.disk_limit is not None else None
        if asked is None:
            return replace(spec, disk_limit_bytes=ceiling)
        if ceiling is not None and asked > ceiling:
            raise InvalidField(
                FIELD,
                f"at most {ceiling} bytes on this node "
                f"({env_name('job_disk_limit')}={self.settings.job_disk_limit})",
                problem=OUT_OF_RANGE,
            )
        return replace(spec, disk_limit_bytes=int(asked))

    def _inodes(self, spec: ContainerSpec) -> ContainerSpec:
        """The inodes it may make: its ``inode_limit``, at most the operator's."""
        ceiling = self.settings.job_inode_limit
        if spec.inode_limit is None:
            return replace(spec, inode_limit=ceiling)
        if spec.inode_limit > ceiling:
            raise InvalidField(
                INODE_FIELD,
                f"at most {ceiling} on this node ({env_name('job_inode_limit')}={ceiling})",
                problem=OUT_OF_RANGE,
            )
        return spec

    def check_room(self, store: ImageStore) -> None:
        """`DiskPressure` (507) while the store is at or above its high threshold, and
        `InodePressure` while its inodes are: a launch then is refused before anything
        is made."""
        if store.pressure and store.used_ratio is not None:
            raise DiskPressure(
                used_ratio=store.used_ratio,
                free_bytes=store.free_bytes or 0,
                total_bytes=store.total_bytes or 0,
                high_percent=self.high,
            )
        if store.inode_pressure and store.inodes_total is not None:
            raise InodePressure(
                inodes_free=store.inodes_free or 0,
                inodes_total=store.inodes_total,
                high_percent=self.settings.inode_high_percent,
            )
