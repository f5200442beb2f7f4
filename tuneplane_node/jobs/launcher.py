"""The launcher: a launch the service decided on, started at once or after its pull.

It runs the pending launches (their background tasks, in the table it is handed) and the
`Reservation` that pairs a launch's card claim with its release, and passes the image
GC's (`ImageCollector`) pull gate before it reserves anything; the GC's holds keep its
image from a run from its first look until its container exists. A launch's spec goes
through its two phases' steps (`LaunchStep`), which `jobs.node.build_node` lists in
order: the vet steps (`vetted`, before the run's lock) and the place steps
(`_placed`, once the cards are reserved). It makes none of its collaborators:
`build_node` hands them over. What a launch does with what it finds is the service's
rule; this is how it is carried out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from tuneplane_node.clock import Clock
from tuneplane_node.errors import DriverTooOld, NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.cudareq import too_old
from tuneplane_node.jobs.disk.limit import DiskLimits
from tuneplane_node.jobs.images.gc import ImageCollector
from tuneplane_node.jobs.images.keeper import ImageKeeper
from tuneplane_node.jobs.images.pulls import PullCoordinator
from tuneplane_node.jobs.mounts.launch import LaunchMounts
from tuneplane_node.jobs.observe.watch import ChangeFeed
from tuneplane_node.jobs.pending import PendingLaunch, PendingTable
from tuneplane_node.jobs.reservation import Reservation
from tuneplane_node.jobs.rules.fabric import FabricAddresses
from tuneplane_node.jobs.volumes.keeper import VolumeKeeper
from tuneplane_node.jobs.words.launch import LaunchRequest, LaunchStep, Pulling, Started
from tuneplane_node.logformat import job_fields
from tuneplane_node.references import canonical
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import STARTING, Launch

log = logging.getLogger(__name__)
Clear = Callable[[], Awaitable[None]]
"""What a launch clears before its container is made: a relaunched run's exited one."""


async def nothing_to_clear() -> None:
    """A launch of a run that has no container."""


def launch_request(launch: Launch) -> LaunchRequest:
    """The contract's launch as the launcher carries it: the runtime's spec of its
    container, before any decision of the node's."""
    return LaunchRequest(
        launch.run_id,
        launch.requested_gpus,
        ContainerSpec.of(launch.container),
        auth=launch.auth,
        pull_policy=launch.pull_policy,
        relaunch=launch.relaunch,
    )


