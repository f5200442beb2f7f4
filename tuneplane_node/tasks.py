"""BackgroundTasks: the one way the package starts a task that nobody awaits at once.

kopf's discipline. Every background task is

- named: its name is in every line about it, and in a test's leaked-task report;
- held until it ends (asyncio keeps only a weak reference to a task);
- guarded: a failure is logged once, at ERROR, with its name and traceback;
- its owner's: the owner's close cancels it and waits until it has ended.

A task whose end means more than "done or failed" passes ``ended`` (a pending launch
frees its cards and records why it failed; a shared pull's error is its waiters'). That
callback runs however the task ends, cancelled before it first ran included (no
``finally`` of the task's own covers that), and is then the one place its failure is
reported; one that raises is logged as the task's failure.

Each owner holds its own `BackgroundTasks` and closes it in its own close, in the order
its docstring gives; the app closes the owners in the reverse order of their start.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError

T = TypeVar("T")
CANCEL_AGAIN_S = 10.0
"""A cancelled task's grace before it counts as having lost the cancel: a teardown takes
seconds (a launch cancelled mid-create lets the engine's create finish, then removes what
it made), a lost cancel forever; under systemd's 45 s stop (contrib/systemd)."""
Ended = Callable[["asyncio.Task[Any]"], None]


async def periodically(
    step: Callable[[], Awaitable[object]],
    *,
    period_s: float,
    clock: Clock,
    logger: logging.Logger,
    what: str,
) -> None:
    """``step`` now, then every ``period_s``, as long as the node runs; an engine that
    does not answer (a `NodeError`) is said when it starts failing or fails otherwise
    (not every period), and tried again next period."""
    said = None
    while True:
        try:
            await step()
            said = None
        except NodeError as exc:
            if exc.message != said:
                logger.warning("%s: %s; trying again every %g s", what, exc.message, period_s)
            said = exc.message
        await clock.sleep(period_s)


def by_awaiters(task: asyncio.Task[Any]) -> None:
    """An ``ended`` for a task others await (a shared pull, a shared probe read): its
    error reaches each of them, who report it; none is logged here."""
    if not task.cancelled():
        task.exception()  # read: asyncio would otherwise call it never retrieved


class BackgroundTasks:
    """An owner's background tasks: started by `spawn`, ended by `cancel` or `close`."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(
        self, work: Coroutine[Any, Any, T], *, name: str, ended: Ended | None = None
    ) -> asyncio.Task[T]:
        """Start ``work`` as a task of this name, held until it ends."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._finished, ended))
        return task

    def _finished(self, ended: Ended | None, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if ended is not None:
            try:
                ended(task)
            except Exception:
                self.log.exception("%s: recording its end failed", task.get_name())
        elif not task.cancelled() and (error := task.exception()) is not None:
            self.log.error("%s failed", task.get_name(), exc_info=error)

    async def cancel(self, task: asyncio.Task[Any]) -> None:
        """Cancel one task and wait until it has ended, its ``ended`` run (a task already
        done too: the wait comes after its callbacks)."""
        task.cancel()
        await asyncio.wait({task})

    async def close(self) -> None:
        """Cancel every task and wait until all have ended (shutdown), those a cancelled
        one started as it ended included. A task still running a while after its cancel
        has lost it (a bug: `asyncio.wait_for` before Python 3.12 loses one that comes as
        its awaitable ends) and is cancelled again, named in a warning: a shutdown that
        waited on it would never end."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            _, running = await asyncio.wait(tasks, timeout=CANCEL_AGAIN_S)
            for task in running:
                self.log.warning(
                    "%s: still running after its cancel; cancelled again", task.get_name()
                )

    def names(self) -> list[str]:
        """The tasks running now, by name."""
        return sorted(task.get_name() for task in self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


class KeptReading(Generic[T]):
    """A reading that health and inventory ask for on every request (the host's /proc,
    the volume store, the GPU readiness look), kept ``ttl_s`` and then read again by one
    read in flight, which the callers arriving meanwhile share: a burst of requests sent
    one thread hop each. A reading only older than ``ttl_s`` is answered as it is while
    that read runs behind it, so no request of a burst waits on a thread; none yet, one
    of another ``generation`` (what it reads changed), or one ``keep`` refused (an engine
    that could not say) is waited for. Its read is a task of ``tasks``, named ``name``."""

    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        *,
        ttl_s: float,
        clock: Clock,
        tasks: BackgroundTasks,
        name: str,
        generation: Callable[[], int] = lambda: 0,
        keep: Callable[[T], bool] = lambda value: True,
    ) -> None:
        self.read, self.ttl_s, self.clock, self.tasks, self.name = read, ttl_s, clock, tasks, name
        self.generation, self.keep = generation, keep
        self._kept: tuple[float, int, T] | None = None  # (at, generation, reading)
        self._reading: asyncio.Task[T] | None = None  # the read in flight

    async def get(self) -> T:
        kept = self._kept
        if kept is not None and kept[1] == self.generation():
            if self.clock.monotonic() - kept[0] >= self.ttl_s and self._reading is None:
                self._reading = self.tasks.spawn(self._read(), name=self.name)
            return kept[2]
        if self._reading is None:
            self._reading = self.tasks.spawn(self._read(), name=self.name)
        return await asyncio.shield(self._reading)

    async def _read(self) -> T:
        try:
            at, generation = self.clock.monotonic(), self.generation()
            value = await self.read()
            self._kept = (at, generation, value) if self.keep(value) else None
            return value
        finally:
            self._reading = None


class TurnShared(Generic[T]):
    """What ``compute`` answered, shared by the callers that run after it in the same
    turn of the event loop (and those the turn woke before it), computed again after.
    Each of them was woken by a request read before that answer was made, so none
    asked after it: a burst of 200 health calls read in one turn builds the node's
    status once, not 200 times. A compute that waited (a thread, an engine) is not
    shared: what it read before its wait may be older than another caller's request.
    Its owner calls `forget` when a change is answered in the turn (a request pipelined
    after it may run there). Used on the event loop only."""

    def __init__(self, compute: Callable[[], Awaitable[T]]) -> None:
        self.compute = compute
        self._turn: object | None = None  # this turn's marker, until the next turn
        self._value: tuple[T] | None = None  # this turn's answer

    async def get(self) -> T:
        if self._value is not None:
            return self._value[0]
        turn = self._this_turn()
        value = await self.compute()
        if self._turn is turn and self._value is None:  # it did not wait
            self._value = (value,)
        return value

    def forget(self) -> None:
        """This turn's answer no longer holds (a change was answered meanwhile): the
        next caller computes again."""
        self._value = None

    def _this_turn(self) -> object:
        if self._turn is None:
            self._turn = object()
            # Scheduled now, it runs in the next turn after the callbacks scheduled
            # before it: the callers woken by requests read before this answer.
            asyncio.get_running_loop().call_soon(self._next_turn)
        return self._turn

    def _next_turn(self) -> None:
        self._turn = self._value = None
