"""The stopper: stop and remove of the node's containers, pending launches cancelled first.

A missing or foreign container is nothing to do, and no error: the service's "ours" rule
(`Own`) says which containers are the node's.
"""

from __future__ import annotations

import logging

from tuneplane_node.jobs.launcher import Launcher
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.nodestate import NodeStateStore
from tuneplane_node.jobs.results import Own
from tuneplane_node.runtime.base import RUNNING, ContainerRuntime, ContainerState
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)


class Stopper:
    """Ends jobs: a pending launch at whatever stage, a running one by its signals."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        settings: NodeSettings,
        *,
        own: Own,
        locks: RefLocks,
        launcher: Launcher,
        store: NodeStateStore,
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.own = own
        self.locks = locks
        self.launcher = launcher
        self.store = store

    async def stop(self, ref: str, timeout: float | None) -> None:
        """Cancel a pending launch at whatever stage; SIGTERM, then SIGKILL once the grace
        period ends.

        The grace period is waited on the loop, holding neither an engine thread nor the
        ref's lock: a remove meanwhile kills the job at once, and 50 stops of jobs that
        ignore SIGTERM leave every thread to the other verbs.
        """
        grace = self.settings.local_stop_timeout if timeout is None else timeout
        async with self.locks.hold(ref):
            await self.launcher.cancel(ref)
            state = await self.own(ref)
            if state.status not in RUNNING:
                return
            await self.runtime.kill(state.handle, "SIGTERM")
        log.info("stopping %s: SIGTERM, SIGKILL after %g s", ref, grace)
        if not await self.runtime.wait_exited(ref, grace):
            await self._kill(ref, seen=state, grace=grace)

    async def _kill(self, ref: str, *, seen: ContainerState, grace: float) -> None:
        async with self.locks.hold(ref):
            now = await self.own(ref)
            if now.id != seen.id or now.status not in RUNNING:
                return  # gone, or relaunched meanwhile: not the job this stop was for
            log.info("stopping %s: still running after %g s, SIGKILL", ref, grace)
            await self.runtime.kill(now.handle, "SIGKILL")
        if not await self.runtime.wait_exited(ref, self.settings.local_api_timeout):
            log.warning("stopping %s: still running after SIGKILL", ref)

    async def remove(self, ref: str) -> None:
        """Cancel a pending launch, then force-remove the container (missing: no-op)."""
        async with self.locks.hold(ref):
            await self.launcher.cancel(ref)
            state = await self.own(ref)
            if state.exists:
                await self.discard(state)
                log.info("removed %s", ref)

    async def discard(self, state: ContainerState) -> None:
        """Remove a container already read, under its ref's lock, and the reason the node
        kept for having stopped it."""
        await self.runtime.remove(state.handle)
        await self.store.forget(state)
