"""StateCache: every labelled container's state, kept current without sweeping the engine.

Filled by one list plus one inspect per container before the daemon serves, kept
current by the engine's event stream (read on one dedicated thread, each event followed
by an inspect of just that container), and reconciled by a periodic relist, because
events alone drift (kubelet's lesson). When the stream breaks the cache goes stale:
every read answers `RuntimeUnavailable` until a full resync succeeds, so a container
the cache simply has not seen since is never reported gone.

`CachedRuntime` puts the cache in front of an engine runtime: reads come from memory,
and the verbs the daemon performs update it from their own result before returning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

from tuneplane_node.errors import NodeError, RuntimeUnavailable
from tuneplane_node.runtime.base import (
    BlockingPool,
    ContainerRuntime,
    ContainerSpec,
    ContainerState,
    ProgressCallback,
    RuntimeHealth,
    iso,
)

log = logging.getLogger(__name__)
# The actions that change what a ContainerState says; others (exec, attach...) do not.
WATCHED_ACTIONS = frozenset(
    {"create", "start", "restart", "die", "oom", "stop", "kill", "pause", "unpause"}
    | {"destroy", "rename", "remove", "cleanup"}
)
SIGKILLED = 137  # 128 + SIGKILL: the OOM killer's exit code, among others
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 10.0


class Brief(NamedTuple):
    """A container as the engine's list shows it: enough to tell whether it changed."""

    id: str
    name: str
    signature: tuple[str, int | None]


_EXIT_CODE = re.compile(r"^Exited \((-?\d+)\)")


def brief_from_list(entry: Mapping[str, Any]) -> Brief:
    """A Brief from a docker-format list entry (docker's, or podman's compat one)."""
    status = str(entry.get("State", "")).lower()
    code = _EXIT_CODE.match(str(entry.get("Status", "")))
    names = entry.get("Names") or [""]
    exit_code = int(code.group(1)) if code and status in ("exited", "dead") else None
    return Brief(str(entry.get("Id")), str(names[0]).lstrip("/"), (status, exit_code))


class EngineEvent(NamedTuple):
    """One container event; a ``die`` carries the exit code and the time it happened."""

    id: str
    action: str
    exit_code: int | None = None
    at: str | None = None


def event_from_docker(event: Mapping[str, Any]) -> EngineEvent:
    """An EngineEvent from a docker-format event (docker's, or podman's compat one)."""
    actor = event.get("Actor") or {}
    attributes = actor.get("Attributes") or {}
    code = str(attributes.get("exitCode", ""))
    nanos = event.get("timeNano")
    moment = datetime.fromtimestamp(nanos / 1e9, tz=timezone.utc) if nanos else None
    return EngineEvent(
        id=str(event.get("id") or actor.get("ID")),
        action=str(event.get("Action") or event.get("status", "")),
        exit_code=int(code) if code.lstrip("-").isdigit() else None,
        at=iso(moment),
    )


def signature_of(state: ContainerState) -> tuple[str, int | None]:
    return state.status, state.exit_code


class EngineFeed(ContainerRuntime, Protocol):
    """What an engine runtime offers the cache: blocking calls, run on its pool or thread."""

    pool: BlockingPool

    def list_brief(self) -> list[Brief]: ...
    def inspect_now(self, ref: str) -> ContainerState: ...
    def open_events(self) -> tuple[Iterator[EngineEvent], Callable[[], None]]: ...


