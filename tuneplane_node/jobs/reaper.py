"""The reaper: the node's finished containers past their age, and the wreckage of launches.

Reap takes what the console asks for (exited, or never started, past an age); the sweep
takes, unasked, what a daemon killed between create and start left behind. Neither takes
a container a launch is making right now.
"""

from __future__ import annotations

import logging
from datetime import datetime

from tuneplane_node.clock import Clock, parse_rfc3339
from tuneplane_node.errors import EngineConflict, NodeError
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.ours import Listing
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.stopper import Stopper
from tuneplane_node.jobs.words.views import Own
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.settings import LifecycleSettings
from tuneplane_node.wire.values import FAILED

log = logging.getLogger(__name__)


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


class Reaper:
    """Removes what the node's containers left: through the stopper, under each ref's lock,
    after reading the container again from the engine (``own``: it may have been
    relaunched meanwhile, and the state cache may not yet know of its start)."""

    def __init__(
        self,
        runtime: Listing,
        settings: LifecycleSettings,
        *,
        own: Own,
        locks: RefLocks,
        pending: PendingTable,
        stopper: Stopper,
        clock: Clock,
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.own = own
        self.locks = locks
        self.pending = pending
        self.stopper = stopper
        self.clock = clock

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
            state = await self.own(name)  # it may have been relaunched meanwhile
            if not reapable(state, max_age_s, self.clock.now()):
                return False
            try:
                await self.stopper.discard(state)
            except EngineConflict:
                return False  # the engine is busy with it: next time
            return True

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
            state = await self.own(seen.name)
            if state.id != seen.id or not _wreck(state, older_than_s, self.clock.now()):
                return False
            log.warning(
                "%s was created and never started: removing it", seen.name,
                extra=job_fields(seen.name, seen.run_id, gpus=list(seen.gpus)),
            )  # fmt: skip
            await self.stopper.discard(state)
            return True

    @property
    def wreck_grace_s(self) -> float:
        """How old a never-started container must be to be wreckage: one engine call's
        deadline, the longest a launch takes between its create and its start."""
        return self.settings.local_api_timeout

    async def maintain(self) -> None:
        """Sweep wreckage once a relist period, as long as the node runs."""
        while True:
            await self.clock.sleep(self.settings.state_relist_s)
            try:
                await self.sweep_wreckage(older_than_s=self.wreck_grace_s)
            except NodeError as exc:
                log.warning("sweeping wreckage failed: %s", exc.message)
