"""StateCache: every labelled container's state, kept current without sweeping the engine.

Filled by one list before the daemon serves (names, labels, status: what health and the
cards need), then by one inspect per container on a fill thread, 8 at once; until a
container's inspect is in, a read of it (observe, every verb) asks the engine itself.
Kept current by the engine's event stream (read on one dedicated thread, `EventThread`
in events.py, each event followed by an inspect of just that container), and reconciled
by a periodic relist, because
events alone drift (kubelet's lesson). When the stream breaks the cache goes stale:
every read answers `EngineUnavailable` until a full resync succeeds, so a container
the cache simply has not seen since is never reported gone.

The thread only reads; it posts what it read to the loop, and every change to the
cache happens on the loop thread (`on_event`, `on_inspected`, `replace_all`,
`on_filled`), which is
also what the unit tests drive, event by event.

`CachedRuntime` (runtime.py) puts it in front of an engine runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, parse_rfc3339, rfc3339
from tuneplane_node.errors import EngineUnavailable, NodeError
from tuneplane_node.runtime.base import (
    EXIT_SIGKILL,
    RUNNING,
    Brief,
    CacheStatus,
    ChangeListener,
    ContainerState,
    EngineEvent,
    EngineFeed,
)
from tuneplane_node.runtime.cache.events import EventThread
from tuneplane_node.runtime.labels import run_id_of
from tuneplane_node.tasks import BackgroundTasks

log = logging.getLogger(__name__)
HEARTBEAT_S = 2.0
"""How often a synced cache asks the engine whether it still answers."""
ANSWER_S = 1.5
"""How long health waits on the engine, and how long a heartbeat may go unanswered
before health says so: a probe's answer comes within 2 s whatever the engine does."""
RECHECK_S = 1.0
"""A waiter looks again this often even without a change: a stale cache may resync."""
BACKOFF_S = (0.5, 10.0)
"""The first and the longest wait between two tries to reopen a broken event stream."""


def _signature(state: ContainerState) -> tuple[str, int | None]:
    return state.status, state.exit_code


