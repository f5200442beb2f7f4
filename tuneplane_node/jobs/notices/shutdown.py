"""ShutdownWatcher: the OS's shutdown, heard from systemd-logind and turned into a drain
in the time its delay lock gives.

At start the node takes a delay lock on shutdown (where the system bus answers: a
container, a machine without systemd, has none, and SIGTERM to the node ends it as
before). On ``PrepareForShutdown(true)`` the shutdown is a notice that ends the jobs,
its deadline logind's ``InhibitDelayMaxSec`` from now: the reactor drains on that clock,
and the lock goes once the node is drained, or just before the delay ends (logind would
go on then anyway). A shutdown cancelled (``false``) withdraws the notice and takes the
lock again.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from tuneplane_node.clock import Clock
from tuneplane_node.jobs.notices.reactor import NoticeReactor
from tuneplane_node.jobs.words.notices import SHUTDOWN, Notice
from tuneplane_node.runtime.logind import Logind, LogindUnavailable, release
from tuneplane_node.wire.values import DRAINED

log = logging.getLogger(__name__)
LISTEN_S = 1.0  # a wait for logind's signal, in steps a cancel ends
RELEASE_EARLY_S = 0.5  # the lock goes this long before the delay ends, drained or not
KEY = "logind shutdown"
WHY = "drain the node's jobs, each warned first"


class ShutdownWatcher:
    def __init__(self, reactor: NoticeReactor, *, clock: Clock, bus: str = "SYSTEM") -> None:
        self.reactor = reactor
        self.clock = clock
        self.logind = Logind(bus)
        self.delay_s: float | None = None  # logind's, once asked: `check` and health say it

    async def run(self) -> None:
        """Until cancelled: the lock held, each shutdown drained in its delay."""
        try:
            await asyncio.to_thread(self.logind.open)
            self.delay_s = await asyncio.to_thread(self.logind.delay_max_s)
        except LogindUnavailable as exc:
            log.info("no systemd-logind (%s): the OS's shutdown is not drained for", exc)
            return
        log.info("holding a shutdown delay lock: logind gives %g s to drain", self.delay_s)
        try:
            while True:
                lock = await asyncio.to_thread(self.logind.inhibit, WHY)
                await self._until_shutdown()
                await self._drained_or_late()
                release(lock)
                await self._until_cancelled()
        except LogindUnavailable as exc:
            log.warning("systemd-logind went away (%s): the OS's shutdown is not drained for", exc)
        finally:
            await asyncio.to_thread(self.logind.close)

    async def _until_shutdown(self) -> None:
        while await asyncio.to_thread(self.logind.prepared, LISTEN_S) is not True:
            pass
        delay = self.delay_s or 0.0
        deadline = self.clock.now() + timedelta(seconds=delay)
        # Its own margin: the lock goes RELEASE_EARLY_S before the delay ends, and a
        # cloud's 10 s would be all of logind's default 5.
        notice = Notice(
            "logind", SHUTDOWN, KEY, True, deadline, "PrepareForShutdown", RELEASE_EARLY_S
        )
        await self.reactor.react("logind", [notice])

    async def _drained_or_late(self) -> None:
        """Until the node is drained, or the delay is nearly over."""
        end = self.clock.monotonic() + max(0.0, (self.delay_s or 0.0) - RELEASE_EARLY_S)
        while self.reactor.keeper.node.state != DRAINED and self.clock.monotonic() < end:
            await self.clock.sleep(0.05)

    async def _until_cancelled(self) -> None:
        """A shutdown under way ends the node soon; one cancelled withdraws the notice."""
        while await asyncio.to_thread(self.logind.prepared, LISTEN_S) is not False:
            pass
        log.warning("the OS's shutdown was cancelled")
        await self.reactor.react("logind", [])
