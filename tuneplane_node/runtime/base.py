"""The runtime contract: job containers as plain data, and the async interface over an engine.

Nothing above `runtime/` sees an SDK object: the job service speaks `ContainerSpec` in
(`runtime.spec`) and `ContainerState` out, through `ContainerRuntime`; what an engine
says of itself is `runtime.facts`. `EngineFeed` is the narrower contract between an
engine adapter and the state cache in front of it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

from tuneplane_node.runtime.facts import (
    DataRoot,
    DeviceSupport,
    DiskUse,
    EngineImage,
    ImageInfo,
    IsolationSupport,
    MountSupport,
    RuntimeHealth,
    Usage,
)
from tuneplane_node.runtime.labels import (
    disk_limit_of,
    gpus_of,
    inode_limit_of,
    run_id_of,
    runtime_of,
    userns_note_of,
    userns_of,
)
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import RegistryAuth

if TYPE_CHECKING:
    from tuneplane_node.runtime.pool import BlockingPool

log = logging.getLogger(__name__)

LIVE_STATUSES = frozenset({"running", "created", "paused", "restarting"})
"""A container in one of these holds its cards: it runs, or may run without asking us."""
RUNNING = frozenset({"running", "paused", "restarting"})
"""A container in one of these has processes a signal can reach."""
EXIT_SIGKILL = 137
"""128 + SIGKILL: what engines report for a job killed by SIGKILL (the OOM killer too)."""


@dataclass(frozen=True)
class ContainerState:
    """What a runtime says about one container. Times are RFC 3339 UTC strings or None;
    ``exit_code`` is set only once the container has exited (``exited`` or ``dead``)."""

    name: str
    exists: bool
    status: str = ""
    exit_code: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    oom_killed: bool = False
    id: str | None = None
    stop_signal: str | None = None  # what a stop sends first; None: not known (a list entry)
    image_id: str | None = None  # the engine's id of its image (``sha256:...``); None: not known
    read_only_root: bool | None = None  # its image filesystem read-only; None: not known
    engine_runtime: str | None = None  # the engine's OCI runtime for it; None: not known

    @classmethod
    def missing(cls, name: str) -> ContainerState:
        return cls(name=name, exists=False)

    @functools.cached_property
    def gpus(self) -> tuple[int, ...]:
        """Parsed once per state: occupancy reads it for every container."""
        return gpus_of(self.labels)

    @property
    def run_id(self) -> str | None:
        return run_id_of(self.labels)

    @property
    def ours(self) -> bool:
        """The node's own container: it exists and carries the run-id label."""
        return self.exists and bool(self.run_id)

    @property
    def handle(self) -> str:
        """What the node acts on and knows the container by: the id it holds for the name
        (engines try ids before names, so a name could reach another container), else the
        name (the process runtime has no ids)."""
        return self.id or self.name

    @property
    def disk_limit_bytes(self) -> int | None:
        """The disk limit its label holds; None: none (or a label that is no number)."""
        return disk_limit_of(self.labels)

    @property
    def inode_limit(self) -> int | None:
        """The inode limit its label holds; None: none (a job of an older node)."""
        return inode_limit_of(self.labels)

    @property
    def userns(self) -> str | None:
        """``own`` or ``host`` as its label says; None for a job launched without one."""
        return userns_of(self.labels)

    @property
    def userns_note(self) -> str | None:
        """A note on the job's user namespace, as its label says: why it keeps the host's,
        or how its writable mounts reach its own."""
        return userns_note_of(self.labels)

    @property
    def runtime(self) -> str | None:
        """The OCI runtime it runs under: the engine's word, else the one the node asked
        for; None where neither is known (a list entry, the process runtime)."""
        return self.engine_runtime or runtime_of(self.labels)

    @property
    def never_started(self) -> bool:
        return self.exists and self.started_at is None

    @property
    def live(self) -> bool:
        return self.exists and self.status in LIVE_STATUSES


@dataclass(frozen=True)
class CacheStatus:
    """How fresh a cached runtime's view is; ages in seconds, None when never."""

    synced: bool
    last_event_age_s: float | None
    last_relist_age_s: float | None
    containers: int
    generation: int = 0  # changes with every change to any container: readers rebuild


class LogQuery(NamedTuple):
    """What part of a log to read: the last ``tail`` lines, none before ``since``, and at
    most ``max_bytes`` of the newest of them."""

    tail: int
    max_bytes: int
    since: datetime | None = None


class LogText(NamedTuple):
    """A log's lines, each prefixed with its RFC 3339 time; ``truncated`` when the byte
    cap cut older output (or the front of a line longer than the cap)."""

    text: str
    truncated: bool = False


class LogStream(Protocol):
    """A followed log: chunks of its text as the job writes them, until it stops.

    The text is `LogText`'s (each line after its RFC 3339 time), cut anywhere, never
    more than a few KiB a chunk. ``aclose`` releases at once all the stream holds (the
    engine's response, the thread reading it); iterating after it ends at once.
    """

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def __anext__(self) -> bytes: ...

    async def aclose(self) -> None: ...


