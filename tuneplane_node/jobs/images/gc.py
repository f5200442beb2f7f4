"""ImageCollector: the engine's disk kept below its high threshold, and pulls that fit.

kubelet's image GC, with the node's own records (`ImageLedger`) for what the engine
cannot say: which images are the node's doing and when its containers last used each.
A run (every ``TUNEPLANE_IMAGE_GC_INTERVAL_S``, before every pull, and after a pull that
filled the disk) removes images least recently used first while the data root's
filesystem is at or above the high threshold, until it is at or below the low one;
one unused past ``TUNEPLANE_IMAGE_GC_MAX_UNUSED_S`` goes whatever the disk.

Room is made for bytes, never for a claim (design, principle 12): a pull whose size (its
registry's word, a tenant's registry) does not fit below high even with every removable
image gone is refused before it starts; one that fits only with images removed starts
with nothing removed, and images go as its bytes come and need the room: while a pull
runs, the room below high is kept `AHEAD_BYTES` ahead of what it has left (`ahead`).
A manifest that claims 100 GB and a blob that sends 1 MB remove room for a window at most.

Never removed: an image any container is made from (the engine's word, of every
container, the node's or not, running or not); one the node holds now (`ImageHolds`:
a pull in flight, a pending launch, a launch between its image check and its
container); one prefetched less than ``TUNEPLANE_IMAGE_PIN_S`` ago and not used since;
one younger than the minimum age; under ``node`` scope, one the ledger does not hold
(the operator's). A removal the engine refuses (in use after all) is skipped, logged.

One run at a time, as a task of the collector's: a caller waits for its result, and
leaving does not cancel it. Each engine call is the pool's, with its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from tuneplane_node.clock import Clock, within
from tuneplane_node.errors import InodePressure, InsufficientStorage, NodeError
from tuneplane_node.fetch import registry
from tuneplane_node.jobs.images.pulls import PullCoordinator, SharedPull
from tuneplane_node.jobs.words.images import GcRun, ImageStore, RemovedImage
from tuneplane_node.references import ImageName
from tuneplane_node.runtime.facts import DataRoot, EngineImage
from tuneplane_node.settings import ImageSettings
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
READ_TTL_S = 1.0
READ_WAIT_S = 0.25  # a wedged engine must not hold health (0.5 s, the promise)
DISK_FULL = ("disk is full", "no space left on device")  # runtime/engines/pulling.py's words
AHEAD_BYTES = 512 * 2**20  # room kept ahead of a pull's bytes, at most


class ImageStoreRuntime(Protocol):
    """What the collector asks of the engine: its images and its data root."""

    async def data_root(self) -> DataRoot | None: ...
    async def list_images(self) -> list[EngineImage]: ...
    async def remove_image(self, image: EngineImage) -> bool: ...


class ImageRecord(Protocol):
    """What the collector reads of a ledger record (`imageledger.ImageRecord`)."""

    @property
    def pulled_at(self) -> datetime | None: ...
    @property
    def prefetched_at(self) -> datetime | None: ...
    @property
    def last_used_at(self) -> datetime | None: ...


class Ledger(Protocol):
    """The node's image records, by engine id (`imageledger.ImageLedger`)."""

    def get(self, image_id: str) -> ImageRecord | None: ...
    def forget(self, id: str) -> None: ...


class _NoLedger:
    """A node that keeps no records: nothing is the node's."""

    def get(self, image_id: str) -> ImageRecord | None:
        return None

    def forget(self, id: str) -> None:
        return None


NO_LEDGER = _NoLedger()


class Sizer(Protocol):
    def __call__(self, image: str, auth: RegistryAuth | None) -> int | None:
        """The bytes a pull of the image downloads, as its registry states them; None
        when it does not say. Blocking."""


def _key(ref: str) -> tuple[str, str]:
    """A reference as held and matched: its repository path and tag or digest, not its
    registry (podman says ``localhost/x`` for what docker calls ``x``): holding one
    image too many is safe, one too few is not."""
    name = ImageName.parse(ref)
    return name.path, name.reference


class ImageHolds:
    """The images the node is about to use, counted by reference: what no run removes."""

    def __init__(self) -> None:
        self._held: collections.Counter[tuple[str, str]] = collections.Counter()

    @contextlib.contextmanager
    def hold(self, image: str) -> Iterator[None]:
        key = _key(image)
        self._held[key] += 1
        try:
            yield
        finally:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]

    def held(self, refs: Iterable[str]) -> bool:
        return any(_key(ref) in self._held for ref in refs)


