"""JobService: launch, observe, stop, remove, reap, logs and the node's status.

The one place the node's rules live: which containers are its own, what a launch does
with what it finds, what observe and stats say of a ref. The mechanisms are its
collaborators, each given what it needs and never the service, all made once by
`jobs.node.build_node`: the launcher (pending launches, the card reservation), the
stopper, the reaper, the logs reader, the node-state keeper (cordon and drain), the
health reader, the disk monitor, the sampler. It speaks the runtime contract below and
typed results above; it knows no HTTP and no JSON.

Every verb that changes a container holds that container's control lock (`RefLocks`),
so two verbs on one ref never interleave; verbs on different refs never wait for each
other. The GPU allocation lock covers only choosing cards and recording the claim.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import datetime

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeCordoned
from tuneplane_node.jobs.disk.monitor import DiskMonitor
from tuneplane_node.jobs.drain import NodeStateKeeper
from tuneplane_node.jobs.health import HealthReader
from tuneplane_node.jobs.launcher import Launcher, launch_request
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.nodestate import NodeStateStore
from tuneplane_node.jobs.observe.logs import LogsReader
from tuneplane_node.jobs.observe.stats import JobStats, StatsSampler
from tuneplane_node.jobs.observe.views import ChangeCount, Observed, StoppedViews
from tuneplane_node.jobs.ours import OursRule
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.reaper import Reaper
from tuneplane_node.jobs.retries import check_run, retried
from tuneplane_node.jobs.stopper import NO_PLAN, Stopper
from tuneplane_node.jobs.words.launch import AlreadyPending, LaunchResult
from tuneplane_node.jobs.words.status import Inventory, NodeState, NodeStatus
from tuneplane_node.jobs.words.views import JobView, StoppedView
from tuneplane_node.runtime.base import ContainerRuntime, ContainerState, LogStream, LogText
from tuneplane_node.wire.values import FAILED, Launch, StopPlan

log = logging.getLogger(__name__)


class JobService:
    """The job verbs over the collaborators `build_node` made: it makes none itself."""

    def __init__(
        self,
        *,
        runtime: ContainerRuntime,
        clock: Clock,
        own: OursRule,
        locks: RefLocks,
        launcher: Launcher,
        pending: PendingTable,
        store: NodeStateStore,
        stopper: Stopper,
        reaper: Reaper,
        keeper: NodeStateKeeper,
        monitor: DiskMonitor,
        views: StoppedViews,
        health: HealthReader,
        reader: LogsReader,
        sampler: StatsSampler,
        gpu_faults: Callable[[], Mapping[str, str]],
        told: ChangeCount,
    ) -> None:
        self.runtime = runtime
        self.clock = clock
        self.own = own  # the "ours" rule: every container read goes through it
        self.locks = locks  # one verb at a time per ref
        self.launcher = launcher
        self.pending = pending
        self.store = store
        self.stopper = stopper
        self.reaper = reaper
        self.keeper = keeper
        self.monitor = monitor
        self.views = views
        self.health = health
        self.reader = reader
        self.sampler = sampler
        # The job faults of the cards under each job, by container name (the fault reactor's).
        self.gpu_faults = gpu_faults
        self.told = told  # the sources' changes, for `observed`

    @property
    def node(self) -> NodeState:
        """The node state in force: ready, cordoned, draining or drained."""
        return self.store.node

    # --- launch -------------------------------------------------------------------------

    async def launch(self, launch: Launch) -> LaunchResult:
        """Start the run's container, or say what is already there.

        A live container of the run is the answer itself (idempotent); an exited one, or
        the wreckage of a launch that died before its start, is replaced by the launch,
        whatever its spec (an exited one is the answer without ``relaunch``). A name held
        by another run is refused, and so is another spec of a live or pending job, or of
        an exited one kept (`retries`). What is replaced goes only once the launch has
        passed every check of the node (`Launcher.start`): a refused relaunch leaves the
        exited job, its exit code and logs, as it was.
        """
        ref = launch.ref
        request = await self.launcher.vetted(launch_request(launch))
        async with self.locks.hold(ref):
            record = self.pending.get(ref)
            if record is not None and record.phase != FAILED:
                check_run(ref, record.request.run_id, record.request.spec.labels, request)
                return AlreadyPending(record.phase, record.image)
            self.pending.pop(ref)  # a failed record is replaced by the retry
            state = await self.own(ref)
            if state.live:  # "running" is acted on at once: the engine's word, not the cache's
                state = await self.own(ref, fresh=True)
            if state.exists and (answer := retried(state, request)) is not None:
                return answer
            self._check_open()
            if not state.exists:
                return await self.launcher.start(request)
            clear = functools.partial(self.stopper.discard_for_relaunch, state)
            return await self.launcher.start(request, clear=clear)

    def _check_open(self) -> None:
        if not self.node.open:
            raise NodeCordoned(state=self.node.state, reason=self.node.reason)

    # --- observe and logs ---------------------------------------------------------------

    async def observe(self, refs: Iterable[str]) -> dict[str, JobView]:
        """Each ref's pending launch or container (missing when neither); duplicates once."""
        asked = list(dict.fromkeys(refs))
        # One call for all: from the cache it is a loop without a wait (a task or an
        # await per ref cost more than the read).
        states = await self.runtime.inspect_many(asked)
        now = self.clock.monotonic()
        views: dict[str, JobView] = {}
        node, measured, stops = self.store.node, self.monitor.measured, self.stopper.stopping
        faults = self.gpu_faults()
        # Each asked of a ref only when it holds anything: usually none does, and three
        # look-ups per ref were a fifth of observe's time for 300.
        pending = self.pending if len(self.pending) else None
        for ref, state in zip(asked, states, strict=True):
            record = pending.get(ref) if pending is not None else None
            if record is not None:
                views[ref] = record.view(now)
                continue
            stop = stops.get(state.name) if stops else None
            facts = (node, measured, stop, faults.get(state.name) if faults else None)
            view = self.views.answered(state, ref, facts)
            if view is None:
                view = self._why(self.own.mine(state, ref))
                self.views.answer(state, ref, facts, view)
            views[ref] = view
        return views

    def observed(self, refs: Collection[str]) -> Observed | None:
        """What observe's answer for ``refs`` is made of now beside them, for an answer
        kept whole while it holds (the route's memo). None where one cannot be kept: a
        runtime without a synced cache (its reads answer 503, or are the engine's own), or
        a pending launch among the refs (its progress and elapsed time move)."""
        generation = self.runtime.cache_generation()
        if generation is None or self.pending.holds_any(refs):
            return None
        return Observed(generation, self.told.count, self.store.node, self.monitor.measured)

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
            state = await self.own(ref)
            sample = self.sampler.latest(state) if state.status == "running" else None
            disk = self.monitor.figures(state) if sample else None
            fault = self.gpu_faults().get(state.name) if sample else None
            answers[ref] = JobStats(state.exists, state.status or None, sample, disk, fault)
        return answers

    def _why(self, state: ContainerState) -> ContainerState | StoppedView:
        reason = self.store.stop_reason(state)  # and how far a stop under way is:
        stopping = self.stopper.stopping.get(state.name) if state.exists else None
        disk = self.monitor.figures(state)  # a running job's, or why it was stopped
        fault = self.gpu_faults().get(state.name) if state.exists else None
        if not (reason or stopping or disk or fault):
            return state
        return self.views.of(state, reason, stopping, disk, fault)

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

    # --- stop, remove, reap -------------------------------------------------------------

    async def stop(self, ref: str, plan: StopPlan = NO_PLAN) -> None:
        """Cancel a pending launch; warn, signal, SIGKILL, as the plan says (`Stopper`)."""
        await self.stopper.stop(ref, plan)

    async def signal(self, ref: str, signal: str) -> None:
        """A signal to a running job, which goes on; not running or pending: 409."""
        await self.stopper.signal(ref, signal)

    async def remove(self, ref: str) -> None:
        """Cancel a pending launch, then force-remove the container (missing: no-op)."""
        await self.stopper.remove(ref)

    async def reap(self, max_age_s: float | None) -> int:
        """Remove the node's exited (and never-started) containers older than the age."""
        return await self.reaper.reap(max_age_s)

    async def sweep_wreckage(self, *, older_than_s: float) -> int:
        """Remove the created, never-started containers no launch is making."""
        return await self.reaper.sweep_wreckage(older_than_s=older_than_s)

    # --- cordon and drain ---------------------------------------------------------------

    async def cordon(self, reason: str | None) -> NodeState:
        return await self.keeper.cordon(reason)

    async def uncordon(self) -> NodeState:
        return await self.keeper.uncordon()

    async def drain(self, reason: str | None, plan: StopPlan = NO_PLAN) -> NodeState:
        return await self.keeper.drain(reason, plan)

    # --- the node -----------------------------------------------------------------------

    async def status(self) -> NodeStatus:
        """What health reports: the engine, the cards, the pending launches, the disk."""
        return await self.health.status(pending=self.pending, node=self.node)

    async def inventory(self) -> Inventory:
        return await self.health.inventory(self.node)
