"""The disk monitor: every job held to its disk limit, and the filler of a full store
stopped before the image GC touches the other tenants' cache.

Every ``TUNEPLANE_JOB_DISK_CHECK_S`` it measures what each running job of the node has
written to the engine's disk (its writable layer and anonymous volumes, walked by the
runtime within `WALK_BUDGET_S`, one job at a time on the pool, so a walk never holds
more than one of its threads). A job is walked again only when it could have passed its
limit since its last walk (the store's growth since then, every pass's rise added up,
is more than its room: no job grows by more than the store does), when the store is
under pressure, or once `FULL_WALK_S` has gone: walking 50 layers of 100,000 files
every 5 s would take more CPU than the jobs. The rises are added up, not the store's
net change, so space freed (an image, a removed container) hides no growth but what
the same pass frees, which a job's own deletes bound: it must have written them first.
It is the backstop wherever the kernel does not hold the limit (project quotas), and the
only bound where it cannot.

A job past its limit (its `LABEL_DISK_LIMIT`) is stopped as a stop would (its stop
signal, the grace period, SIGKILL), its reason written first in the node state, which
outlives the daemon: observe then says ``stop_reason: "disk_limit"`` with the bytes.

While the store is at or above the image GC's high threshold (``disk_pressure``), the
node (1) stops the jobs over their limit, then (2) the job with the largest writable
layer, when it holds more than its fair share: the store below its high threshold
divided among the running jobs and the image cache, counted as one more tenant
(``disk_pressure`` is its reason); (3) the image GC runs only after that (`relieve` is
its hook), and removes no image for the pressure while a job is being stopped for it,
or while the jobs stopped for their disk hold more than the store is over its
threshold: a stopped job's layer stays on the disk until its container is removed (the
console's `remove`, or `reap`), and the other tenants' cache should not pay for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tuneplane_node import inventory
from tuneplane_node.jobs.disk.accounting import PressureAccount
from tuneplane_node.jobs.images.gc import ImageCollector
from tuneplane_node.jobs.nodestate import NodeStateStore
from tuneplane_node.jobs.stopper import Stopper
from tuneplane_node.jobs.words.images import ImageStore
from tuneplane_node.jobs.words.views import DiskFigures
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.facts import DataRoot, DiskUse, EngineImage
from tuneplane_node.runtime.labels import mounts_of
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks, periodically

log = logging.getLogger(__name__)
SCRATCH_SUFFIX = ".ext4"  # `jobs.mounts.scratch`'s file, named by the job's mounts label
WALK_BUDGET_S = 2.0
"""The longest one job's walk may take; past it, what was counted is a lower bound."""
FULL_WALK_S = 60 * 60.0
"""Every job is walked at least this often, whatever the store's growth says: what one
pass frees can hide as much growth in that pass."""
DISK_LIMIT, DISK_PRESSURE = "disk_limit", "disk_pressure"
INODE_LIMIT, INODE_PRESSURE = "inode_limit", "inode_pressure"
DISK_REASONS = (DISK_LIMIT, DISK_PRESSURE, INODE_LIMIT, INODE_PRESSURE)


class DiskRuntime(Protocol):
    """What the disk monitor asks of the engine: the jobs, their writes, its disk."""

    async def ps(self) -> list[ContainerState]: ...
    async def data_root(self) -> DataRoot | None: ...
    async def list_images(self) -> list[EngineImage]: ...
    async def disk_usage(self, ref: str, *, budget_s: float) -> DiskUse | None: ...


@dataclass(frozen=True)
class Measured:
    """One running job's latest measure: of that very container (``id``)."""

    id: str | None
    figures: DiskFigures
    complete: bool = True
    run_id: str | None = None
    at: float = 0.0  # when (the monitor's clock)
    store_grown: int | None = None  # the store's growth so far (`DiskMonitor.grown`) then
    files_grown: int | None = None  # its inodes' likewise (`DiskMonitor.files`)