@dataclass(frozen=True)
class Candidate:
    """An image a run may remove, and when it was last used."""

    image: EngineImage
    last_use: datetime

    @property
    def name(self) -> str:
        return self.image.refs[0] if self.image.refs else self.image.id


class ImageCollector:
    """The image GC and the pull gate of one engine."""

    def __init__(
        self,
        runtime: ImageStoreRuntime,
        settings: ImageSettings,
        *,
        pulls: PullCoordinator,
        clock: Clock,
        sizer: Sizer = registry.compressed_size,
    ) -> None:
        self.runtime = runtime
        self.pulls = pulls
        self.ledger: Ledger = pulls.ledger or NO_LEDGER
        self.clock = clock
        self.telemetry = pulls.telemetry
        self.sizer = sizer
        pulls.on_failure.append(self.after_failed_pull)
        pulls.on_progress.append(self.ahead)
        self.scope = settings.image_gc
        self.high, self.low = settings.image_gc_high_percent, settings.image_gc_low_percent
        self.inode_high, self.inode_low = settings.inode_high_percent, settings.inode_low_percent
        # Whether a pressure is the GC's to chase down to low: not one the node cannot
        # explain (the disk monitor says, `jobs.disk.accounting`).
        self.chase: Callable[[], bool] = lambda: True
        self.min_age_s = settings.image_gc_min_age_s
        self.max_unused_s = settings.image_gc_max_unused_s
        self.interval_s = settings.image_gc_interval_s
        self.pin_s = settings.image_pin_s
        self.holds = ImageHolds()
        self.ahead_bytes = AHEAD_BYTES
        # Under pressure, run before any image is removed for it (the disk monitor's
        # stops of the jobs filling the store); True: the jobs it stopped are the
        # pressure, and this run removes nothing for it (their layers fill the store).
        self.relievers: list[Callable[[], Awaitable[bool]]] = []
        self.last_store = ImageStore()
        self._first_seen: dict[str, datetime] = {}  # id -> when a run first listed it
        self._run: asyncio.Task[GcRun] | None = None
        self._ahead: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[ImageStore] | None = None
        self._read_at, self._first = -math.inf, True
        self._tasks = BackgroundTasks(log)

    # --- the store ----------------------------------------------------------------------

    async def reading(self) -> ImageStore:
        """The store for health, never waiting on a wedged engine: the last reading,
        with one refresh behind it when it is older than a second (the first one is
        waited for, `READ_WAIT_S` at most)."""
        now = self.clock.monotonic()
        if now - self._read_at > READ_TTL_S and (self._refresh is None or self._refresh.done()):
            self._read_at = now
            self._refresh = self._tasks.spawn(self.store(), name="image store measure")
        if self._first and self._refresh is not None:
            self._first = False
            with contextlib.suppress(asyncio.TimeoutError):
                await within(asyncio.shield(self._refresh), READ_WAIT_S)
        return self.last_store

    async def store(self) -> ImageStore:
        """The data root's filesystem now; unknown when the engine cannot say."""
        try:
            root = await self.runtime.data_root()
        except NodeError as exc:
            log.debug("image store unknown: %s", exc.message)
            return ImageStore()
        path, space = (root.path, root.space) if root is not None else (None, None)
        self.last_store = ImageStore.of(
            path, space, high_percent=self.high, inode_percent=self.inode_high
        )
        return self.last_store

    # --- runs ---------------------------------------------------------------------------

    async def collect(self, *, room_for: int = 0) -> GcRun:
        """One run now, or the one under way; what it removed and the store after.
        ``room_for``: bytes a pull needs written below the high threshold: a run under
        way, which does not know them, is waited for, then one more runs."""
        if self._run is not None and not self._run.done():
            done = await asyncio.shield(self._run)
            if not room_for:
                return done
        if self._run is None or self._run.done():
            self._run = self._tasks.spawn(self._collect(room_for), name="image gc", ended=_warned)
        return await asyncio.shield(self._run)

    def kick(self) -> None:
        """A run soon, awaited by nobody (before a pull, after one that filled the disk);
        one that fails is a warning, as an interval's."""
        if self._run is None or self._run.done():
            self._run = self._tasks.spawn(self._collect(0), name="image gc", ended=_warned)

    def after_failed_pull(self, error: NodeError) -> None:
        if any(words in error.message.lower() for words in DISK_FULL):
            log.warning("a pull filled the engine's disk: image GC runs now")
            # Room a pull needs (its size is not known here: a look ahead's worth), which a
            # pressure nobody explains does not forbid.
            run = self.collect(room_for=self.ahead_bytes)  # after a run under way, if one
            self._tasks.spawn(run, name="image gc for a pull", ended=_warned)

    def ahead(self, pull: SharedPull) -> None:
        """A pull's bytes came: when the room below high is less than what it has left
        (`AHEAD_BYTES` at most), a run makes that room (one such check at a time; the
        store's kept reading, a second old at most: no engine call per report)."""
        if self.scope == "off" or (self._ahead is not None and not self._ahead.done()):
            return
        progress = pull.progress
        left = self.ahead_bytes
        if progress.bytes_total:
            left = min(left, max(0, progress.bytes_total - progress.bytes_done))
        if left:
            self._ahead = self._tasks.spawn(self._room_ahead(left), name="image gc ahead")

    async def _room_ahead(self, left: int) -> None:
        room = (await self.reading()).room(self.high)
        if room is not None and room < left:
            try:
                await self.collect(room_for=left)
            except NodeError as exc:
                log.warning("image GC ahead of a pull: %s", exc.message)

    async def maintain(self) -> None:
        """A run every interval, as long as the node runs: one that fails is logged, and
        the next interval tries again (the engine may be down; a bug must not end the
        collection for good)."""
        while True:
            await self.clock.sleep(self.interval_s)
            try:
                await self.collect()
            except NodeError as exc:
                log.warning("image GC: %s", exc.message)
            except Exception:
                log.exception("image GC failed on a bug")

    async def _collect(self, room_for: int) -> GcRun:
        store = await self.store()
        if self.scope == "off":
            return GcRun((), store, self.scope)
        relieved = store.pressed and any([await relieve() for relieve in self.relievers])
        chased = store.pressed and self.chase()
        now = self.clock.now()
        images = await self.runtime.list_images()
        candidates = sorted(self._candidates(images, now), key=lambda c: c.last_use)
        removed: list[RemovedImage] = []
        short = room_for > 0 and (store.room(self.high) or 0) < room_for
        freeing = (chased or short) and not relieved
        for candidate in candidates:
            seen = store if freeing else ImageStore()
            why = self._why(candidate, seen, now, room_for, to_low=chased)
            # Held since the list was read (a launch came): kept. Checked on the loop
            # right before the removal, which nothing can come between.
            if why is None or self._held(candidate.image):
                continue
            if await self._remove(candidate, why):
                removed.append(self._removed(candidate, why))
                store = await self.store()
        self.telemetry.image_gc_run()
        if removed:
            log.info("image GC: removed %d images; store %s", len(removed), _shown(store))
        return GcRun(tuple(removed), store, self.scope)

    def _candidates(self, images: list[EngineImage], now: datetime) -> Iterator[Candidate]:
        """The images no rule keeps, each with its last use."""
        listed = {image.id for image in images}
        self._first_seen = {i: t for i, t in self._first_seen.items() if i in listed}
        for image in images:
            seen = self._first_seen.setdefault(image.id, now)
            record = self.ledger.get(image.id)
            if image.in_use or self._held(image):
                continue
            if record is None and self.scope != "all":
                continue  # not the node's: the operator's to remove
            times = _times(record)
            arrived = record.pulled_at if record and record.pulled_at else seen
            if (now - arrived).total_seconds() < self.min_age_s or self._pinned(record, now):
                continue
            yield Candidate(image, max(times) if times else seen)

    def _held(self, image: EngineImage) -> bool:
        """Held by a launch, or being pulled (a launch's pull, or a prefetch)."""
        pulled = {_key(ref) for ref in self.pulls.images()}
        return self.holds.held(image.refs) or any(_key(ref) in pulled for ref in image.refs)

    def _pinned(self, record: ImageRecord | None, now: datetime) -> bool:
        """Prefetched less than the pin's time ago, and not used since."""
        fetched = record.prefetched_at if record is not None else None
        if fetched is None or (now - fetched).total_seconds() >= self.pin_s:
            return False
        used = record.last_used_at if record is not None else None
        return used is None or used < fetched

    def _why(
        self, candidate: Candidate, store: ImageStore, now: datetime, room: int, *, to_low: bool
    ) -> str | None:
        """Why the candidate goes now, or None: past the max unused age; else, for a
        pull, while it does not fit below high (and no further); else, in a run that
        began under pressure (``to_low``), until the disk is at or below low."""
        unused = (now - candidate.last_use).total_seconds()
        if self.max_unused_s and unused >= self.max_unused_s:
            return f"unused for {unused:.0f} s (max {self.max_unused_s:g} s)"
        if store.used_ratio is None:
            return None
        used = store.used_ratio * 100
        if room > 0 and (store.room(self.high) or 0) < room:
            return f"disk {used:.1f}% used: {room} bytes to pull below high {self.high}%"
        if to_low and used > self.low:
            return f"disk {used:.1f}% used (high {self.high}%, freeing to low {self.low}%)"
        inode_room = store.inode_room(self.inode_low)
        if to_low and inode_room is not None and inode_room < 0:
            return f"inodes over {self.inode_low}% used (high {self.inode_high}%)"
        return None

    async def _remove(self, candidate: Candidate, why: str) -> bool:
        try:
            gone = await self.runtime.remove_image(candidate.image)
        except NodeError as exc:
            log.warning("image GC: %s not removed: %s", candidate.name, exc.message)
            return False
        if not gone:
            log.warning("image GC: %s not removed: the engine says it is in use", candidate.name)
        return gone

    def _removed(self, candidate: Candidate, why: str) -> RemovedImage:
        image = candidate.image
        self.ledger.forget(image.id)
        self._first_seen.pop(image.id, None)
        removed = RemovedImage(candidate.name, image.id, image.size, why)
        self.telemetry.image_removed(removed.image, removed.id, removed.size_bytes, why)
        return removed

    # --- the pull gate ------------------------------------------------------------------

    async def fit(self, image: str, auth: RegistryAuth | None, *, present: bool) -> None:
        """Return when a pull of the image may start; else `InsufficientStorage`, before
        anything is downloaded: the store at or above high after a run, or the image
        (the registry's size; not asked for an image here already, whose pull downloads
        what changed only) larger than the room below high with every image a run may
        remove gone. Nothing is removed for the size (`ahead` removes for bytes)."""
        store = await self.store()
        if store.inode_pressure:  # a pull makes inodes: after a run, or refused
            if self.scope != "off":
                store = (await self.collect()).store
            if store.inode_pressure and store.inodes_total is not None:
                raise InodePressure(
                    inodes_free=store.inodes_free or 0,
                    inodes_total=store.inodes_total,
                    high_percent=self.inode_high,
                )
        room = store.room(self.high)
        # The registry is asked only where the answer can refuse: a store of known size.
        sized = not present and room is not None
        size = await asyncio.to_thread(self.sizer, image, auth) if sized else None
        short = size is not None and room is not None and size > room
        if not (store.pressure or short):
            if self.scope != "off":
                self.kick()  # the run before every pull, awaited by nobody
            return
        if short and not store.pressure and size is not None and room is not None:
            freeable = await self.freeable() if self.scope != "off" else 0
            if size > room + freeable:
                log.warning(
                    "pull of %s refused: %d bytes, %d left below %d%%, %d removable",
                    image, size, room, self.high, freeable,
                )  # fmt: skip
                raise self._refusal(image, store, needed=size)
            if self.scope != "off":
                self.kick()
            return  # admitted: its bytes have images removed as they come (`ahead`)
        if self.scope != "off":
            store = (await self.collect()).store
        if store.pressure:
            raise self._refusal(image, store)

    async def freeable(self) -> int:
        """Bytes a run could free now: the sizes of the images no rule keeps (shared
        layers counted in each, as the engines state sizes: an upper bound)."""
        images = await self.runtime.list_images()
        return sum(c.image.size for c in self._candidates(images, self.clock.now()))

    def _refusal(
        self, image: str, store: ImageStore, *, needed: int | None = None
    ) -> InsufficientStorage:
        """What the launch is told: what its pull needs, never what the node could free
        (a tenant's registry's size is no lever on the other tenants' images)."""
        return InsufficientStorage(
            image=image,
            free_bytes=store.free_bytes or 0,
            high_percent=self.high,
            needed_bytes=needed,
        )

    async def close(self) -> None:
        """Cancel a run in flight (shutdown); an engine call in it ends on its own."""
        await self._tasks.close()


def _warned(task: asyncio.Task[GcRun]) -> None:
    """The end of a run nobody awaits: an engine's refusal a warning, a bug an error.
    A caller that joined it (`collect`) gets its error as well."""
    if task.cancelled() or (error := task.exception()) is None:
        return
    if isinstance(error, NodeError):
        log.warning("image GC: %s", error.message)
    else:
        log.error("image GC failed on a bug", exc_info=error)


def _times(record: ImageRecord | None) -> list[datetime]:
    """Its last uses: the newest container made from it, its newest pull or prefetch."""
    if record is None:
        return []
    return [t for t in (record.last_used_at, record.pulled_at) if t is not None]


def _shown(store: ImageStore) -> str:
    if store.used_ratio is None:
        return "unknown"
    return f"{store.used_ratio * 100:.1f}% used, {store.free_bytes} bytes free"
