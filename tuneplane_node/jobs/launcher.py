"""The launcher: a launch the service decided on, started at once or after its pull.

It owns the pending launches (their table and their background tasks) and the
`Reservation` that pairs a launch's card claim with its release, and the image GC
(`ImageCollector`), whose pull gate a launch passes before it reserves anything and whose
holds keep its image from a run from its first look until its container exists. What a
launch does with what it finds is the service's rule; this is how it is carried out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import replace

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.affinity import CpuAffinity
from tuneplane_node.jobs.confinement import JobRules
from tuneplane_node.jobs.disklimit import DiskLimits
from tuneplane_node.jobs.imagegc import ImageCollector
from tuneplane_node.jobs.images import ImageKeeper
from tuneplane_node.jobs.mounts import MountPolicy
from tuneplane_node.jobs.pending import STARTING, PendingLaunch, PendingTable
from tuneplane_node.jobs.prefetch import Prefetcher
from tuneplane_node.jobs.pulls import PullCoordinator
from tuneplane_node.jobs.results import LaunchRequest, Pulling, Started
from tuneplane_node.jobs.watch import ChangeLog
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import DEVICES_ENV, ContainerRuntime, ContainerSpec, Mount
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks

log = logging.getLogger(__name__)


class Reservation:
    """A launch's cards, from its acceptance until its container's label holds them or
    the launch ends without one. The one place a launch claims cards (`claim`; again
    after a pull, which keeps them if they are still free) and the one place it lets
    them go (`release`, once: a second call does nothing). ``async with`` ties the
    release to a block; a pending launch's task ends in `Launcher._ended`, which
    releases it."""

    def __init__(self, allocator: GpuAllocator, request: LaunchRequest) -> None:
        self.allocator = allocator
        self.request = request
        self._held = False

    async def claim(self) -> tuple[int, ...]:
        """The cards, or `NoCapacity`; a refusal leaves an earlier claim held."""
        request = self.request
        cards = await self.allocator.claim(
            request.ref, request.requested_gpus, run_id=request.run_id
        )
        self._held = True
        return cards

    def release(self) -> None:
        if self._held:
            self._held = False
            self.allocator.release(self.request.ref)

    async def __aenter__(self) -> tuple[int, ...]:
        return await self.claim()

    async def __aexit__(self, *exc_info: object) -> None:
        self.release()


class Launcher:
    """Starts vetted launches: the container at once when its image is here, else a
    pending launch whose task pulls the image, then starts it."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        allocator: GpuAllocator,
        pulls: PullCoordinator,
        *,
        images: ImageKeeper,
        settings: NodeSettings,
        clock: Clock,
    ) -> None:
        self.runtime = runtime
        self.allocator = allocator
        self.pulls = pulls
        self.images = images
        self.clock = clock
        self.changes = ChangeLog(runtime, settings, clock=clock)  # watch's, fed by the table
        self.pending = PendingTable(clock=clock, on_change=self.changes.changed)
        self.tasks = BackgroundTasks(log)  # the pending launches'
        self.rules = JobRules(settings)
        self.disk = DiskLimits(settings)
        self.affinity = CpuAffinity(settings)
        self.mounts = MountPolicy(settings.mount_roots, never_a_root=settings.never_a_root)
        self.gc = ImageCollector(runtime, settings, pulls=pulls, clock=clock)
        self.prefetcher = Prefetcher(runtime, pulls, images=images, gc=self.gc, clock=clock)

    async def vetted(self, request: LaunchRequest) -> LaunchRequest:
        """The launch with its spec as the node allows it: the operator's confinement
        (`JobRules`, RDMA by the cards it asks for), real mount paths under the mount
        roots, the bytes it may write to the engine's disk, and the cards the node chose
        as the only ones the container may see."""
        spec, cards = request.spec, request.requested_gpus
        env = dict(spec.env)
        if env.pop(DEVICES_ENV, None) is not None:
            log.warning(
                "launch %s: dropped %s from env: the node chooses", spec.name, DEVICES_ENV,
                extra=about(request),
            )  # fmt: skip
        spec = await asyncio.to_thread(self.rules.apply, replace(spec, env=env), cards=cards)
        spec = self.disk.apply(spec, await self.gc.store())
        return replace(request, spec=replace(spec, mounts=await self._checked_mounts(spec)))

    async def _checked_mounts(self, spec: ContainerSpec) -> tuple[Mount, ...]:
        return await asyncio.to_thread(self.mounts.check, spec.mounts) if spec.mounts else ()

    async def start(self, request: LaunchRequest) -> Started | Pulling:
        """Run the image that is here (a private one only for credentials it admits:
        `ImageAccessDenied` before anything is made), or pull it first: when it is
        missing, or the pull policy says pull again. Under disk pressure, nothing:
        `DiskPressure` (507)."""
        self.disk.check_room(await self.gc.store())
        image = request.spec.image
        request = replace(request, auth=await self.images.credentials(request))
        with self.gc.holds.hold(image):  # no GC run takes it between the look and the use
            present = await self.runtime.image_exists(image)
            if present:
                await self.images.admit(image, request.auth)
            if present and not self.images.must_pull(image, request.pull_policy):
                return await self.start_now(request)
            await self.gc.fit(image, request.auth, present=present)  # else 507, nothing held
            return await self.start_pending(request)

    async def start_now(self, request: LaunchRequest) -> Started:
        """The container, with the cards it was given; its image is here."""
        async with Reservation(self.allocator, request) as cards:
            container_id = await self.runtime.run(await self._placed(request.spec, cards))
        # The label holds the cards now, or nobody does.
        await self._used(request)
        log.info(
            "launch %s: running with gpus %s", request.ref, list(cards),
            extra=about(request, gpus=list(cards)),
        )  # fmt: skip
        return Started(container_id[:12], cards)

    async def start_pending(self, request: LaunchRequest) -> Pulling:
        """Reserve the cards now (an accepted launch cannot lose them mid-pull), pull the
        image in the background, then start the container."""
        reservation = Reservation(self.allocator, request)
        await reservation.claim()
        record = PendingLaunch(request, accepted=self.clock.monotonic())
        self.pending.add(record)
        record.task = self.tasks.spawn(
            self._complete(record, reservation),
            name=f"launch {request.ref}",
            ended=functools.partial(self._ended, record, reservation),
        )
        log.info(
            "launch %s: pulling %s in the background", request.ref, request.spec.image,
            extra=about(request),
        )  # fmt: skip
        return Pulling(request.spec.image, request.requested_gpus)

    async def _complete(self, record: PendingLaunch, reservation: Reservation) -> None:
        """Pull, then start; how it ended is `_ended`'s to record."""
        with self.gc.holds.hold(record.image):
            await self._pull_and_run(record, reservation)

    async def _pull_and_run(self, record: PendingLaunch, reservation: Reservation) -> None:
        auth = record.request.auth
        request = record.request
        record.pull = pull = self.pulls.join(
            record.image, auth, ref=request.ref, run_id=request.run_id
        )
        progressed = functools.partial(self.changes.progressed, record.ref)
        pull.listeners.append(progressed)
        try:
            await self.pulls.wait(pull)
        finally:
            pull.listeners.remove(progressed)
        await self.images.pulled(record.image, auth)
        record.phase = STARTING
        self.pending.changed(record.ref)
        # A pull takes minutes, in which a job could swap a mount's directory for a link.
        mounts = await self._checked_mounts(record.request.spec)
        cards = await reservation.claim()
        spec = await self._placed(replace(record.request.spec, mounts=mounts), cards)
        start = asyncio.ensure_future(self.runtime.run(spec))
        try:
            await asyncio.shield(start)
        except asyncio.CancelledError:
            # A stop landed while the engine was creating the container: let the engine
            # call finish, then tear down whatever it made.
            with contextlib.suppress(Exception):
                await start
            await self._teardown(record.request)
            raise
        await self._used(record.request)

    async def _used(self, request: LaunchRequest) -> None:
        """Write the container's image's use in the ledger: the image id the engine made
        it from (the tag may have moved since). The container runs either way."""
        ledger = self.pulls.ledger
        if ledger is None:
            return
        try:
            state = await self.runtime.inspect(request.spec.name)
        except NodeError as exc:
            log.warning("launch %s: its image's use is not recorded: %s", request.ref, exc.message)
            return
        if state.image_id is not None:
            ledger.record_use(request.spec.image, state.image_id, self.clock.now())

    async def _placed(self, spec: ContainerSpec, cards: tuple[int, ...]) -> ContainerSpec:
        """The spec on the cards it was given, with their CPUs and memory (`CpuAffinity`)."""
        spec = replace(spec, gpus=cards)
        return self.affinity.apply(spec, await self.allocator.snapshot()) if cards else spec

    def _ended(
        self, record: PendingLaunch, reservation: Reservation, task: asyncio.Task[None]
    ) -> None:
        """Where every pending launch ends, whichever way: its record says how, in the
        same step as its cards are let go. A done callback, because a task cancelled
        before it first ran never enters its body, so no ``finally`` of its own runs."""
        reservation.release()
        if task.cancelled():
            return
        error, job = task.exception(), about(record.request)
        if error is None:
            self.pending.finish(record)
            log.info("launch %s: started after its pull", record.ref, extra=job)
        elif isinstance(error, NodeError):
            log.warning("launch %s failed: %s", record.ref, error.message, extra=job)
            self.pending.fail(record, error.message)
        else:
            log.error("launch %s failed on a bug", record.ref, exc_info=error, extra=job)
            self.pending.fail(record, f"internal error: {type(error).__name__}: {error}")

    async def _teardown(self, request: LaunchRequest) -> None:
        try:
            await self.runtime.remove(request.ref)
        except NodeError as exc:
            log.error(
                "could not remove %s after its launch was cancelled: %s", request.ref,
                exc.message, extra=about(request),
            )  # fmt: skip

    async def cancel(self, ref: str) -> None:
        """End a pending launch at whatever stage. Its cards are let go once this
        returns: the wait, even on a task already done, comes after `_ended`."""
        record = self.pending.pop(ref)
        if record is None or record.task is None:
            return
        running = not record.task.done()
        await self.tasks.cancel(record.task)
        if running:
            log.info(
                "launch %s cancelled in phase %s", ref, record.phase, extra=about(record.request)
            )

    async def close(self) -> None:
        """Cancel every background launch and prefetch, then every pull (shutdown): a
        launch cancelled while its pull runs leaves it first, as a stop would."""
        await self.tasks.close()
        await self.prefetcher.close()
        await self.pulls.close()
        await self.changes.close()
        await self.gc.close()


def about(request: LaunchRequest, **more: object) -> dict[str, object]:
    """The fields of a log line about this launch (JSON logs)."""
    return job_fields(request.ref, request.run_id, image=request.spec.image, **more)
