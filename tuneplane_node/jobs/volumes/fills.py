"""VolumeFills: one fill per digest, shared by every launch that names it.

As `PullCoordinator` does for images: a launch joins the fill of its volume's digest (or
starts it), watches its progress, and leaves it; the download stops when the last one
leaves, and its partial file stays for the next fill to resume. A fill first asks the
file's size (the lane it takes, `FillLanes`), then downloads from the end of its partial
file with ``Range``, again after a dropped connection (up to `RETRIES` times in a row
without a byte), hashing as it writes; the entry appears only if the digest matches,
else the bytes are discarded and the fill fails. Downloads run on the event loop
(aiohttp's client, `Fetcher`); writes, hashing and every file call run in the fills' own
threads, one per lane slot, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, TypeVar

from tuneplane_node import durable
from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.jobs.images.pullrate import PullRate
from tuneplane_node.jobs.volumes.lanes import FillLanes
from tuneplane_node.jobs.volumes.layers import Budget, HostileLayer, unpack
from tuneplane_node.jobs.volumes.store import Entry, Hasher, VolumeStore
from tuneplane_node.runtime.base import RegistryAuth
from tuneplane_node.runtime.fetching import Download, Fetcher, shown
from tuneplane_node.runtime.ociregistry import Layer, OciRegistry, is_oci
from tuneplane_node.tasks import BackgroundTasks, by_awaiters

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRIES = 5
BACKOFF_S = 1.0
MAX_ENTRIES = 2**20  # files, directories and links of one OCI volume
# What an OCI volume's layers may unpack to, past their compressed size: text datasets
# compress about tenfold; a layer past that is a bomb.
EXPANSION, SLACK_BYTES = 20, 2**30


@dataclass
class VolumeFill:
    """One fill of one digest; ``bytes_done`` counts its partial file's bytes (those a
    resume found included), ``bytes_total`` the file's size (None while unknown)."""

    digest: str
    source: str
    clock: Clock = SYSTEM_CLOCK
    auth: RegistryAuth | None = None  # an OCI source's credentials (its repr hides them)
    task: asyncio.Task[Entry] | None = None
    waiters: int = 0
    bytes_done: int = 0
    bytes_total: int | None = None
    fetched: int = 0  # bytes this fill downloaded (not those it resumed from)
    hasher: Hasher | None = None  # the partial file's bytes so far
    listeners: list[Callable[[], None]] = field(default_factory=list)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)  # past its room check
    retrying: asyncio.Event = field(default_factory=asyncio.Event)  # a try failed, retried
    started_at: datetime = field(init=False)
    rate: PullRate = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.clock.now()
        self.rate = PullRate(self.clock.monotonic())

    def update(self, bytes_done: int) -> None:
        self.bytes_done = bytes_done
        self.rate.add(self.clock.monotonic(), bytes_done)
        for listener in self.listeners:
            listener()


