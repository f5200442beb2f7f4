"""VolumeFills: one fill per digest and access, shared by every launch that names both.

As `PullCoordinator` does for images: a launch joins the fill of its volume's digest from
its own access (`Accesses`: the URL it names, or the OCI repository and credentials it
asks with), or starts it, watches its progress, and leaves it; the download stops when
the last one leaves, and its partial file stays for the next fill of that access to
resume. A launch never waits on a fill another source started, and never resumes the
bytes another source left (design, principle 12): a tenant naming the public hash of
another's weights with a source that trickles holds nobody's launch but its own.

A fill first asks the file's size (the lane it takes, `FillLanes`), then downloads from
the end of its partial file with ``Range``, again after a dropped connection (up to
`RETRIES` tries in a row that bring less than `PROGRESS_BYTES`), hashing as it writes;
the entry appears only if the digest matches, else the bytes are discarded and the fill
fails. A fill has ``timeout_s`` in all. An entry that is here already is handed to a
fill's access only when the entry recorded it, or once the source proves it holds the
bytes (`Possession`: a few ranges; a server without ranges sends the whole file, hashed
and not kept). Downloads run on the event loop (aiohttp's client, `Fetcher`), each fill
in a session of its own; writes, hashing and every file call run in the fills' own
threads, one per lane slot, never on the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TypeVar

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import VolumeAccessDenied, VolumeFillFailed
from tuneplane_node.fetch.fetching import PROGRESS_BYTES, Download, Fetcher, shown
from tuneplane_node.fetch.ociregistry import Layer, OciRegistry, is_oci
from tuneplane_node.jobs.volumes.access import Accesses
from tuneplane_node.jobs.volumes.downloads import Downloads
from tuneplane_node.jobs.volumes.lanes import FillLanes
from tuneplane_node.jobs.volumes.layers import Budget, HostileLayer, unpack
from tuneplane_node.jobs.volumes.possession import Possession
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words.volumes import Entry, VolumeFill
from tuneplane_node.settings import env_name
from tuneplane_node.tasks import BackgroundTasks, by_awaiters
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRIES = 5
BACKOFF_S = 1.0
TIMEOUT_S = 6 * 3600.0  # TUNEPLANE_VOLUME_FILL_TIMEOUT_S's default
MAX_ENTRIES = 2**20  # files, directories and links of one OCI volume, at most
# Its entry budget, taken from its manifest: one entry per BYTES_PER_ENTRY compressed
# bytes, ENTRY_SLACK more. A tar header of an empty file gzips to some 22 bytes: a layer
# of 1.4 MB unpacked to 63,921 inodes; real files compress to more than 128 bytes each.
BYTES_PER_ENTRY, ENTRY_SLACK = 128, 10_000
# What an OCI volume's layers may unpack to, past their compressed size: text datasets
# compress about tenfold; a layer past that is a bomb.
EXPANSION, SLACK_BYTES = 20, 2**30
Key = tuple[str, str]  # (digest, access)


class VolumeFills:
    """The fills of a store; `close` cancels them (their partial files stay)."""

    def __init__(
        self,
        store: VolumeStore,
        fetcher: Fetcher,
        *,
        registry: OciRegistry | None = None,
        accesses: Accesses | None = None,
        limit: int,
        timeout_s: float = TIMEOUT_S,
        clock: Clock = SYSTEM_CLOCK,
        backoff_s: float = BACKOFF_S,
        admit: Callable[[VolumeFill], Awaitable[None]] | None = None,
        grant: Callable[[VolumeFill, int], Awaitable[None]] | None = None,
        fetched: Callable[[int], None] | None = None,
    ) -> None:
        self.store = store
        self.admit = admit  # before the first byte: raises when the file cannot fit
        self.fetcher = fetcher
        self.registry = registry  # OCI sources' (none: URLs only)
        self.accesses = accesses if accesses is not None else Accesses(store.root)
        self.clock = clock
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.lanes = FillLanes(limit)
        self.fills: dict[Key, VolumeFill] = {}
        self.tasks = BackgroundTasks(log)
        # Two a fill: its writes and its hashing run side by side (`_write`).
        self._threads = ThreadPoolExecutor(max_workers=2 * limit, thread_name_prefix="volume-fill")
        self.possession = Possession(fetcher, io=self.io, clock=clock)
        self.downloads = Downloads(store, io=self.io, grant=grant, fetched=fetched)

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

    async def handed(self, digest: str, source: str, auth: RegistryAuth | None = None) -> bool:
        """Whether the entry of ``digest`` is here and recorded for this access: it is
        then bound at once, without a fill or a proof."""
        access = self.accesses.of(source, auth)
        return await self.entry(digest) is not None and await self.io(
            self.accesses.holds, digest, access
        )

    def join(self, digest: str, source: str, auth: RegistryAuth | None = None) -> VolumeFill:
        """The fill of ``digest`` from this access (``source``, and ``auth``: an OCI
        source's credentials) in flight, or a new one, started now."""
        access = self.accesses.of(source, auth)
        fill = self.fills.get((digest, access))
        if fill is None:
            fill = VolumeFill(digest, source, access, self.clock, auth)
            fill.task = self.tasks.spawn(
                self._fill(fill), name=f"volume fill sha256:{digest}", ended=by_awaiters
            )
            self.fills[(digest, access)] = fill
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
        """The entry of ``digest`` for ``source``: at once where this access has it, else
        filled, or proved, first."""
        return await self.wait(self.join(digest, source, auth))

    async def _fill(self, fill: VolumeFill) -> Entry:
        try:
            async with self.fetcher.session() as fill.http:
                entry = await self._within(fill)
        except asyncio.CancelledError:
            log.info("volume fill of sha256:%s cancelled: nobody waits for it", fill.digest)
            raise
        except (VolumeFillFailed, VolumeAccessDenied) as exc:
            log.warning("volume fill of sha256:%s failed: %s", fill.digest, exc.message)
            raise
        finally:
            fill.http = None
            self._forget(fill)
        log.info(
            "volume sha256:%s filled from %s: %d bytes, %d fetched",
            fill.digest, shown(fill.source), entry.size, fill.fetched,
        )  # fmt: skip
        return entry

    async def _within(self, fill: VolumeFill) -> Entry:
        """The fill's work, within its ``timeout_s``; its access recorded on the entry."""
        made = self._tree(fill) if is_oci(fill.source) else self._file(fill)
        try:
            entry = await self.clock.wait_for(made, self.timeout_s)
        except asyncio.TimeoutError:
            reason = (
                f"not done within {self.timeout_s:g} s "
                f"({env_name('volume_fill_timeout_s')}); its partial file stays"
            )
            raise VolumeFillFailed(source=shown(fill.source), reason=reason) from None
        await self.io(self.accesses.record, fill.digest, fill.access)
        return entry

    async def _admitted(self, fill: VolumeFill) -> None:
        if self.admit is not None:
            await self.admit(fill)
        fill.admitted.set()

    async def _file(self, fill: VolumeFill) -> Entry:
        """A URL's file: the entry when here (proved for this access), else its size
        asked, admitted, downloaded, checked, linked in."""
        http = fill.http
        assert http is not None  # `_fill`'s session
        if (present := await self.entry(fill.digest)) is not None:
            return await self._proved(fill, present)
        await self.io(self.store.discard_others, fill.digest, self._keys_of(fill.digest))
        fill.bytes_total = await self._retried(fill, lambda: http.size(fill.source))
        await self._admitted(fill)

        def opened(offset: int) -> AbstractAsyncContextManager[Download]:
            return http.open(fill.source, offset=offset)

        async with self.lanes.slot(fill.bytes_total):
            await self._retried(fill, lambda: self.downloads.into(fill, fill.key, opened))
        return await self.io(self._verified, fill)

    async def _proved(self, fill: VolumeFill, present: Entry) -> Entry:
        """``present`` for this fill's access: at once where the entry recorded it, else
        once the source proved it holds the bytes (a few ranges; the whole file, hashed
        and not kept, from a server without ranges); else `VolumeAccessDenied`."""
        if await self.io(self.accesses.holds, fill.digest, fill.access):
            return present
        fill.bytes_total = present.size
        fill.admitted.set()  # nothing to write: no room to find
        try:
            proof = await self.possession.ranged(fill.source, present)
        except asyncio.TimeoutError:
            proof = False
        if proof is None:
            proof = await self._hashed_whole(fill)
        if not proof:
            raise VolumeAccessDenied(
                digest=fill.digest, source=shown(fill.source),
                reason="its source does not serve the bytes the node holds for it",
            )  # fmt: skip
        return present

    async def _hashed_whole(self, fill: VolumeFill) -> bool:
        """Whether the source's whole file hashes to the digest (nothing of it kept)."""
        http = fill.http
        assert http is not None

        def opened(offset: int) -> AbstractAsyncContextManager[Download]:
            return http.open(fill.source)

        async with self.lanes.slot(fill.bytes_total):
            await self._retried(fill, lambda: self.downloads.into(fill, None, opened))
        return fill.hasher is not None and fill.hasher.hexdigest() == fill.digest

    def _keys_of(self, digest: str) -> set[str]:
        """The partial files of ``digest``'s fills under way (each its own access's)."""
        return {fill.key for (each, _), fill in self.fills.items() if each == digest}

    async def _tree(self, fill: VolumeFill) -> Entry:
        """An OCI reference's layers: its manifest asked (their summed sizes admitted),
        each blob downloaded and checked, unpacked in order, the directory renamed in.
        An entry here already is handed on by the private rule (`VolumeSources`)."""
        registry, http = self.registry, fill.http
        assert registry is not None and http is not None  # the keeper's; `_fill`'s
        if (present := await self.entry(fill.digest)) is not None:
            return present
        await self.io(self.store.discard_others, fill.digest, self._keys_of(fill.digest))
        manifest = await self._retried(
            fill, lambda: registry.manifest(http, fill.source, fill.auth)
        )
        fill.bytes_total = manifest.size
        await self._admitted(fill)
        budget = budget_of(manifest.size)
        async with self.lanes.slot(fill.bytes_total):
            into = await self.io(self.store.unpacking, fill.key)
            done = 0
            for layer in manifest.layers:
                await self._layer(fill, registry, layer, base=done)
                await self.io(self._unpacked, fill, layer, into, budget)
                done += layer.size
        return await self.io(self.store.commit_tree, fill.key, fill.digest)

    async def _layer(
        self, fill: VolumeFill, registry: OciRegistry, layer: Layer, *, base: int
    ) -> None:
        """One layer's blob in its partial file (resumed), its sha256 checked."""
        http = fill.http
        assert http is not None

        def opened(offset: int) -> AbstractAsyncContextManager[Download]:
            return registry.blob(http, fill.source, layer, fill.auth, offset=offset)

        async def step() -> None:
            await registry.authorize(http, fill.source, fill.auth)  # a token that lapsed
            key = f"{fill.key}.{layer.digest}"
            await self.downloads.into(fill, key, opened, base=base, most=layer.size)

        await self._retried(fill, step)
        got = fill.hasher.hexdigest() if fill.hasher is not None else ""
        if got != layer.digest:
            await self.io(self.store.discard_tree, fill.key)
            log.warning(
                "volume sha256:%s: a layer's blob hashes to sha256:%s, not sha256:%s",
                fill.digest, got, layer.digest,
            )  # fmt: skip
            reason = f"a layer's bytes do not match the sha256:{layer.digest} its manifest names"
            raise VolumeFillFailed(source=shown(fill.source), reason=reason)

    def _unpacked(self, fill: VolumeFill, layer: Layer, into: Path, budget: Budget) -> None:
        """The checked layer unpacked over ``into``, its blob gone; a layer unsafe to
        unpack fails the fill, and nothing of it stays."""
        blob = self.store.partial(f"{fill.key}.{layer.digest}")
        with self.store.tree_lock(fill.key):
            try:
                unpack(blob, into, budget)
            except HostileLayer as exc:
                self.store.discard_tree(fill.key)
                raise VolumeFillFailed(source=shown(fill.source), reason=str(exc)) from None
            blob.unlink()

    async def _retried(self, fill: VolumeFill, step: Callable[[], Awaitable[T]]) -> T:
        """``step()`` again after a retryable failure, while each try brings progress
        (`PROGRESS_BYTES`: a trickle is none) or until `RETRIES` tries in a row brought
        none."""
        fruitless = 0
        while True:
            before = fill.bytes_done
            try:
                return await step()
            except VolumeFillFailed as exc:
                moved = fill.bytes_done - before >= PROGRESS_BYTES
                fruitless = 0 if moved else fruitless + 1
                if not exc.retryable or fruitless >= RETRIES:
                    raise
                log.info("volume fill of sha256:%s resumes: %s", fill.digest, exc.reason)
                fill.retrying.set()
            await self.clock.sleep(self.backoff_s)

    def _verified(self, fill: VolumeFill) -> Entry:  # a URL's file
        """The entry made of the partial file, if it is the file asked; else it goes. What
        the bytes hash to is the operator's to read, in the log: an answer says only that
        they did not match (a tenant must not learn the hash of what a source served)."""
        got = fill.hasher.hexdigest() if fill.hasher is not None else ""
        if got != fill.digest:
            self.store.discard(fill.key)
            log.warning(
                "volume sha256:%s from %s: its bytes hash to sha256:%s", fill.digest,
                shown(fill.source), got,
            )  # fmt: skip
            raise VolumeFillFailed(
                source=shown(fill.source),
                reason=f"its bytes do not match the sha256:{fill.digest} asked",
            )
        return self.store.commit(fill.key, fill.digest)

    def _forget(self, fill: VolumeFill) -> None:
        if self.fills.get((fill.digest, fill.access)) is fill:
            del self.fills[(fill.digest, fill.access)]

    async def close(self) -> None:
        """Cancel every fill and wait for them to end; then the threads."""
        await self.tasks.close()
        self.fills.clear()
        self._threads.shutdown(wait=True)


def budget_of(compressed: int) -> Budget:
    """What an OCI volume of ``compressed`` bytes (its manifest's layers) may unpack to:
    entries and bytes, decided before its first byte, counted while it unpacks."""
    entries = min(MAX_ENTRIES, ENTRY_SLACK + compressed // BYTES_PER_ENTRY)
    return Budget(entries=entries, bytes=compressed * EXPANSION + SLACK_BYTES)
