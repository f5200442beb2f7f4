"""The stopper: stop and remove of the node's containers, pending launches cancelled first.

A missing or foreign container is nothing to do, and no error: the service's "ours" rule
(`Own`) says which containers are the node's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, rfc3339
from tuneplane_node.errors import NodeError, NotRunning
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.nodestate import NodeStateStore
from tuneplane_node.jobs.observe.watch import ChangeFeed
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.words.launch import Stopping
from tuneplane_node.jobs.words.views import DiskFigures, Own
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import RUNNING, ContainerState
from tuneplane_node.runtime.labels import warn_s_of, warn_signal_of
from tuneplane_node.settings import LifecycleSettings
from tuneplane_node.signals import DEFAULT_STOP_SIGNAL
from tuneplane_node.wire.values import SIGNALLED, WARNED, StopPlan

log = logging.getLogger(__name__)
NO_PLAN = StopPlan()
NOT_CAUGHT = "warning skipped: not caught"
"""Observe's note of a stop whose job has no handler for the warning signal: the warning
would have killed it by the signal's default action, so it got the stop signal alone."""


class Launches(Protocol):
    """The launcher (`Launcher`), as far as a stop needs it: its pending launches and
    the change log they feed, a pending launch cancelled, a container's mounts let go."""

    @property
    def changes(self) -> ChangeFeed: ...
    @property
    def pending(self) -> PendingTable: ...
    async def cancel(self, ref: str) -> None: ...
    async def release_mounts(self, labels: Mapping[str, str]) -> None: ...


class StoppingRuntime(Protocol):
    """What a stop asks of the engine."""

    async def inspect_fresh(self, name: str) -> ContainerState: ...
    async def kill(self, ref: str, signal: str) -> bool: ...
    async def catches(self, ref: str, signal: str) -> bool | None: ...
    async def wait_exited(self, name: str, timeout: float) -> bool: ...
    async def remove(self, ref: str) -> None: ...


