"""The node-state keeper: cordon, uncordon and drain, and the drain's background task.

A drain cordons the node, then passes over it until nothing is left: each pass cancels
the pending launches and stops the running jobs, noting why on each. A drain the last
daemon left unfinished goes on when the next one starts: its state is on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import replace

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.jobs.launcher import Launcher
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.nodestate import NodeStateStore
from tuneplane_node.jobs.ours import Listing
from tuneplane_node.jobs.stopper import Stopper
from tuneplane_node.jobs.words.status import NodeState
from tuneplane_node.runtime.base import RUNNING
from tuneplane_node.settings import LifecycleSettings
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import CORDONED, DRAINED, DRAINING, READY, StopPlan

log = logging.getLogger(__name__)

DRAIN_RETRY_S = 5.0
"""A drain whose stops failed (the engine down) tries again after this long."""
DRAIN_AGAIN_S = 0.1
"""The pause before the next pass after stops: a job that will not die never turns the
drain into a busy loop."""


class DrainPass(enum.Enum):
    """How one pass over the node went, and so when the next one comes."""

    DRAINED = "drained"  # nothing pending, nothing running: the drain is done
    AGAIN = "again"  # stops were sent: look again at once
    LATER = "later"  # the engine failed, or a stop did: look again after DRAIN_RETRY_S

    @property
    def pause_s(self) -> float:
        return DRAIN_RETRY_S if self is DrainPass.LATER else DRAIN_AGAIN_S


class NodeStateKeeper:
    """Whether the node takes launches, as the operator decided; the drain that carries a
    ``drain`` out. The state itself is the store's (`NodeStateStore`)."""

    def __init__(
        self,
        runtime: Listing,
        settings: LifecycleSettings,
        *,
        store: NodeStateStore,
        locks: RefLocks,
        launcher: Launcher,
        stopper: Stopper,
        clock: Clock,
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.store = store
        self.locks = locks
        self.launcher = launcher
        self.stopper = stopper
        self.clock = clock
        self.tasks = BackgroundTasks(log)  # the drain's, one at a time
        self._drain: asyncio.Task[None] | None = None

    @property
    def node(self) -> NodeState:
        return self.store.node

    async def start(self) -> None:
        """Read the operator's decision from disk; a drain the last daemon left unfinished
        goes on (a node coming back never undoes what the operator decided)."""
        node = await self.store.load()
        log.info("node state: %s%s", node.state, _because(node.reason))
        if node.state == DRAINING:
            self._start_drain()

    async def cordon(self, reason: str | None, *, notice: str | None = None) -> NodeState:
        """Refuse new launches; what runs goes on. A draining or drained node stays so.
        ``notice``: the notice that cordons it (its withdrawal undoes it), else the
        operator."""
        if self.node.state in (READY, CORDONED):
            await self.store.save(self.node.to(CORDONED, reason, self.store.stamp(), notice=notice))
        return self.node

    async def uncordon(self) -> NodeState:
        """Take launches again; a drain in progress ends (stops already sent stand)."""
        await self.close()
        await self.store.save(self.node.to(READY, None, self.store.stamp()))
        return self.node

    async def withdrawn(self, notice: str) -> NodeState:
        """The notice that made the node's state is withdrawn: the node takes launches
        again (a drain of it ends: stops already sent stand). A state the operator made
        since, or another notice's, stays."""
        if self.node.notice == notice:
            await self.uncordon()
        return self.node

    async def drain(
        self,
        reason: str | None,
        plan: StopPlan,
        *,
        notice: str | None = None,
        stopping_as: str | None = None,
    ) -> NodeState:
        """Cordon, then cancel every pending launch and stop every running job as the
        plan says (its warning, the job's stop signal, SIGKILL after the grace period),
        in the background: draining, then drained. A plan without a warning warns each
        job as it asked at launch, else as the operator said (`Stopper.warned`).
        ``notice``: the notice that drains it, else the operator; ``stopping_as``: how its
        stops are noted (``drain: <reason>``)."""
        grace = self.settings.local_stop_timeout if plan.grace is None else plan.grace
        await self.close()
        draining = self.node.to(DRAINING, reason, self.store.stamp(), notice=notice)
        draining = replace(
            draining, grace_s=grace, warn_signal=plan.warn_signal, warn_s=plan.warn_s,
            stopping_as=stopping_as,
        )  # fmt: skip
        await self.store.save(draining)
        self._start_drain()
        return self.node

    async def close(self) -> None:
        """End a drain in progress; the next start resumes it from the state on disk."""
        if self._drain is not None:
            await self.tasks.cancel(self._drain)
        self._drain = None

    def _start_drain(self) -> None:
        self._drain = self.tasks.spawn(self._drain_node(), name="drain")

    async def _drain_node(self) -> None:
        why = self.node.stopping_as or f"drain: {self.node.reason or 'no reason given'}"
        node = self.node
        grace = node.grace_s if node.grace_s is not None else 0.0
        plan = StopPlan(grace=grace, warn_signal=node.warn_signal, warn_s=node.warn_s)
        while (outcome := await self._drain_once(why, plan)) is not DrainPass.DRAINED:
            await self.clock.sleep(outcome.pause_s)
        log.info("node drained%s", _because(self.node.reason))
        drained = self.node.to(
            DRAINED, self.node.reason, self.store.stamp(), notice=self.node.notice
        )
        with contextlib.suppress(NodeError):  # the engine down: prune next time
            drained = drained.keeping(s.handle for s in await self.runtime.ps())
        try:
            await self.store.save(drained)
        except NodeError as exc:
            log.error("%s", exc.message)

    async def _drain_once(self, why: str, plan: StopPlan) -> DrainPass:
        """One pass: cancel what is pending, stop what runs."""
        try:
            for record in self.launcher.pending.records():
                async with self.locks.hold(record.ref):
                    await self.launcher.cancel(record.ref)
            running = [state for state in await self.runtime.ps() if state.status in RUNNING]
            if not running:
                return DrainPass.AGAIN if len(self.launcher.pending) else DrainPass.DRAINED
            failed = await self.stopper.stop_by_node(running, why, plan)
        except NodeError as exc:
            log.warning("drain: %s; trying again in %g s", exc.message, DRAIN_RETRY_S)
            return DrainPass.LATER
        for error in failed:
            log.warning("drain: a stop failed: %s; trying again in %g s", error, DRAIN_RETRY_S)
        return DrainPass.LATER if failed else DrainPass.AGAIN


def _because(reason: str | None) -> str:
    return f" ({reason})" if reason else ""
