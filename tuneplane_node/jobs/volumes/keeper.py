"""VolumeKeeper: a launch's volumes, from the rule on their sources to their binds.

The launcher asks it which volumes a launch lacks (it then waits in ``phase: pulling``),
waits for their fills beside the image's pull, and has it open each entry for the
staging (`MountStaging`), which binds it read-only: what the job sees is the file that
was checked, opened without following a link, and no write of the job reaches it.

Its store's room is `VolumeRoom`'s (room.py): a fill admitted before its first byte,
entries evicted as its bytes need them, a run down to the low threshold, what a launch
holds and a prefetch (`prefetch`) pins. Who may be handed an entry is the sources'
rule (`VolumeSources`: the private rule, possession).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import InvalidField, NodeError, VolumeAccessDenied
from tuneplane_node.fetch.fetching import Fetcher, shown
from tuneplane_node.fetch.ociregistry import OciRegistry, is_oci
from tuneplane_node.jobs.volumes.access import Accesses
from tuneplane_node.jobs.volumes.fills import VolumeFills
from tuneplane_node.jobs.volumes.room import Thresholds, VolumeRoom
from tuneplane_node.jobs.volumes.sources import FIELD, PrivateRule, VolumeSources, other_kind
from tuneplane_node.jobs.volumes.space import filesystem
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words.mounts import Opened
from tuneplane_node.jobs.words.volumes import (
    Entry,
    EntryView,
    FailedFill,
    Space,
    StoreView,
    VolumeFill,
    VolumeGcRun,
    VolumePrefetched,
    VolumesView,
)
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.reach import Reach
from tuneplane_node.settings import VolumeSettings, env_name
from tuneplane_node.tasks import BackgroundTasks, by_awaiters
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry
from tuneplane_node.wire.values import PRESENT, Mount, RegistryAuth, Volume
from tuneplane_node.wire.volumes import FILLING

log = logging.getLogger(__name__)
OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_FAILED = 100  # failed prefetches remembered for GET /node/v1/volumes
Ps = Callable[[], Awaitable[list[ContainerState]]]


class VolumeKeeper:
    def __init__(
        self,
        settings: VolumeSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        ps: Ps | None = None,
        space_of: Callable[[Path], Space] = filesystem,
        telemetry: Telemetry = NO_TELEMETRY,
        images: PrivateRule | None = None,
    ) -> None:
        self.store = VolumeStore(settings.volume_dir)
        self.clock = clock
        self.fetcher = Fetcher(
            stall_s=settings.local_image_pull_stall_s,
            reach=Reach(settings.volume_allowed_networks),
            insecure=frozenset(settings.volume_insecure_hosts),
            ca_file=settings.volume_ca_file,
            clock=clock,
        )
        registry = OciRegistry(self.fetcher)
        self.accesses = Accesses(self.store.root)
        self.fills = VolumeFills(
            self.store, self.fetcher, registry=registry, accesses=self.accesses,
            limit=settings.volume_fills, timeout_s=settings.volume_fill_timeout_s,
            clock=clock, admit=self._admit, grant=self._grant, fetched=telemetry.volume_fetched,
        )  # fmt: skip
        # OCI references' digests and the private rule; URLs' possession
        self.sources = VolumeSources(registry, self.fills, images=images)
        self.failed: dict[str, FailedFill] = {}
        self.tasks = BackgroundTasks(log)  # the prefetches' waits, the store's readings
        self.room = VolumeRoom(
            self.store, self.accesses,
            Thresholds(settings.volume_gc_high_percent, settings.volume_gc_low_percent,
                       settings.volume_pin_s),
            in_flight=lambda: self.fills.fills.values(), clock=clock, ps=ps,
            space_of=space_of, telemetry=telemetry, tasks=self.tasks,
        )  # fmt: skip
        self.telemetry = telemetry

    def vet(self, volumes: Sequence[Volume], *, field: str = FIELD) -> None:
        """A 422 naming each volume whose plain-HTTP host the operator did not list
        (``<field>[i].source``; a prefetch's: ``source``)."""
        refused = [
            InvalidField(
                f"{field}[{i}].source" if field else "source",
                f"plain http:// only for the hosts in {env_name('volume_insecure_hosts')}",
            )
            for i, volume in enumerate(volumes)
            if not self._secure_enough(volume.source)
        ]
        if refused:
            raise InvalidField.of(refused)

    def _secure_enough(self, source: str) -> bool:
        if is_oci(source):
            return True  # https, unless its registry is listed (`OciRegistry`)
        parts = urlsplit(source)
        if parts.scheme == "https":
            return True
        try:
            return self.fetcher.insecure_host(parts.hostname or "", parts.port)
        except ValueError:
            return False

    async def missing(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The volumes a fill must make or prove: an entry not in the store now, or a
        URL's entry its access was not handed (its source proves it in the fill)."""
        return [volume for volume in volumes if await self._here(volume) is None]

    async def _here(self, volume: Volume) -> Entry | None:
        """The entry this volume may be bound to now: an OCI volume's (the private rule
        was the sources'), a URL's where the entry recorded its access."""
        if is_oci(volume.source):
            return await self.fills.entry(volume.sha256)
        handed = await self.fills.handed(volume.sha256, volume.source)
        return await self.fills.entry(volume.sha256) if handed else None

    def join(
        self,
        volumes: Sequence[Volume],
        listener: Callable[[], None],
        auth: Mapping[str, RegistryAuth | None] | None = None,
    ) -> list[VolumeFill]:
        """The fills of ``volumes`` (one per digest; ``auth``: an OCI digest's
        credentials), started where none runs; each tells ``listener`` of its progress
        until `wait_all` leaves it."""
        fills = [
            self.fills.join(digest, source, (auth or {}).get(digest))
            for digest, source in _by_digest(volumes)
        ]
        for fill in fills:
            fill.listeners.append(listener)
        return fills

    async def wait_all(self, fills: Sequence[VolumeFill], listener: Callable[[], None]) -> None:
        """Until every fill has its entry; the first failure is raised and every fill
        left (each stops when nobody else waits for it)."""
        waits = [asyncio.ensure_future(self.fills.wait(fill)) for fill in fills]
        try:
            if waits:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
                for each in done:
                    each.result()
        finally:
            for each in waits:
                each.cancel()
            if waits:
                await asyncio.wait(waits)
            for fill in fills:
                if listener in fill.listeners:
                    fill.listeners.remove(listener)

    def open(self, volumes: Sequence[Volume]) -> list[Opened]:
        """Each volume's entry opened without following a link, to be bound read-only at
        its path. Blocking; a 422 naming the volume whose entry is gone."""
        opened: list[Opened] = []
        try:
            for i, volume in enumerate(volumes):
                opened.append(self._opened(volume, f"{FIELD}[{i}]"))
        except BaseException:
            for each in opened:
                each.close()
            raise
        return opened

    def _opened(self, volume: Volume, field: str) -> Opened:
        entry = self.store.entry(volume.sha256)
        if entry is None:
            raise InvalidField(field, f"sha256:{volume.sha256} is not in the volume store")
        fd = os.open(entry.path, OPEN)
        is_tree = stat.S_ISDIR(os.fstat(fd).st_mode)  # an OCI volume's: a directory
        if is_tree != is_oci(volume.source):
            os.close(fd)
            raise other_kind(volume, field, is_tree=is_tree)
        if not is_tree and not self.accesses.holds(volume.sha256, self.accesses.of(volume.source)):
            os.close(fd)  # the sources' rule, checked again where the entry is handed over
            raise VolumeAccessDenied(
                digest=volume.sha256, source=shown(volume.source),
                reason="its source has not shown it holds the bytes",
            )  # fmt: skip
        self.store.touch(volume.sha256)  # its last use: eviction takes the oldest first
        self.telemetry.volume_served(entry.size)
        return Opened(Mount(str(entry.path), volume.path, True), fd, is_tree, field)

    # --- the room's, for the launcher and the routes ---------------------------------------

    def hold(self, volumes: Iterable[Volume]) -> Callable[[], None]:
        """`VolumeRoom.hold`: the launch's volumes kept from eviction until released."""
        return self.room.hold(volumes)

    async def collect(self) -> VolumeGcRun:
        """`VolumeRoom.collect`: one eviction run now."""
        return await self.room.collect()

    async def reading(self) -> StoreView:
        """`VolumeRoom.reading`: the store for health and inventory."""
        return await self.room.reading()

    async def _admit(self, fill: VolumeFill) -> None:
        await self.room.admit(fill)

    async def _grant(self, fill: VolumeFill, upto: int) -> None:
        await self.room.grant(fill, upto)

    # --- prefetch -----------------------------------------------------------------------

    async def prefetch(self, volume: Volume, *, wait: bool = False) -> VolumePrefetched:
        """The entry of ``volume`` pinned for `pin_s`, and filled in the background when
        it is missing. Returns once the fill is admitted (its room found: else
        `VolumeStoreFull`; its source's size asked: else `VolumeFillFailed`) or retries a
        dropped connection in the background, or, with ``wait``, once it ended (its error
        raised)."""
        self.vet([volume], field="")
        resolved = await self.sources.resolved([volume], field="")
        [volume] = resolved.volumes
        digest = volume.sha256
        pinned = self.room.pin(digest)
        entry = await self._here(volume)
        if entry is not None:
            await self.fills.io(self.store.touch, digest)
            return VolumePrefetched(digest, PRESENT, pinned, entry=entry)
        self.failed.pop(digest, None)
        fill = self.fills.join(digest, volume.source, resolved.auth.get(digest))
        kept = self.tasks.spawn(
            self._kept(fill, volume), name=f"volume prefetch sha256:{digest}", ended=by_awaiters
        )
        assert fill.task is not None
        # Until admitted, refused, or retrying a dropped connection (then in the background).
        steps = {asyncio.ensure_future(event.wait()) for event in (fill.admitted, fill.retrying)}
        try:
            await asyncio.wait({*steps, fill.task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for step in steps:
                step.cancel()
        if wait or fill.task.done():
            entry = await asyncio.shield(kept)  # the fill's error, raised
            return VolumePrefetched(digest, PRESENT, pinned, entry=entry)
        return VolumePrefetched(digest, FILLING, pinned, fill=fill)

    async def _kept(self, fill: VolumeFill, volume: Volume) -> Entry:
        """The prefetch's wait on its fill (it keeps the fill going); a failure is kept
        for the list, a success told to the private record."""
        try:
            entry = await self.fills.wait(fill)
            await self.sources.pulled([volume], {fill.digest: fill.auth})
            return entry
        except NodeError as exc:
            if len(self.failed) >= MAX_FAILED:
                self.failed.pop(next(iter(self.failed)))
            self.failed[fill.digest] = FailedFill(
                fill.digest, fill.source, exc.message, self.clock.now()
            )
            raise

    # --- the list -------------------------------------------------------------------------

    async def view(self) -> VolumesView:
        """The store's entries with their users and last use, the fills under way, the
        failed prefetches, and the store's space."""
        fills = list(self.fills.fills.values())  # before any wait: a fill may end meanwhile
        entries = await self.fills.entries()
        users: dict[str, list[ContainerState]] | None
        try:
            users = await self.room.users()
        except NodeError as exc:  # the entries stand; their users are unknown, not none
            log.debug("volume users unknown: %s", exc.message)
            users = None
        views = [
            EntryView(
                entry,
                self.room.last_used(entry, users or {}),
                None
                if users is None
                else tuple(sorted(state.name for state in users.get(entry.digest, []))),
                self.room.pin_expires_at(entry.digest),
            )
            for entry in entries
        ]
        return VolumesView(views, fills, list(self.failed.values()), await self.room.store_view())

    async def close(self) -> None:
        await self.tasks.close()
        await self.fills.close()


def _by_digest(volumes: Sequence[Volume]) -> list[tuple[str, str]]:
    """(digest, source) once per digest: two paths of one file are one fill."""
    return list({volume.sha256: volume.source for volume in reversed(volumes)}.items())
