"""What a console reads of a job: a pending launch, a stopped or stopping container and
its disk's figures, the change log's answer, a followed log that is one sentence."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

from tuneplane_node.jobs.words.launch import Stopping
from tuneplane_node.runtime.base import ContainerState, PullProgress
from tuneplane_node.wire.values import Cursor

FAILED_RECORD_TTL_S = 1800.0  # how long a failed launch (or prefetch) is shown


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