class DiskMonitor:
    """Measures the running jobs' disk, stops those past their limit, and the filler of
    a store under pressure. Used on the loop only."""

    def __init__(
        self,
        runtime: DiskRuntime,
        settings: NodeSettings,
        *,
        stopper: Stopper,
        store: NodeStateStore,
        gc: ImageCollector,
    ) -> None:
        self.runtime = runtime
        self.stopper = stopper
        self.store = store
        self.gc = gc
        self.clock = gc.clock
        self.telemetry = gc.telemetry
        self.interval_s = settings.job_disk_check_s
        self.measured: dict[str, Measured] = {}  # container name -> its latest measure
        self.held_by: str | None = None  # what holds a job to its limit, once known
        self.grown: int | None = 0  # the store's rises added up, pass by pass; None: unknown
        self._used: int | None = None  # the store's used bytes at the last pass
        self.files = Rises()  # the store's used inodes, likewise
        self.scratch_dir = settings.scratch_dir
        dirs = (settings.scratch_dir, settings.volume_dir)
        self.account = PressureAccount(runtime, dirs=dirs, high_percent=gc.high)
        gc.chase = lambda: not self.account.unexplained
        self.account.pulling = gc.pulls.bytes_done
        self.inode_high = settings.inode_high_percent
        self._stops: dict[str, asyncio.Task[None]] = {}  # container name -> its stop
        self._tasks = BackgroundTasks(log)
        self._pass = asyncio.Lock()
        gc.relievers.append(self.relieve)

    # --- what observe and stats show -------------------------------------------------

    def figures(self, state: ContainerState) -> DiskFigures | None:
        """A running job's latest measure, or what a job the node stopped for its disk
        had written then (kept in the node state, after a restart too); None: neither,
        or not measurable from here."""
        if not state.exists:
            return None
        node = self.store.node
        stopped = node.disk_used.get(state.handle)
        if stopped is not None:
            deleted = node.disk_deleted_open.get(state.handle)
            inodes = node.disk_inodes.get(state.handle)
            return DiskFigures(stopped, state.disk_limit_bytes, deleted, inodes, state.inode_limit)
        seen = self.measured.get(state.name)
        if state.status != "running" or seen is None or seen.id != state.id:
            return None
        return seen.figures if seen.figures.used_bytes is not None else None

    # --- the passes ---------------------------------------------------------------------

    async def run(self) -> None:
        """A pass now, then every interval, as long as the node runs."""
        await periodically(
            self.check, period_s=self.interval_s, clock=self.clock, logger=log,
            what="disk monitor",
        )  # fmt: skip

    async def check(self) -> bool:
        """One pass: measure, stop who is past their limit, then relieve a store under
        pressure. True when the jobs stopped for their disk are its pressure: one is
        being stopped now, or those stopped hold more than the store is over its high
        threshold (their removal, the console's, ends it)."""
        async with self._pass:
            if self.held_by is None:
                self.held_by = await self._holder()
            states = [s for s in await self.runtime.ps() if s.ours]
            running = [s for s in states if s.status == "running"]
            store = await self.gc.store()
            await self._measure(running, store)
            for state in running:
                figures = self.figures(state)
                if figures is not None and figures.over:
                    self._stop(state, figures, DISK_LIMIT)
                elif figures is not None and figures.over_inodes:
                    self._stop(state, figures, INODE_LIMIT)
            held = self._held(states)
            jobs = sum(f.used_bytes or 0 for f in (m.figures for m in self.measured.values()))
            unexplained = await self.account.judge(store, jobs_bytes=jobs + held)
            if store.pressure and unexplained is not True:  # step 2: the jobs' pressure only
                scratch = await asyncio.to_thread(self._scratches, running, store.path)
                self._relieve(running, store, scratch)
            if store.inode_pressure:
                self._relieve_inodes(running, store)
            if any(not task.done() for task in self._stops.values()):
                return True
            return bool(store.pressure) and held > 0 and held >= over_high(store, self.gc.high)

    def _held(self, states: list[ContainerState]) -> int:
        """Bytes the node's stopped-for-disk containers that ran no more had written."""
        return sum(
            self.store.node.disk_used.get(s.handle, 0)
            for s in states
            if s.status != "running" and self.store.stop_reason(s) in DISK_REASONS
        )

    async def relieve(self) -> bool:
        """The image GC's hook, before it removes anything for the pressure: steps 1
        and 2, waited for. True when a job was stopped for its disk."""
        stopping = await self.check()
        tasks = [task for task in self._stops.values() if not task.done()]
        if tasks:
            await asyncio.gather(*(asyncio.shield(task) for task in tasks), return_exceptions=True)
        return stopping

    async def _holder(self) -> str | None:
        """``project_quotas`` where the engine's store has them, else ``monitor``; None
        for a store not on this machine (nothing holds the limit there)."""
        root = await self.runtime.data_root()
        if root is None or root.space is None:
            return None
        return "project_quotas" if root.project_quotas else "monitor"

    async def _measure(self, running: list[ContainerState], store: ImageStore) -> None:
        measured: dict[str, Measured] = {}
        grown, now = self._grown(store), self.clock.monotonic()
        files = self.files.add(store_files_used(store))
        for state in running:
            seen = self.measured.get(state.name)
            due = seen is None or self._due(seen, grown, store, now) or _files_due(seen, files)
            if seen is not None and seen.id == state.id and not due:
                measured[state.name] = seen
                continue
            use = await self.runtime.disk_usage(state.handle, budget_s=WALK_BUDGET_S)
            if use is None:
                continue  # gone, or stopped, since the list
            self.telemetry.disk_walked(use.walk_s)
            figures = DiskFigures(
                use.used_bytes,
                state.disk_limit_bytes,
                use.deleted_open_bytes,
                use.inodes,
                state.inode_limit,
            )
            measured[state.name] = Measured(
                state.id,
                figures,
                use.complete,
                state.run_id,
                at=now,
                store_grown=grown,
                files_grown=files,
            )
            if not use.complete:
                log.warning(
                    "disk monitor: %s: walk past %g s, %s bytes counted so far",
                    state.name, WALK_BUDGET_S, use.used_bytes,
                    extra=job_fields(state.name, state.run_id),
                )  # fmt: skip
        self.measured = measured

    def _grown(self, store: ImageStore) -> int | None:
        """The store's rises so far, this pass's added; None once its size was unknown
        (every job is walked then, and the count starts again)."""
        used = store_used(store)
        if used is None or self.grown is None or self._used is None:
            self.grown = None if used is None else 0
        else:
            self.grown += max(0, used - self._used)
        self._used = used
        return self.grown

    def _due(self, seen: Measured, grown: int | None, store: ImageStore, now: float) -> bool:
        """Whether a job measured before must be walked again now: under pressure (the
        fair share needs every size), once `FULL_WALK_S` has gone, or when the store has
        grown enough since its last walk that it could be past its limit (no job grows
        by more than the store does)."""
        pressed = store.pressed
        if pressed or not seen.complete or grown is None or seen.store_grown is None:
            return True
        if now - seen.at >= FULL_WALK_S:
            return True
        limit, before = seen.figures.limit_bytes, seen.figures.used_bytes
        if limit is None or before is None:
            return False  # no limit to pass: its size matters under pressure only
        return before + grown - seen.store_grown > limit

    def _scratches(self, running: list[ContainerState], store_path: str | None) -> dict[str, int]:
        """The allocated bytes of each job's scratch file where it lies on the store's
        filesystem (there, it is the job's part of the pressure). Blocking."""
        if store_path is None:
            return {}
        found = {}
        for state in running:
            key = mounts_of(state.labels)
            file = self.scratch_dir / f"{key}{SCRATCH_SUFFIX}"
            if not key or os.sep in key or not inventory.same_filesystem(file, Path(store_path)):
                continue
            try:
                found[state.name] = file.stat().st_blocks * 512
            except OSError:
                continue  # none: a job without scratch
        return found

    def _relieve(
        self, running: list[ContainerState], store: ImageStore, scratch: dict[str, int]
    ) -> None:
        """Step 2: the largest writer (its scratch on the store counted as its own), when
        it holds more than its fair share."""
        share = fair_share(store, len(running), high_percent=self.gc.high)
        sized = [(self.figures(s), s) for s in running]
        known = [
            (f.used_bytes + scratch.get(s.name, 0), s)
            for f, s in sized
            if f is not None and f.used_bytes is not None
        ]
        if share is None or not known:
            return
        used, largest = max(known, key=lambda pair: pair[0])
        if used > share and (figures := self.figures(largest)) is not None:
            self._stop(largest, figures, DISK_PRESSURE, share=share)

    def _relieve_inodes(self, running: list[ContainerState], store: ImageStore) -> None:
        """Under inode pressure: the largest maker of inodes, when it holds more than
        its fair share of the store's inodes below their high threshold."""
        if store.inodes_total is None or not running:
            return
        share = store.inodes_total * self.inode_high // 100 // (len(running) + 1)
        sized = [(self.figures(s), s) for s in running]
        known = [(f.inodes, f, s) for f, s in sized if f is not None and f.inodes is not None]
        if known:
            made, figures, largest = max(known, key=lambda made: made[0])
            if made > share:
                self._stop(largest, figures, INODE_PRESSURE, share=share)

    def _stop(
        self, state: ContainerState, figures: DiskFigures, reason: str, *, share: int | None = None
    ) -> None:
        if (task := self._stops.get(state.name)) is not None and not task.done():
            return
        inodes = reason in (INODE_LIMIT, INODE_PRESSURE)
        limit = figures.inode_limit if inodes else figures.limit_bytes
        why = f"limit {limit}" if share is None else f"fair share {share}"
        log.warning(
            "disk monitor: stopping %s: %s bytes, %s inodes written (%s), %s",
            state.name, figures.used_bytes, figures.inodes, why, reason,
            extra=job_fields(state.name, state.run_id),
        )  # fmt: skip
        self._stops[state.name] = self._tasks.spawn(
            self._stopped(state, figures, reason), name=f"disk stop {state.name}"
        )
        self._stops = {name: t for name, t in self._stops.items() if not t.done()}

    async def _stopped(self, state: ContainerState, figures: DiskFigures, reason: str) -> None:
        """The reason first, in the node state (a restart keeps it), then the stop,
        warned as the job asked (`Stopper.stop_by_node`)."""
        for error in await self.stopper.stop_by_node([state], reason, disk=figures):
            log.warning("disk monitor: stopping %s failed: %s", state.name, error)

    async def close(self) -> None:
        await self._tasks.close()


