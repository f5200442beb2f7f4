"""The engine's store, as an engine runtime sees it: its data root and the room there,
its images listed and removed, what a container has written there and whether the store
bounds it itself (project quotas); and how host mounts reach the engine, with the
directories it calls its own. Helpers of `EngineRuntime` (`runtime.engines.engine`), each
made with its seam (`EngineSeam`) and the adapter's calls it needs. Nothing here imports
an SDK.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneplane_node import inventory
from tuneplane_node.runtime import diskwalk
from tuneplane_node.runtime.engines import dockerformat as fmt
from tuneplane_node.runtime.engines.seam import EngineSeam
from tuneplane_node.runtime.facts import (
    REMOTE,
    STAGED,
    DataRoot,
    DiskUse,
    EngineImage,
    MountSupport,
)
from tuneplane_node.runtime.spec import ContainerSpec

log = logging.getLogger(__name__)


# --- project quotas -----------------------------------------------------------------
# Whether the engine's store can hold a job's writable layer to a size itself.
#
# Docker's overlay2 and podman's overlay take ``storage_opt size`` only where the store's
# backing filesystem is xfs mounted with project quotas (``pquota``/``prjquota``): the
# kernel then refuses a write past the size (``EDQUOT``), and nothing can outrun it. The
# engine says its backing filesystem (docker's ``DriverStatus``, podman's
# ``store.graphStatus``); the mount's options are read here, in /proc/self/mountinfo,
# so only for an engine on this machine. Anywhere else the disk monitor is the bound.
# A kernel built without quota support (``CONFIG_QUOTA`` off) refuses those options at
# mount time, so such a store never reads as having them.

QUOTA_FILESYSTEMS = frozenset({"xfs"})
QUOTA_OPTIONS = frozenset({"pquota", "prjquota"})  # pqnoenforce counts, never refuses


def project_quotas(backing_fs: str | None, options: str | None) -> bool | None:
    """Whether the store enforces project quotas; None when either fact is unknown."""
    if backing_fs is None or options is None:
        return None
    enforced = QUOTA_OPTIONS & set(options.split(","))
    return backing_fs.strip().lower() in QUOTA_FILESYSTEMS and bool(enforced)


def backing_filesystem(status: object) -> str | None:
    """The ``Backing Filesystem`` of a storage driver's status: docker's list of pairs
    (``DriverStatus``) or podman's object (``store.graphStatus``)."""
    if isinstance(status, dict):
        status = list(status.items())
    for pair in status if isinstance(status, list) else ():
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and pair[0] == "Backing Filesystem":
            return str(pair[1])
    return None


def size_option(limit_bytes: int | None, enforced: bool | None) -> dict[str, dict[str, str]]:
    """The create option that bounds the writable layer, both SDKs' spelling; none
    without a limit or without project quotas."""
    if limit_bytes is None or not enforced:
        return {}
    return {"storage_opt": {"size": str(limit_bytes)}}


@dataclass(frozen=True)
class StoreCalls:
    """The adapter's blocking calls the store makes: a narrow interface declared where it
    is used (as Nomad's pull coordinator takes a three-method image client)."""

    data_root: Callable[[], str]
    """The engine's own word for where it keeps images (its info); "" if none."""
    storage_status: Callable[[], object]
    """The storage driver's status as the engine's info says it (docker's
    ``DriverStatus`` pairs, podman's ``store.graphStatus``)."""
    image_entries: Callable[[], tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]]
    """The engine's image list and its list of every container (any owner, any state),
    both in docker's list shapes."""
    remove_image_ref: Callable[[str], None]
    """Remove one reference of an image (the image with its last), never forced."""


