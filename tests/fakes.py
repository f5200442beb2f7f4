"""An in-memory engine, a clock moved by hand, and a GPU probe: for the fast tests.

`FakeRuntime` honours the documented `ContainerRuntime` and `EngineFeed` contracts
(missing is not an error, a name in use is `EngineConflict`, a start that fails leaves
no container, ps lists only labelled containers, a pull succeeds only with the image
present) and lets a test hold any verb open, fail it, or play the job's part (exit,
OOM, ignore SIGTERM). Its events go to every open event stream, as an engine's do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import queue
import secrets
import threading
from collections.abc import AsyncGenerator, Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import Any, TypeVar

from tuneplane_node.clock import Clock, rfc3339
from tuneplane_node.errors import EngineConflict, EngineRefused, EngineUnavailable, NodeError
from tuneplane_node.gpu.probe import CardFacts, GpuProcess, GpuSnapshot
from tuneplane_node.inventory import Space
from tuneplane_node.references import ID_PREFIX, canonical
from tuneplane_node.runtime.base import (
    EXIT_SIGKILL,
    RUNNING,
    Brief,
    CacheStatus,
    ContainerState,
    EngineEvent,
    LogQuery,
    LogStream,
    LogText,
    ProgressCallback,
    PullLimits,
    PullProgress,
    tells_no_changes,
)
from tuneplane_node.runtime.engines.dockerformat import LogFold
from tuneplane_node.runtime.facts import (
    DIRECT,
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
from tuneplane_node.runtime.labels import job_labels
from tuneplane_node.runtime.pool import BlockingPool
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.signals import JOB_SIGNALS
from tuneplane_node.wire.values import LABEL_RUN_ID, RegistryAuth

T = TypeVar("T")

ENGINE = "fake"
MIB = 2**20
DATA_ROOT = "/fake/data-root"
PIECE = 16 * 1024  # docker cuts log lines into pieces this long
EPOCH = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


class FakeClock(Clock):
    """Both clocks, moved only by `advance`; a `sleep` (and so `wait_for`) ends when
    `advance` has moved the clock past it, never by itself."""

    def __init__(self, start: float = 1000.0) -> None:
        self.start = start
        self.t = start
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []  # (until, waker)
        self.slept = asyncio.Event()  # set by every new sleeper

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t - self.start)

    def advance(self, seconds: float) -> None:
        """Move the clock on, waking every sleep that ends by then (on the next turns)."""
        self.t += seconds
        for until, waker in self.sleepers:
            if until <= self.t and not waker.done():
                waker.set_result(None)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        sleeper = (self.t + seconds, asyncio.get_running_loop().create_future())
        self.sleepers.append(sleeper)
        self.slept.set()
        try:
            await sleeper[1]
        finally:
            self.sleepers.remove(sleeper)

    async def sleeping(self, within: float, timeout: float = 5) -> None:
        """Until something sleeps on the clock that `advance` by ``within`` wakes (a
        timer is armed); a failure after ``timeout`` real seconds, never a hang."""

        async def armed() -> None:
            while not any(t <= self.t + within and not w.done() for t, w in self.sleepers):
                self.slept.clear()
                await self.slept.wait()

        await asyncio.wait_for(armed(), timeout)


@dataclass
class FakeContainer:
    id: str
    spec: ContainerSpec
    labels: dict[str, str]
    created_at: str
    status: str = "created"
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    oom_killed: bool = False
    ignores_sigterm: bool = False
    sigterm_exit_code: int = 143  # what its own handler exits with; 128 + 15 without one
    # Its handlers of the other signals: the exit code it ends with, or None (it traps
    # the signal and runs on). Unhandled, a signal ends it with 128 + its number, as the
    # kernel's default does (SIGWINCH's default is to ignore it).
    handlers: dict[str, int | None] = field(default_factory=dict)
    image_stop_signal: str | None = None  # its image's STOPSIGNAL
    image_id: str | None = None  # the id its image had when it was made
    output: list[str] = field(default_factory=list)

    def state(self) -> ContainerState:
        return ContainerState(
            name=self.spec.name,
            exists=True,
            status=self.status,
            exit_code=self.exit_code,
            labels=dict(self.labels),
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            oom_killed=self.oom_killed,
            id=self.id,
            stop_signal=self.spec.stop_signal or self.image_stop_signal or "SIGTERM",
            image_id=self.image_id,
            read_only_root=bool(self.spec.read_only_root),
        )

    def exit_on(self, signal: str) -> int | None:
        """The exit code this signal ends it with; None: it runs on."""
        if signal == "SIGKILL":
            return EXIT_SIGKILL
        if signal in self.handlers:
            return self.handlers[signal]
        if signal == "SIGTERM":
            return None if self.ignores_sigterm else self.sigterm_exit_code
        return None if signal == "SIGWINCH" else 128 + JOB_SIGNALS[signal]


class FakePull:
    """One pull the fake engine is doing: the test reports progress, finishes or fails it."""

    def __init__(self, runtime: FakeRuntime, image: str) -> None:
        self.runtime = runtime
        self.image = image
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.cancelled = False
        self.on_progress: ProgressCallback | None = None
        self.auth: RegistryAuth | None = None  # the credentials the pull was given

    def report(self, done: int, total: int, layers_done: int = 0, layers_total: int = 1) -> None:
        assert self.on_progress is not None
        self.on_progress(PullProgress(done, total, layers_done, layers_total))

    def finish(self) -> None:
        self.runtime.arrived(self.image)
        self.done.set_result(None)

    def fail(self, reason: str) -> None:
        self.done.set_exception(
            EngineRefused(engine=ENGINE, action=f"pull {self.image}", reason=reason)
        )


class Gate:
    """Holds a verb open until the test lets it through."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def pass_through(self) -> None:
        self.entered.set()
        await self.opened.wait()

    def open(self) -> None:
        self.opened.set()


