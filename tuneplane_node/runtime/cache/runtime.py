"""CachedRuntime: the state cache (`StateCache`, state.py) in front of an engine runtime:
reads come from memory, and the verbs the node performs update it from their own result
before returning."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Collection, Sequence

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.runtime.base import (
    CacheStatus,
    ChangeListener,
    ContainerState,
    EngineFeed,
    LogQuery,
    LogStream,
    LogText,
    ProgressCallback,
    PullLimits,
)
from tuneplane_node.runtime.cache.state import ANSWER_S, BACKOFF_S, HEARTBEAT_S, StateCache
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
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)


class CachedRuntime:
    """A ContainerRuntime whose reads come from the StateCache (docker and podman)."""

    def __init__(
        self,
        inner: EngineFeed,
        *,
        relist_s: float,
        sync_timeout: float,
        clock: Clock = SYSTEM_CLOCK,
        backoff_s: tuple[float, float] = BACKOFF_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.cache = StateCache(
            inner,
            relist_s=relist_s,
            sync_timeout=sync_timeout,
            clock=clock,
            backoff_s=backoff_s,
            heartbeat_s=heartbeat_s,
        )
        # (sync generation, the healthy answer): one object while it holds, so health's
        # part made of it is made once
        self._version: tuple[int, RuntimeHealth] | None = None
        self._asking: asyncio.Future[RuntimeHealth] | None = None  # health's question

    async def start(self) -> None:
        await self.cache.start()
        await self.inner.start()  # the engine's own start-up sweep (podman's job networks)

    async def close(self) -> None:
        if self._asking is not None:
            self._asking.cancel()
            await asyncio.gather(self._asking, return_exceptions=True)
        await self.cache.close()
        await self.inner.close()

    def status(self) -> CacheStatus:
        return self.cache.status()

    def cache_generation(self) -> int | None:
        cache = self.cache  # without the status's ages: health asks this on every call
        return cache.generation if cache.synced else None

    def on_change(self, listener: ChangeListener) -> bool:
        self.cache.listeners.append(listener)
        return True

    async def inspect(self, name: str) -> ContainerState:
        state = self.cache.get(name)
        if name not in self.cache.unread:
            return state
        # Only listed so far (no times): never answered as it is. The engine's word,
        # by the id the list gave (a name could reach another container).
        fresh = await self.inner.pool.call(self.inner.inspect_now, state.id or name)
        self.cache.put(fresh, state.id)
        return self.cache.get(name)

    async def inspect_many(self, names: Sequence[str]) -> list[ContainerState]:
        """From memory without a wait, but for a container only listed so far."""
        states = self.cache.get_many(names)
        if self.cache.unread:  # a relist's new names: usually none
            for index, name in enumerate(names):
                if name in self.cache.unread:
                    states[index] = await self.inspect(name)
        return states

    async def inspect_fresh(self, name: str) -> ContainerState:
        self.cache.get(name)  # a stale cache answers 503 here, as every read does
        state = await self.inner.inspect(name)  # by exact name, with its deadline
        self.cache.put(state, state.id if state.exists else None)
        return state

    async def ps(self) -> list[ContainerState]:
        return self.cache.all()

    async def run(self, spec: ContainerSpec) -> str:
        try:
            return await self.inner.run(spec)
        finally:
            await self.refresh(spec.name)  # made, or torn down after a failed start

    async def kill(self, ref: str, signal: str) -> bool:
        return await self.inner.kill(ref, signal)  # the exit arrives as an event

    async def catches(self, ref: str, signal: str) -> bool | None:
        return await self.inner.catches(ref, signal)  # the processes now, never cached

    async def wait_exited(self, name: str, timeout: float) -> bool:
        return await self.cache.wait_exited(name, timeout)

    async def remove(self, ref: str) -> None:
        await self.inner.remove(ref)
        self.cache.put(ContainerState.missing(ref), ref)  # ref: an id, or a name

    async def refresh(self, ref: str) -> None:
        """Write the engine's word about one container into the cache, now."""
        with contextlib.suppress(NodeError):
            self.cache.put(await self.inner.pool.call(self.inner.inspect_now, ref), ref)

    async def logs(self, ref: str, query: LogQuery) -> LogText | None:
        return await self.inner.logs(ref, query)

    async def follow_logs(self, ref: str, query: LogQuery) -> LogStream | None:
        return await self.inner.follow_logs(ref, query)

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        return await self.inner.usage(refs)  # figures are read now, never cached

    async def disk_usage(self, ref: str, *, budget_s: float) -> DiskUse | None:
        return await self.inner.disk_usage(ref, budget_s=budget_s)  # walked now, never cached

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        return self.inner.holders_of(pids)

    async def device_support(self) -> DeviceSupport:
        return await self.inner.device_support()

    async def health(self) -> RuntimeHealth:
        """From memory, within `ANSWER_S` whatever the engine does: the engine's version
        is asked once per sync generation, and never waited on longer. A stale cache is
        not ok, at once, nor one whose heartbeat the engine has left unanswered: its
        containers' states are then its last word, which may no longer hold."""
        cache = self.cache
        known = self._version[1].version if self._version is not None else None
        if not cache.synced:
            return RuntimeHealth(
                ok=False, engine=self.name, version=known, error=cache.stale_reason
            )
        asked = cache.asking_since  # the heartbeat in flight, if any
        silent = 0.0 if asked is None else cache.clock.monotonic() - asked
        if silent > ANSWER_S:
            return self._silent(known, f"has not answered for {silent:.0f} s")
        if self._version is not None and self._version[0] == cache.syncs:
            return self._version[1]
        # One question in flight, however many probes wait: each would hold a thread of
        # the engine's pool for as long as the engine is frozen.
        if self._asking is None or self._asking.done():
            self._asking = asyncio.ensure_future(self.inner.health())
            self._asking.add_done_callback(functools.partial(self._learn, cache.syncs))
        try:
            return await cache.clock.wait_for(asyncio.shield(self._asking), ANSWER_S)
        except asyncio.TimeoutError:
            return self._silent(known, f"did not say its version within {ANSWER_S:g} s")

    def _learn(self, syncs: int, asked: asyncio.Future[RuntimeHealth]) -> None:
        """The version, once the engine says it: late, it is kept all the same."""
        if not asked.cancelled() and asked.exception() is None and asked.result().ok:
            self._version = (syncs, asked.result())

    def _silent(self, version: str | None, how: str) -> RuntimeHealth:
        error = (
            f"the engine {how}: the containers' states and the cards' occupancy are "
            "its last word, which may no longer hold"
        )
        return RuntimeHealth(ok=False, engine=self.name, version=version, error=error)

    async def data_root(self) -> DataRoot | None:
        return await self.inner.data_root()

    async def mount_support(self) -> MountSupport:
        return await self.inner.mount_support()

    async def isolation_support(self) -> IsolationSupport:
        return await self.inner.isolation_support()

    async def list_images(self) -> list[EngineImage]:
        return await self.inner.list_images()  # images are not cached: a GC run asks

    async def remove_image(self, image: EngineImage) -> bool:
        return await self.inner.remove_image(image)

    async def image_exists(self, image: str) -> bool:
        return await self.inner.image_exists(image)

    async def image_info(self, image: str) -> ImageInfo | None:
        return await self.inner.image_info(image)

    async def pull(
        self,
        image: str,
        *,
        limits: PullLimits,
        on_progress: ProgressCallback | None = None,
        auth: RegistryAuth | None = None,
    ) -> None:
        await self.inner.pull(image, limits=limits, on_progress=on_progress, auth=auth)
