"""JobService: launch, observe, stop, remove, reap, logs and the node's status.

The one place the node's rules live: which containers are its own, what a launch does
with what it finds, how a pending launch is pulled, started or cancelled at any moment,
which containers reap may take. It speaks the runtime contract below and typed results
above; it knows no HTTP and no JSON.

Every verb that changes a container holds that container's control lock (`RefLocks`),
so two verbs on one ref never interleave; verbs on different refs never wait for each
other. The GPU allocation lock covers only choosing cards and recording the claim.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from tuneplane_node import inventory
from tuneplane_node.clock import SYSTEM_CLOCK, Clock, parse_rfc3339, rfc3339
from tuneplane_node.errors import (
    EngineConflict,
    NameTaken,
    NodeCordoned,
    NodeError,
)
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.launcher import Launcher
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.logs import LogsReader
from tuneplane_node.jobs.nodestate import (
    CORDONED,
    DRAINED,
    DRAINING,
    READY,
    NodeState,
    NodeStateFile,
)
from tuneplane_node.jobs.pending import FAILED
from tuneplane_node.jobs.pulls import PullCoordinator
from tuneplane_node.jobs.results import (
    AlreadyPending,
    AlreadyRunning,
    Inventory,
    JobView,
    LaunchRequest,
    LaunchResult,
    NodeStatus,
    StoppedView,
)
from tuneplane_node.jobs.stats import JobStats, StatsSampler
from tuneplane_node.runtime.base import (
    RUNNING,
    ContainerRuntime,
    ContainerState,
    LogStream,
    LogText,
    PullLimits,
)
from tuneplane_node.settings import NodeSettings
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry

log = logging.getLogger(__name__)
DRAIN_RETRY_S = 5.0
"""A drain whose stops failed (the engine down) tries again after this long."""


def reapable(state: ContainerState, max_age_s: float, now: datetime) -> bool:
    """Exited past the age, or created and never started past it (it holds GPU labels).

    Running, paused and restarting containers are never reapable.
    """
    if state.status in ("exited", "dead"):
        moment = parse_rfc3339(state.finished_at) or parse_rfc3339(state.created_at)
    elif state.status == "created" and state.never_started:
        moment = parse_rfc3339(state.created_at)
    else:
        return False
    return moment is not None and (now - moment).total_seconds() > max_age_s


def _wreck(state: ContainerState, older_than_s: float, now: datetime) -> bool:
    created = parse_rfc3339(state.created_at)
    return (
        state.status == "created"
        and state.never_started
        and created is not None
        and (now - created).total_seconds() >= older_than_s
    )


class JobService:
    """The job verbs over one runtime and one allocator."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        allocator: GpuAllocator,
        settings: NodeSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.runtime = runtime
        self.allocator = allocator
        self.settings = settings
        self.clock = clock
        self.locks = RefLocks()
        limits = PullLimits(settings.local_image_pull_timeout_s, settings.local_image_pull_stall_s)
        self.pulls = PullCoordinator(runtime, limits, telemetry)
        self.launcher = Launcher(runtime, allocator, self.pulls, settings=settings, clock=clock)
        self.pending = self.launcher.pending
        self.rules = self.launcher.rules
        self.disk = inventory.DiskGauge(settings.storage, clock=clock)
        self.reader = LogsReader(runtime, settings, own=self._own, pending=self.pending)
        self.follow_limit = self.reader.follow_limit
        self.state_file = NodeStateFile(settings.state_dir)
        self.node = NodeState()  # until start() reads the file
        self._saves = itertools.count(1)
        self._drain: asyncio.Task[None] | None = None
        interval = settings.stats_interval_s
        self.sampler = StatsSampler(runtime, allocator, interval_s=interval, clock=clock)

    # --- the "ours" rule ----------------------------------------------------------------

    async def _own(self, ref: str, *, fresh: bool = False) -> ContainerState:
        """The node's container of that name, or missing: a container without the node's
        run-id label is none of its business, whoever asks. ``fresh``: ask the engine
        itself, not the cache (which may not yet know of an exit)."""
        read = self.runtime.inspect_fresh if fresh else self.runtime.inspect
        return self._mine(await read(ref), ref)

    @staticmethod
    def _mine(state: ContainerState, ref: str) -> ContainerState:
        """The rule itself, for a state already read (observe reads many at once)."""
        if state.exists and not state.ours:
            log.debug("%s is not a container of this node: treated as missing", ref)
            return ContainerState.missing(ref)
        return state

    # --- launch -------------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> LaunchResult:
        """Start the run's container, or say what is already there.

        A live container of the run is the answer itself (idempotent); an exited one, or
        the wreckage of a launch that died before its start, is removed and launched
        again. A name held by another run is refused.
        """
        ref = request.ref
        request = replace(request, spec=await self.launcher.vetted(request.spec))
        async with self.locks.hold(ref):
            record = self.pending.get(ref)
            if record is not None and record.phase != FAILED:
                self._check_holder(ref, record.request.run_id, request.run_id)
                return AlreadyPending(record.phase, record.image)
            self.pending.pop(ref)  # a failed record is replaced by the retry
            state = await self._own(ref)
            if state.live:  # "running" is acted on at once: the engine's word, not the cache's
                state = await self._own(ref, fresh=True)
            if state.exists:
                self._check_holder(ref, state.run_id, request.run_id)
                if state.live and not state.never_started:
                    return AlreadyRunning(state.gpus)
            self._check_open()
            if state.exists:
                log.info("relaunch of %s: removing its %s container", ref, state.status)
                await self._remove(state)
            if await self.runtime.image_exists(request.spec.image):
                return await self.launcher.start_now(request)
            return await self.launcher.start_pending(request)

    def _check_open(self) -> None:
        if not self.node.open:
            raise NodeCordoned(state=self.node.state, reason=self.node.reason)

    @staticmethod
    def _check_holder(ref: str, holder: str | None, run_id: str) -> None:
        if holder != run_id:
            raise NameTaken(ref=ref, run_id=holder)

    # --- observe and logs ---------------------------------------------------------------

    async def observe(self, refs: Iterable[str]) -> dict[str, JobView]:
        """Each ref's pending launch or container (missing when neither); duplicates once."""
        asked = list(dict.fromkeys(refs))
        # One call for all: from the cache it is a loop without a wait (a task or an
        # await per ref cost more than the read).
        states = await self.runtime.inspect_many(asked)
        now = self.clock.monotonic()
        views: dict[str, JobView] = {}
        for ref, state in zip(asked, states, strict=True):
            record = self.pending.get(ref)
            if record is not None:
                views[ref] = record.view(now)
            else:
                views[ref] = self._why(self._mine(state, ref))
        return views

    async def stats(self, refs: Iterable[str] | None) -> dict[str, JobStats]:
        """Each ref's figures from the latest sample while it runs (never sampled here);
        whether it exists and its status when it does not. None: every running job."""
        if refs is None:
            refs = [s.name for s in await self.runtime.ps() if s.ours and s.status == "running"]
        answers: dict[str, JobStats] = {}
        for ref in dict.fromkeys(refs):
            record = self.pending.get(ref)
            if record is not None:  # as observe shows it: created, or dead once failed
                answers[ref] = JobStats(True, "dead" if record.phase == FAILED else "created")
                continue
            state = await self._own(ref)
            sample = self.sampler.latest(state) if state.status == "running" else None
            answers[ref] = JobStats(state.exists, state.status or None, sample)
        return answers

    def _why(self, state: ContainerState) -> ContainerState | StoppedView:
        reason = self.node.stop_reasons.get(state.handle) if state.exists else None
        return StoppedView(state, reason) if reason else state

    async def logs(self, ref: str, tail: int, since: datetime | None = None) -> LogText:
        """The container's last lines, at most ``TUNEPLANE_LOGS_MAX_BYTES`` of the newest;
        for a pending or missing one, a sentence saying so."""
        return await self.reader.logs(ref, tail, since)

    def follow(
        self, ref: str, tail: int, since: datetime | None = None
    ) -> contextlib.AbstractAsyncContextManager[LogStream]:
        """The container's last lines, then its new ones until it stops; for a pending or
        missing one, the sentence `logs` gives. Past `follow_limit` streams at once,
        `TooManyFollows` (before anything is sent)."""
        return self.reader.follow(ref, tail, since)

    @property
    def follow_end_grace_s(self) -> float:
        """How long after a followed log's end the job's exit may take to be known."""
        return self.reader.end_grace_s

    @follow_end_grace_s.setter
    def follow_end_grace_s(self, seconds: float) -> None:
        self.reader.end_grace_s = seconds

    # --- stop, remove, reap -------------------------------------------------------------

    async def stop(self, ref: str, timeout: float | None) -> None:
        """Cancel a pending launch at whatever stage; SIGTERM, then SIGKILL once the grace
        period ends. A missing or foreign container: nothing to do, and no error.

        The grace period is waited on the loop, holding neither an engine thread nor the
        ref's lock: a remove meanwhile kills the job at once, and 50 stops of jobs that
        ignore SIGTERM leave every thread to the other verbs.
        """
        grace = self.settings.local_stop_timeout if timeout is None else timeout
        async with self.locks.hold(ref):
            await self.launcher.cancel(ref)
            state = await self._own(ref)
            if state.status not in RUNNING:
                return
            await self.runtime.kill(state.handle, "SIGTERM")
        log.info("stopping %s: SIGTERM, SIGKILL after %g s", ref, grace)
        if await self.runtime.wait_exited(ref, grace):
            return
        async with self.locks.hold(ref):
            now = await self._own(ref)
            if now.id != state.id or now.status not in RUNNING:
                return  # gone, or relaunched meanwhile: not the job this stop was for
            log.info("stopping %s: still running after %g s, SIGKILL", ref, grace)
            await self.runtime.kill(now.handle, "SIGKILL")
        if not await self.runtime.wait_exited(ref, self.settings.local_api_timeout):
            log.warning("stopping %s: still running after SIGKILL", ref)

    async def remove(self, ref: str) -> None:
        """Cancel a pending launch, then force-remove the container (missing: no-op)."""
        async with self.locks.hold(ref):
            await self.launcher.cancel(ref)
            state = await self._own(ref)
            if state.exists:
                await self._remove(state)
                log.info("removed %s", ref)

    async def _remove(self, state: ContainerState) -> None:
        """Remove the container, and the reason the node kept for having stopped it: a
        runtime without ids keys it by name, which the next job of the name must not get."""
        await self.runtime.remove(state.handle)
        key = state.handle
        if key in self.node.stop_reasons:
            try:
                await self._save(self.node.forgetting(key))
            except NodeError as exc:  # the container is gone all the same
                log.warning("%s", exc.message)

    async def reap(self, max_age_s: float | None) -> int:
        """Remove the node's exited (and never-started) containers older than the age."""
        if max_age_s is None:
            max_age_s = self.settings.local_container_ttl_s
        now = self.clock.now()
        removed = 0
        for state in await self.runtime.ps():
            if reapable(state, max_age_s, now) and await self._reap_one(state.name, max_age_s):
                removed += 1
        if removed:
            log.info("reaped %d container(s) older than %g s", removed, max_age_s)
        return removed

    async def _reap_one(self, name: str, max_age_s: float) -> bool:
        async with self.locks.hold(name):
            if self.pending.get(name) is not None:
                return False  # a launch is starting it right now
            state = await self._own(name)  # it may have been relaunched meanwhile
            if not reapable(state, max_age_s, self.clock.now()):
                return False
            try:
                await self._remove(state)
            except EngineConflict:
                return False  # the engine is busy with it: next time
            return True

    # --- wreckage -----------------------------------------------------------------------

    async def sweep_wreckage(self, *, older_than_s: float) -> int:
        """Remove the node's containers that were created and never started, older than
        the age, with no launch making them: the wreckage of a daemon killed between
        create and start. They carry card labels, and would hold the cards for good."""
        now = self.clock.now()
        removed = 0
        for state in await self.runtime.ps():
            if _wreck(state, older_than_s, now) and await self._sweep_one(state, older_than_s):
                removed += 1
        if removed:
            log.warning("removed %d container(s) created and never started", removed)
        return removed

    async def _sweep_one(self, seen: ContainerState, older_than_s: float) -> bool:
        async with self.locks.hold(seen.name):  # a direct launch holds it while it creates
            record = self.pending.get(seen.name)
            if record is not None and record.phase != FAILED:
                return False  # a pulled launch is starting it right now
            state = await self._own(seen.name)
            if state.id != seen.id or not _wreck(state, older_than_s, self.clock.now()):
                return False
            log.warning("%s was created and never started: removing it", seen.name)
            await self._remove(state)
            return True

    async def maintain(self) -> None:
        """Sweep wreckage once a relist period, as long as the node runs."""
        while True:
            await asyncio.sleep(self.settings.state_relist_s)
            try:
                await self.sweep_wreckage(older_than_s=self.settings.local_api_timeout)
            except NodeError as exc:
                log.warning("sweeping wreckage failed: %s", exc.message)

    # --- cordon and drain ---------------------------------------------------------------

    async def start(self) -> None:
        """Read the operator's decision from disk; a drain the last daemon left unfinished
        goes on (a node coming back never undoes what the operator decided)."""
        self.node = await asyncio.to_thread(self.state_file.load, self._stamp())
        log.info("node state: %s%s", self.node.state, _because(self.node.reason))
        if self.node.state == DRAINING:
            self._start_drain()

    async def cordon(self, reason: str | None) -> NodeState:
        """Refuse new launches; what runs goes on. A draining or drained node stays so."""
        if self.node.state in (READY, CORDONED):
            await self._save(self.node.to(CORDONED, reason, self._stamp()))
        return self.node

    async def uncordon(self) -> NodeState:
        """Take launches again; a drain in progress ends (stops already sent stand)."""
        await self._end_drain()
        await self._save(self.node.to(READY, None, self._stamp()))
        return self.node

    async def drain(self, reason: str | None, grace_s: float | None) -> NodeState:
        """Cordon, then cancel every pending launch and stop every running job (SIGTERM,
        SIGKILL after the grace period), in the background: draining, then drained."""
        grace = self.settings.local_stop_timeout if grace_s is None else grace_s
        await self._end_drain()
        await self._save(replace(self.node.to(DRAINING, reason, self._stamp()), grace_s=grace))
        self._start_drain()
        return self.node

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self._drain_node(), name="drain")
        self._drain.add_done_callback(_report_drain)

    async def _end_drain(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
            await asyncio.wait({self._drain})
        self._drain = None

    async def _drain_node(self) -> None:
        why = f"drain: {self.node.reason or 'no reason given'}"
        grace = self.node.grace_s if self.node.grace_s is not None else 0.0
        while (outcome := await self._drain_once(why, grace)) != "drained":
            # "again": a short pause all the same, so a job that will not die never
            # turns the drain into a busy loop.
            await asyncio.sleep(DRAIN_RETRY_S if outcome == "later" else 0.1)
        log.info("node drained%s", _because(self.node.reason))
        try:
            await self._save(self.node.to(DRAINED, self.node.reason, self._stamp()), prune=True)
        except NodeError as exc:
            log.error("%s", exc.message)

    async def _drain_once(self, why: str, grace: float) -> str:
        """One pass: cancel what is pending, stop what runs. ``drained`` once nothing is
        left, ``again`` after stops (check at once), ``later`` when the engine failed."""
        try:
            for record in self.pending.records():
                async with self.locks.hold(record.ref):
                    await self.launcher.cancel(record.ref)
            running = [state for state in await self.runtime.ps() if state.status in RUNNING]
            if not running:
                return "again" if len(self.pending) else "drained"
            await self._save(self.node.stopped((s.handle for s in running), why))
            stops = [self.stop(state.name, grace) for state in running]
            failed = [r for r in await asyncio.gather(*stops, return_exceptions=True) if r]
        except NodeError as exc:
            log.warning("drain: %s; trying again in %g s", exc.message, DRAIN_RETRY_S)
            return "later"
        for error in failed:
            log.warning("drain: a stop failed: %s; trying again in %g s", error, DRAIN_RETRY_S)
        return "later" if failed else "again"

    async def _save(self, node: NodeState, *, prune: bool = False) -> None:
        """The state takes effect at once, and is written to disk to outlive the daemon."""
        if prune:
            with contextlib.suppress(NodeError):  # the engine down: prune next time
                node = node.keeping(s.handle for s in await self.runtime.ps())
        self.node = node
        try:
            await asyncio.to_thread(self.state_file.save, node, next(self._saves))
        except OSError as exc:
            raise NodeError(
                f"the node is {node.state} now, but {self.state_file.path} could not be "
                f"written ({exc.strerror or exc}): a restart would not keep it"
            ) from exc

    def _stamp(self) -> str:
        return rfc3339(self.clock.now())

    # --- the node -----------------------------------------------------------------------

    async def status(self) -> NodeStatus:
        """What health reports: the engine, the cards, the pending launches, the disk."""
        engine = await self.runtime.health()
        occupancy, error = None, engine.error
        if engine.ok:
            try:
                occupancy = await self.allocator.occupancy()
            except NodeError as exc:
                error = exc.message
        now = self.clock.monotonic()
        return NodeStatus(
            engine=engine,
            series=self.settings.cluster_profile.lower() or None,
            disk=await self.disk.read(),
            pending={record.ref: record.view(now) for record in self.pending.records()},
            cache=self.runtime.status(),
            occupancy=occupancy,
            error=error,
            node=self.node,
        )

    async def job_counts(self) -> collections.Counter[str]:
        """The node's containers by status, and its pending launches by phase."""
        counts = collections.Counter(record.phase for record in self.pending.records())
        counts.update(state.status for state in await self.runtime.ps())
        return counts

    async def inventory(self) -> Inventory:
        return await read_inventory(self.runtime, self.allocator, self.settings, self.node)

    async def close(self) -> None:
        """Cancel a drain in progress, every background launch and pull (shutdown). A
        drain is resumed by the next start: its state is on disk."""
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.wait({self._drain})
        await self.launcher.close()


async def read_inventory(
    runtime: ContainerRuntime, allocator: GpuAllocator, settings: NodeSettings, node: NodeState
) -> Inventory:
    """The machine, its cards and its engine; for the API and `tuneplane-node inventory`."""
    engine = await runtime.health()
    gpus = await allocator.snapshot()
    machine = await asyncio.to_thread(inventory.collect, settings)
    return Inventory(
        machine=machine,
        gpus=gpus,
        accelerator_count=allocator.card_count(gpus),
        runtime=f"{engine.engine}://{engine.version}" if engine.version else None,
        node=node,
    )


def _because(reason: str | None) -> str:
    return f" ({reason})" if reason else ""


def _report_drain(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the drain failed on a bug", exc_info=task.exception())