class EngineImages:
    """The store verbs of an engine runtime: its data root measured (the image GC's),
    its images listed with whether a container uses each, one removed; what a container
    has written there (the disk monitor's), and whether the store bounds it itself. Made
    with the seam and the adapter's `StoreCalls`."""

    def __init__(self, seam: EngineSeam, calls: StoreCalls) -> None:
        self.seam, self.calls = seam, calls
        self.root: str | None = None  # the data root, once the engine said it
        self.quotas: bool | None = None  # whether it has project quotas, once known
        self._layers: diskwalk.LayerMeter | None = None  # where each container writes

    async def data_root(self) -> DataRoot | None:
        return await self.seam.call("report its data root", self._measured_root, read=True)

    def _measured_root(self) -> DataRoot | None:
        if self.root is None:
            self.root = self.calls.data_root()  # the engine's word, once: it never moves
        if not self.root:
            return None
        if not self.seam.local():
            return DataRoot(self.root, None)
        return DataRoot(self.root, self._space(self.root), self.project_quotas())

    def project_quotas(self) -> bool | None:
        """Whether the store holds a writable layer to a size (`project_quotas`): asked
        once of the engine and the mount table; None for a store not on this machine."""
        if self.quotas is None and self.seam.local():
            if self.root is None:
                self.root = self.calls.data_root()
            backing = backing_filesystem(self.calls.storage_status())
            options = inventory.superoptions(Path(self.root)) if self.root else None
            self.quotas = project_quotas(backing, options)
        return self.quotas

    def disk_bound(self, spec: ContainerSpec) -> dict[str, Any]:
        """The create option that holds the writable layer to the job's disk limit,
        where the store has project quotas (blocking: asked once)."""
        if spec.disk_limit_bytes is None:
            return {}  # nothing to bound: the engine is not asked
        return size_option(spec.disk_limit_bytes, self.project_quotas())

    async def disk_usage(self, ref: str, *, budget_s: float) -> DiskUse | None:
        return await self.seam.call(
            f"measure the disk of {ref}", self._disk_usage, ref, budget_s, read=True
        )

    def _disk_usage(self, ref: str, budget_s: float) -> DiskUse | None:
        if self._layers is None:
            self._layers = diskwalk.LayerMeter()
        document = functools.partial(self.seam.or_missing, None, self.seam.document, ref)
        return self._layers.measure(ref, document, local=self.seam.local(), budget_s=budget_s)

    @staticmethod
    def _space(path: str) -> inventory.Space | None:
        """Unknown, not an error, when this process cannot measure it (the node in a
        container of its own that does not see the engine's disk)."""
        try:
            return inventory.space(Path(path))
        except OSError as exc:
            log.warning("the engine's data root %s: cannot measure: %s", path, exc)
            return None

    async def list_images(self) -> list[EngineImage]:
        return await self.seam.call("list images", self._images, read=True)

    def _images(self) -> list[EngineImage]:
        entries, containers = self.calls.image_entries()
        used = {fmt.sha_id(entry.get("ImageID")) for entry in containers}
        return [fmt.image_from_list(entry, used=used) for entry in entries]

    async def remove_image(self, image: EngineImage) -> bool:
        return await self.seam.call(f"remove image {image.id[:12]}", self._remove_whole, image)

    def _remove_whole(self, image: EngineImage) -> bool:
        """Each tag, then the image by its id (gone by then, unless only digests named
        it); a conflict (in use) stops there."""
        _, containers = self.calls.image_entries()
        if image.id in {fmt.sha_id(entry.get("ImageID")) for entry in containers}:
            # Untagging one of several names succeeds even in use: asked first, in the
            # same call, so a container made since the list keeps the names it was made by.
            log.info("image %s not removed: a container uses it now", image.id[:19])
            return False
        tags = [ref for ref in image.refs if "@" not in ref]
        return all(self._remove_ref_quietly(ref) for ref in [*tags, image.id])

    def _remove_ref_quietly(self, ref: str) -> bool:
        try:
            self.seam.or_missing(None, self.calls.remove_image_ref, ref)
        except self.seam.errors.api_error as exc:
            if getattr(exc, "status_code", None) != 409:
                raise
            words = str(getattr(exc, "explanation", None) or exc)
            log.info("image %s not removed: %s", ref, words)
            return False
        return True


class EngineMounts:
    """How an engine runtime takes host mounts (`MountSupport`): staged when the engine is
    this machine's, refused when it is another's; and the directories it calls its own
    (``engine_dirs``: the adapter's, as its info gives them: data root, run root)."""

    def __init__(self, seam: EngineSeam, engine_dirs: Callable[[], list[str]]) -> None:
        self.seam, self.engine_dirs = seam, engine_dirs

    async def support(self) -> MountSupport:
        dirs = await self.seam.call("report its directories", self.engine_dirs, read=True)
        return MountSupport(STAGED if self.seam.local() else REMOTE, tuple(d for d in dirs if d))
