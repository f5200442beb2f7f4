"""VolumeKeeper: a launch's volumes, from the rule on their sources to their binds.

The launcher asks it which volumes a launch lacks (it then waits in ``phase: pulling``),
waits for their fills beside the image's pull, and has it open each entry for the
staging (`MountStaging`), which binds it read-only: what the job sees is the file that
was checked, opened without following a link, and no write of the job reaches it.

It keeps the store's space too (`space`): a fill is admitted before its first byte
(entries evicted for it, or `VolumeStoreFull`), a run evicts down to the low threshold,
and a prefetch (`prefetch`) pins its entry. What a job uses is read from its
container's ``tuneplane.volumes`` label (labels are the truth); what a launch holds
between its look and its container (`hold`), and the pins, are the daemon's memory.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlsplit

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, parse_rfc3339
from tuneplane_node.errors import InvalidField, NodeError, VolumeStoreFull
from tuneplane_node.jobs.mounts.policy import Opened
from tuneplane_node.jobs.volumes.fills import VolumeFill, VolumeFills
from tuneplane_node.jobs.volumes.sources import PrivateRule, VolumeSources
from tuneplane_node.jobs.volumes.space import (
    Candidate,
    Space,
    evictable,
    filesystem,
    store_reading,
    to_evict,
)
from tuneplane_node.jobs.volumes.store import Entry, VolumeStore
from tuneplane_node.runtime.base import ContainerState, Mount, RegistryAuth, Volume
from tuneplane_node.runtime.fetching import Fetcher, shown
from tuneplane_node.runtime.ociregistry import OciRegistry, is_oci
from tuneplane_node.settings import VolumeSettings, env_name
from tuneplane_node.tasks import BackgroundTasks, by_awaiters
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry
from tuneplane_node.wire.values import LABEL_VOLUMES

log = logging.getLogger(__name__)
FIELD = "container.volumes"
OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
PRESENT, FILLING, FAILED = "present", "filling", "failed"
MAX_FAILED = 100  # failed prefetches remembered for GET /node/v1/volumes
Ps = Callable[[], Awaitable[list[ContainerState]]]


@dataclass(frozen=True)
class Prefetched:
    """A prefetch's answer: the entry (``present``) or its fill (``filling``)."""

    digest: str
    phase: str
    pin_expires_at: datetime
    entry: Entry | None = None
    fill: VolumeFill | None = None


@dataclass(frozen=True)
class Pin:
    """A prefetch's pin: its end on the monotonic clock (what counts) and the wall's."""

    until: float
    wall: datetime


@dataclass(frozen=True)
class FailedFill:
    digest: str
    source: str
    error: str
    at: datetime


@dataclass(frozen=True)
class EntryView:
    entry: Entry
    last_used_at: datetime | None
    in_use_by: tuple[str, ...] | None  # None: the engine did not say
    pin_expires_at: datetime | None


@dataclass(frozen=True)
class StoreView:
    """The store's place, its filesystem now (None: unreadable) and its thresholds."""

    path: Path
    space: Space | None
    high_percent: int
    low_percent: int


@dataclass(frozen=True)
class VolumesView:
    entries: list[EntryView]
    fills: list[VolumeFill]
    failed: list[FailedFill]
    store: StoreView


@dataclass(frozen=True)
class Evicted:
    entry: Entry
    last_used_at: datetime


