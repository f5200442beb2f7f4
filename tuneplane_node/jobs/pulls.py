"""PullCoordinator: one pull per image, shared by every launch waiting for it.

As Nomad's docker driver keeps its coordinator apart from the driver: launches join a
pull, watch its progress, and leave it; the download stops when the last one leaves.
A pull is shared by the launches of one image with the same credentials: a launch with
wrong ones must not ride on another's right ones, nor fail them.
Every pull is a task of the coordinator's (`BackgroundTasks`), cancelled and awaited on
close; its error is its waiters' to report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuneplane_node.runtime.base import ContainerRuntime, PullLimits, PullProgress, RegistryAuth
from tuneplane_node.tasks import BackgroundTasks, by_awaiters
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry

log = logging.getLogger(__name__)


@dataclass
class SharedPull:
    """One pull of one image; ``progress`` is the engine's latest report, told to each
    of ``listeners`` (the launches waiting for it: each a change to watch)."""

    image: str
    auth: RegistryAuth | None = None
    task: asyncio.Task[None] | None = None
    waiters: int = 0
    progress: PullProgress = field(default_factory=PullProgress)
    listeners: list[Callable[[], None]] = field(default_factory=list)

    def update(self, progress: PullProgress) -> None:
        self.progress = progress
        for listener in self.listeners:
            listener()


class PullCoordinator:
    def __init__(
        self, runtime: ContainerRuntime, limits: PullLimits, telemetry: Telemetry = NO_TELEMETRY
    ) -> None:
        self.runtime = runtime
        self.limits = limits
        self.telemetry = telemetry
        self.pulls: dict[tuple[str, RegistryAuth | None], SharedPull] = {}
        self.tasks = BackgroundTasks(log)

    def join(self, image: str, auth: RegistryAuth | None = None) -> SharedPull:
        """The pull of ``image`` with ``auth`` in flight, or a new one, started now."""
        pull = self.pulls.get((image, auth))
        if pull is None:
            pull = SharedPull(image, auth)
            pull.task = self.tasks.spawn(self._pull(pull), name=f"pull {image}", ended=by_awaiters)
            self.pulls[(image, auth)] = pull
        pull.waiters += 1
        return pull

    async def wait(self, pull: SharedPull) -> None:
        """Wait for a joined pull to end (its error is raised); leave it whatever happens.

        When the last waiter leaves a pull still running, it is cancelled: nobody wants
        the image any more.
        """
        assert pull.task is not None
        try:
            await asyncio.shield(pull.task)
        finally:
            pull.waiters -= 1
            if pull.waiters == 0 and not pull.task.done():
                self._forget(pull)
                pull.task.cancel()

    async def _pull(self, pull: SharedPull) -> None:
        # Its duration is measured for the log and the metric, not the clock's (clock.py).
        started, outcome = time.monotonic(), "failed"
        try:
            await self.runtime.pull(
                pull.image, limits=self.limits, on_progress=pull.update, auth=pull.auth
            )
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._forget(pull)
            elapsed = time.monotonic() - started
            self.telemetry.pull_finished(outcome, elapsed, pull.progress.bytes_done)
            log.info(
                "pull of %s: %s after %.1f s, %d bytes",
                pull.image,
                outcome,
                elapsed,
                pull.progress.bytes_done,
                extra={"image": pull.image, "result": outcome},
            )

    def in_flight(self) -> int:
        return len(self.pulls)

    def _forget(self, pull: SharedPull) -> None:
        if self.pulls.get((pull.image, pull.auth)) is pull:
            del self.pulls[(pull.image, pull.auth)]

    async def close(self) -> None:
        """Cancel every pull (shutdown) and wait for them to end."""
        await self.tasks.close()
        self.pulls.clear()
