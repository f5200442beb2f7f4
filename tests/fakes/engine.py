"""The fake engine's state and what a test does to it: its containers and images, the
pulls and verbs it holds open, its event streams (the blocking `EngineFeed`), and what
every verb does first (`_answer`: down, or a fault the test set). `FakeRuntime`
(`tests.fakes.runtime`) puts the `ContainerRuntime` verbs over it."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import itertools
import secrets
import threading
from collections.abc import Callable, Iterator

from tests.fakes.clock import FakeClock
from tests.fakes.containers import EventStream, FakeContainer, brief
from tests.fakes.references import ByReference, References
from tuneplane_node.clock import rfc3339
from tuneplane_node.errors import EngineRefused, EngineUnavailable
from tuneplane_node.references import ID_PREFIX, canonical
from tuneplane_node.runtime.base import (
    Brief,
    ContainerState,
    EngineEvent,
    ProgressCallback,
    PullProgress,
)
from tuneplane_node.runtime.facts import DIRECT, DeviceSupport, IsolationSupport, Usage
from tuneplane_node.runtime.pool import BlockingPool
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, RegistryAuth

ENGINE = "fake"
MIB = 2**20
DATA_ROOT = "/fake/data-root"


class FakePull:
    """One pull the fake engine is doing: the test reports progress, finishes or fails it."""

    def __init__(self, runtime: FakeEngine, image: str) -> None:
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


class FakeEngine:
    """The engine's state, what a test does to it, and its event feed; `FakeRuntime` adds
    the `ContainerRuntime` verbs."""

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

    def find(self, ref: str) -> FakeContainer | None:
        """A container by id or by name, as engines resolve a ref."""
        return next((c for c in self.containers.values() if ref == c.id), None) or (
            self.containers.get(ref)
        )

    def image_id(self, image: str) -> str:
        """The id the engine holds ``image`` by: set by the test, else one of its name
        (an id is its own)."""
        if image.startswith(ID_PREFIX):
            return image
        name = canonical(image)
        return self.image_ids.get(name) or "sha256:" + hashlib.sha256(name.encode()).hexdigest()

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