@dataclass(frozen=True)
class VolumeGcRun:
    removed: list[Evicted]
    store: StoreView

    @property
    def freed_bytes(self) -> int:
        return sum(each.entry.size for each in self.removed)


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
        fetcher = Fetcher(stall_s=settings.local_image_pull_stall_s)
        self.insecure = frozenset(settings.volume_insecure_hosts)
        registry = OciRegistry(fetcher, insecure=self.insecure)
        self.sources = VolumeSources(registry, images=images)  # OCI references' digests
        self.fills = VolumeFills(
            self.store, fetcher, registry=registry, limit=settings.volume_fills, clock=clock,
            admit=self.admit, fetched=telemetry.volume_fetched,
        )  # fmt: skip
        self.high, self.low = settings.volume_gc_high_percent, settings.volume_gc_low_percent
        self.pin_s = settings.volume_pin_s
        self.ps = ps
        self.space_of = space_of
        self.telemetry = telemetry
        self.pins: dict[str, Pin] = {}  # digest -> when its pin ends
        self.holds: collections.Counter[str] = collections.Counter()
        self._held_since: set[str] = set()  # every digest held since the run began
        self.failed: dict[str, FailedFill] = {}
        self.tasks = BackgroundTasks(log)  # the prefetches' waits, the store's readings
        self._evicting = asyncio.Lock()
        self._reading = store_reading(
            self.store_view, lambda: self.store.generation, clock, self.tasks
        )

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
            port = parts.port or 80
        except ValueError:
            return False
        return f"{(parts.hostname or '').lower()}:{port}" in self.insecure

    async def missing(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The volumes whose entry is not in the store now."""
        return [volume for volume in volumes if await self.fills.entry(volume.sha256) is None]

    async def present(self, digest: str) -> bool:
        return await self.fills.entry(digest) is not None

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
            # A URL naming a registry volume's digest would skip the private rule that
            # guards it (the registry's credentials), and the other way round.
            os.close(fd)
            kind = "a registry volume's directory" if is_tree else "a downloaded file"
            said = f"sha256:{volume.sha256} is {kind} in the volume store"
            raise InvalidField(field, f"{said}: a source of the other kind cannot name it")
        self.store.touch(volume.sha256)  # its last use: eviction takes the oldest first
        self.telemetry.volume_served(entry.size)
        return Opened(Mount(str(entry.path), volume.path, True), fd, is_tree, field)

    # --- holds and pins ----------------------------------------------------------------

    def hold(self, volumes: Iterable[Volume]) -> Callable[[], None]:
        """Keep ``volumes``' entries from eviction until the returned release is called:
        a launch's, from its look at the store until its container (and label) exists."""
        digests = [volume.sha256 for volume in volumes]
        self.holds.update(digests)
        self._held_since.update(digests)

        def release() -> None:
            self.holds.subtract(digests)
            self.holds += collections.Counter()  # drops the zeros

        return release

    def pin_expires_at(self, digest: str) -> datetime | None:
        pin = self.pins.get(digest)
        return pin.wall if pin is not None and pin.until > self.clock.monotonic() else None

    def _pinned(self) -> set[str]:
        now = self.clock.monotonic()
        self.pins = {digest: pin for digest, pin in self.pins.items() if pin.until > now}
        return set(self.pins)

    # --- prefetch -----------------------------------------------------------------------

    async def prefetch(self, volume: Volume, *, wait: bool = False) -> Prefetched:
        """The entry of ``volume`` pinned for `pin_s`, and filled in the background when
        it is missing. Returns once the fill is admitted (its room found: else
        `VolumeStoreFull`; its source's size asked: else `VolumeFillFailed`) or retries a
        dropped connection in the background, or, with ``wait``, once it ended (its error
        raised)."""
        self.vet([volume], field="")
        resolved = await self.sources.resolved([volume], present=self.present)
        [volume] = resolved.volumes
        digest = volume.sha256
        pinned = self.clock.now() + timedelta(seconds=self.pin_s)
        self.pins[digest] = Pin(self.clock.monotonic() + self.pin_s, pinned)
        entry = await self.fills.entry(digest)
        if entry is not None:
            await self.fills.io(self.store.touch, digest)
            return Prefetched(digest, PRESENT, pinned, entry=entry)
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
            return Prefetched(digest, PRESENT, pinned, entry=entry)
        return Prefetched(digest, FILLING, pinned, fill=fill)

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

    # --- space --------------------------------------------------------------------------

    async def space(self) -> Space | None:
        """The store's filesystem now, with the store's own bytes; None when it cannot be
        read."""
        try:
            found = await self.fills.io(self.space_of, self.store.root)
            used = await self.fills.io(self.store.used_bytes)
        except OSError as exc:
            log.warning("volume store %s: cannot read its space: %s", self.store.root, exc)
            return None
        return Space(found.total_bytes, found.free_bytes, used)

    async def admit(self, fill: VolumeFill) -> None:
        """Return when ``fill`` may write its bytes below the high threshold (entries
        evicted for it where needed); else `VolumeStoreFull`, nothing removed. A size
        nobody said is admitted: nothing can be decided before its bytes."""
        if fill.bytes_total is None:
            return
        async with self._evicting:
            space = await self.space()
            if space is None or space.total_bytes == 0:
                return
            partial = await self.fills.io(_size_of, self.store.partial(fill.digest))
            reserved = sum(
                max(0, (other.bytes_total or 0) - other.bytes_done)
                for other in self.fills.fills.values()
                if other is not fill and other.admitted.is_set()
            )
            need = max(0, fill.bytes_total - partial) + reserved
            if need <= space.room(self.high):
                return
            candidates = await self._candidates()
            freeable = sum(c.entry.size for c in candidates)
            if need > space.room(self.high) + freeable:
                raise VolumeStoreFull(
                    source=shown(fill.source), needed_bytes=need,
                    room_bytes=max(0, space.room(self.high)), freeable_bytes=freeable,
                    free_bytes=space.free_bytes, high_percent=self.high,
                )  # fmt: skip
            await self._evict(to_evict(candidates, space, high=self.high, low=self.low, need=need))

    async def collect(self) -> VolumeGcRun:
        """One eviction run now: at or above the high threshold, the least recently used
        entries no rule keeps go until the use is at the low one. Runs one at a time."""
        async with self._evicting:
            await self.fills.io(self.store.empty_trash)
            space = await self.space()
            if space is None or not space.above(self.high):
                return VolumeGcRun([], self._store_view(space))
            chosen = to_evict(await self._candidates(), space, high=self.high, low=self.low)
            removed = await self._evict(chosen)
            return VolumeGcRun(removed, await self.store_view())

    async def store_view(self) -> StoreView:
        """The store now, for the GC's runs and the volumes' list."""
        return self._store_view(await self.space())

    async def reading(self) -> StoreView:
        """The store for health and inventory (`KeptReading`)."""
        return await self._reading.get()

    def _store_view(self, space: Space | None) -> StoreView:
        return StoreView(self.store.root, space, self.high, self.low)

    async def _candidates(self) -> list[Candidate]:
        """The entries no rule keeps, least recently used first; the users read from
        the engine (its error raised: nothing is evicted on a guess)."""
        self._held_since = set(self.holds)
        users = await self.users()
        entries = await self.fills.entries()
        last = {entry.digest: self._last_used(entry, users) for entry in entries}
        return evictable(entries, last_used=last, kept=frozenset(users) | self._kept_now())

    def _kept_now(self) -> set[str]:
        return self._held_since | set(self.holds) | self._pinned()

    async def _evict(self, chosen: list[Candidate]) -> list[Evicted]:
        removed: list[Evicted] = []
        for candidate in chosen:
            digest = candidate.entry.digest
            # Checked on the loop right before the rename, which nothing comes between: a
            # launch that held it meanwhile keeps it.
            if digest in self._kept_now():
                continue
            taken = self.store.take_out(digest)
            if taken is None:
                continue
            await self.fills.io(self.store.removed, taken)
            removed.append(Evicted(candidate.entry, candidate.last_used))
            self.telemetry.volume_evicted(digest, candidate.entry.size)
            log.info(
                "volume sha256:%s evicted: %d bytes, last used %s",
                digest, candidate.entry.size, candidate.last_used.isoformat(),
            )  # fmt: skip
        return removed

    async def users(self) -> dict[str, list[ContainerState]]:
        """The containers that use each digest, by their ``tuneplane.volumes`` label."""
        found: dict[str, list[ContainerState]] = {}
        for state in await self.ps() if self.ps is not None else []:
            for digest in filter(None, state.labels.get(LABEL_VOLUMES, "").split(",")):
                found.setdefault(digest, []).append(state)
        return found

    def _last_used(self, entry: Entry, users: dict[str, list[ContainerState]]) -> datetime:
        times = [datetime.fromtimestamp(entry.used_at, timezone.utc)]
        created = (parse_rfc3339(state.created_at) for state in users.get(entry.digest, []))
        return max([*times, *filter(None, created)])

    # --- the list -------------------------------------------------------------------------

    async def view(self) -> VolumesView:
        """The store's entries with their users and last use, the fills under way, the
        failed prefetches, and the store's space."""
        fills = list(self.fills.fills.values())  # before any wait: a fill may end meanwhile
        entries = await self.fills.entries()
        users: dict[str, list[ContainerState]] | None
        try:
            users = await self.users()
        except NodeError as exc:  # the entries stand; their users are unknown, not none
            log.debug("volume users unknown: %s", exc.message)
            users = None
        views = [
            EntryView(
                entry,
                self._last_used(entry, users or {}),
                None
                if users is None
                else tuple(sorted(state.name for state in users.get(entry.digest, []))),
                self.pin_expires_at(entry.digest),
            )
            for entry in entries
        ]
        return VolumesView(views, fills, list(self.failed.values()), await self.store_view())

    async def close(self) -> None:
        await self.tasks.close()
        await self.fills.close()


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _by_digest(volumes: Sequence[Volume]) -> list[tuple[str, str]]:
    """(digest, source) once per digest: two paths of one file are one fill."""
    return list({volume.sha256: volume.source for volume in reversed(volumes)}.items())
