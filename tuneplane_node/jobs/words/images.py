"""The image wing's words: the engine's image store as a launch and the GC read it, a GC
run, a prefetch's answer, the images and pulls the console lists."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuneplane_node.inventory import Space
from tuneplane_node.runtime.base import PullProgress


@dataclass(frozen=True)
class Prefetched:
    """What a prefetch found: the image ``present``, or ``pulling`` now."""

    image: str
    phase: str


@dataclass(frozen=True)
class ImageView:
    """An image the node pulled or its containers use. Times RFC 3339 UTC or None;
    ``in_use_by``: the node's containers made from it (any status: each holds it)."""

    image: str
    id: str
    size_bytes: int | None
    pulled_at: str | None
    last_used_at: str | None
    in_use_by: tuple[str, ...]
    private: bool


@dataclass(frozen=True)
class PullView:
    """A pull in flight (``pulling``), or a prefetch that failed (``failed``, with its
    error, kept as long as a failed launch's record). ``waiting``: the pending launches
    that wait on it."""

    image: str
    phase: str
    progress: PullProgress
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: tuple[str, ...]
    error: str | None


@dataclass(frozen=True)
class ImagesView:
    images: tuple[ImageView, ...]
    pulls: tuple[PullView, ...]


@dataclass(frozen=True)
class ImageStore:
    """The filesystem of the engine's data root, where its images are; every figure None
    when the node cannot know it (a remote engine, a runtime without images).
    ``used_ratio`` counts what others than root may not use (statvfs' available) as
    used, as kubelet does; ``pressure``: at or above the image GC's high threshold.
    Its inodes likewise (``f_favail`` free): ``inode_pressure`` at or above
    ``TUNEPLANE_INODE_HIGH_PERCENT``; None for a filesystem without a fixed count."""

    path: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    used_ratio: float | None = None
    pressure: bool | None = None
    inodes_total: int | None = None
    inodes_free: int | None = None
    inode_pressure: bool | None = None

    @classmethod
    def of(
        cls, path: str | None, space: Space | None, *, high_percent: int, inode_percent: int = 100
    ) -> ImageStore:
        if space is None or space.total <= 0:
            return cls(path=path)
        used = (space.total - space.available) / space.total
        store = cls(path, space.total, space.available, round(used, 4), used * 100 >= high_percent)
        if not space.inodes or space.inodes_available is None:
            return store
        files_used = (space.inodes - space.inodes_available) * 100
        pressed = files_used >= space.inodes * inode_percent
        return replace(
            store,
            inodes_total=space.inodes,
            inodes_free=space.inodes_available,
            inode_pressure=pressed,
        )

    @property
    def pressed(self) -> bool:
        """Under pressure of either kind: launches are refused, jobs may be stopped."""
        return bool(self.pressure or self.inode_pressure)

    def room(self, percent: int) -> int | None:
        """Bytes that may be written before use reaches ``percent``; None: unknown."""
        if self.total_bytes is None or self.free_bytes is None:
            return None
        return self.free_bytes - self.total_bytes * (100 - percent) // 100

    def inode_room(self, percent: int) -> int | None:
        """Inodes that may be made before their use reaches ``percent``; None: unknown."""
        if self.inodes_total is None or self.inodes_free is None:
            return None
        return self.inodes_free - self.inodes_total * (100 - percent) // 100


@dataclass(frozen=True)
class RemovedImage:
    """An image a GC run removed: a name it had (its id if none), its size as the
    engine stated it, and why it went."""

    image: str
    id: str
    size_bytes: int
    why: str


@dataclass(frozen=True)
class GcRun:
    """What one image GC run removed, and the store after it."""

    removed: tuple[RemovedImage, ...]
    store: ImageStore
    scope: str

    @property
    def freed_bytes(self) -> int:
        return sum(image.size_bytes for image in self.removed)
