"""The change log behind watch: every job as observe shows it, each change numbered.

The state cache (each container it writes, each sync and each loss of the engine) and,
through the `ChangeFeed`, the pending table (each launch's phase), the launcher (its
pull's progress, at most once a second), the stopper and the reactors say which refs
may have changed. The log reads those refs again with the service's own
observe, so a job reads here exactly as observe shows it, and numbers each one that now
reads differently. A ref's latest change is all it keeps of it (a burst of changes is
one), and at most ``TUNEPLANE_WATCH_HISTORY`` refs' changes: a cursor older than the
oldest kept is answered with every job (``full``), as is one of another process.

A blocking query whose cursor is current waits on one future that the next change
resolves: no thread, no poll, nothing run while nothing changes. A runtime that tells
no changes (the process runtime, development only) is read whole once a second while a
query waits. A read the engine cannot answer leaves the refs to read again and answers
every query with the engine's error (503), never with the jobs "removed".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Protocol

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError, TooManyWatches
from tuneplane_node.jobs.words.views import JobChanges, JobView, PendingView
from tuneplane_node.runtime.base import ChangeListener, ContainerState
from tuneplane_node.settings import ObserveSettings
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import Cursor

log = logging.getLogger(__name__)
POLL_S = 1.0
"""How often a runtime that tells no changes is read whole while a query waits."""
PROGRESS_S = 1.0
"""A pending launch's pull progress is a change at most this often."""
CONSOLE_SHARE = 4
"""A quarter of the waiting slots (at least one) is kept for consoles (``full``
tokens): observers' queries may never take every slot and hold the console's watch at
429."""

Read = Callable[[Iterable[str]], Awaitable[Mapping[str, JobView]]]
"""The service's observe: each ref's view, missing when it is neither pending nor a
container of the node."""
Refs = Callable[[], Iterable[str]]


class Ear(Protocol):
    """Who hears the feed: the change log."""

    def changed(self, ref: str) -> None: ...
    def progressed(self, ref: str) -> None: ...
    def node_changed(self) -> None: ...


class ChangeFeed:
    """What the node's sources tell the change log: a ref that may read differently, a
    pending launch's progress, the node itself. Made first and handed to each source
    (the pending table, the launcher, the stopper, the fault and notice reactors) in its
    constructor; the log, made last with the service's observe, listens in its own. So
    every part is made complete, though the log reads through the service that the
    sources feed. Used on the loop only."""

    def __init__(self) -> None:
        self._ears: list[Ear] = []

    def listen(self, ear: Ear) -> None:
        self._ears.append(ear)

    def changed(self, ref: str) -> None:
        for ear in self._ears:
            ear.changed(ref)

    def progressed(self, ref: str) -> None:
        for ear in self._ears:
            ear.progressed(ref)

    def node_changed(self) -> None:
        for ear in self._ears:
            ear.node_changed()


class WatchedRuntime(Protocol):
    """What the watch asks of the engine: its changes, else its list."""

    async def ps(self) -> list[ContainerState]: ...
    def on_change(self, listener: ChangeListener) -> bool: ...