class Launcher:
    """Starts vetted launches: the container at once when its image is here, else a
    pending launch whose task pulls the image, then starts it."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        allocator: GpuAllocator,
        pulls: PullCoordinator,
        *,
        vet: Sequence[LaunchStep],
        place: Sequence[LaunchStep],
        images: ImageKeeper,
        clock: Clock,
        changes: ChangeFeed,
        pending: PendingTable,
        tasks: BackgroundTasks,
        disk: DiskLimits,
        mounts: LaunchMounts,
        volumes: VolumeKeeper,
        gc: ImageCollector,
        fabric: FabricAddresses,
    ) -> None:
        self.runtime = runtime
        self.allocator = allocator
        self.pulls = pulls
        self.vet = tuple(vet)  # the launch's phases, in `build_node`'s order
        self.place = tuple(place)
        self.images = images
        self.clock = clock
        self.changes = changes  # watch's, fed by the table
        self.pending = pending
        self.tasks = tasks  # the pending launches'
        self.disk = disk  # the room a launch needs
        self.mounts = mounts  # staged by a place step, released here when the launch fails
        self.volumes = volumes
        self.gc = gc
        self.fabric = fabric  # the fabric network's addresses, held with the cards

    async def vetted(self, request: LaunchRequest) -> LaunchRequest:
        """The vet phase, before the run's lock: each vet step in turn (the spec stamped,
        confined, isolated, its disk limited, its mounts vetted: `build_node`), so the
        launch is as the node allows it, or refused before anything is held."""
        for step in self.vet:
            request = await step(request)
        return request

    async def release_mounts(self, labels: Mapping[str, str]) -> None:
        """Unmount a container's staged mounts (its label names them): it is gone."""
        await self.mounts.release(labels)

    async def start(
        self, request: LaunchRequest, *, clear: Clear = nothing_to_clear
    ) -> Started | Pulling:
        """Run the image that is here (a private one only for credentials it admits:
        `ImageAccessDenied` before anything is made), or pull it first: when it is
        missing, or the pull policy says pull again. The image is resolved to its id
        once, and the container is created from that id: what was checked is what runs.
        Under disk pressure, nothing: `DiskPressure` (507).

        ``clear`` is awaited once every check has passed (credentials, the image and
        volumes they may use, the room, the cards, the mounts staged), just before the
        container is made or the pull starts: a launch refused before leaves what it
        would replace as it was."""
        store = request.store if request.store is not None else await self.gc.store()
        self.disk.check_room(store)
        image = request.spec.image
        self.images.refuse_id(image, field="container.image")
        request = replace(request, auth=await self.images.credentials(request))
        request = await self._resolved(request)
        release = self.volumes.hold(request.spec.volumes)  # no eviction between look and use
        try:
            return await self._start_held(request, image, clear)
        finally:
            release()

    async def _resolved(self, request: LaunchRequest) -> LaunchRequest:
        """The launch with its OCI volumes named by digest, each one's credentials kept
        for its fill (a private entry these credentials may not use: `ImageAccessDenied`),
        and its URLs' entries proved (another source's bytes: `VolumeAccessDenied`)."""
        if not request.spec.volumes:
            return request
        resolved = await self.volumes.sources.resolved(
            request.spec.volumes, image=request.spec.image, auth=request.auth
        )
        spec = replace(request.spec, volumes=resolved.volumes)
        return replace(request, spec=spec, volume_auth=resolved.auth)

    async def _start_held(
        self, request: LaunchRequest, image: str, clear: Clear
    ) -> Started | Pulling:
        with self.gc.holds.hold(image):  # no GC run takes it between the look and the use
            info = await self.runtime.image_info(canonical(image))
            present = info is not None or await self._imageless(image)
            if info is not None:
                await self.images.admit(image, info, request.auth)
                await self._runs_on_driver(request, info)
            pull = not present or self.images.must_pull(image, request.pull_policy)
            if not pull and not await self.volumes.missing(request.spec.volumes):
                return await self.start_now(request, info, clear=clear)
            if not pull:
                return await self.start_pending(request, pull=False, clear=clear)
            await self.gc.fit(image, request.auth, present=present)  # else 507, nothing held
            await self.images.before_pull(image, request.auth)  # else 507: no record, no pull
            return await self.start_pending(request, clear=clear)

    async def _runs_on_driver(self, request: LaunchRequest, info: ImageInfo) -> None:
        """A card launch of an image needing a newer CUDA than the driver's is refused
        (`DriverTooOld`, 409): it would run without a usable card (`gpu.cudareq`)."""
        if request.requested_gpus <= 0 or not info.cuda_env:
            return
        gpus = await self.allocator.snapshot()
        old = too_old(info.cuda_env, gpus.cuda)
        if old is not None:
            raise DriverTooOld(
                image=request.spec.image, needs=old[0], driver_cuda=old[1], driver=gpus.driver
            )

    async def _imageless(self, image: str) -> bool:
        """A runtime that has an image it cannot describe: the process runtime's "every
        image is here" (it runs no image). An engine that lacks the image says False."""
        return await self.runtime.image_exists(canonical(image))

    async def start_now(
        self, request: LaunchRequest, info: ImageInfo | None, *, clear: Clear = nothing_to_clear
    ) -> Started:
        """The container, from the image id the reference resolved to, with the cards it
        was given; ``clear`` first, once the cards are held and the mounts staged."""
        async with Reservation(self.allocator, request, self.fabric) as cards:
            spec = await self._placed(request, info, cards)
            try:
                await clear()
                container_id = await self.runtime.run(spec)
            except BaseException:
                await self.mounts.release(spec.labels)  # the launch failed: nothing uses them
                raise
        # The label holds the cards now, or nobody does.
        self._used(request, info)
        log.info(
            "launch %s: running with gpus %s", request.ref, list(cards),
            extra=about(request, gpus=list(cards)),
        )  # fmt: skip
        return Started(container_id[:12], cards)

    async def start_pending(
        self, request: LaunchRequest, *, pull: bool = True, clear: Clear = nothing_to_clear
    ) -> Pulling:
        """Reserve the cards now (an accepted launch cannot lose them mid-pull), ``clear``,
        pull the image (``pull``) and fill the volumes in the background, then start the
        container."""
        reservation = Reservation(self.allocator, request, self.fabric)
        await reservation.claim()
        try:
            await clear()
        except BaseException:
            reservation.release()
            raise
        record = PendingLaunch(request, accepted=self.clock.monotonic(), needs_pull=pull)
        record.volumes_held = self.volumes.hold(request.spec.volumes)  # until it ends
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
        progressed = functools.partial(self.changes.progressed, record.ref)
        missing = await self.volumes.missing(record.request.spec.volumes)
        record.fills = self.volumes.join(missing, progressed, record.request.volume_auth)
        filled = asyncio.ensure_future(self.volumes.wait_all(record.fills, progressed))
        try:
            if record.needs_pull:
                await self._pull(record, progressed)
            await filled
        finally:
            if not filled.done():
                filled.cancel()
                await asyncio.wait({filled})
        await self.volumes.sources.pulled(missing, record.request.volume_auth)
        info = await self.runtime.image_info(canonical(record.image))
        if record.needs_pull:
            await self.images.pulled(record.image, info, record.request.auth)
        elif info is not None:
            # Admitted before its fills, by what the name named then: a name re-pointed
            # meanwhile (a tag) names another image, whose rule is asked now.
            await self.images.admit(record.image, info, record.request.auth)
        if info is not None:
            await self._runs_on_driver(record.request, info)
        record.phase = STARTING
        self.pending.changed(record.ref)
        cards = await reservation.claim()
        # Placed now, after the pull: what is mounted is what the walk opened at create.
        spec = await self._placed(record.request, info, cards)
        start = asyncio.ensure_future(self.runtime.run(spec))
        try:
            await asyncio.shield(start)
        except asyncio.CancelledError:
            # A stop landed while the engine was creating the container: let the engine
            # call finish, then tear down whatever it made.
            with contextlib.suppress(Exception):
                await start
            await self._teardown(record.request)
            await self.mounts.release(spec.labels)
            raise
        except BaseException:
            await self.mounts.release(spec.labels)
            raise
        self._used(record.request, info)

    async def _pull(self, record: PendingLaunch, progressed: Callable[[], None]) -> None:
        request = record.request
        record.pull = pull = self.pulls.join(
            record.image, request.auth, ref=request.ref, run_id=request.run_id
        )
        pull.listeners.append(progressed)
        try:
            await self.pulls.wait(pull)
        finally:
            pull.listeners.remove(progressed)

    def _used(self, request: LaunchRequest, info: ImageInfo | None) -> None:
        """Write the container's image's use in the ledger, by the id it was made from."""
        if self.pulls.ledger is not None and info is not None:
            self.pulls.ledger.record_use(info.id, self.clock.now())

    async def _placed(
        self, request: LaunchRequest, info: ImageInfo | None, cards: tuple[int, ...]
    ) -> ContainerSpec:
        """The place phase, once the cards are reserved: the spec made from the image's
        id (`_from`) on the cards it was given, through each place step in turn (its
        network, fabric address, cpuset, staged mounts: `build_node`)."""
        plan = replace(request, spec=replace(_from(request.spec, info), gpus=cards))
        for step in self.place:
            plan = await step(plan)
        return plan.spec

    def _ended(
        self, record: PendingLaunch, reservation: Reservation, task: asyncio.Task[None]
    ) -> None:
        """Where every pending launch ends, whichever way: its record says how, in the
        same step as its cards are let go. A done callback, because a task cancelled
        before it first ran never enters its body, so no ``finally`` of its own runs."""
        reservation.release()
        record.volumes_held()
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
        """Cancel every background launch (shutdown; `Node.close` then closes the pulls:
        a launch cancelled while its pull runs leaves it first, as a stop would)."""
        await self.tasks.close()


def _from(spec: ContainerSpec, info: ImageInfo | None) -> ContainerSpec:
    """The spec created from the image's id: nothing between the check and the create
    can re-point a name. A runtime without images runs it by its reference."""
    return replace(spec, image=info.id) if info is not None and info.id else spec


def about(request: LaunchRequest, **more: object) -> dict[str, object]:
    """The fields of a log line about this launch (JSON logs)."""
    return job_fields(request.ref, request.run_id, image=request.spec.image, **more)
