"""The volume wing's words: an entry of the store and its partial file's name, the
store's filesystem and its view, a fill in flight, an eviction run, a prefetch's answer,
and the volumes the console lists."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.fetch.fetching import Session
from tuneplane_node.jobs.words.rate import PullRate
from tuneplane_node.wire.values import RegistryAuth


def partial_key(digest: str, access: str) -> str:
    """The name of ``digest``'s partial file when ``access`` writes it."""
    return f"{digest}~{access[:16]}"


class Hasher(Protocol):
    """hashlib's sha256 object, as far as a fill uses it."""

    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class Entry:
    digest: str  # hex
    size: int
    path: Path
    used_at: float = 0.0  # its last use (a job's bind, a prefetch): its mtime, epoch seconds


@dataclass(frozen=True)
class Space:
    """The store's filesystem: its size and free bytes; ``used_bytes``: the store's own
    (entries and partial files)."""

    total_bytes: int
    free_bytes: int
    used_bytes: int = 0

    def room(self, high_percent: int) -> int:
        """Bytes that may still be written before the filesystem reaches ``high``
        percent of use (negative: above it already)."""
        return self.total_bytes * high_percent // 100 - (self.total_bytes - self.free_bytes)

    def above(self, percent: int) -> bool:
        return self.total_bytes > 0 and self.room(percent) < 0


@dataclass(frozen=True)
class StoreView:
    """The store's place, its filesystem now (None: unreadable) and its thresholds."""

    path: Path
    space: Space | None
    high_percent: int
    low_percent: int


@dataclass(frozen=True)
class Evicted:
    entry: Entry
    last_used_at: datetime


@dataclass(frozen=True)
class VolumeGcRun:
    removed: list[Evicted]
    store: StoreView

    @property
    def freed_bytes(self) -> int:
        return sum(each.entry.size for each in self.removed)


@dataclass
class VolumeFill:
    """One fill of one digest from one access; ``bytes_done`` counts its partial file's
    bytes (those a resume found included), ``bytes_total`` the file's size (None while
    unknown)."""

    digest: str
    source: str
    access: str = ""  # `Accesses.of` the source and credentials: whose fill this is
    clock: Clock = SYSTEM_CLOCK
    auth: RegistryAuth | None = None  # an OCI source's credentials (its repr hides them)
    task: asyncio.Task[Entry] | None = None
    waiters: int = 0
    bytes_done: int = 0
    bytes_total: int | None = None
    fetched: int = 0  # bytes this fill downloaded (not those it resumed from)
    granted: int = 0  # its bytes up to here have room below the high threshold
    hasher: Hasher | None = None  # the partial file's bytes so far
    http: Session | None = None  # its own connections, while it runs
    listeners: list[Callable[[], None]] = field(default_factory=list)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)  # past its room check
    retrying: asyncio.Event = field(default_factory=asyncio.Event)  # a try failed, retried
    started_at: datetime = field(init=False)
    rate: PullRate = field(init=False)

    def __post_init__(self) -> None:
        self.started_at = self.clock.now()
        self.rate = PullRate(self.clock.monotonic())

    @property
    def key(self) -> str:
        """Its partial file's name (`store.partial_key`)."""
        return partial_key(self.digest, self.access)

    def update(self, bytes_done: int) -> None:
        self.bytes_done = bytes_done
        self.rate.add(self.clock.monotonic(), bytes_done)
        for listener in self.listeners:
            listener()


@dataclass(frozen=True)
class VolumePrefetched:
    """A prefetch's answer: the entry (``present``) or its fill (``filling``)."""

    digest: str
    phase: str
    pin_expires_at: datetime
    entry: Entry | None = None
    fill: VolumeFill | None = None


@dataclass(frozen=True)
class FailedFill:
    digest: str
    source: str
    error: str
    at: datetime


@dataclass(frozen=True)
class EntryView:
    entry: Entry
    last_used_at: datetime | None
    in_use_by: tuple[str, ...] | None  # None: the engine did not say
    pin_expires_at: datetime | None


@dataclass(frozen=True)
class VolumesView:
    entries: list[EntryView]
    fills: list[VolumeFill]
    failed: list[FailedFill]
    store: StoreView