class EventStream:
    """One open event stream: what the engine sent on it, and how much its reader took."""

    def __init__(self) -> None:
        self._queue: queue.Queue[EngineEvent | None] = queue.Queue()
        self.sent = 0
        self.taken = 0  # written by the reader's thread
        self.closed = False

    def send(self, event: EngineEvent) -> None:
        self.sent += 1
        self._queue.put(event)

    def get(self) -> EngineEvent | None:
        return self._queue.get()

    def close(self) -> None:
        """From any thread: the reader's iterator ends after what was sent before."""
        self.closed = True
        self._queue.put(None)

    def behind(self) -> bool:
        return not self.closed and self.taken < self.sent


class References(set[str]):
    """The references an engine has: every spelling of one is one (`canonical`), as the
    engines normalise them."""

    def __init__(self, refs: Iterable[str] = ()) -> None:
        super().__init__(canonical(ref) for ref in refs)

    def add(self, ref: str) -> None:
        super().add(canonical(ref))

    def discard(self, ref: object) -> None:
        if isinstance(ref, str):
            super().discard(canonical(ref))

    def remove(self, ref: str) -> None:
        super().remove(canonical(ref))

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and super().__contains__(canonical(ref))


class ByReference(dict[str, T]):
    """A fact of an image, by reference (every spelling of one is one)."""

    def __setitem__(self, ref: str, value: T) -> None:
        super().__setitem__(canonical(ref), value)

    def __getitem__(self, ref: str) -> T:
        return super().__getitem__(canonical(ref))

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and super().__contains__(canonical(ref))

    def get(self, ref: str, default: Any = None) -> Any:
        return super().get(canonical(ref), default)


