"""No room: the engine's image store, the node's own disk, the volume store (507); and a
volume whose source did not give its bytes (502)."""

from __future__ import annotations

from typing import ClassVar

from tuneplane_node.errors.base import NodeError


class InsufficientStorage(NodeError):
    """A pull refused before it starts: the filesystem of the engine's data root is at
    or above the high threshold, or the image (the registry's compressed size) would not
    fit in the room left below it, even with every image a GC run may remove gone (then
    nothing was removed). Nothing was reserved or created. Its figures are fields of the
    answer too (`figures`): what the pull needs and the disk's free bytes, never what a
    GC run could free (``freeable_bytes`` is null: a tenant's size is no probe of the
    other tenants' images)."""

    status = 507
    code: ClassVar[str] = "insufficient_storage"

    def __init__(
        self,
        *,
        image: str,
        free_bytes: int,
        high_percent: int,
        needed_bytes: int | None = None,
        room_bytes: int | None = None,
        freeable_bytes: int | None = None,
    ) -> None:
        if needed_bytes is None:
            why = (
                f"the engine's image store is at or above its {high_percent}% threshold "
                "after image GC"
            )
        else:
            why = (
                f"it is {needed_bytes} bytes compressed, more than the engine's image store "
                f"can hold below its {high_percent}% threshold: nothing was removed"
            )
        super().__init__(
            f"no room to pull {image}: {why} ({free_bytes} bytes free, threshold {high_percent}%)"
        )
        self.image = image
        self.free_bytes = free_bytes
        self.high_percent = high_percent
        self.needed_bytes = needed_bytes
        self.room_bytes = room_bytes
        self.freeable_bytes = freeable_bytes

    def figures(self) -> dict[str, int | None] | None:
        """The answer's fields: bytes the pull needs below the threshold (null when the
        store is at it already), free now, and what a GC run could free (null: not
        counted)."""
        return {
            "needed_bytes": self.needed_bytes,
            "free_bytes": self.free_bytes,
            "freeable_bytes": self.freeable_bytes,
            "high_percent": self.high_percent,
        }


class DiskPressure(InsufficientStorage):
    """A launch refused before anything is made: the filesystem of the engine's data root
    is at or above its high threshold (the node's ``disk_pressure`` condition)."""

    code = "insufficient_storage"

    def __init__(
        self, *, used_ratio: float, free_bytes: int, total_bytes: int, high_percent: int
    ) -> None:
        NodeError.__init__(
            self,
            f"disk pressure: the engine's store is {used_ratio * 100:.1f}% used "
            f"({free_bytes} bytes free of {total_bytes}), at or above its {high_percent}% "
            "threshold; no job is launched here until it is below",
        )
        self.image = ""
        self.used_ratio = used_ratio
        self.total_bytes = total_bytes
        self.free_bytes = free_bytes
        self.high_percent = high_percent
        self.needed_bytes = None
        self.room_bytes = None
        self.freeable_bytes = None


class InodePressure(InsufficientStorage):
    """A launch refused before anything is made: the inodes of the engine's data root's
    filesystem are used at or above their high threshold (``inode_pressure``)."""

    code = "insufficient_storage"

    def __init__(self, *, inodes_free: int, inodes_total: int, high_percent: int) -> None:
        NodeError.__init__(
            self,
            f"inode pressure: the engine's store has {inodes_free} inodes free of "
            f"{inodes_total}, at or above its {high_percent}% threshold of inodes used; no "
            "job is launched here until it is below",
        )
        self.image = ""
        self.free_bytes = 0
        self.high_percent = high_percent
        self.inodes_free = inodes_free
        self.inodes_total = inodes_total
        self.needed_bytes = None
        self.room_bytes = None
        self.freeable_bytes = None

    def figures(self) -> dict[str, int | None] | None:
        return None  # its bytes are not what is short: the message says the inodes


class StateDiskFull(InsufficientStorage):
    """The node state file could not be written for want of space. The state asked for
    is in force, but a restart would not keep it: the operator frees space, asks again."""

    code = "insufficient_storage"

    def __init__(self, *, state: str, path: str, reason: str) -> None:
        NodeError.__init__(
            self,
            f"the node is {state} now, but {path} could not be written ({reason}): a "
            "restart would not keep it; free space on that disk and ask again",
        )
        self.state = state
        self.path = path
        self.reason = reason

    def figures(self) -> dict[str, int | None] | None:
        return None  # the node's own disk: the engine's figures do not apply


class PrivateRecordUnwritable(InsufficientStorage):
    """A pull with credentials refused before it starts: the private-image record could
    not be written, and an image pulled without its record would run for anyone."""

    code = "insufficient_storage"

    def __init__(self, *, image: str, path: str, reason: str) -> None:
        NodeError.__init__(
            self,
            f"no pull of {image} with credentials: the private-image record {path} could "
            f"not be written ({reason}); free space on that disk and launch again",
        )
        self.image = image
        self.path = path
        self.reason = reason

    def figures(self) -> dict[str, int | None] | None:
        return None  # the node's own disk: the engine's figures do not apply


class VolumeStoreFull(InsufficientStorage):
    """A volume fill refused: before its first byte, the file (its size as its server
    or manifest said, less what a partial file of it holds) does not fit below the
    store's high threshold even with every entry eviction may remove gone (nothing was
    removed); or later, its bytes found no room (the store filled meanwhile). It says
    what the fill needs, never what eviction could free: a tenant's size is no lever on
    the other tenants' entries. Its figures are fields of the answer too (`figures`)."""

    code = "volume_store_full"

    def __init__(
        self, *, source: str, needed_bytes: int, free_bytes: int, high_percent: int
    ) -> None:
        NodeError.__init__(
            self,
            f"no room to fill volume {source}: it needs {needed_bytes} bytes below the "
            f"volume store's {high_percent}% threshold ({free_bytes} bytes free)",
        )
        self.source = source
        self.room_bytes = None
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.freeable_bytes = None
        self.high_percent = high_percent


class VolumeFillFailed(NodeError):
    """A volume could not be filled from its source: the server refused or has no such
    file, the connection kept dropping, or the bytes hash to another digest (then nothing
    of them is kept). ``retryable``: a dropped connection, which a fill resumes."""

    status = 502
    code: ClassVar[str] = "volume_fill_failed"

    def __init__(self, *, source: str, reason: str, retryable: bool = False) -> None:
        super().__init__(f"volume {source} cannot be filled: {reason}")
        self.source = source
        self.reason = reason
        self.retryable = retryable
