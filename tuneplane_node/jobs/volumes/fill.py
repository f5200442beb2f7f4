"""VolumeFill: one fill of one digest from one access, as the fills, the downloads, the
room and the volumes' list see it: its progress, its room, whose it is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.jobs.images.pullrate import PullRate
from tuneplane_node.jobs.volumes.store import Entry, Hasher, partial_key
from tuneplane_node.runtime.base import RegistryAuth
from tuneplane_node.runtime.fetching import Session


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