class FakeRuntime:
    """An engine in memory. Every verb is also an EngineFeed call, blocking or not."""

    name = ENGINE

    def __init__(self, *, clock: FakeClock | None = None, images: tuple[str, ...] = ()) -> None:
        self.clock = clock or FakeClock()
        self.containers: dict[str, FakeContainer] = {}
        self.images = References(images)  # the references the engine has
        self.image_size = 1000  # an image's size when the test names none (`image_sizes`)
        # The data root's size; None (unless a test says): not measurable, as a remote
        # engine's, so no launch asks a registry for an image's size.
        self.disk_total: int | None = None
        self.disk_other = 0  # bytes on the engine's disk that are not images
        self.mount_mode = DIRECT  # how it takes host mounts (`MountSupport`)
        self.isolation = IsolationSupport()  # its runtimes and namespaces
        self.refuse_image_removal: set[str] = set()  # ids the engine calls in use anyway
        self.image_removals: list[str] = []  # ids removed, in order
        self.stop_signals: ByReference[str] = ByReference()  # an image's STOPSIGNAL, by image
        self.image_ids: ByReference[str] = ByReference()  # an image's id (else one from its name)
        self.image_sizes: ByReference[int] = ByReference()  # its size (else image_size)
        self.image_envs: ByReference[dict[str, str]] = ByReference()  # its CUDA env
        self._up = True
        self.calls: collections.Counter[str] = collections.Counter()
        self.pulls: list[FakePull] = []
        self.pulling = asyncio.Event()  # set when any pull starts
        self.create_gate: Gate | None = None  # holds run() after the create
        self.refuse_start: str | None = None  # run() creates, fails the start
        self.refuse_logs: str | None = None  # logs() refused, as a log driver can
        self.following = 0  # followed logs being read now
        self.end_follows_early = False  # a follow ends after its first chunk, job or not
        self.ps_error: Exception | None = None  # ps() raises it, health still ok
        self.faults: dict[str, BaseException] = {}  # verb -> what it raises (a bug below)
        self.signals: list[tuple[str, str]] = []  # (name, signal) of every signal that landed
        self.changed = asyncio.Event()  # set on every change to any container
        self.refs: list[tuple[str, str]] = []  # (verb, the ref it was given) of every verb
        self.usages: dict[str, Usage] = {}  # container name -> what usage() reads for it
        self.written: dict[str, int] = {}  # container name -> bytes it wrote to the disk
        self.deleted_open: dict[str, int] = {}  # container name -> deleted bytes it holds open
        self.made: dict[str, int] = {}  # container name -> inodes it made on the disk
        self.inodes_total: int | None = None  # the store's inodes; None: it counts none
        self.inodes_other = 0  # inodes made outside any job
        self.root_path = DATA_ROOT  # where its data root says it is (a test's real directory)
        self.holders: dict[int, str] = {}  # pid -> the handle of the container it runs in
        self.caught: dict[str, bool | None] = {}  # name -> whether it catches a warning
        # name -> the code it ends with by itself as the next signal goes out, which finds
        # it stopped (a node that read it running a moment before: issue 52's race)
        self.ending: dict[str, int] = {}
        self.support = DeviceSupport(runtimes=("nvidia", "runc"))  # device_support()'s answer
        self.pool = BlockingPool(2, name="fake")
        self._streams: list[EventStream] = []
        self._streams_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.closed = False

    # --- what a test does to the engine ------------------------------------------------

    def exit(self, name: str, code: int, *, oom: bool = False) -> None:
        """The job ends by itself (or by the kernel's OOM killer)."""
        container = self.containers[name]
        if oom:
            self._emit(container, "oom")
        container.oom_killed = oom
        self._end(container, code)

    def _end(self, container: FakeContainer, code: int) -> None:
        container.status, container.exit_code = "exited", code
        container.finished_at = rfc3339(self.clock.now())
        self._emit(container, "die", exit_code=code)

    def create_outside(self, spec: ContainerSpec, *, start: bool = True) -> FakeContainer:
        """A container made behind the node's back (a person's own, or wreckage)."""
        container = self._create(spec, labels=dict(spec.labels))
        if start:
            self._start(container)
        return container

    def pull_of(self, image: str) -> FakePull:
        """The latest pull of ``image``."""
        return [pull for pull in self.pulls if pull.image == image][-1]

    def events_open(self) -> int:
        return len(self._streams)

    @property
    def up(self) -> bool:
        """Whether the engine answers. Going down breaks every open event stream, as an
        engine's do when it stops (their connections close)."""
        return self._up

    @up.setter
    def up(self, up: bool) -> None:
        self._up = up
        if not up:
            self.close_streams()

    async def delivered(self, timeout: float = 5) -> None:
        """Until every event sent so far has been taken by the reader of each open
        stream and what it did with it (a cache's posts to the loop) has run: a test
        that changed the engine then reads what an event-fed reader made of it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(stream.behind() for stream in self._open_streams()):
            assert loop.time() < deadline, "an event stream's reader never took its events"
            await asyncio.sleep(0.001)
        await asyncio.sleep(0)  # the reader's posts, queued before this task, run first

    # --- ContainerRuntime --------------------------------------------------------------

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True
        self.close_streams()
        self.pool.close()

    def status(self) -> CacheStatus | None:
        return None

    def cache_generation(self) -> int | None:
        return None

    on_change = tells_no_changes  # the state cache in front of it tells them

    async def run(self, spec: ContainerSpec) -> str:
        self._answer("run")
        if spec.name in self.containers:
            raise EngineConflict(
                engine=ENGINE, action=f"run {spec.name}", reason="name is already in use"
            )
        container = self._create(spec, labels=job_labels(spec))
        if self.create_gate is not None:
            await self.create_gate.pass_through()
        if not self.up:  # gone between create and start: the created container stays
            raise EngineUnavailable(engine=ENGINE, reason="down before the start")
        if self.refuse_start is not None:
            self._destroy(spec.name)  # a failed start leaves no container
            raise EngineRefused(engine=ENGINE, action=f"run {spec.name}", reason=self.refuse_start)
        self._start(container)
        return container.id

    async def inspect(self, name: str) -> ContainerState:
        self._answer("inspect")
        container = self.containers.get(name)
        return container.state() if container else ContainerState.missing(name)

    inspect_fresh = inspect

    async def inspect_many(self, names: Sequence[str]) -> list[ContainerState]:
        return [await self.inspect(name) for name in names]

    def find(self, ref: str) -> FakeContainer | None:
        """A container by id or by name, as engines resolve a ref."""
        return next((c for c in self.containers.values() if ref == c.id), None) or (
            self.containers.get(ref)
        )

    async def logs(self, ref: str, query: LogQuery) -> LogText | None:
        """The container's output as docker streams it: entries of at most 16 KiB,
        folded as the engine adapters fold them."""
        self._answer("logs")
        self.refs.append(("logs", ref))
        container = self.find(ref)
        if container is None:
            return None
        if self.refuse_logs is not None:
            action = f"read the logs of {ref}"
            raise EngineRefused(engine=ENGINE, action=action, reason=self.refuse_logs)
        now = self.clock.now()
        stamp = rfc3339(now).encode()
        fold = LogFold(keep=query.tail, max_bytes=query.max_bytes)
        # Every line is stamped with the time of the read: all of them are before a
        # ``since`` still to come, and none before one that has passed.
        lines = container.output if query.since is None or query.since <= now else []
        for line in lines:
            data = f"{line}\n".encode()
            for start in range(0, len(data), PIECE):
                fold.add(stamp + b" " + data[start : start + PIECE])
        return fold.text(skip_first=False)

    async def follow_logs(self, ref: str, query: LogQuery) -> LogStream | None:
        """The last ``tail`` lines of the output, then each line appended to it, until
        the container runs no more (looked at every 10 ms)."""
        self._answer("follow_logs")
        self.refs.append(("follow_logs", ref))
        container = self.find(ref)
        if container is None:
            return None
        if self.refuse_logs is not None:
            action = f"follow the logs of {ref}"
            raise EngineRefused(engine=ENGINE, action=action, reason=self.refuse_logs)
        return self._follow(container, query)

    async def _follow(
        self, container: FakeContainer, query: LogQuery
    ) -> AsyncGenerator[bytes, None]:
        self.following += 1
        try:
            sent = max(0, len(container.output) - query.tail)
            if query.since is not None and query.since > self.clock.now():
                sent = len(container.output)  # the lines so far: all before ``since``
            while True:
                running = container.status in RUNNING
                lines, sent = container.output[sent:], len(container.output)
                if lines:
                    stamp = rfc3339(self.clock.now())
                    yield "".join(f"{stamp} {line}\n" for line in lines).encode()
                    if self.end_follows_early:
                        return
                elif not running:
                    return
                else:
                    await asyncio.sleep(0.01)
        finally:
            self.following -= 1

    async def kill(self, ref: str, signal: str) -> bool:
        self._answer("kill")
        container = self.find(ref)
        self.refs.append((signal, ref))
        if container is not None and container.spec.name in self.ending:
            self._end(container, self.ending.pop(container.spec.name))  # first: it won
        if container is None or container.status not in RUNNING:
            return False
        self.signals.append((container.spec.name, signal))
        code = container.exit_on(signal)
        if code is not None:
            self._end(container, code)
        return True

    async def wait_exited(self, name: str, timeout: float) -> bool:
        """Waits for real time (tests give short grace periods) on the fake's changes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (c := self.containers.get(name)) is not None and c.status in RUNNING:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    async def remove(self, ref: str) -> None:
        self._answer("remove")
        self.refs.append(("remove", ref))
        container = self.find(ref)
        if container is not None:
            self._destroy(container.spec.name)

    async def ps(self) -> list[ContainerState]:
        self._answer("ps")
        if self.ps_error is not None:
            raise self.ps_error
        return [c.state() for c in self.containers.values() if LABEL_RUN_ID in c.labels]

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        return {pid: self.holders.get(pid) for pid in pids}

    async def catches(self, ref: str, signal: str) -> bool | None:
        """What the test set in ``caught`` for the job (by name), else True: a job that
        hears every warning, as the node assumed before it could tell."""
        self._answer("catches")
        container = self.find(ref)
        if container is None or container.status not in RUNNING:
            return None
        return self.caught.get(container.spec.name, True)

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        """What the test set in ``usages`` for each running container asked for (by id or
        name); a running one without an entry reads all unknown."""
        self._answer("usage")
        found = {ref: self.find(ref) for ref in refs}
        return {
            ref: self.usages.get(c.spec.name, Usage())
            for ref, c in found.items()
            if c is not None and c.status == "running"
        }

    async def disk_usage(self, ref: str, *, budget_s: float) -> DiskUse | None:
        """What the test set in ``written`` for the running container (unknown without
        an entry), with what ``deleted_open`` says its processes hold open deleted;
        what it wrote fills the data root, as a writable layer does."""
        self._answer("disk_usage")
        container = self.find(ref)
        if container is None or container.status not in RUNNING:
            return None
        name = container.spec.name
        written, deleted = self.written.get(name), self.deleted_open.get(name)
        made = self.made.get(name)
        if written is None or deleted is None:
            return DiskUse(written, walk_s=0.001, inodes=made)
        return DiskUse(written + deleted, walk_s=0.001, deleted_open_bytes=deleted, inodes=made)

    async def health(self) -> RuntimeHealth:
        self.calls["health"] += 1
        if not self.up:
            return RuntimeHealth(ok=False, engine=ENGINE, error="engine unreachable: fake: down")
        return RuntimeHealth(ok=True, engine=ENGINE, version="1.0-fake")

    async def device_support(self) -> DeviceSupport:
        """An engine with the NVIDIA runtime, unless a test set ``support``."""
        return self.support

    async def image_exists(self, image: str) -> bool:
        self._answer("image_exists")
        return image in self.images

    def image_id(self, image: str) -> str:
        """The id the engine holds ``image`` by: set by the test, else one of its name
        (an id is its own)."""
        if image.startswith(ID_PREFIX):
            return image
        name = canonical(image)
        return self.image_ids.get(name) or "sha256:" + hashlib.sha256(name.encode()).hexdigest()

    async def image_info(self, image: str) -> ImageInfo | None:
        self._answer("image_info")
        by_id = [name for name in sorted(self.images) if self.image_id(name) == image]
        names = by_id or ([image] if image in self.images else [])
        if not names:
            return None
        size = self.image_sizes.get(names[0], self.image_size)
        env = self.image_envs.get(names[0], {})
        return ImageInfo(self.image_id(names[0]), size, tuple(names), cuda_env=env)

    async def pull(
        self,
        image: str,
        *,
        limits: PullLimits,
        on_progress: ProgressCallback | None = None,
        auth: RegistryAuth | None = None,
    ) -> None:
        self._answer("pull")
        pull = FakePull(self, image)
        pull.on_progress = on_progress
        pull.auth = auth
        self.pulls.append(pull)
        self.pulling.set()
        try:
            await pull.done
        except asyncio.CancelledError:
            pull.cancelled = True
            raise
        if image not in self.images:
            raise EngineRefused(engine=ENGINE, action=f"pull {image}", reason="no image after")

    async def mount_support(self) -> MountSupport:
        """DIRECT by default: the fast suite opens mounts but binds none (no privilege)."""
        self._answer("mount_support")
        return MountSupport(self.mount_mode, (DATA_ROOT,))

    async def isolation_support(self) -> IsolationSupport:
        """What `isolation` says (none by default: no runtime, no namespaces); an engine
        that does not answer says its error, as the engines' adapters do."""
        try:
            self._answer("isolation_support")
        except NodeError as exc:
            return IsolationSupport(error=exc.message)
        return self.isolation

    async def data_root(self) -> DataRoot | None:
        self._answer("data_root")
        if self.disk_total is None:
            return DataRoot(DATA_ROOT, None)
        layers = sum(
            self.written.get(name, 0) + self.deleted_open.get(name, 0) for name in self.containers
        )
        free = max(0, self.disk_total - self.disk_other - self.images_bytes() - layers)
        if self.inodes_total is None:
            return DataRoot(self.root_path, Space(self.disk_total, free, free))
        files = self.inodes_total - self.inodes_other - sum(self.made.values())
        space = Space(self.disk_total, free, free, self.inodes_total, files)
        return DataRoot(self.root_path, space)

    async def list_images(self) -> list[EngineImage]:
        self._answer("list_images")
        used = self.used_ids()
        by_id: dict[str, list[str]] = {}
        for ref in sorted(self.images):
            by_id.setdefault(self.image_id(ref), []).append(ref)
        return [
            EngineImage(image_id, tuple(refs), self.size_of(image_id), None, image_id in used)
            for image_id, refs in by_id.items()
        ]

    async def remove_image(self, image: EngineImage) -> bool:
        self._answer("remove_image")
        if image.id in self.used_ids() or image.id in self.refuse_image_removal:
            return False
        self.images -= {ref for ref in self.images if self.image_id(ref) == image.id}
        self.image_removals.append(image.id)
        return True

    def used_ids(self) -> set[str]:
        """The images containers are made from (any owner, any state)."""
        return {c.image_id for c in self.containers.values() if c.image_id}

    def arrived(self, ref: str, *, size: int | None = None) -> None:
        """An image came (a pull, a load), of ``size`` bytes if the test says."""
        self.images.add(ref)
        if size is not None:
            self.image_sizes[ref] = size

    def tag(self, ref: str, new: str) -> None:
        """A second name for the same image."""
        self.images.add(new)
        self.image_ids[new] = self.image_id(ref)

    def size_of(self, image_id: str) -> int:
        """An image's size: its first name's (by name, as `image_info` reads it)."""
        names = sorted(ref for ref in self.images if self.image_id(ref) == image_id)
        return self.image_sizes.get(names[0], self.image_size) if names else 0

    def images_bytes(self) -> int:
        return sum(self.size_of(i) for i in {self.image_id(ref) for ref in self.images})

    # --- EngineFeed (blocking, thread-safe enough for one event thread) ----------------

    def list_brief(self) -> list[Brief]:
        self._answer("list_brief")
        return [
            brief(c.state()) for c in list(self.containers.values()) if LABEL_RUN_ID in c.labels
        ]

    def inspect_now(self, ref: str) -> ContainerState:
        self._answer("inspect_now")
        for container in list(self.containers.values()):
            if ref in (container.id, container.spec.name):
                return container.state()
        return ContainerState.missing(ref)

    def open_events(self) -> tuple[Iterator[EngineEvent], Callable[[], None]]:
        self._answer("open_events")
        stream = EventStream()
        with self._streams_lock:
            self._streams.append(stream)

        def events() -> Iterator[EngineEvent]:
            try:
                while (event := stream.get()) is not None:
                    yield event
                    stream.taken += 1  # the reader asks for the next: done with this one
                if not self.up:
                    raise EngineUnavailable(engine=ENGINE, reason="the stream broke")
            finally:  # ended, or dropped by its reader: its connection is closed
                self._drop(stream)

        return events(), stream.close

    def close_streams(self) -> None:
        """End every open event stream, as an engine restart does."""
        for stream in self._open_streams():
            stream.close()
            self._drop(stream)

    def _open_streams(self) -> list[EventStream]:
        with self._streams_lock:
            return list(self._streams)

    def _drop(self, stream: EventStream) -> None:
        with self._streams_lock, contextlib.suppress(ValueError):
            self._streams.remove(stream)

    # --- the engine's insides ----------------------------------------------------------

    def _answer(self, call: str) -> None:
        self.calls[call] += 1
        if not self.up:
            raise EngineUnavailable(engine=ENGINE, reason="down")
        if call in self.faults:
            raise self.faults[call]

    def _create(self, spec: ContainerSpec, *, labels: dict[str, str]) -> FakeContainer:
        container_id = f"{next(self._ids):04x}" + secrets.token_hex(30)
        container = FakeContainer(
            id=container_id,
            spec=spec,
            labels=labels,
            created_at=rfc3339(self.clock.now()),
            image_stop_signal=self._stop_signal(spec.image),
            image_id=self._made_from(spec.image),
        )
        self.containers[spec.name] = container
        self._emit(container, "create")
        return container

    def _names(self, image: str) -> list[str]:
        """The references of ``image`` (a reference or an id) the engine has."""
        if image.startswith(ID_PREFIX):
            return sorted(ref for ref in self.images if self.image_id(ref) == image)
        return [canonical(image)] if image in self.images else []

    def _made_from(self, image: str) -> str | None:
        names = self._names(image)
        return self.image_id(names[0]) if names else None

    def _stop_signal(self, image: str) -> str | None:
        return next(
            (self.stop_signals[n] for n in self._names(image) if n in self.stop_signals), None
        )

    def _start(self, container: FakeContainer) -> None:
        container.status = "running"
        container.started_at = rfc3339(self.clock.now())
        self._emit(container, "start")

    def _destroy(self, name: str) -> None:
        container = self.containers.pop(name)
        for pid in [pid for pid, held_by in self.holders.items() if held_by == container.id]:
            del self.holders[pid]  # a removed container's processes are gone
        self._emit(container, "destroy")

    def _emit(self, container: FakeContainer, action: str, *, exit_code: int | None = None) -> None:
        self.changed.set()
        if LABEL_RUN_ID not in container.labels:
            return  # the engines' event filter: only the node's containers
        event = EngineEvent(container.id, action, exit_code, rfc3339(self.clock.now()))
        for stream in self._open_streams():
            stream.send(event)


