"""What the job service takes and returns: plain, typed data. The daemon's `render` fills
the contract's JSON shapes (`wire`) from it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

from tuneplane_node.gpu.allocator import Occupancy
from tuneplane_node.gpu.probe import GpuSnapshot
from tuneplane_node.gpu.readiness import NO_CARDS, GpuReadiness
from tuneplane_node.inventory import DiskReading, MachineFacts, Space
from tuneplane_node.jobs.nodestate import NodeState
from tuneplane_node.jobs.notices.notice import Standing
from tuneplane_node.jobs.volumes.room import StoreView
from tuneplane_node.runtime.base import CacheStatus, ContainerState, PullProgress, RegistryAuth
from tuneplane_node.runtime.facts import RuntimeHealth
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import (  # the contract's, shared
    ALWAYS as ALWAYS,
)
from tuneplane_node.wire.values import (
    CURSOR_EPOCH as CURSOR_EPOCH,
)
from tuneplane_node.wire.values import (
    IF_NOT_PRESENT as IF_NOT_PRESENT,
)
from tuneplane_node.wire.values import (
    PULL_POLICIES as PULL_POLICIES,
)
from tuneplane_node.wire.values import (
    Cursor as Cursor,
)
from tuneplane_node.wire.values import (
    PrefetchRequest as PrefetchRequest,
)
from tuneplane_node.wire.values import (
    StopPlan as StopPlan,
)


@dataclass(frozen=True)
class LaunchRequest:
    """A launch as the service takes it. ``auth``: the launch's own registry
    credentials (its repr hides them); they never enter the spec, whose labels and env
    reach the engine."""

    run_id: str
    requested_gpus: int
    spec: ContainerSpec
    auth: RegistryAuth | None = None
    pull_policy: str = IF_NOT_PRESENT
    relaunch: bool = True  # False: an exited container of the run is the answer
    store: ImageStore | None = None
    """The engine's image store as vetting read it: one reading per launch serves the
    disk limit and the room check (None: not vetted yet)."""
    volume_auth: Mapping[str, RegistryAuth | None] = field(default_factory=dict)
    """Each OCI volume's credentials, by its digest (`VolumeSources`): hidden as ``auth``."""

    @property
    def ref(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Stopping:
    """A stop under way: ``warned`` (the warning signal went out) or ``signalled`` (the
    stop signal did), since that moment (RFC 3339)."""

    phase: str
    since: str
    note: str | None = None  # why the stop went otherwise than asked


# --- launch -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The image was here: the container runs with these cards."""

    container_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class AlreadyRunning:
    """The run's container is live already: nothing was done."""

    gpus: tuple[int, ...]


@dataclass(frozen=True)
class AlreadyExited:
    """The run's container exited, and the launch asked for no relaunch: nothing was
    done (at most once)."""

    exit_code: int | None


@dataclass(frozen=True)
class Pulling:
    """The image is being pulled in the background; the cards are reserved."""

    image: str
    requested_gpus: int


@dataclass(frozen=True)
class AlreadyPending:
    """A launch of this ref is pending already: nothing was done."""

    phase: str
    image: str


LaunchResult = Started | AlreadyRunning | AlreadyExited | Pulling | AlreadyPending


# --- images -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Prefetched:
    """What a prefetch found: the image ``present``, or ``pulling`` now."""

    image: str
    phase: str


@dataclass(frozen=True)
class ImageView:
    """An image the node pulled or its containers use. Times RFC 3339 UTC or None;
    ``in_use_by``: the node's containers made from it (any status: each holds it)."""

    image: str
    id: str
    size_bytes: int | None
    pulled_at: str | None
    last_used_at: str | None
    in_use_by: tuple[str, ...]
    private: bool


@dataclass(frozen=True)
class PullView:
    """A pull in flight (``pulling``), or a prefetch that failed (``failed``, with its
    error, kept as long as a failed launch's record). ``waiting``: the pending launches
    that wait on it."""

    image: str
    phase: str
    progress: PullProgress
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: tuple[str, ...]
    error: str | None


@dataclass(frozen=True)
class ImagesView:
    images: tuple[ImageView, ...]
    pulls: tuple[PullView, ...]


# --- observe ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingView:
    """A launch that has no container yet, as observe and health show it."""

    ref: str
    labels: Mapping[str, str]
    phase: str  # pulling, starting, failed
    image: str
    elapsed_s: float
    requested_gpus: int
    progress: PullProgress
    error: str | None
    stop_signal: str | None = None  # the launch's; None: the image's, known once it runs
    read_only_root: bool | None = None  # the node's decision for it
    rate_bytes_per_s: float | None = None  # the pull's, while it runs (`PullRate`)
    eta_s: float | None = None

    @property
    def failed(self) -> bool:
        return self.phase == "failed"

    @property
    def exists(self) -> bool:
        """A pending launch reads as a container that exists (created, or dead)."""
        return True


@dataclass(frozen=True)
class DiskFigures:
    """What a job has written to the engine's disk (its writable layer and anonymous
    volumes, and the deleted files its processes hold open there), and its limit; each
    None where unknown (no limit: None). ``deleted_open_bytes``: the part of
    ``used_bytes`` that is deleted files held open. ``inodes``: the files, directories
    and links it made there, and their limit."""

    used_bytes: int | None
    limit_bytes: int | None = None
    deleted_open_bytes: int | None = None
    inodes: int | None = None
    inode_limit: int | None = None

    @property
    def over(self) -> bool:
        """Past its limit (the monitor stops it)."""
        used, limit = self.used_bytes, self.limit_bytes
        return used is not None and limit is not None and used > limit

    @property
    def over_inodes(self) -> bool:
        """Past its inode limit (the monitor stops it)."""
        made, limit = self.inodes, self.inode_limit
        return made is not None and limit is not None and made > limit


@dataclass(frozen=True)
class StoppedView:
    """A container the node stopped itself (a drain, its disk), with why, or one a stop
    is under way for, with its phase, or a running one with its disk's figures: the
    service's facts, kept beside the runtime's state rather than in it, so the state
    stays the cache's object."""

    state: ContainerState
    stop_reason: str | None
    stopping: Stopping | None = None
    disk: DiskFigures | None = None
    gpu_fault: str | None = None  # a job-scope fault of a card it holds

    @property
    def exists(self) -> bool:
        return self.state.exists


JobView = ContainerState | StoppedView | PendingView


@dataclass(frozen=True)
class JobChanges:
    """Jobs as the change log holds them at ``index``: every job (``full``), or those
    changed since the cursor asked with, and the refs gone since (``removed``);
    ``node``: the node itself changed since (a notice, its state)."""

    index: Cursor
    jobs: Mapping[str, JobView]
    removed: tuple[str, ...] = ()
    full: bool = True
    node: bool = True


Own = Callable[[str], Awaitable[ContainerState]]
"""The service's "ours" rule as it hands it to its collaborators: the node's container
of that name, or missing (`ContainerState.missing`) for one that is not the node's."""


# --- the node ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageStore:
    """The filesystem of the engine's data root, where its images are; every figure None
    when the node cannot know it (a remote engine, a runtime without images).
    ``used_ratio`` counts what others than root may not use (statvfs' available) as
    used, as kubelet does; ``pressure``: at or above the image GC's high threshold.
    Its inodes likewise (``f_favail`` free): ``inode_pressure`` at or above
    ``TUNEPLANE_INODE_HIGH_PERCENT``; None for a filesystem without a fixed count."""

    path: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    used_ratio: float | None = None
    pressure: bool | None = None
    inodes_total: int | None = None
    inodes_free: int | None = None
    inode_pressure: bool | None = None

    @classmethod
    def of(
        cls, path: str | None, space: Space | None, *, high_percent: int, inode_percent: int = 100
    ) -> ImageStore:
        if space is None or space.total <= 0:
            return cls(path=path)
        used = (space.total - space.available) / space.total
        store = cls(path, space.total, space.available, round(used, 4), used * 100 >= high_percent)
        if not space.inodes or space.inodes_available is None:
            return store
        files_used = (space.inodes - space.inodes_available) * 100
        pressed = files_used >= space.inodes * inode_percent
        return replace(
            store,
            inodes_total=space.inodes,
            inodes_free=space.inodes_available,
            inode_pressure=pressed,
        )

    @property
    def pressed(self) -> bool:
        """Under pressure of either kind: launches are refused, jobs may be stopped."""
        return bool(self.pressure or self.inode_pressure)

    def room(self, percent: int) -> int | None:
        """Bytes that may be written before use reaches ``percent``; None: unknown."""
        if self.total_bytes is None or self.free_bytes is None:
            return None
        return self.free_bytes - self.total_bytes * (100 - percent) // 100

    def inode_room(self, percent: int) -> int | None:
        """Inodes that may be made before their use reaches ``percent``; None: unknown."""
        if self.inodes_total is None or self.inodes_free is None:
            return None
        return self.inodes_free - self.inodes_total * (100 - percent) // 100


@dataclass(frozen=True)
class RemovedImage:
    """An image a GC run removed: a name it had (its id if none), its size as the
    engine stated it, and why it went."""

    image: str
    id: str
    size_bytes: int
    why: str


@dataclass(frozen=True)
class GcRun:
    """What one image GC run removed, and the store after it."""

    removed: tuple[RemovedImage, ...]
    store: ImageStore
    scope: str

    @property
    def freed_bytes(self) -> int:
        return sum(image.size_bytes for image in self.removed)


@dataclass(frozen=True)
class Conditions:
    """What the console may schedule by, each None when unknown: the engine's store at or
    above its high threshold (``disk_pressure``), less than a tenth of the host's PIDs
    left (``pid_pressure``), less than 100 MiB of memory available
    (``memory_pressure``)."""

    disk_pressure: bool | None = None
    pid_pressure: bool | None = None
    memory_pressure: bool | None = None
    inode_pressure: bool | None = None  # the store's inodes at or above their threshold
    # Under disk pressure, whether something other than the jobs, their scratches, the
    # volume store and the images made it (`jobs.disk.accounting`); false without.
    disk_pressure_unexplained: bool | None = None


@dataclass(frozen=True)
class DiskRule:
    """How jobs' disk is bounded here: ``TUNEPLANE_JOB_DISK_LIMIT`` as set, and what
    holds a job to it: ``project_quotas`` (the kernel), ``monitor``, or None (not known
    yet, or a store not on this machine: nothing does)."""

    limit: str = ""
    held_by: str | None = None


@dataclass(frozen=True)
class NodeStatus:
    """Everything health says. ``occupancy`` None: the cards' state is unknown."""

    engine: RuntimeHealth
    series: str | None
    disk: DiskReading | None
    pending: Mapping[str, PendingView]
    cache: CacheStatus | None
    occupancy: Occupancy | None
    error: str | None
    node: NodeState
    gpu: GpuReadiness = NO_CARDS  # whether a GPU job can run here
    image_store: ImageStore = ImageStore()
    conditions: Conditions = Conditions()
    job_disk: DiskRule = DiskRule()
    volume_store: StoreView | None = None  # None: not known (the CLI's inventory)
    notices: tuple[Standing, ...] = ()  # the cloud's (or the OS's), most urgent first

    @property
    def ok(self) -> bool:
        """The engine answered, the cards' occupancy was read, and a launch is taken
        (no disk or inode pressure refuses it)."""
        return self.engine.ok and self.occupancy is not None and self.launch_refused is None

    @property
    def launch_refused(self) -> str | None:
        """The condition every launch is refused for now (a `507`): ``disk_pressure``,
        ``inode_pressure``; None: none."""
        if self.conditions.disk_pressure:
            return "disk_pressure"
        return "inode_pressure" if self.conditions.inode_pressure else None

    def why_not_ok(self) -> str:
        if not self.engine.ok or self.occupancy is None:
            return self.error or "the cards' occupancy could not be read"
        what = "store" if self.launch_refused == "disk_pressure" else "store's inodes"
        return (
            f"{self.launch_refused}: the engine's {what} at or above the high threshold; "
            "every launch is refused (507) until it is below"
        )


@dataclass(frozen=True)
class IsolationRule:
    """The operator's isolation rules, and what the engine makes of them: whether its jobs
    get a user namespace of their own, whether the sandbox runtime is registered in it,
    and the runtimes it has (None and empty: the engine could not say)."""

    userns: str = "auto"
    sandbox: str = "off"
    sandbox_runtime: str = "runsc"
    own_userns: bool | None = None
    sandbox_available: bool | None = None
    runtimes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Inventory:
    """What the machine has: its own facts, the cards, and the engine."""

    machine: MachineFacts
    gpus: GpuSnapshot | None
    accelerator_count: int | None
    runtime: str | None
    node: NodeState
    cpu_affinity: str = "numa"  # TUNEPLANE_CPU_AFFINITY: numa or off
    image_store: ImageStore = ImageStore()
    conditions: Conditions = Conditions()
    job_disk: DiskRule = DiskRule()
    isolation: IsolationRule = IsolationRule()
    volume_store: StoreView | None = None  # None: not known (the CLI's inventory)
    draining: Mapping[int, str] | None = None  # cards draining, and why; None: not known


class LogNote:
    """A followed log that is one sentence (a pending launch, no such container): a
    `LogStream` like the engine's, so the daemon streams either alike."""

    def __init__(self, text: str) -> None:
        self._chunks = [text.encode()]

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if not self._chunks:
            raise StopAsyncIteration
        return self._chunks.pop()

    async def aclose(self) -> None:
        self._chunks.clear()