class StateCache:
    """The states, fed by its event thread (`EventThread`), and the relist task. Mutated on
    the loop thread only."""

    def __init__(
        self,
        feed: EngineFeed,
        *,
        relist_s: float,
        sync_timeout: float,
        clock: Clock = SYSTEM_CLOCK,
        backoff_s: tuple[float, float] = BACKOFF_S,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.feed, self.clock = feed, clock
        self.relist_s, self.sync_timeout = relist_s, sync_timeout
        self.backoff_s, self.heartbeat_s = backoff_s, heartbeat_s
        self.states: dict[str, ContainerState] = {}
        self.names: dict[str, str] = {}  # container id -> name
        self.touched: dict[str, float] = {}  # name -> when last written
        # Listed only (no times yet): a read asks the engine first; the fill reads them all.
        self.unread: set[str] = set()
        self._fills = 0  # which sync a fill belongs to: an older one writes nothing
        self.synced = False
        self.syncs = 0  # full resyncs so far: an engine restart is a new generation
        self.generation = 0  # bumped by every change: readers rebuild what they derived
        self.stale_reason = "the first sync has not finished"
        self.last_event: float | None = None
        self.last_relist: float | None = None
        self.asking_since: float | None = None  # when the heartbeat in flight asked
        self._oomed: set[str] = set()  # ids whose "oom" came and whose "die" has not
        self._watchers: dict[str, set[asyncio.Event]] = {}  # name -> waiters for a change
        self.listeners: list[ChangeListener] = []  # told of every change (watch's change log)
        self._thread = EventThread(feed, self, clock=clock, backoff_s=backoff_s)
        self._tasks = BackgroundTasks(log)  # the relist's
        self._first_sync = asyncio.Event()

    # --- reads ------------------------------------------------------------------------

    def get(self, name: str) -> ContainerState:
        self._require_synced()
        return self.states.get(name) or ContainerState.missing(name)

    def get_many(self, names: Iterable[str]) -> list[ContainerState]:
        """`get` of each, the sync checked once (observe asks for hundreds)."""
        self._require_synced()
        found, missing = self.states.get, ContainerState.missing
        return [found(name) or missing(name) for name in names]

    def all(self) -> list[ContainerState]:
        self._require_synced()
        return list(self.states.values())

    def _require_synced(self) -> None:
        if not self.synced:
            raise EngineUnavailable(engine=self.feed.name, reason=self.stale_reason)

    def status(self) -> CacheStatus:
        now = self.clock.monotonic()
        return CacheStatus(
            synced=self.synced,
            last_event_age_s=age(now, self.last_event),
            last_relist_age_s=age(now, self.last_relist),
            containers=len(self.states),
            generation=self.generation,
        )

    # --- changes (loop thread) ----------------------------------------------------------

    def put(self, state: ContainerState, container_id: str | None = None) -> None:
        """Record what the engine just said about one container (gone included)."""
        key = container_id or state.id
        if not state.exists:
            name = self.names.pop(key, None) if key else None
            self._forget(name or state.name)
            return
        if not state.run_id:
            return  # not the node's: the cache holds labelled containers only
        self.unread.discard(state.name)
        old_name = self.names.get(state.id or "")
        if old_name and old_name != state.name:
            self._forget(old_name)  # renamed
        self.states[state.name] = state
        self.touched[state.name] = self.clock.monotonic()
        if state.id:
            self.names[state.id] = state.name
        self._changed(state.name)

    def _forget(self, name: str) -> None:
        self.unread.discard(name)
        state = self.states.pop(name, None)
        self.touched[name] = self.clock.monotonic()
        if state is not None and state.id:
            self.names.pop(state.id, None)
        self._changed(name)

    def _changed(self, name: str | None) -> None:  # None: every container (a sync, or lost)
        self.generation += 1
        for waiter in self._watchers.get(name or "", ()):
            waiter.set()
        for listener in self.listeners:
            listener(name)

    async def wait_exited(self, name: str, timeout: float) -> bool:
        """Until the container of that name runs no more (by the events), at most
        ``timeout`` seconds. While the cache is stale nothing is known: it waits on."""
        deadline = self.clock.monotonic() + timeout
        changed = asyncio.Event()
        self._watchers.setdefault(name, set()).add(changed)
        try:
            while True:
                with contextlib.suppress(EngineUnavailable):
                    if self.get(name).status not in RUNNING:
                        return True
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    return False
                changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await self.clock.wait_for(changed.wait(), min(remaining, RECHECK_S))
        finally:
            self._watchers[name].discard(changed)
            if not self._watchers[name]:
                del self._watchers[name]

    def on_event(self, event: EngineEvent) -> None:
        """An event as it arrives, before its inspect: say "exited" at once on a die."""
        self.last_event = self.clock.monotonic()
        if event.action == "oom":
            self._oomed.add(event.id)  # an "oom" comes before its "die"
        elif event.action == "die":
            self._provisional_exit(event, oom_killed=event.id in self._oomed)
            self._oomed.discard(event.id)
        elif event.action == "destroy":
            self._oomed.discard(event.id)

    def _provisional_exit(self, event: EngineEvent, *, oom_killed: bool) -> None:
        """The exited state the die event alone tells, until its inspect lands."""
        known = self.states.get(self.names.get(event.id, ""))
        if known is None or not known.live or event.exit_code is None:
            return
        if event.exit_code == EXIT_SIGKILL and not oom_killed:
            return  # maybe an OOM kill whose event is late: let the inspect say which
        # finished_at must be set: reap would otherwise date the job by its creation.
        finished = event.at or rfc3339(self.clock.now())
        self.put(
            replace(
                known,
                status="exited",
                exit_code=event.exit_code,
                finished_at=finished,
                oom_killed=known.oom_killed or oom_killed,
            )
        )

    def on_filled(self, state: ContainerState, container_id: str, fill: int) -> None:
        """A fill's inspect: written only where nothing newer came since the list."""
        if fill == self._fills and state.name in self.unread:
            self.put(state, container_id)
        elif not state.exists and fill == self._fills:
            name = self.names.get(container_id)
            if name in self.unread:
                self._forget(name)  # gone since the list

    def on_inspected(self, state: ContainerState, container_id: str) -> None:
        """The inspect that follows an event: the engine's word on that container, but
        one read before the end the cache already holds (`read_before_its_end`)."""
        self.last_event = self.clock.monotonic()
        known = self.states.get(self.names.get(container_id, ""))
        if known is not None and read_before_its_end(state, known):
            return
        self.put(state, container_id)

    def replace_all(self, briefs: list[Brief], started: float, fill: int) -> None:
        """A full resync from the engine's list: it replaces everything written before it
        began. Its states are partial (no times) until the fill that follows reads them."""
        self._fills = fill
        fresh = {b.name: b.partial_state() for b in briefs if run_id_of(b.labels)}
        for name in list(self.states):
            if name not in fresh and self.touched.get(name, 0) < started:
                self._forget(name)
        for state in fresh.values():
            if self.touched.get(state.name, 0) < started:
                self.put(state)
                self.unread.add(state.name)
        self.touched = {name: t for name, t in self.touched.items() if name in self.states}
        self.synced = True
        self.syncs += 1
        self.last_relist = self.clock.monotonic()
        self._first_sync.set()
        self._changed(None)
        log.info("state cache synced: %d containers", len(self.states))

    def mark_stale(self, reason: str) -> None:
        if self.synced:
            log.warning("state cache stale: %s", reason)
        self.synced = False
        self.stale_reason = f"event stream broken: {reason}"
        self._first_sync.set()  # the first try is over: serve, and answer 503
        self._changed(None)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the event thread and the relist; wait (bounded) for the first sync.

        An engine that is down does not hold the daemon back: reads answer 503 until
        the thread's next try syncs.
        """
        self._thread.start(asyncio.get_running_loop())
        self._tasks.spawn(self._relist_forever(), name="state cache relist")
        try:
            await self.clock.wait_for(self._first_sync.wait(), self.sync_timeout)
        except asyncio.TimeoutError:
            log.warning("state cache: no first sync yet (%s); answering 503", self.stale_reason)

    async def close(self) -> None:
        """Stop the event thread's stream, end the relist, then wait for the thread."""
        self._thread.stop()
        await self._tasks.close()
        await self._thread.join()

    def break_stream(self) -> None:
        """Close the event stream under the thread, as an engine restart would."""
        self._thread.break_stream()

    # --- the relist ---------------------------------------------------------------------

    async def _relist_forever(self) -> None:
        """A heartbeat every few seconds, and a relist every ``relist_s``."""
        beat = min(self.heartbeat_s, self.relist_s)
        last_relist = self.clock.monotonic()
        while True:
            await self.clock.sleep(beat)
            if not self.synced:
                continue  # the event thread is resyncing from scratch
            await self._heartbeat()
            if self.synced and self.clock.monotonic() - last_relist >= self.relist_s:
                last_relist = self.clock.monotonic()
                try:
                    await self.relist()
                except NodeError as exc:
                    log.warning("state cache relist failed: %s", exc.message)

    async def _heartbeat(self) -> None:
        """An engine that stops answering sends no event: without asking it, the cache
        would serve its last word as the truth. Not answering within the API deadline
        makes the cache stale (reads answer 503) and reopens the stream."""
        with _asking(self):  # how long the engine takes is health's to read
            health = await self.feed.health()
        if not health.ok and self.synced:
            self.mark_stale(f"the engine does not answer: {health.error}")
            self.break_stream()

    async def relist(self) -> None:
        """One list; inspect only what changed or is new; drop what vanished."""
        started = self.clock.monotonic()
        briefs = await self.feed.pool.call(self.feed.list_brief)
        listed = {brief.id for brief in briefs}
        for brief in briefs:
            known = self.states.get(self.names.get(brief.id, ""))
            if known is None or _signature(known) != brief.signature:
                state = await self.feed.pool.call(self.feed.inspect_now, brief.id)
                if self.touched.get(state.name, 0) < started:
                    self.put(state, brief.id)
        for container_id, name in list(self.names.items()):
            if container_id not in listed and self.touched.get(name, 0) < started:
                self._forget(name)
        # Marks of containers long gone: kept only while a write may still race the list.
        self.touched = {n: t for n, t in self.touched.items() if n in self.states or t >= started}
        self.last_relist = self.clock.monotonic()


@contextlib.contextmanager
def _asking(cache: StateCache) -> Iterator[None]:
    """Marks the heartbeat in flight: an engine that takes long to answer it is silent."""
    cache.asking_since = cache.clock.monotonic()
    try:
        yield
    finally:
        cache.asking_since = None


def age(now: float, moment: float | None) -> float | None:
    return None if moment is None else round(now - moment, 3)


def read_before_its_end(state: ContainerState, known: ContainerState) -> bool:
    """Whether ``state``, live, was read before ``known``'s end: the inspect after a
    start event that lands after the die event's provisional exit (`_provisional_exit`;
    podman under load, seen in CI) showed an exited job running again, its exit code
    gone, until the die's own inspect. A container started again starts after its end."""
    if not state.live or known.live or not known.exists:
        return False
    ended, started = parse_rfc3339(known.finished_at), parse_rfc3339(state.started_at)
    return ended is not None and (started is None or started <= ended)