class FakeProbe:
    """A GPU probe answering what the test set: cards, faults, processes, links."""

    source = "simulation"
    blocking = False
    reading_ttl_s = 0.0

    def __init__(self, cards: int = 4) -> None:
        self.cards = {index: CardFacts(index, name="NVIDIA H100") for index in range(cards)}
        self.links: dict[tuple[int, int], str] = {}
        self.ok = True
        self.reads = 0

    def set(self, index: int, *, unhealthy: str | None = None, pids: tuple[int, ...] = ()) -> None:
        processes = tuple(GpuProcess(pid, 100) for pid in pids)
        self.cards[index] = CardFacts(
            index, name="NVIDIA H100", unhealthy=unhealthy, processes=processes
        )

    def snapshot(self) -> GpuSnapshot:
        self.reads += 1
        if not self.ok:
            return GpuSnapshot.failed(self.source, "the test says no")
        return GpuSnapshot(
            source=self.source,
            ok=True,
            error=None,
            driver="580.159.03",
            cuda="13.0",
            cards=tuple(self.cards[index] for index in sorted(self.cards)),
            processes_ok=True,
            links=MappingProxyType(dict(self.links)),
        )

    def close(self) -> None:
        return None


def brief(state: ContainerState) -> Brief:
    """What an engine's list says of a container."""
    signature = (state.status, state.exit_code)
    return Brief(
        state.id or "", state.name, signature, state.labels, state.created_at, state.image_id
    )