class Stopper:
    """Ends jobs: a pending launch at whatever stage, a running one by its signals."""

    def __init__(
        self,
        runtime: StoppingRuntime,
        settings: LifecycleSettings,
        *,
        own: Own,
        locks: RefLocks,
        launcher: Launches,
        store: NodeStateStore,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.runtime = runtime
        self.clock = clock
        self.stopping: dict[str, Stopping] = {}  # the stops under way, by ref
        self.settings = settings
        self.own = own
        self.locks = locks
        self.launcher = launcher
        self.store = store

    async def stop(self, ref: str, plan: StopPlan = NO_PLAN) -> None:
        """Cancel a pending launch at whatever stage; then, for a running job, the plan's
        warning signal and the time it gives the job to end by itself, its stop signal,
        and SIGKILL once the grace period ends.

        Every wait is on the loop, holding neither an engine thread nor the ref's lock: a
        remove meanwhile kills the job at once, and 50 stops of jobs that ignore their
        signals leave every thread to the other verbs. Each signal after the first goes
        only to the container the stop began with, and only while it runs.
        """
        grace = self.settings.local_stop_timeout if plan.grace is None else plan.grace
        async with self.locks.hold(ref):
            await self.launcher.cancel(ref)
            seen = await self.own(ref)
            if seen.status not in RUNNING:
                return
            stop_signal = plan.signal or await self._stop_signal_of(seen)
            warning = await self._warning(seen, plan)
            first = warning or stop_signal
            await self.runtime.kill(seen.handle, first)
        skipped = NOT_CAUGHT if plan.warn_signal and not warning else None
        mark = self._mark(ref, WARNED if warning else SIGNALLED, note=skipped)
        job = job_fields(ref, seen.run_id)
        try:
            if warning:
                warn_s = grace if plan.warn_s is None else plan.warn_s
                log.info(
                    "stopping %s: %s, %s after %g s", ref, first, stop_signal, warn_s, extra=job
                )
                if await self.runtime.wait_exited(ref, warn_s):
                    return
                if not await self._signal(ref, seen, stop_signal):
                    return
                mark = self._mark(ref, SIGNALLED)
            log.info("stopping %s: %s, SIGKILL after %g s", ref, stop_signal, grace, extra=job)
            if not await self.runtime.wait_exited(ref, grace):
                await self._kill(ref, seen=seen, grace=grace)
        finally:
            if self.stopping.get(ref) is mark:
                del self.stopping[ref]
                self.launcher.changes.changed(ref)  # observe shows no stop under way now

    async def stop_by_node(
        self,
        states: Sequence[ContainerState],
        reason: str,
        plan: StopPlan = NO_PLAN,
        *,
        disk: DiskFigures | None = None,
    ) -> list[BaseException]:
        """Stop jobs the node decided to stop on its own (a card's fault, a notice, a
        drain, disk pressure): ``reason`` first, in the node state (observe's
        ``stop_reason``; a restart keeps it; ``disk``: what the jobs wrote, when the disk
        is why), then every job at once, each warned as `warned` says. Answers
        the errors of the stops that failed (a drain tries those again)."""
        handles = (s.handle for s in states)
        if disk is None:
            node = self.store.node.stopped(handles, reason)
        else:
            node = self.store.node.stopped(
                handles, reason, disk_used=disk.used_bytes,
                deleted_open=disk.deleted_open_bytes, inodes=disk.inodes,
            )  # fmt: skip
        try:
            await self.store.save(node)
        except NodeError as exc:  # in force all the same: the jobs must stop
            log.warning("%s", exc.message)
        stops = [self.stop(state.name, self.warned(state, plan)) for state in states]
        return [r for r in await asyncio.gather(*stops, return_exceptions=True) if r is not None]

    def warned(self, state: ContainerState, plan: StopPlan = NO_PLAN) -> StopPlan:
        """The plan of a stop the node makes on its own: a plan with a warning of its own
        (an operator's drain that gave one) as it is; else the job's launch's warning
        (its labels: `warn_signal_of`, `warn_s_of`), else the operator's
        (``TUNEPLANE_JOB_WARN_SIGNAL``, ``TUNEPLANE_JOB_WARN_S``), its time no longer than
        the plan's ``warn_s`` where it has one (a notice's clock)."""
        if plan.warn_signal:
            return plan
        labels = state.labels
        signal = warn_signal_of(labels) or self.settings.job_warn_signal
        if signal is None:
            return plan
        wanted = warn_s_of(labels)
        if wanted is None:
            wanted = self.settings.job_warn_s
        warn_s = wanted if plan.warn_s is None else min(wanted, plan.warn_s)
        return replace(plan, warn_signal=signal, warn_s=warn_s)

    async def signal(self, ref: str, signal: str) -> None:
        """Send a running job a signal, the job going on (a checkpoint request): a pending
        launch, or a job that is not running, is a `NotRunning` (409). So is one that
        ended as the signal went out (the engine found it stopped): nothing was sent."""
        async with self.locks.hold(ref):
            record = self.launcher.pending.get(ref)
            if record is not None:
                raise NotRunning(ref=ref, job_status=f"a pending launch ({record.phase})")
            state = await self.own(ref)
            if state.status in RUNNING and not await self.runtime.kill(state.handle, signal):
                state = await self.runtime.inspect_fresh(state.name)  # its end, as it is now
            if state.status not in RUNNING:
                raise NotRunning(ref=ref, job_status=state.status if state.exists else "missing")
        log.info("signalled %s: %s", ref, signal, extra=job_fields(ref, state.run_id))

    async def _stop_signal_of(self, state: ContainerState) -> str:
        """The job's stop signal; a state from the engine's list does not carry it."""
        if state.stop_signal is None:
            state = await self.runtime.inspect_fresh(state.name)
        return state.stop_signal or DEFAULT_STOP_SIGNAL

    async def _warning(self, seen: ContainerState, plan: StopPlan) -> str | None:
        """The plan's warning signal, unless no process of the job catches it (its
        default action would end the job at once, nothing saved); sent as asked where
        the node cannot tell."""
        if not plan.warn_signal:
            return None
        if await self.runtime.catches(seen.handle, plan.warn_signal) is not False:
            return plan.warn_signal
        log.info(
            "stopping %s: no process of it catches %s: its stop signal without the warning",
            seen.name, plan.warn_signal, extra=job_fields(seen.name, seen.run_id),
        )  # fmt: skip
        return None

    def _mark(self, ref: str, phase: str, *, note: str | None = None) -> Stopping:
        mark = Stopping(phase, rfc3339(self.clock.now()), note)
        self.stopping[ref] = mark
        self.launcher.changes.changed(ref)  # observe shows the stop's phase
        return mark

    async def _signal(self, ref: str, seen: ContainerState, signal: str) -> bool:
        """The signal to the container the stop began with, if it still runs."""
        async with self.locks.hold(ref):
            now = await self.own(ref)
            if now.id != seen.id or now.status not in RUNNING:
                return False  # gone, or relaunched meanwhile: not the job this stop was for
            await self.runtime.kill(now.handle, signal)
            return True

    async def _kill(self, ref: str, *, seen: ContainerState, grace: float) -> None:
        if not await self._signal(ref, seen, "SIGKILL"):
            return
        job = job_fields(ref, seen.run_id)
        log.info("stopping %s: still running after %g s, SIGKILL", ref, grace, extra=job)
        if not await self.runtime.wait_exited(ref, self.settings.local_api_timeout):
            log.warning("stopping %s: still running after SIGKILL", ref, extra=job)

    async def remove(self, ref: str) -> None:
        """Cancel a pending launch, then force-remove the container (missing: no-op)."""
        async with self.locks.hold(ref):
            await self.launcher.cancel(ref)
            state = await self.own(ref)
            if state.exists:
                await self.discard(state)
                log.info("removed %s", ref, extra=job_fields(ref, state.run_id))

    async def discard_for_relaunch(self, state: ContainerState) -> None:
        """The exited (or never started) container of a run launched again: it goes."""
        job = job_fields(state.name, state.run_id)
        log.info("relaunch of %s: removing its %s container", state.name, state.status, extra=job)
        await self.discard(state)

    async def discard(self, state: ContainerState) -> None:
        """Remove a container already read, under its ref's lock, and the reason the node
        kept for having stopped it."""
        await self.runtime.remove(state.handle)
        await self.launcher.release_mounts(state.labels)
        await self.store.forget(state)