class VolumeFills:
    """The fills of a store; `close` cancels them (their partial files stay)."""

    def __init__(
        self,
        store: VolumeStore,
        fetcher: Fetcher,
        *,
        registry: OciRegistry | None = None,
        limit: int,
        clock: Clock = SYSTEM_CLOCK,
        backoff_s: float = BACKOFF_S,
        admit: Callable[[VolumeFill], Awaitable[None]] | None = None,
        fetched: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.admit = admit  # before the first byte: raises when the file cannot fit
        self.fetched = fetched  # told of every batch downloaded (a metric)
        self.fetcher = fetcher
        self.registry = registry  # OCI sources' (none: URLs only)
        self.clock = clock
        self.backoff_s = backoff_s
        self.lanes = FillLanes(limit)
        self.fills: dict[str, VolumeFill] = {}
        self.tasks = BackgroundTasks(log)
        # Two a fill: its writes and its hashing run side by side (`_write`).
        self._threads = ThreadPoolExecutor(max_workers=2 * limit, thread_name_prefix="volume-fill")

    async def io(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)`` in the fills' threads: every file call of the store goes there."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(call, *args))

    async def entry(self, digest: str) -> Entry | None:
        """The complete entry of ``digest``, None while it is not in the store."""
        return await self.io(self.store.entry, digest)

    async def entries(self) -> list[Entry]:
        """Every complete entry of the store."""
        return await self.io(self.store.entries)

    def join(self, digest: str, source: str, auth: RegistryAuth | None = None) -> VolumeFill:
        """The fill of ``digest`` in flight, or a new one from ``source`` (with ``auth``:
        an OCI source's credentials), started now."""
        fill = self.fills.get(digest)
        if fill is None:
            fill = VolumeFill(digest, source, self.clock, auth)
            fill.task = self.tasks.spawn(
                self._fill(fill), name=f"volume fill sha256:{digest}", ended=by_awaiters
            )
            self.fills[digest] = fill
        fill.waiters += 1
        return fill

    async def wait(self, fill: VolumeFill) -> Entry:
        """The entry, once the joined fill has made it (its error raised); the fill left
        whatever happens, and cancelled when its last waiter leaves."""
        assert fill.task is not None
        try:
            return await asyncio.shield(fill.task)
        finally:
            fill.waiters -= 1
            if fill.waiters == 0 and not fill.task.done():
                self._forget(fill)
                fill.task.cancel()

    async def ensure(self, digest: str, source: str, auth: RegistryAuth | None = None) -> Entry:
        """The entry of ``digest``, filled from ``source`` first when it is not there."""
        entry = await self.entry(digest)
        return entry if entry is not None else await self.wait(self.join(digest, source, auth))

    async def _fill(self, fill: VolumeFill) -> Entry:
        try:
            if (present := await self.entry(fill.digest)) is not None:
                return present  # another fill made it since the caller looked
            entry = await (self._tree(fill) if is_oci(fill.source) else self._file(fill))
        except asyncio.CancelledError:
            log.info("volume fill of sha256:%s cancelled: nobody waits for it", fill.digest)
            raise
        except VolumeFillFailed as exc:
            log.warning("volume fill of sha256:%s failed: %s", fill.digest, exc.message)
            raise
        finally:
            self._forget(fill)
        log.info(
            "volume sha256:%s filled from %s: %d bytes, %d fetched",
            fill.digest,
            shown(fill.source),
            entry.size,
            fill.fetched,
        )
        return entry

    async def _admitted(self, fill: VolumeFill) -> None:
        if self.admit is not None:
            await self.admit(fill)
        fill.admitted.set()

    async def _file(self, fill: VolumeFill) -> Entry:
        """A URL's file: its size asked, admitted, downloaded, checked, renamed in."""
        fill.bytes_total = await self._retried(fill, lambda: self.fetcher.size(fill.source))
        await self._admitted(fill)

        def opened(offset: int) -> AbstractAsyncContextManager[Download]:
            return self.fetcher.open(fill.source, offset=offset)

        async with self.lanes.slot(fill.bytes_total):
            await self._retried(fill, lambda: self._download(fill, fill.digest, opened))
        return await self.io(self._verified, fill)

    async def _tree(self, fill: VolumeFill) -> Entry:
        """An OCI reference's layers: its manifest asked (their summed sizes admitted),
        each blob downloaded and checked, unpacked in order, the directory renamed in."""
        registry = self.registry
        assert registry is not None  # the keeper makes its fills with one
        manifest = await self._retried(fill, lambda: registry.manifest(fill.source, fill.auth))
        fill.bytes_total = manifest.size
        await self._admitted(fill)
        budget = Budget(entries=MAX_ENTRIES, bytes=manifest.size * EXPANSION + SLACK_BYTES)
        async with self.lanes.slot(fill.bytes_total):
            into = await self.io(self.store.unpacking, fill.digest)
            done = 0
            for layer in manifest.layers:
                await self._layer(fill, registry, layer, base=done)
                await self.io(self._unpacked, fill, layer, into, budget)
                done += layer.size
        return await self.io(self.store.commit_tree, fill.digest)

    async def _layer(
        self, fill: VolumeFill, registry: OciRegistry, layer: Layer, *, base: int
    ) -> None:
        """One layer's blob in its partial file (resumed), its sha256 checked."""

        def opened(offset: int) -> AbstractAsyncContextManager[Download]:
            return registry.blob(fill.source, layer, fill.auth, offset=offset)

        async def step() -> None:
            await registry.authorize(fill.source, fill.auth)  # a token that lapsed
            key = f"{fill.digest}.{layer.digest}"
            await self._download(fill, key, opened, base=base, most=layer.size)

        await self._retried(fill, step)
        got = fill.hasher.hexdigest() if fill.hasher is not None else ""
        if got != layer.digest:
            await self.io(self.store.discard_tree, fill.digest)
            reason = f"a layer hashes to sha256:{got}, not the sha256:{layer.digest} it names"
            raise VolumeFillFailed(source=shown(fill.source), reason=reason)

    def _unpacked(self, fill: VolumeFill, layer: Layer, into: Path, budget: Budget) -> None:
        """The checked layer unpacked over ``into``, its blob gone; a layer unsafe to
        unpack fails the fill, and nothing of it stays."""
        blob = self.store.partial(f"{fill.digest}.{layer.digest}")
        with self.store.tree_lock(fill.digest):
            try:
                unpack(blob, into, budget)
            except HostileLayer as exc:
                self.store.discard_tree(fill.digest)
                raise VolumeFillFailed(source=shown(fill.source), reason=str(exc)) from None
            blob.unlink()

    async def _retried(self, fill: VolumeFill, step: Callable[[], Awaitable[T]]) -> T:
        """``step()`` again after a retryable failure, while each try brings bytes
        or until `RETRIES` tries in a row brought none."""
        fruitless = 0
        while True:
            before = fill.bytes_done
            try:
                return await step()
            except VolumeFillFailed as exc:
                fruitless = 0 if fill.bytes_done > before else fruitless + 1
                if not exc.retryable or fruitless >= RETRIES:
                    raise
                log.info("volume fill of sha256:%s resumes: %s", fill.digest, exc.reason)
                fill.retrying.set()
            await self.clock.sleep(self.backoff_s)

    async def _download(
        self,
        fill: VolumeFill,
        key: str,
        opened: Callable[[int], AbstractAsyncContextManager[Download]],
        *,
        base: int = 0,
        most: int | None = None,
    ) -> None:
        """The file ``opened`` answers, into the partial file ``key`` from its end;
        ``base``: the bytes of the fill's earlier files (its progress counts them);
        ``most``: the file's size as its manifest says (a server sending more fails)."""
        offset, fill.hasher = await self.io(self.store.resume, key)
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
            partial = await self.io(self._opened, key, offset)
            writer = WrittenOut(partial, offset)
            # One batch is written and hashed on the fill's threads while the loop reads
            # the next: the download never waits for the disk and the hash, nor they for it.
            writing: asyncio.Future[int] | None = None
            received, hasher = offset, fill.hasher
            assert hasher is not None  # the resume's or a new one, set above
            try:
                async for batch in download.batches():
                    received += len(batch)
                    if most is not None and received > most:
                        if writing is not None:
                            await self._last_written(fill, writing)
                        await self.io(self.store.discard_tree, fill.digest)
                        reason = f"a layer's blob is longer than its manifest's {most} bytes"
                        raise VolumeFillFailed(source=shown(fill.source), reason=reason)
                    if writing is not None:
                        self._written(fill, await writing)
                    writing = asyncio.ensure_future(self._write(writer, hasher, batch))
                if writing is not None:
                    self._written(fill, await writing)
            finally:
                if writing is not None and not writing.done():
                    await self._last_written(fill, writing)
                await self.io(_closed, partial)

    async def _last_written(self, fill: VolumeFill, writing: asyncio.Future[int]) -> None:
        """The batch in the thread's hands when the download ended early (a drop, a
        cancel): awaited, as its thread holds the file, and counted if written (the next
        try's progress is judged by it); its own failure gives way to the download's."""
        with contextlib.suppress(OSError):
            self._written(fill, await asyncio.shield(writing))

    async def _write(self, writer: WrittenOut, hasher: Hasher, batch: bytearray) -> int:
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

    def _verified(self, fill: VolumeFill) -> Entry:  # a URL's file
        """The entry made of the partial file, if it is the file asked; else it goes."""
        got = fill.hasher.hexdigest() if fill.hasher is not None else ""
        if got != fill.digest:
            self.store.discard(fill.digest)
            raise VolumeFillFailed(
                source=shown(fill.source),
                reason=f"its bytes hash to sha256:{got}, not the sha256:{fill.digest} asked",
            )
        return self.store.commit(fill.digest)

    def _forget(self, fill: VolumeFill) -> None:
        if self.fills.get(fill.digest) is fill:
            del self.fills[fill.digest]

    async def close(self) -> None:
        """Cancel every fill and wait for them to end; then the threads and connections."""
        await self.tasks.close()
        self.fills.clear()
        await self.fetcher.close()
        self._threads.shutdown(wait=True)


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