class ChangeLog:
    """Every job's view, numbered by its latest change. Used on the loop only."""

    def __init__(
        self,
        runtime: WatchedRuntime,
        settings: ObserveSettings,
        *,
        clock: Clock,
        feed: ChangeFeed,
        read: Read,
        pending: Refs,
    ):
        """``read``: the service's observe; ``pending``: the refs of the pending
        launches; ``feed``: what the node's sources tell (the engine tells its own)."""
        self.runtime = runtime
        self.epoch = secrets.token_hex(8)  # this process: a restart's cursors are new
        self.history = settings.watch_history
        self.limit = settings.watch_max
        self.observers_limit = self.limit - kept_for_consoles(self.limit)
        self.clock = clock
        self.position = 0
        self.waiting = 0  # queries waiting now
        self.observing = 0  # of them, observers' (not a console's)
        self._entries: OrderedDict[str, int] = OrderedDict()  # ref -> its latest change
        self._views: dict[str, JobView] = {}  # every job, as last read
        self._floor = 0  # the newest change dropped from the history
        self._node_at = 0  # the node's latest change (its state, its notices)
        self._dirty: set[str] = set()
        self._everything = True  # read every job: at first, and after a sync of the cache
        self._unavailable: NodeError | None = None  # why the last read failed
        self._read = read
        self._pending = pending
        self._next: asyncio.Future[None] | None = None
        self._settling: asyncio.Task[None] | None = None
        self._progressed: dict[str, float] = {}  # ref -> when its progress was last a change
        self._later: set[str] = set()  # refs whose progress is held for the next second
        self._tasks = BackgroundTasks(log)
        self._closing = False
        self.fed = runtime.on_change(self._engine_changed)
        feed.listen(self)

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.epoch, self.position)

    # --- what the sources tell --------------------------------------------------------

    def changed(self, ref: str) -> None:
        """The ref may read differently now."""
        self._dirty.add(ref)
        self._kick()

    def node_changed(self) -> None:
        """The node itself changed (a notice came or went, its state with it): a change
        every waiting query hears, as a node event."""
        self.position += 1
        self._node_at = self.position
        self._wake()

    def progressed(self, ref: str) -> None:
        """A pending launch's pull moved: a change now, or a second after the last one."""
        now, last = self.clock.monotonic(), self._progressed.get(ref)
        if last is None or now - last >= PROGRESS_S:
            self._progressed[ref] = now
            self.changed(ref)
        elif ref not in self._later and not self._closing:
            self._later.add(ref)
            delay = last + PROGRESS_S - now
            self._tasks.spawn(self._progress_later(ref, delay), name=f"watch progress {ref}")

    async def _progress_later(self, ref: str, delay: float) -> None:
        await self.clock.sleep(delay)
        self._later.discard(ref)
        self._progressed[ref] = self.clock.monotonic()
        self.changed(ref)

    def _engine_changed(self, name: str | None) -> None:
        """The runtime's word: one container (by name), or every one (None: a sync, or the
        engine lost)."""
        if name is None:
            self._everything = True
            self._kick()
        else:
            self.changed(name)

    # --- reading what changed ---------------------------------------------------------

    def _kick(self) -> None:
        if self._settling is None and not self._closing:
            self._settling = self._tasks.spawn(self._settle(), name="watch: reading changes")

    async def _settle(self) -> None:
        try:
            while (self._dirty or self._everything) and not self._closing:
                if not await self._read_changes():
                    return  # the engine is down: the next change, or query, reads again
        finally:
            self._settling = None

    async def _read_changes(self) -> bool:
        refs, everything = self._dirty, self._everything
        self._dirty, self._everything = set(), False
        try:
            if everything:
                listed = [state.name for state in await self.runtime.ps()]
                refs = {*refs, *listed, *self._pending(), *self._views}
            views = await self._read(refs)
        except NodeError as exc:  # the engine is down: nothing is known, nothing gone
            self._dirty |= refs
            self._everything |= everything
            self._unavailable = exc  # the queries raise it: this task ends quietly
            self._wake()
            return False
        self._unavailable = None
        self._apply(views)
        return True

    def _apply(self, views: Mapping[str, JobView]) -> None:
        before = self.position
        for ref, view in views.items():
            old = self._views.get(ref)
            if not view.exists:
                if old is not None:
                    del self._views[ref]
                    self._progressed.pop(ref, None)
                    self._record(ref)
                continue
            if old is None or not _same(old, view):  # else the old object stays: a
                self._views[ref] = view  # position names one set of views (and answers)
                self._record(ref)
        if self.position != before:
            self._wake()

    def _record(self, ref: str) -> None:
        self.position += 1
        self._entries[ref] = self.position
        self._entries.move_to_end(ref)
        if len(self._entries) > self.history:
            _, self._floor = self._entries.popitem(last=False)

    async def _settled(self) -> None:
        """Until every change told so far is read; the engine's error if it could not be."""
        if self._dirty or self._everything:
            self._kick()
        if self._settling is not None:
            await asyncio.shield(self._settling)
        if self._unavailable is not None:
            raise self._unavailable

    # --- the queries ------------------------------------------------------------------

    async def list(self) -> JobChanges:
        """Every job now, as the log holds it once every change told so far is read: the
        same views the watch answers with (a pending launch's age as of its latest
        change). A runtime that tells no changes is read whole first."""
        self._everything |= not self.fed
        await self._settled()
        return self._listing()

    async def query(self, cursor: Cursor, *, wait: float, console: bool = True) -> JobChanges:
        """What changed after ``cursor``, at once when anything did; otherwise after the
        next change, or ``wait`` seconds and up to a sixteenth more (Nomad's spread, so
        a fleet's consoles do not all ask again at once). Every job (``full``) for a
        cursor of another process or older than the history. Not ``console`` (an
        observer's): it may wait only in the slots not kept for consoles."""
        await self._settled()
        if not self._stale(cursor) and self.position == cursor.position and wait > 0:
            with self._slot(console=console):
                await self._wait(cursor, wait + random.uniform(0, wait / 16))
        if self._stale(cursor):
            return self._listing()
        return self._since(cursor)

    def _stale(self, cursor: Cursor) -> bool:
        return (
            cursor.epoch != self.epoch
            or cursor.position < self._floor
            or cursor.position > self.position
        )

    @contextlib.contextmanager
    def _slot(self, *, console: bool) -> Iterator[None]:
        """One waiting slot, held until the query ends, answered or cancelled (its
        client gone): a 429 when every slot its kind may take is taken."""
        if self.waiting >= self.limit:
            raise TooManyWatches(limit=self.limit)
        if not console and self.observing >= self.observers_limit:
            raise TooManyWatches(limit=self.observers_limit, observers=True)
        self.waiting += 1
        self.observing += not console
        try:
            yield
        finally:
            self.waiting -= 1
            self.observing -= not console

    async def _wait(self, cursor: Cursor, timeout: float) -> None:
        deadline = self.clock.monotonic() + timeout
        while self.position == cursor.position and not self._closing:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return
            step = remaining if self.fed else min(remaining, POLL_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await self.clock.wait_for(asyncio.shield(self._future()), step)
            if not self.fed:
                self._everything = True
            await self._settled()  # the engine lost meanwhile: its 503

    def _future(self) -> asyncio.Future[None]:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        return self._next

    def _wake(self) -> None:
        """Every waiting query looks again: a change, a failed read, or the stop."""
        if self._next is not None and not self._next.done():
            self._next.set_result(None)
        self._next = None

    def _listing(self) -> JobChanges:
        return JobChanges(self.cursor, dict(self._views))

    def _since(self, cursor: Cursor) -> JobChanges:
        changed: list[str] = []
        for ref, position in reversed(self._entries.items()):
            if position <= cursor.position:
                break
            changed.append(ref)
        changed.reverse()
        jobs = {ref: self._views[ref] for ref in changed if ref in self._views}
        removed = tuple(ref for ref in changed if ref not in self._views)
        node = self._node_at > cursor.position
        return JobChanges(self.cursor, jobs, removed, full=False, node=node)

    # --- shutdown ---------------------------------------------------------------------

    def stop(self) -> None:
        """Answer every waiting query now (a daemon stopping): none waits for its time."""
        self._closing = True
        self._wake()

    async def close(self) -> None:
        self.stop()
        await self._tasks.close()


def kept_for_consoles(limit: int) -> int:
    """The waiting slots of ``limit`` only a console's query may take."""
    return max(1, limit // CONSOLE_SHARE)


def _same(old: JobView, new: JobView) -> bool:
    """Whether observe shows the two alike: a pending launch's age moves by itself."""
    if isinstance(old, PendingView) and isinstance(new, PendingView):
        return replace(old, elapsed_s=0.0) == replace(new, elapsed_s=0.0)
    return old == new
