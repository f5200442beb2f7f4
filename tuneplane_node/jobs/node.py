"""The one place the node's services are made: `build_node`, and the `Node` it returns.

Every collaborator is made here once and handed, by keyword, to those that use it: the
job service and the launcher make none of their own. The daemon holds the `Node` and
talks to each service it needs directly (the catalog for images, the GC for a collect,
the sampler for stats), never through one service to another. `Node.start` and
`Node.close` are the services' lifecycle, in the order each needs; `Node.spawn_tasks`
names every background loop they run.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.disk.limit import DiskLimits
from tuneplane_node.jobs.disk.monitor import DiskMonitor
from tuneplane_node.jobs.drain import NodeStateKeeper
from tuneplane_node.jobs.faults.reactor import FaultReactor
from tuneplane_node.jobs.health import HealthReader
from tuneplane_node.jobs.images.catalog import ImageCatalog
from tuneplane_node.jobs.images.gc import ImageCollector
from tuneplane_node.jobs.images.keeper import CredentialSource, ImageKeeper
from tuneplane_node.jobs.images.ledger import ImageLedger
from tuneplane_node.jobs.images.prefetch import Prefetcher
from tuneplane_node.jobs.images.pulls import PullCoordinator
from tuneplane_node.jobs.launcher import Launcher
from tuneplane_node.jobs.locks import RefLocks
from tuneplane_node.jobs.mounts.launch import LaunchMounts
from tuneplane_node.jobs.mounts.policy import MountPolicy
from tuneplane_node.jobs.mounts.scratch import ScratchSpaces
from tuneplane_node.jobs.mounts.staging import MountStaging
from tuneplane_node.jobs.nodestate import NodeStateStore
from tuneplane_node.jobs.notices.reactor import NoticeReactor
from tuneplane_node.jobs.notices.shutdown import ShutdownWatcher
from tuneplane_node.jobs.notices.watcher import NoticeWatcher, watching
from tuneplane_node.jobs.observe.logs import LogsReader
from tuneplane_node.jobs.observe.stats import StatsSampler
from tuneplane_node.jobs.observe.views import ChangeCount, StoppedViews
from tuneplane_node.jobs.observe.watch import ChangeFeed, ChangeLog
from tuneplane_node.jobs.ours import OursRule
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.reaper import Reaper
from tuneplane_node.jobs.retries import stamp
from tuneplane_node.jobs.rules.affinity import CpuAffinity
from tuneplane_node.jobs.rules.confinement import JobRules
from tuneplane_node.jobs.rules.fabric import FabricAddresses
from tuneplane_node.jobs.rules.isolation import Isolation
from tuneplane_node.jobs.rules.network import NetworkPlacement, neighbours
from tuneplane_node.jobs.service import JobService
from tuneplane_node.jobs.stopper import Stopper
from tuneplane_node.jobs.volumes.keeper import VolumeKeeper
from tuneplane_node.jobs.words.launch import LaunchStep
from tuneplane_node.runtime.base import ContainerRuntime, PullLimits
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry

log = logging.getLogger(__name__)
launches_log = logging.getLogger("tuneplane_node.jobs.launcher")  # the launches' tasks


@dataclass(frozen=True)
class Node:
    """The node's services, each made once (`build_node`). The daemon talks to the one
    it needs: ``jobs`` for the job verbs, the others for what they alone know."""

    runtime: ContainerRuntime
    allocator: GpuAllocator
    settings: NodeSettings
    jobs: JobService  # the job verbs and the "ours" rule
    launcher: Launcher  # pending launches and their card reservations
    pending: PendingTable  # launches waiting for their image or volumes
    changes: ChangeLog  # the change log behind watch
    pulls: PullCoordinator  # one pull per image
    ledger: ImageLedger  # what the node pulled and ran
    images: ImageKeeper  # credentials and private images
    catalog: ImageCatalog  # GET /images and prefetch
    prefetcher: Prefetcher
    gc: ImageCollector  # the image GC, and the pull gate of launches
    volumes: VolumeKeeper  # the volume store
    mounts: LaunchMounts  # a launch's host paths, scratch and volumes, staged
    store: NodeStateStore  # the node state on disk
    stopper: Stopper
    reaper: Reaper  # the reap verb and the wreckage sweep
    keeper: NodeStateKeeper  # cordon and drain
    monitor: DiskMonitor  # a job's disk limit, and the store's relief
    health: HealthReader  # health and inventory
    reader: LogsReader
    sampler: StatsSampler  # the usage samples
    rules: JobRules  # what a job is confined to
    isolation: Isolation
    notices: NoticeReactor  # the cloud's (and the OS's) notices, turned into drains
    watcher: NoticeWatcher | None  # the cloud's metadata service, where one is watched
    shutdown: ShutdownWatcher | None  # the OS's shutdown, heard from systemd-logind
    faults: FaultReactor  # the cards' faults, turned into notes, warned stops and drains

    async def start(self) -> None:
        """Before the first request: the ledger, the private record it backs, the node
        state (an operator's cordon or drain), the staged mounts, the engine's memlock
        and its runtimes' registration."""
        await self.ledger.load()
        await self.images.start()
        await self.keeper.start()
        await self.mounts.start()
        self.mounts.watch()
        await asyncio.to_thread(self.rules.read_engine, self.runtime.name)
        await self.isolation.support()  # the runtimes' registration, said at start

    async def spawn_tasks(self, tasks: BackgroundTasks, *, sweep: bool) -> None:
        """Every background loop of the services, named, in ``tasks`` (the daemon's,
        cancelled and awaited before `close`), as kopf's ``spawn_tasks``: the one place
        that says what runs in the background. ``sweep``: the wreckage of a daemon killed
        between create and start is swept before serving, then once a relist period."""
        tasks.spawn(self.sampler.run(), name="stats sampler")
        tasks.spawn(self.monitor.run(), name="disk monitor")
        tasks.spawn(self.faults.run(), name="gpu faults")
        if sweep:
            await self._sweep_at_start()
            tasks.spawn(self.reaper.maintain(), name="wreckage sweep")
        tasks.spawn(self.gc.maintain(), name="image gc")
        if self.watcher is not None:
            tasks.spawn(self.watcher.run(), name="cloud notices")
        if self.shutdown is not None:
            tasks.spawn(self.shutdown.run(), name="shutdown inhibitor")

    async def _sweep_at_start(self) -> None:
        # Only what is older than the periodic sweep's grace: a container younger may be a
        # launch in flight of another daemon on this engine (a remote engine's other host).
        try:
            await self.jobs.sweep_wreckage(older_than_s=self.reaper.wreck_grace_s)
        except NodeError as exc:  # the engine may be down: the periodic sweep will do it
            log.warning("could not sweep wreckage at start: %s", exc.message)

    async def close(self) -> None:
        """Shutdown, in this order: a drain in progress (it cancels launches), the disk's
        refresh, every background launch, prefetch and pull (a launch cancelled while its
        pull runs leaves it first, as a stop would), the fills, the watch, the GC, the
        ledger. A drain is resumed by the next start: its state is on disk."""
        await self.keeper.close()
        await self.faults.close()
        await self.monitor.close()
        await self.launcher.close()
        await self.mounts.close()
        await self.prefetcher.close()
        await self.pulls.close()
        await self.volumes.close()
        await self.changes.close()
        await self.gc.close()
        await self.ledger.close()
        await self.images.close()
        await self.health.close()


def build_node(
    settings: NodeSettings,
    *,
    runtime: ContainerRuntime,
    allocator: GpuAllocator,
    clock: Clock = SYSTEM_CLOCK,
    telemetry: Telemetry = NO_TELEMETRY,
    credentials: CredentialSource | None = None,  # the node's registry auth file
    port_held: bool = False,  # systemd holds the node's port across restarts
) -> Node:
    """Every collaborator, made once, each handed what it uses: of the settings, the view
    of its concern where it has one (settings/views.py)."""
    image, observe, lifecycle = settings.images, settings.observe, settings.lifecycle
    ledger = ImageLedger(image.state_dir)
    limits = PullLimits(image.local_image_pull_timeout_s, image.local_image_pull_stall_s)
    pulls = PullCoordinator(runtime, limits, telemetry, ledger=ledger, clock=clock)
    images = ImageKeeper(image, credentials=credentials, clock=clock, ledger=ledger)
    # What the sources tell the change log, made last: it reads through the service.
    feed = ChangeFeed()
    pending = PendingTable(clock=clock, on_change=feed.changed)
    gc = ImageCollector(runtime, image, pulls=pulls, clock=clock)
    prefetcher = Prefetcher(runtime, pulls, images=images, gc=gc, clock=clock)
    rules = JobRules(settings, port_held=port_held)
    isolation = Isolation(settings, runtime)
    volumes = VolumeKeeper(
        settings.volumes, clock=clock, ps=runtime.ps, telemetry=telemetry, images=images
    )
    policy = MountPolicy(
        settings.mount_roots, never_a_root=settings.never_a_root, node_files=settings.node_files()
    )
    mounts = LaunchMounts(
        runtime, policy=policy, staging=MountStaging(settings.state_dir),
        scratch=ScratchSpaces(settings), volumes=volumes,
    )  # fmt: skip
    disk = DiskLimits(settings, store=gc.store)
    fabric = FabricAddresses(settings.fabric_network, runtime)
    around = functools.partial(neighbours, runtime=runtime, allocator=allocator, pending=pending)
    # A launch's two phases, each step one door (`LaunchStep`), run in this order.
    vet: list[LaunchStep] = [  # before the run's lock, on the launch as the console asked
        stamp,  # the spec's digest: a retry is told from another job by it
        rules.vet,  # the operator's confinement, RDMA by the cards it asks
        isolation.vet,  # user namespace, sandbox runtime
        disk.vet,  # the bytes and inodes it may write, by the store read now
        mounts.vet,  # host paths, scratch and volumes refused now, opened at `place`
    ]
    place: list[LaunchStep] = [  # once the cards are reserved, on its cards and image id
        NetworkPlacement(rules.network, around).place,  # whole-node: the machine around it
        fabric.place,  # its address on the fabric, held with the cards
        CpuAffinity(settings, gpus=allocator.snapshot).place,  # its cards' CPUs and memory
        mounts.place,  # opened and staged: last, nothing fails between it and the create
    ]
    launcher = Launcher(
        runtime, allocator, pulls, vet=vet, place=place, images=images, clock=clock,
        changes=feed, pending=pending, tasks=BackgroundTasks(launches_log), disk=disk,
        mounts=mounts, volumes=volumes, gc=gc, fabric=fabric,
    )  # fmt: skip
    catalog = ImageCatalog(
        runtime, ledger=ledger, images=images, pulls=pulls, prefetcher=prefetcher,
        pending=pending,
    )  # fmt: skip
    own, locks = OursRule(runtime), RefLocks()
    store = NodeStateStore(settings.state_dir, clock=clock)
    stopper = Stopper(
        runtime, lifecycle, own=own, locks=locks, launcher=launcher, store=store, clock=clock
    )
    # What the reaper removes is what the engine says now: the cache can lag a start.
    fresh = functools.partial(own, fresh=True)
    reaper = Reaper(
        runtime, lifecycle, own=fresh, locks=locks, pending=pending, stopper=stopper, clock=clock
    )
    keeper = NodeStateKeeper(
        runtime, lifecycle, store=store, locks=locks, launcher=launcher, stopper=stopper,
        clock=clock,
    )  # fmt: skip
    # It relieves the store before the image GC runs.
    monitor = DiskMonitor(runtime, settings, stopper=stopper, store=store, gc=gc)
    notices = NoticeReactor(
        keeper, clock=clock, margin_s=settings.cloud_notice_margin_s,
        stop_s=lifecycle.local_stop_timeout, changed=feed.node_changed,
    )  # fmt: skip
    health = HealthReader(
        runtime, allocator, settings, clock=clock, gc=gc,
        held_by=lambda: monitor.held_by, unexplained=lambda: monitor.account.unexplained,
        cards_refused=rules.card_jobs_refused, volume_store=volumes.reading,
        notices=notices.current,
    )  # fmt: skip
    reader = LogsReader(runtime, observe, own=own, pending=pending)
    sampler = StatsSampler(runtime, allocator, interval_s=observe.stats_interval_s, clock=clock)
    faults = FaultReactor(
        allocator, runtime, stopper=stopper, keeper=keeper, clock=clock,
        period_s=settings.gpu_fault_poll_s, changed=feed.changed,
        node_changed=feed.node_changed,
    )  # fmt: skip
    jobs = JobService(
        runtime=runtime, clock=clock, own=own, locks=locks, launcher=launcher,
        pending=pending, store=store, stopper=stopper, reaper=reaper, keeper=keeper,
        monitor=monitor, views=StoppedViews(), health=health, reader=reader, sampler=sampler,
        gpu_faults=lambda: faults.job_faults, told=ChangeCount(feed),
    )  # fmt: skip
    changes = ChangeLog(
        runtime, observe, clock=clock, feed=feed, read=jobs.observe,
        pending=lambda: [record.ref for record in pending.records()],
    )  # fmt: skip
    return Node(
        runtime=runtime, allocator=allocator, settings=settings, jobs=jobs,
        launcher=launcher, pending=pending, changes=changes, pulls=pulls, ledger=ledger,
        images=images, catalog=catalog, prefetcher=prefetcher, gc=gc, volumes=volumes,
        mounts=mounts,
        store=store, stopper=stopper, reaper=reaper, keeper=keeper, monitor=monitor,
        health=health, reader=reader, sampler=sampler, rules=rules, isolation=isolation,
        notices=notices, watcher=watching(settings, reactor=notices, clock=clock),
        shutdown=(
            ShutdownWatcher(notices, clock=clock) if settings.shutdown_inhibit == "auto" else None
        ),
        faults=faults,
    )  # fmt: skip
