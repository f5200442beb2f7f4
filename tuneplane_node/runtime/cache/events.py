"""The state cache's event thread: it reads the engine and posts what it read to the loop.

One dedicated thread opens the engine's event stream, lists the containers, starts
their fill (an inspect of each, `FILL_THREADS` at once) and then follows the events,
each watched one followed by an inspect of just that container. It never changes the
cache: every reading goes to the `CacheSink` on the loop thread (`StateCache`), which
is what the unit tests drive, event by event. A broken stream makes the sink stale and
is reopened after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from tuneplane_node.clock import Clock
from tuneplane_node.errors import EngineRefused, NodeError
from tuneplane_node.runtime.base import Brief, ContainerState, EngineEvent, EngineFeed

log = logging.getLogger(__name__)
# The actions that change what a ContainerState says; others (exec, attach...) do not,
# nor do "kill" and "stop": each only comes before or after the "die" that tells the
# exit (docker's stop is kill, kill, die, stop). Their inspects were three of a docker
# stop's four, 18 ms each of the event thread's one-at-a-time work in a burst of stops.
WATCHED_ACTIONS = frozenset(
    {"create", "start", "restart", "die", "oom", "pause", "unpause"}
    | {"destroy", "rename", "remove", "cleanup"}
)
HANDOVER_TURNS = 12
HANDOVER_S = 0.005
"""The loop turns an event's inspect waits for, and at most how long (an inspect after a
die takes about 18 ms on docker: a busy loop costs the event thread little more)."""
FILL_THREADS = 8
"""Inspects at once while the cache fills after a sync (within the SDK's connection
pool, 18 by default: the fill takes a few seconds once, at start or after a resync)."""
INSPECT_TRIES = 3
INSPECT_RETRY_S = 0.05  # a thread's wait, on the stop event: never a busy loop


def watched(event: EngineEvent) -> bool:
    return event.action.split(":")[0] in WATCHED_ACTIONS


class CacheSink(Protocol):
    """What the thread hands its readings to, each call on the loop thread."""

    def replace_all(self, briefs: list[Brief], started: float, fill: int) -> None: ...
    def on_filled(self, state: ContainerState, container_id: str, fill: int) -> None: ...
    def on_event(self, event: EngineEvent) -> None: ...
    def on_inspected(self, state: ContainerState, container_id: str) -> None: ...
    def mark_stale(self, reason: str) -> None: ...


class EventThread:
    """The reading thread of one cache: started once, stopped once."""

    def __init__(
        self, feed: EngineFeed, sink: CacheSink, *, clock: Clock,
        backoff_s: tuple[float, float],
    ) -> None:  # fmt: skip
        self.feed, self.sink, self.clock, self.backoff_s = feed, sink, clock, backoff_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._close_stream: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._lists = 0  # the thread's own count of its lists: it numbers the fills

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        name = f"tuneplane-{self.feed.name}-events"
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Tell the thread to end, and close its stream under it."""
        self._stopping.set()
        self.break_stream()

    async def join(self) -> None:
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)

    def break_stream(self) -> None:
        """Close the event stream under the thread, as an engine restart would."""
        if self._close_stream is not None:
            self._close_stream()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._loop.call_soon_threadsafe(fn, *args)

    def _watch(self) -> None:
        backoff, longest = self.backoff_s
        while not self._stopping.is_set():
            lists = self._lists
            try:
                self._follow()
                reason = "the engine closed it"
            except Exception as exc:
                reason = exc.message if isinstance(exc, NodeError) else repr(exc)
            if self._stopping.is_set():
                return
            self._post(self.sink.mark_stale, reason)
            # Backoff, never a busy loop; from the first again once a stream synced (listed).
            backoff = self.backoff_s[0] if self._lists > lists else backoff
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, longest)

    def _follow(self) -> None:
        events, close = self.feed.open_events()
        self._close_stream = close
        if self._stopping.is_set():
            close()
            return
        # The stream is open before the list: nothing can fall between the two.
        started = self.clock.monotonic()
        briefs = self.feed.list_brief()
        # Counted here, not read back from the loop: a second list may come before the
        # loop has taken the first.
        self._lists += 1
        fill = self._lists
        self._post(self.sink.replace_all, briefs, started, fill)
        self._fill([b.id for b in briefs], fill)
        for event in events:
            if watched(event):
                handed_over(self._loop, self.sink.on_event, event)
                self._post(self.sink.on_inspected, self._inspect_after(event.id), event.id)

    def _inspect_after(self, container_id: str) -> ContainerState:
        """The container as an event left it. An engine that refuses one inspect of a
        container mid-exit (podman 4: "read /proc/<pid>/cgroup: no such process") is
        asked again a moment later; only a third refusal breaks the stream (503s until
        the resync), which a refusal of one container should not do lightly."""
        for _ in range(INSPECT_TRIES - 1):
            try:
                return self.feed.inspect_now(container_id)
            except EngineRefused as exc:
                log.debug("inspect of %s refused (%s): again", container_id, exc.message)
                if self._stopping.wait(INSPECT_RETRY_S):
                    break
        return self.feed.inspect_now(container_id)

    def _fill(self, ids: list[str], fill: int) -> None:
        """Start inspecting every listed container, several at once, and return: the list
        already made the cache answer (health and the cards need only labels and status;
        a read of a container not yet filled asks the engine itself). Filling first held
        the first answer back 2.75 s with 1,000 containers (bench/startup.py)."""

        def one(container_id: str) -> None:
            if self._stopping.is_set():
                return
            try:
                state = self.feed.inspect_now(container_id)
            except Exception:  # the engine went: the resync after the broken stream redoes it
                return
            self._post(self.sink.on_filled, state, container_id, fill)

        pool = ThreadPoolExecutor(FILL_THREADS, thread_name_prefix=f"{self.feed.name}-fill")
        for container_id in ids:
            pool.submit(one, container_id)
        pool.shutdown(wait=False)  # the queued inspects still run; the events go on now


def handed_over(
    loop: asyncio.AbstractEventLoop | None, fn: Callable[..., None], *args: Any
) -> None:
    """Post ``fn(*args)`` to the loop from a thread, and return once the loop has run it
    and had its next turns, in which what it set off runs (the watch's read, the woken
    queries through their futures, the answers' writes). The event thread's next step,
    the inspect after an event, builds its request in a couple of milliseconds of Python
    under the GIL: started at once, it held an exit's answer back by as much
    (bench/watch.py). A busy loop holds the thread ``HANDOVER_S`` at most."""
    assert loop is not None  # set before the thread starts
    done = threading.Event()

    def turn(left: int) -> None:
        if left:
            loop.call_soon(turn, left - 1)
        else:
            done.set()

    def take() -> None:
        fn(*args)
        turn(HANDOVER_TURNS)

    with contextlib.suppress(RuntimeError):  # the loop is closing
        loop.call_soon_threadsafe(take)
        done.wait(HANDOVER_S)
