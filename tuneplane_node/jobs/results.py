"""What the job service takes and returns: plain, typed data. `wire` gives it JSON shape."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from tuneplane_node.gpu.allocator import Occupancy
from tuneplane_node.gpu.probe import GpuSnapshot
from tuneplane_node.inventory import DiskReading, MachineFacts
from tuneplane_node.jobs.nodestate import NodeState
from tuneplane_node.runtime.base import (
    CacheStatus,
    ContainerSpec,
    ContainerState,
    PullProgress,
    RegistryAuth,
    RuntimeHealth,
)

IF_NOT_PRESENT = "if_not_present"
ALWAYS = "always"
PULL_POLICIES = (IF_NOT_PRESENT, ALWAYS)


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

    @property
    def ref(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class StopPlan:
    """How a stop goes. With ``warn_signal``: that signal first, and up to ``warn_s`` (None:
    as long as the grace period) for the job to end by itself. Then ``signal`` (None: the
    job's own stop signal), then SIGKILL once ``grace`` has passed (None: the node's
    ``TUNEPLANE_LOCAL_STOP_TIMEOUT``)."""

    grace: float | None = None
    signal: str | None = None
    warn_signal: str | None = None
    warn_s: float | None = None


@dataclass(frozen=True)
class Stopping:
    """A stop under way: ``warned`` (the warning signal went out) or ``signalled`` (the
    stop signal did), since that moment (RFC 3339)."""

    phase: str
    since: str


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
class Pulling:
    """The image is being pulled in the background; the cards are reserved."""

    image: str
    requested_gpus: int


@dataclass(frozen=True)
class AlreadyPending:
    """A launch of this ref is pending already: nothing was done."""

    phase: str
    image: str


LaunchResult = Started | AlreadyRunning | Pulling | AlreadyPending


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

    @property
    def failed(self) -> bool:
        return self.phase == "failed"

    @property
    def exists(self) -> bool:
        """A pending launch reads as a container that exists (created, or dead)."""
        return True


@dataclass(frozen=True)
class StoppedView:
    """A container the node stopped itself (a drain), with why, or one a stop is under
    way for, with its phase: the service's facts, kept beside the runtime's state rather
    than in it, so the state stays the cache's object."""

    state: ContainerState
    stop_reason: str | None
    stopping: Stopping | None = None

    @property
    def exists(self) -> bool:
        return self.state.exists


JobView = ContainerState | StoppedView | PendingView


@dataclass(frozen=True)
class Cursor:
    """A position in one daemon process's change log: opaque to the console, which
    sends back the ``index`` it was given. ``epoch`` names the process."""

    epoch: str
    position: int

    def __str__(self) -> str:
        return f"{self.epoch}-{self.position}"

    @classmethod
    def read(cls, text: str) -> Cursor | None:
        """The cursor a ``str`` made; None for anything else."""
        epoch, _, position = text.partition("-")
        if not (CURSOR_EPOCH.fullmatch(epoch) and position.isascii() and position.isdigit()):
            return None
        if len(position) > 19:  # past any position a process reaches
            return None
        return cls(epoch, int(position))


CURSOR_EPOCH = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True)
class JobChanges:
    """Jobs as the change log holds them at ``index``: every job (``full``), or those
    changed since the cursor asked with, and the refs gone since (``removed``)."""

    index: Cursor
    jobs: Mapping[str, JobView]
    removed: tuple[str, ...] = ()
    full: bool = True


Own = Callable[[str], Awaitable[ContainerState]]
"""The service's "ours" rule as it hands it to its collaborators: the node's container
of that name, or missing (`ContainerState.missing`) for one that is not the node's."""


# --- the node ---------------------------------------------------------------------------


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

    @property
    def ok(self) -> bool:
        return self.engine.ok and self.occupancy is not None


@dataclass(frozen=True)
class Inventory:
    """What the machine has: its own facts, the cards, and the engine."""

    machine: MachineFacts
    gpus: GpuSnapshot | None
    accelerator_count: int | None
    runtime: str | None
    node: NodeState
    cpu_affinity: str = "numa"  # TUNEPLANE_CPU_AFFINITY: numa or off


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
