"""VolumeRoom: the volume store's space, and what eviction may take to make room.

What no eviction takes: an entry a job binds (read from its container's
``tuneplane.volumes`` label: labels are the truth), one a launch holds between its look
and its container (`hold`), one a prefetch pinned (`pin`, the daemon's memory). What it
takes first: partial files no fill is writing (another source's leftovers, a cancelled
fill's), then entries, least recently used first.

Room is found for bytes, never for a claim (design, principle 12): a fill is admitted
before its first byte when its size (its server's word, or its manifest's) fits below the
high threshold with every evictable entry gone, else it is refused (`VolumeStoreFull`,
nothing removed); but nothing is evicted then. Entries go as the fill's bytes arrive and
need the room: each `GRANT_BYTES` ahead of what it wrote (`grant`). A server that claims
100 GB and sends 1 MB evicts room for a few MB at most.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tuneplane_node.clock import Clock, parse_rfc3339
from tuneplane_node.errors import VolumeStoreFull
from tuneplane_node.fetch.fetching import shown
from tuneplane_node.jobs.volumes.access import Accesses
from tuneplane_node.jobs.volumes.space import Candidate, evictable, store_reading, to_evict
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words.volumes import (
    Entry,
    Evicted,
    Space,
    StoreView,
    VolumeFill,
    VolumeGcRun,
)
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.labels import volumes_of
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.telemetry import Telemetry
from tuneplane_node.wire.values import Volume

log = logging.getLogger(__name__)
GRANT_BYTES = 64 * 2**20  # room found ahead of a fill's bytes, at most
Ps = Callable[[], Awaitable[list[ContainerState]]]


@dataclass(frozen=True)
class Pin:
    """A prefetch's pin: its end on the monotonic clock (what counts) and the wall's."""

    until: float
    wall: datetime


@dataclass(frozen=True)
class Thresholds:
    high: int
    low: int
    pin_s: float


class VolumeRoom:
    """The room of one volume store. ``in_flight``: the fills under way (their partial
    files are not evicted, and the room they were granted and did not write yet is
    theirs)."""

    def __init__(
        self,
        store: VolumeStore,
        accesses: Accesses,
        thresholds: Thresholds,
        *,
        in_flight: Callable[[], Iterable[VolumeFill]],
        clock: Clock,
        ps: Ps | None,
        space_of: Callable[[Path], Space],
        telemetry: Telemetry,
        tasks: BackgroundTasks,
    ) -> None:
        self.store = store
        self.accesses = accesses
        self.high, self.low, self.pin_s = thresholds.high, thresholds.low, thresholds.pin_s
        self.in_flight = in_flight
        self.clock = clock
        self.ps = ps
        self.space_of = space_of
        self.telemetry = telemetry
        self.grant_bytes = GRANT_BYTES
        self.pins: dict[str, Pin] = {}  # digest -> when its pin ends
        self.holds: collections.Counter[str] = collections.Counter()
        self._held_since: set[str] = set()  # every digest held since the run began
        self._evicting = asyncio.Lock()
        self._reading = store_reading(self.store_view, lambda: store.generation, clock, tasks)

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

    def pin(self, digest: str) -> datetime:
        """``digest``'s entry kept from eviction for `pin_s` from now; when it ends."""
        wall = self.clock.now() + timedelta(seconds=self.pin_s)
        self.pins[digest] = Pin(self.clock.monotonic() + self.pin_s, wall)
        return wall

    def pin_expires_at(self, digest: str) -> datetime | None:
        pin = self.pins.get(digest)
        return pin.wall if pin is not None and pin.until > self.clock.monotonic() else None

    def _pinned(self) -> set[str]:
        now = self.clock.monotonic()
        self.pins = {digest: pin for digest, pin in self.pins.items() if pin.until > now}
        return set(self.pins)

    # --- space --------------------------------------------------------------------------

    async def space(self) -> Space | None:
        """The store's filesystem now, with the store's own bytes; None when it cannot be
        read."""
        try:
            found = await asyncio.to_thread(self.space_of, self.store.root)
            used = await asyncio.to_thread(self.store.used_bytes)
        except OSError as exc:
            log.warning("volume store %s: cannot read its space: %s", self.store.root, exc)
            return None
        return Space(found.total_bytes, found.free_bytes, used)

    def _granted_to_others(self, fill: VolumeFill) -> int:
        """Room the other fills were granted and have not written yet."""
        return sum(
            max(0, other.granted - other.bytes_done)
            for other in self.in_flight()
            if other is not fill
        )

    async def admit(self, fill: VolumeFill) -> None:
        """Return when ``fill``'s size (less what its partial file holds) could be written
        below the high threshold, with every evictable entry gone if need be; else
        `VolumeStoreFull`. Nothing is evicted for a size: `grant` evicts for bytes. A
        size nobody said is admitted: nothing can be decided before its bytes."""
        if fill.bytes_total is None:
            return
        async with self._evicting:
            space = await self.space()
            if space is None or space.total_bytes == 0:
                return
            partial = await asyncio.to_thread(_size_of, self.store.partial(fill.key))
            need = max(0, fill.bytes_total - partial)
            room = space.room(self.high) - self._granted_to_others(fill)
            if need <= room:
                return
            freeable = sum(c.entry.size for c in await self._candidates())
            if need > room + freeable:
                log.warning(
                    "volume fill of sha256:%s refused: %d bytes, %d left below %d%%, %d "
                    "evictable", fill.digest, need, room, self.high, freeable,
                )  # fmt: skip
                raise self._full(fill, need, space)

    async def grant(self, fill: VolumeFill, upto: int) -> None:
        """Room for ``fill``'s bytes up to ``upto`` and `GRANT_BYTES` past it (its size at
        most): entries evicted for it, least recently used first, where the store has
        not that room below high; else `VolumeStoreFull` (the store filled meanwhile)."""
        mark = upto + self.grant_bytes
        if fill.bytes_total is not None:
            mark = max(upto, min(mark, fill.bytes_total))
        async with self._evicting:
            space = await self.space()
            need = mark - fill.bytes_done + self._granted_to_others(fill)
            if space is not None and space.total_bytes and need > space.room(self.high):
                candidates = await self._candidates()
                await self._evict(
                    to_evict(candidates, space, high=self.high, low=self.low, need=need)
                )
                space = await self.space()
                if space is not None and need > space.room(self.high):
                    raise self._full(fill, need, space)
            fill.granted = mark

    def _full(self, fill: VolumeFill, need: int, space: Space) -> VolumeStoreFull:
        """What a tenant is told: what its fill needs, not what the node could free."""
        return VolumeStoreFull(
            source=shown(fill.source), needed_bytes=need, free_bytes=space.free_bytes,
            high_percent=self.high,
        )  # fmt: skip

    async def collect(self) -> VolumeGcRun:
        """One eviction run now: at or above the high threshold, the least recently used
        entries no rule keeps go until the use is at the low one. Runs one at a time."""
        async with self._evicting:
            await asyncio.to_thread(self.store.empty_trash)
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

    # --- eviction -----------------------------------------------------------------------

    async def _candidates(self) -> list[Candidate]:
        """The partial files no fill writes (oldest first), then the entries no rule
        keeps, least recently used first; the users read from the engine (its error
        raised: nothing is evicted on a guess)."""
        self._held_since = set(self.holds)
        users = await self.users()
        entries = await asyncio.to_thread(self.store.entries)
        last = {entry.digest: self.last_used(entry, users) for entry in entries}
        kept = frozenset(users) | self._kept_now()
        stale = await asyncio.to_thread(self.store.partials, self._writing())
        leftovers = [Candidate(each, _at(each.used_at)) for each in stale]
        return sorted(leftovers, key=lambda c: c.last_used) + evictable(
            entries, last_used=last, kept=kept
        )

    def _kept_now(self) -> set[str]:
        return self._held_since | set(self.holds) | self._pinned()

    async def _evict(self, chosen: list[Candidate]) -> list[Evicted]:
        removed: list[Evicted] = []
        for candidate in chosen:
            if candidate.entry.path.parent.name != "sha256":  # a partial file no fill had
                if candidate.entry.path.name.split(".", 1)[0] not in self._writing():
                    await asyncio.to_thread(self.store.removed, candidate.entry.path)
                continue
            digest = candidate.entry.digest
            # Checked on the loop right before the rename, which nothing comes between: a
            # launch that held it meanwhile keeps it.
            if digest in self._kept_now():
                continue
            taken = self.store.take_out(digest)
            if taken is None:
                continue
            await asyncio.to_thread(self.store.removed, taken)
            await asyncio.to_thread(self.accesses.forget, digest)
            removed.append(Evicted(candidate.entry, candidate.last_used))
            self.telemetry.volume_evicted(digest, candidate.entry.size)
            log.info(
                "volume sha256:%s evicted: %d bytes, last used %s",
                digest, candidate.entry.size, candidate.last_used.isoformat(),
            )  # fmt: skip
        return removed

    def _writing(self) -> set[str]:
        return {fill.key for fill in self.in_flight()}

    async def users(self) -> dict[str, list[ContainerState]]:
        """The containers that use each digest, by their ``tuneplane.volumes`` label."""
        found: dict[str, list[ContainerState]] = {}
        for state in await self.ps() if self.ps is not None else []:
            for digest in volumes_of(state.labels):
                found.setdefault(digest, []).append(state)
        return found

    @staticmethod
    def last_used(entry: Entry, users: dict[str, list[ContainerState]]) -> datetime:
        times = [_at(entry.used_at)]
        created = (parse_rfc3339(state.created_at) for state in users.get(entry.digest, []))
        return max([*times, *filter(None, created)])


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
