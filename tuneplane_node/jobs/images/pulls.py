"""PullCoordinator: one pull per image, shared by every launch waiting for it.

As Nomad's docker driver keeps its coordinator apart from the driver: launches join a
pull, watch its progress, and leave it; the download stops when the last one leaves.
A pull is shared by the launches of one image with the same credentials: a launch with
wrong ones must not ride on another's right ones, nor fail them. One image is one
canonical reference (`references.canonical`), however a launch spells it, and the engine
is told that reference: podman never sees a short name to match against its store.
Every pull is a task of the coordinator's (`BackgroundTasks`), cancelled and awaited on
close; its error is its waiters' to report. A pull that ends with the image is written
in the node's image ledger (`ImageLedger`), a prefetch's as one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.jobs.images.ledger import ImageLedger
from tuneplane_node.jobs.words.rate import PullRate
from tuneplane_node.logformat import job_fields
from tuneplane_node.references import canonical
from tuneplane_node.runtime.base import ProgressCallback, PullLimits, PullProgress
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.tasks import BackgroundTasks, by_awaiters
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)


class PullingRuntime(Protocol):
    """What a shared pull asks of the engine."""

    async def image_info(self, image: str) -> ImageInfo | None: ...
    async def pull(
        self,
        image: str,
        *,
        limits: PullLimits,
        on_progress: ProgressCallback | None = None,
        auth: RegistryAuth | None = None,
    ) -> None: ...


@dataclass
class SharedPull:
    """One pull of one image; ``progress`` is the engine's latest report, told to each
    of ``listeners`` (the launches waiting for it: each a change to watch), ``rate`` its
    download rate (`PullRate`), ``started_at`` the moment it started (UTC)."""

    image: str
    auth: RegistryAuth | None = None
    clock: Clock = SYSTEM_CLOCK
    task: asyncio.Task[None] | None = None
    waiters: int = 0
    progress: PullProgress = field(default_factory=PullProgress)
    prefetch: bool = False  # a prefetch joined it: the ledger says so
    listeners: list[Callable[[], None]] = field(default_factory=list)
    started_at: datetime = field(init=False)
    rate: PullRate = field(init=False)

    launches: dict[str, str] = field(default_factory=dict)  # ref -> run id, for the log

    def __post_init__(self) -> None:
        self.started_at = self.clock.now()
        self.rate = PullRate(self.clock.monotonic())

    def update(self, progress: PullProgress) -> None:
        self.progress = progress
        self.rate.add(self.clock.monotonic(), progress.bytes_done)
        for listener in self.listeners:
            listener()

    def rate_now(self) -> tuple[float | None, float | None]:
        """Bytes per second and seconds left, now (None while unknown)."""
        now, progress = self.clock.monotonic(), self.progress
        eta = self.rate.eta(now, bytes_done=progress.bytes_done, bytes_total=progress.bytes_total)
        return self.rate.rate(now), eta


class PullCoordinator:
    def __init__(
        self,
        runtime: PullingRuntime,
        limits: PullLimits,
        telemetry: Telemetry = NO_TELEMETRY,
        *,
        ledger: ImageLedger | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.runtime = runtime
        self.limits = limits
        self.telemetry = telemetry
        self.ledger = ledger
        self.clock = clock
        self.pulls: dict[tuple[str, RegistryAuth | None], SharedPull] = {}
        self.tasks = BackgroundTasks(log)
        # Told of every pull that failed (the image GC runs after one that filled the disk).
        self.on_failure: list[Callable[[NodeError], None]] = []
        # Told of every pull's progress (the image GC keeps room ahead of its bytes).
        self.on_progress: list[Callable[[SharedPull], None]] = []

    def join(
        self,
        image: str,
        auth: RegistryAuth | None = None,
        *,
        prefetch: bool = False,
        ref: str = "",
        run_id: str = "",
    ) -> SharedPull:
        """The pull of ``image`` with ``auth`` in flight, or a new one, started now; the
        launch joining it (``ref``, ``run_id``) is named by its log line."""
        key = (canonical(image), auth)
        pull = self.pulls.get(key)
        if pull is None:
            pull = SharedPull(image, auth, self.clock)
            pull.task = self.tasks.spawn(self._pull(pull), name=f"pull {image}", ended=by_awaiters)
            self.pulls[key] = pull
        pull.waiters += 1
        pull.prefetch = pull.prefetch or prefetch
        if ref:
            pull.launches[ref] = run_id
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
                canonical(pull.image),
                limits=self.limits,
                on_progress=functools.partial(self._progressed, pull),
                auth=pull.auth,
            )
            await self._record(pull)
            outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except NodeError as exc:
            for failed in self.on_failure:
                failed(exc)
            raise
        finally:
            self._forget(pull)
            elapsed = time.monotonic() - started
            self.telemetry.pull_finished(outcome, elapsed, pull.progress.bytes_done)
            refs, run_ids = ", ".join(pull.launches), ", ".join(pull.launches.values())
            log.info(
                "pull of %s for %s: %s after %.1f s, %d bytes",
                pull.image,
                refs or "no launch",
                outcome,
                elapsed,
                pull.progress.bytes_done,
                extra={"image": pull.image, "result": outcome}
                | job_fields(refs or None, run_ids or None),
            )

    def _progressed(self, pull: SharedPull, progress: PullProgress) -> None:
        pull.update(progress)
        for told in self.on_progress:
            told(pull)

    async def _record(self, pull: SharedPull) -> None:
        """Write the pulled image in the ledger. The image is here whatever happens: an
        engine that cannot say its id fails nothing, the ledger only misses it."""
        if self.ledger is None:
            return
        try:
            info = await self.runtime.image_info(canonical(pull.image))
        except NodeError as exc:
            log.warning("pulled %s, but its id is not known: %s", pull.image, exc.message)
            return
        if info is not None:
            at = self.clock.now()
            private = pull.auth is not None
            self.ledger.record_pull(
                pull.image, info.id, at, prefetch=pull.prefetch, private=private
            )

    def in_flight(self) -> int:
        return len(self.pulls)

    def bytes_done(self) -> int:
        """The bytes the pulls under way have downloaded (compressed, as the engine says)."""
        return sum(pull.progress.bytes_done for pull in self.pulls.values())

    def images(self) -> list[str]:
        """The images being pulled now."""
        return [pull.image for pull in self.pulls.values()]

    def _forget(self, pull: SharedPull) -> None:
        key = (canonical(pull.image), pull.auth)
        if self.pulls.get(key) is pull:
            del self.pulls[key]

    async def close(self) -> None:
        """Cancel every pull (shutdown) and wait for them to end."""
        await self.tasks.close()
        self.pulls.clear()
