"""Downloads: a fill's file from its server into its partial file (or hashed only, for a
proof), resumed from the partial file's end, each batch written and hashed on the
fills' threads while the loop reads the next, and each batch past the room found for the
fill asked room for first (`VolumeRoom.grant`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import IO, Protocol, TypeVar

from tuneplane_node import durable
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import Download, shown
from tuneplane_node.fetch.ociregistry import is_oci
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words.volumes import Hasher, VolumeFill

T = TypeVar("T")


class Io(Protocol):
    """The fills' threads: ``call(*args)`` run there."""

    async def __call__(self, call: Callable[..., T], *args: object) -> T: ...


class Downloads:
    """The downloads of one store's fills; ``io`` runs a file call in the fills' threads,
    ``grant`` finds room for a fill's bytes, ``fetched`` is told of each batch."""

    def __init__(
        self,
        store: VolumeStore,
        *,
        io: Io,
        grant: Callable[[VolumeFill, int], Awaitable[None]] | None = None,
        fetched: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.io = io
        self.grant = grant
        self.fetched = fetched

    async def into(
        self,
        fill: VolumeFill,
        key: str | None,
        opened: Callable[[int], AbstractAsyncContextManager[Download]],
        *,
        base: int = 0,
        most: int | None = None,
    ) -> None:
        """The file ``opened`` answers, into the partial file ``key`` from its end (None:
        hashed only, nothing kept); ``base``: the bytes of the fill's earlier files (its
        progress counts them); ``most``: the file's size as its manifest says (a server
        sending more fails)."""
        offset, fill.hasher = (
            (0, hashlib.sha256()) if key is None else await self.io(self.store.resume, key)
        )
        known = fill.bytes_total if not base and not is_oci(fill.source) else None
        if known is not None and offset > known:
            offset, fill.hasher = 0, hashlib.sha256()  # not this file's: start again
        fill.update(base + offset)
        if offset and offset == known:  # all there: a restart before its check
            return
        async with opened(offset) as download:
            if offset and not download.resumed:  # the server sends it all again
                offset, fill.hasher = 0, hashlib.sha256()
                fill.update(base)
            if download.total is not None and not is_oci(fill.source):
                fill.bytes_total = download.total
            partial = None if key is None else await self.io(self._opened, key, offset)
            writer = Discarded() if partial is None else WrittenOut(partial, offset)
            try:
                await self._received(
                    fill, download, writer, offset=offset, most=most, keep=partial is not None
                )
            finally:
                if partial is not None:
                    await self.io(_closed, partial)

    async def _received(
        self,
        fill: VolumeFill,
        download: Download,
        writer: Callable[[bytearray], None],
        *,
        offset: int,
        most: int | None,
        keep: bool,
    ) -> None:
        """The download's batches written (``keep``: into the store, each past the room
        found asked for more first) and hashed: one on the fill's threads while the loop
        reads the next, so the download never waits for the disk and the hash, nor they
        for it."""
        writing: asyncio.Future[int] | None = None
        received, hasher = offset, fill.hasher
        assert hasher is not None  # the resume's or a new one, set by the caller
        try:
            async for batch in download.batches():
                received += len(batch)
                if most is not None and received > most:
                    if writing is not None:
                        await self._last_written(fill, writing)
                    await self.io(self.store.discard_tree, fill.key)
                    reason = f"a layer's blob is longer than its manifest's {most} bytes"
                    raise VolumeFillFailed(source=shown(fill.source), reason=reason)
                if writing is not None:
                    self._written(fill, await writing)
                if keep and self.grant is not None and fill.bytes_done + len(batch) > fill.granted:
                    await self.grant(fill, fill.bytes_done + len(batch))
                writing = asyncio.ensure_future(self._write(writer, hasher, batch))
            if writing is not None:
                self._written(fill, await writing)
        finally:
            if writing is not None and not writing.done():
                await self._last_written(fill, writing)

    async def _last_written(self, fill: VolumeFill, writing: asyncio.Future[int]) -> None:
        """The batch in the thread's hands when the download ended early (a drop, a
        cancel): awaited, as its thread holds the file, and counted if written (the next
        try's progress is judged by it); its own failure gives way to the download's."""
        with contextlib.suppress(OSError):
            self._written(fill, await asyncio.shield(writing))

    async def _write(
        self, writer: Callable[[bytearray], None], hasher: Hasher, batch: bytearray
    ) -> int:
        """The batch written and hashed at once, on two of the fills' threads (both let
        go of the GIL): a batch costs the slower of the two, not their sum."""
        await asyncio.gather(self.io(writer, batch), self.io(hasher.update, batch))
        return len(batch)

    def _written(self, fill: VolumeFill, size: int) -> None:
        fill.fetched += size
        if self.fetched is not None:
            self.fetched(size)
        fill.update(fill.bytes_done + size)

    def _opened(self, key: str, offset: int) -> IO[bytes]:
        path = self.store.partial(key)
        partial = open(path, "r+b" if path.exists() else "w+b")  # noqa: SIM115 (closed by _closed)
        partial.truncate(offset)
        partial.seek(offset)
        return partial


class Discarded:
    """A proof's writer: the bytes are hashed, never kept."""

    def __call__(self, batch: bytearray) -> None:
        return None


class WrittenOut:
    """A partial file's writer, one batch at a time on the fills' threads: the batch
    written and the disk started on it at once (`write_behind`: the fill ends with a
    short fsync, not one that writes the whole file, 0.65 to 0.8 s of a 2 GiB fill on
    this project's development machine), and the batches before it, on the disk by
    then, let go of by the page cache (`drop_behind`): a fill holds a few MiB of the
    cache, never the whole file (`bench/volumes.py`)."""

    def __init__(self, partial: IO[bytes], offset: int) -> None:
        self.partial = partial  # opened at ``offset`` (`_opened`): no file call on the loop
        self.kept_from = offset  # where the bytes still in the cache begin

    def __call__(self, batch: bytearray) -> None:
        start, fd = self.partial.tell(), self.partial.fileno()
        self.partial.write(batch)
        durable.write_behind(fd, start, len(batch))
        durable.drop_behind(fd, self.kept_from, start - self.kept_from)
        self.kept_from = start


def _closed(partial: IO[bytes]) -> None:
    partial.flush()
    os.fsync(partial.fileno())
    partial.close()