class StateCache:
    """The states, the event thread and the relist task. Mutated on the loop thread only."""

    def __init__(self, feed: EngineFeed, *, relist_s: float, sync_timeout: float) -> None:
        self.feed = feed
        self.relist_s = relist_s
        self.sync_timeout = sync_timeout
        self.states: dict[str, ContainerState] = {}
        self.names: dict[str, str] = {}  # container id -> name
        self.touched: dict[str, float] = {}  # name -> when last written
        self.synced = False
        self.syncs = 0  # full resyncs so far: an engine restart is a new generation
        self.stale_reason = "the first sync has not finished"
        self.last_event: float | None = None
        self.last_relist: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._close_stream: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._relist: asyncio.Task[None] | None = None
        self._first_sync = asyncio.Event()

    # --- reads ------------------------------------------------------------------------

    def get(self, name: str) -> ContainerState:
        self._require_synced()
        return self.states.get(name) or ContainerState.missing(name)

    def all(self) -> list[ContainerState]:
        self._require_synced()
        return list(self.states.values())

    def _require_synced(self) -> None:
        if not self.synced:
            raise RuntimeUnavailable(engine=self.feed.name, reason=self.stale_reason)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "synced": self.synced,
            "last_event_age_s": _age(now, self.last_event),
            "last_relist_age_s": _age(now, self.last_relist),
            "containers": len(self.states),
        }

    # --- writes (loop thread) -----------------------------------------------------------

    def put(self, state: ContainerState, container_id: str | None = None) -> None:
        """Record what the engine just said about one container (gone included)."""
        key = container_id or state.id
        if not state.exists:
            name = self.names.pop(key, None) if key else None
            self._forget(name or state.name)
            return
        if not state.run_id:
            return  # not the node's: the cache holds labelled containers only
        old_name = self.names.get(state.id or "")
        if old_name and old_name != state.name:
            self._forget(old_name)  # renamed
        self.states[state.name] = state
        self.touched[state.name] = time.monotonic()
        if state.id:
            self.names[state.id] = state.name

    def _forget(self, name: str) -> None:
        state = self.states.pop(name, None)
        self.touched[name] = time.monotonic()
        if state is not None and state.id:
            self.names.pop(state.id, None)

    def _replace_all(self, states: list[ContainerState], started: float) -> None:
        """A full resync: the engine's word replaces everything listed before it began."""
        fresh = {state.name: state for state in states if state.run_id}
        for name in list(self.states):
            if name not in fresh and self.touched.get(name, 0) < started:
                self._forget(name)
        for state in fresh.values():
            if self.touched.get(state.name, 0) < started:
                self.put(state)
        self.touched = {name: t for name, t in self.touched.items() if name in self.states}
        self.synced = True
        self.syncs += 1
        self.last_relist = time.monotonic()
        self._first_sync.set()
        log.info("state cache synced: %d containers", len(self.states))

    def _mark_stale(self, reason: str) -> None:
        if self.synced:
            log.warning("state cache stale: %s", reason)
        self.synced = False
        self.stale_reason = f"event stream broken: {reason}"
        self._first_sync.set()  # the first attempt is over: serve, and answer 503

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(fn, *args)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the event thread and the relist; wait (bounded) for the first sync.

        An engine that is down does not hold the daemon back: reads answer 503 until
        the thread's next attempt syncs.
        """
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._watch, name=f"tuneplane-{self.feed.name}-events", daemon=True
        )
        self._thread.start()
        self._relist = asyncio.create_task(self._relist_forever(), name="state cache relist")
        try:
            await asyncio.wait_for(self._first_sync.wait(), self.sync_timeout)
        except asyncio.TimeoutError:
            log.warning("state cache: no first sync yet (%s); answering 503", self.stale_reason)

    async def close(self) -> None:
        self._stopping.set()
        if self._close_stream is not None:
            self._close_stream()
        if self._relist is not None:
            self._relist.cancel()
            await asyncio.gather(self._relist, return_exceptions=True)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def break_stream(self) -> None:
        """Close the event stream under the thread, as an engine restart would."""
        if self._close_stream is not None:
            self._close_stream()

    # --- the event thread -------------------------------------------------------------

    def _watch(self) -> None:
        backoff = BACKOFF_FIRST_S
        while not self._stopping.is_set():
            try:
                self._follow()
                reason = "the engine closed it"
            except Exception as exc:
                reason = exc.message if isinstance(exc, NodeError) else repr(exc)
            if self._stopping.is_set():
                return
            self._post(self._mark_stale, reason)
            # Backoff, never a busy loop: the engine may be down for minutes.
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _follow(self) -> None:
        events, close = self.feed.open_events()
        self._close_stream = close
        if self._stopping.is_set():
            close()
            return
        # The stream is open before the list: nothing can fall between the two.
        started = time.monotonic()
        states = [self.feed.inspect_now(brief.id) for brief in self.feed.list_brief()]
        self._post(self._replace_all, [s for s in states if s.exists], started)
        oomed: set[str] = set()  # an "oom" comes before its "die"
        for event in events:
            if event.action.split(":")[0] not in WATCHED_ACTIONS:
                continue
            if event.action == "oom":
                oomed.add(event.id)
            if event.action == "die":
                # Say "exited" now: the inspect that confirms it takes as long again.
                self._post(self._on_die, event, event.id in oomed)
                oomed.discard(event.id)
            state = self.feed.inspect_now(event.id)
            self._post(self._on_event, state, event.id)

    def _on_event(self, state: ContainerState, container_id: str) -> None:
        self.last_event = time.monotonic()
        self.put(state, container_id)

    def _on_die(self, event: EngineEvent, oom_killed: bool) -> None:
        """A provisional exited state from the events alone, until its inspect lands."""
        self.last_event = time.monotonic()
        known = self.states.get(self.names.get(event.id, ""))
        if known is None or not known.live or event.exit_code is None:
            return
        if event.exit_code == SIGKILLED and not oom_killed:
            return  # maybe an OOM kill whose event is late: let the inspect say which
        # finished_at must be set: reap would otherwise date the job by its creation.
        finished = event.at or iso(datetime.now(timezone.utc))
        self.put(
            replace(
                known,
                status="exited",
                exit_code=event.exit_code,
                finished_at=finished,
                oom_killed=known.oom_killed or oom_killed,
            )
        )

    # --- the relist ---------------------------------------------------------------------

    async def _relist_forever(self) -> None:
        while True:
            await asyncio.sleep(self.relist_s)
            if not self.synced:
                continue  # the event thread is resyncing from scratch
            try:
                await self.relist()
            except NodeError as exc:
                log.warning("state cache relist failed: %s", exc.message)

    async def relist(self) -> None:
        """One list; inspect only what changed or is new; drop what vanished."""
        started = time.monotonic()
        briefs = await self.feed.pool.call(self.feed.list_brief)
        listed = {brief.id for brief in briefs}
        for brief in briefs:
            known = self.states.get(self.names.get(brief.id, ""))
            if known is None or signature_of(known) != brief.signature:
                state = await self.feed.pool.call(self.feed.inspect_now, brief.id)
                if self.touched.get(state.name, 0) < started:
                    self.put(state, brief.id)
        for container_id, name in list(self.names.items()):
            if container_id not in listed and self.touched.get(name, 0) < started:
                self._forget(name)
        self.last_relist = time.monotonic()


def _age(now: float, moment: float | None) -> float | None:
    return None if moment is None else round(now - moment, 3)


class CachedRuntime:
    """A ContainerRuntime whose reads come from the StateCache (docker and podman)."""

    def __init__(self, inner: EngineFeed, *, relist_s: float, sync_timeout: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.cache = StateCache(inner, relist_s=relist_s, sync_timeout=sync_timeout)
        self._version: tuple[int, str | None] | None = None  # (sync generation, version)

    async def start(self) -> None:
        await self.cache.start()

    async def inspect(self, name: str) -> ContainerState:
        return self.cache.get(name)

    async def ps(self) -> list[ContainerState]:
        return self.cache.all()

    async def run(self, spec: ContainerSpec) -> str:
        try:
            return await self.inner.run(spec)
        finally:
            await self.refresh(spec.name)  # made, or torn down after a failed start

    async def stop(self, name: str, timeout: float) -> None:
        try:
            await self.inner.stop(name, timeout)
        finally:
            await self.refresh(name)

    async def remove(self, name: str) -> None:
        await self.inner.remove(name)
        self.cache.put(ContainerState.missing(name))

    async def refresh(self, name: str) -> None:
        """Write the engine's word about one container into the cache, now."""
        with contextlib.suppress(NodeError):
            self.cache.put(await self.inner.inspect(name))

    async def logs(self, name: str, tail_lines: int) -> str:
        return await self.inner.logs(name, tail_lines)

    async def health(self) -> RuntimeHealth:
        """From memory while the cache is in sync (the engine's version is asked once per
        sync generation); otherwise the engine is asked, and a stale cache is not ok."""
        cache = self.cache
        if cache.synced and self._version is not None and self._version[0] == cache.syncs:
            return RuntimeHealth(ok=True, engine=self.name, version=self._version[1])
        health = await self.inner.health()
        if health.ok and cache.synced:
            self._version = (cache.syncs, health.version)
        elif health.ok:
            return RuntimeHealth(
                ok=False, engine=self.name, version=health.version, error=cache.stale_reason
            )
        return health

    async def image_exists(self, image: str) -> bool:
        return await self.inner.image_exists(image)

    async def pull(
        self,
        image: str,
        *,
        timeout: float,
        stall_timeout: float,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        await self.inner.pull(
            image, timeout=timeout, stall_timeout=stall_timeout, on_progress=on_progress
        )

    async def close(self) -> None:
        await self.cache.close()
        await self.inner.close()
