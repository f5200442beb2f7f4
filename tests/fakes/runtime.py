"""An engine in memory for the fast tests: the `ContainerRuntime` verbs over `FakeEngine`.

`FakeRuntime` honours the documented `ContainerRuntime` and `EngineFeed` contracts
(missing is not an error, a name in use is `EngineConflict`, a start that fails leaves
no container, ps lists only labelled containers, a pull succeeds only with the image
present) and lets a test hold any verb open, fail it, or play the job's part (exit,
OOM, ignore SIGTERM). Its events go to every open event stream, as an engine's do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Collection, Sequence

from tests.fakes.containers import FakeContainer
from tests.fakes.engine import DATA_ROOT, ENGINE, FakeEngine, FakePull
from tuneplane_node.clock import rfc3339
from tuneplane_node.errors import EngineConflict, EngineRefused, EngineUnavailable, NodeError
from tuneplane_node.inventory import Space
from tuneplane_node.runtime.base import (
    RUNNING,
    CacheStatus,
    ContainerState,
    LogQuery,
    LogStream,
    LogText,
    ProgressCallback,
    PullLimits,
    tells_no_changes,
)
from tuneplane_node.runtime.engines.dockerformat import LogFold
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
from tuneplane_node.runtime.labels import job_labels
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, RegistryAuth

PIECE = 16 * 1024  # docker cuts log lines into pieces this long


class FakeRuntime(FakeEngine):
    """An engine in memory. Every verb is also an EngineFeed call, blocking or not."""

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