def store_used(store: ImageStore) -> int | None:
    """The store's bytes in use (counting what only root may use); None: unknown."""
    if store.total_bytes is None or store.free_bytes is None:
        return None
    return store.total_bytes - store.free_bytes


def store_files_used(store: ImageStore) -> int | None:
    """The store's inodes in use (counting what only root may use); None: unknown."""
    if store.inodes_total is None or store.inodes_free is None:
        return None
    return store.inodes_total - store.inodes_free


class Rises:
    """A figure's rises added up, reading by reading (falls are not subtracted: what
    one reading frees hides no growth but its own); None once a reading was unknown,
    then counted again from 0."""

    def __init__(self) -> None:
        self.total: int | None = 0
        self._last: int | None = None

    def add(self, now: int | None) -> int | None:
        if now is None or self.total is None or self._last is None:
            self.total = None if now is None else 0
        else:
            self.total += max(0, now - self._last)
        self._last = now
        return self.total


def _files_due(seen: Measured, files: int | None) -> bool:
    """Whether the store's inodes grew enough since its last walk that it could be past
    its inode limit (no job makes more inodes than the store gains). A store that
    counts no inodes (btrfs) says nothing here: its bytes' growth and `FULL_WALK_S` do."""
    if files is None:
        return False
    if seen.files_grown is None:
        return True
    made, limit = seen.figures.inodes, seen.figures.inode_limit
    if made is None or limit is None:
        return False
    return made + files - seen.files_grown > limit


def over_high(store: ImageStore, high_percent: int) -> int:
    """Bytes the store holds above its high threshold (0: none, or unknown)."""
    room = store.room(high_percent)
    return max(0, -room) if room is not None else 0


def fair_share(store: ImageStore, jobs: int, *, high_percent: int) -> int | None:
    """The bytes a job may hold of a store under pressure before it is the one stopped:
    the store below its high threshold divided among the running jobs and the image
    cache (one more tenant). None: the store's size is unknown."""
    if store.total_bytes is None or jobs <= 0:
        return None
    return store.total_bytes * high_percent // 100 // (jobs + 1)