class PullLimits(NamedTuple):
    """The two deadlines of a pull, in seconds: in all, and without any progress."""

    timeout_s: float
    stall_s: float


class PullProgress(NamedTuple):
    """A pull as the engine reports it: bytes of the layers whose size is known, layers
    downloaded, and layers seen so far (both grow as the engine announces layers)."""

    bytes_done: int = 0
    bytes_total: int = 0
    layers_done: int = 0
    layers_total: int = 0


ProgressCallback = Callable[[PullProgress], None]
ChangeListener = Callable[[str | None], None]
"""Told on the loop of each change to a container, by name; None: every container may
have changed (the state cache synced again, or lost the engine)."""


def no_cache(runtime: object) -> None:
    """`ContainerRuntime.status` and ``cache_generation`` of a runtime that reads on
    every call."""
    return None


def tells_no_changes(runtime: object, listener: ChangeListener) -> bool:
    """`ContainerRuntime.on_change` of a runtime that reads on every call."""
    return False


class ContainerRuntime(Protocol):
    """The verbs the job service needs from an engine, all async.

    "Missing" is never an error: reads answer `ContainerState.missing`, and the verbs
    that change a container succeed when it is already gone (the goal is met). Any verb
    raises `EngineUnavailable` when the engine cannot be asked (nothing is known then,
    so nothing may be taken for gone) and `EngineRefused` when it answered no.
    """

    name: str

    async def start(self) -> None:
        """Get ready to serve; for a cached runtime, fill the cache (bounded wait).

        An engine that is down does not raise here: reads raise `EngineUnavailable`
        until it answers.
        """

    async def close(self) -> None:
        """Release threads and connections. Jobs keep running."""

    def status(self) -> CacheStatus | None:
        """The state cache's freshness; None for a runtime that reads on every call."""

    def cache_generation(self) -> int | None:
        """The state cache's generation while it is synced: it moves with every change
        to any container, so a reader keeps what it derived until it does. None: no
        cache, or one not synced (read again)."""

    def on_change(self, listener: ChangeListener) -> bool:
        """Tell ``listener`` of every change from now on; False: this runtime tells none
        (it reads on every call), and a reader that wants changes must look again."""

    async def run(self, spec: ContainerSpec) -> str:
        """Create and start the container; its id. A name in use: `EngineConflict`.
        A container that was created but failed to start is removed before raising."""

    async def inspect(self, name: str) -> ContainerState:
        """One container by exact name; `ContainerState.missing` when there is none.
        A cached runtime holds only the node's containers: others read as missing."""

    async def inspect_many(self, names: Sequence[str]) -> list[ContainerState]:
        """`inspect` of each name, in order: one call for an observe of many refs."""

    async def inspect_fresh(self, name: str) -> ContainerState:
        """As `inspect`, but asked of the engine now where a cache would answer: for a
        word the console acts on at once (a re-launch answered "running")."""

    # The verbs below act on a ``ref``: the id the runtime reported for the container
    # (ContainerState.id), or its name where it reports none. Engines resolve an id
    # before a name, so acting on the id the node holds is acting on its own container.

    async def logs(self, ref: str, query: LogQuery) -> LogText | None:
        """The lines of stdout and stderr the query asks for; None when the container is
        missing. Read in chunks, never the whole log in memory, off the loop."""

    async def follow_logs(self, ref: str, query: LogQuery) -> LogStream | None:
        """The last ``tail`` lines (none before ``since``), then each new line as the job
        writes it, until the container stops; None when it is missing. ``max_bytes``
        does not apply: nothing is held but the chunk in hand. The next chunk is read
        only once the caller has taken the last, so a slow reader slows the reading and
        never grows the node; the caller must ``aclose`` the stream. Opening it has the
        deadline of any call; waiting for lines has none (the job may be quiet)."""

    async def kill(self, ref: str, signal: str) -> bool:
        """Send ``signal`` (SIGKILL or a name of `signals.JOB_SIGNALS`) to the container:
        through its init to the job's command on an engine, to the whole process group on
        the process runtime. True once sent. Missing, or not running (the engine found it
        stopped, even as the signal went out: the job's own end won the race): nothing
        to do, and False, never an error. Returns at once: the job's exit arrives later
        (`wait_exited`)."""

    async def catches(self, ref: str, signal: str) -> bool | None:
        """Whether a process of the running job (below its init) has a handler for
        ``signal`` (`sigcatch`): the warning phase of a stop is only for a job that
        hears it. None where this machine cannot read the job's processes (a remote
        engine, another pid namespace, the process runtime) or the job is not running:
        the caller sends as asked."""

    async def wait_exited(self, name: str, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the container (by exact name) runs no
        more: exited, dead or gone. True when it does. Holds no thread while it waits:
        a cached runtime waits for its events, others poll."""

    async def remove(self, ref: str) -> None:
        """Force-remove the container, running or not, with its anonymous volumes;
        returns once every process of it has ended."""

    async def ps(self) -> list[ContainerState]:
        """Every container of the node (run-id label), exited ones included."""

    async def health(self) -> RuntimeHealth:
        """Whether the engine answers, and its version. Never raises."""

    async def device_support(self) -> DeviceSupport:
        """How the engine hands cards to a container (its runtimes, where it reads CDI
        specifications), for the node's GPU readiness. Never raises: ``error`` says why
        it could not be asked."""

    async def image_exists(self, image: str) -> bool:
        """Whether the image is on the engine now."""

    async def image_info(self, image: str) -> ImageInfo | None:
        """The image by name or id as the engine holds it now; None when it has none (a
        process runtime has no images)."""

    async def pull(
        self,
        image: str,
        *,
        limits: PullLimits,
        on_progress: ProgressCallback | None = None,
        auth: RegistryAuth | None = None,
    ) -> None:
        """Pull the image, reporting progress; done only when the image is present.

        ``auth`` goes to the engine with this pull only (``X-Registry-Auth``), never to
        its credential store. A missed deadline is `EngineRefused` with the reason; a
        registry that refuses the credentials (or has no such image: the engines do not
        tell the two apart) is `RegistryRefused`, at once; cancelling the awaiting task
        stops the download at once.
        """

    async def data_root(self) -> DataRoot | None:
        """Where the engine keeps its images (its info, asked once) and a statvfs of that
        path now; None for a runtime without images (the process runtime)."""

    async def mount_support(self) -> MountSupport:
        """How host mounts reach the engine, and the engine's own directories (its info,
        asked once it answers)."""

    async def isolation_support(self) -> IsolationSupport:
        """The engine's runtimes and user namespaces (its info, asked each time); the
        error in the answer, never raised, when it cannot be asked."""

    async def list_images(self) -> list[EngineImage]:
        """Every image of the engine (intermediate layers left out), each saying whether
        a container of any owner uses it, read in one call."""

    async def remove_image(self, image: EngineImage) -> bool:
        """Remove the image (never forced): each of its references, then the image.
        False when the engine refuses because it is in use (a conflict): nothing more
        is tried. Gone already: True."""

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        """CPU time, memory and pids of each running container, by ref, read in one
        blocking call for all of them (the job sampler calls it every few seconds for a
        slice of a few dozen, never a request). Read from the container's cgroup files
        where this machine can reach them, else from the engine's one-shot stats. A ref
        that is gone or not running is left out; one whose figures cannot be read maps
        to a `Usage` of Nones."""

    async def disk_usage(self, ref: str, *, budget_s: float) -> DiskUse | None:
        """What the running container has written to the engine's disk: its writable
        layer and anonymous volumes, walked on this machine (`runtime.diskwalk`) within
        ``budget_s``, on the pool, never with the engine's size inspect; asked of running
        containers. None when it is gone (or not running when first asked);
        ``used_bytes`` None when this machine cannot see its layer."""

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        """For each process, the container it runs in, named as the node acts on it
        (`ContainerState.handle`), or None: in none of the engine's, or unknown. Blocking
        but cheap (small local files, nothing asked of the engine): callers pass only
        the processes the GPU probe saw on the cards."""


class Brief(NamedTuple):
    """A container as the engine's list shows it: enough to tell whether it changed, and
    for a first, partial state (no start or finish times, no OOM flag)."""

    id: str
    name: str
    signature: tuple[str, int | None]  # (status, exit code)
    labels: Mapping[str, str] = MappingProxyType({})
    created_at: str | None = None
    image_id: str | None = None

    def partial_state(self) -> ContainerState:
        status, exit_code = self.signature
        return ContainerState(
            name=self.name,
            exists=True,
            status=status,
            exit_code=exit_code,
            labels=dict(self.labels),
            created_at=self.created_at,
            id=self.id,
            image_id=self.image_id,
        )


class EngineEvent(NamedTuple):
    """One container event; a ``die`` carries the exit code and the time it happened."""

    id: str
    action: str
    exit_code: int | None = None
    at: str | None = None


class EngineFeed(ContainerRuntime, Protocol):
    """What an engine adapter offers the state cache: blocking calls, each run on the
    adapter's pool or on the cache's event thread, raising the node's errors."""

    pool: BlockingPool

    def list_brief(self) -> list[Brief]:
        """Every container of the node, as the engine's list shows it."""

    def inspect_now(self, ref: str) -> ContainerState:
        """One container by id or name; missing when there is none."""

    def open_events(self) -> tuple[Iterator[EngineEvent], Callable[[], None]]:
        """The engine's container events from now on, and a function that closes the
        stream from any thread (the iterator then ends or raises)."""
