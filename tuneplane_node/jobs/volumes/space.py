"""The volume store's space: its filesystem's figures, and which entries eviction takes.

Eviction runs between two thresholds of the filesystem's use, as the image GC does: at
or above ``high`` percent it removes the least recently used entries until the use is at
``low`` or below; a fill that needs room below ``high`` has entries removed until it fits,
or is refused (`VolumeStoreFull`) before anything is removed when even every evictable
entry gone would not make the room. An entry a job uses (its container's
``tuneplane.volumes`` label), one a launch or a fill holds, or one a prefetch pinned is
never evictable. Pure: the keeper reads the figures and removes the entries.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from tuneplane_node.clock import Clock
from tuneplane_node.jobs.words.volumes import Entry, Space
from tuneplane_node.tasks import BackgroundTasks, KeptReading

T = TypeVar("T")
READING_TTL_S = 1.0  # as health's reading of the host (jobs.health)


def filesystem(root: Path) -> Space:
    """The figures of the filesystem that holds ``root`` (or would: its nearest existing
    directory). Blocking."""
    where = root
    while not where.exists() and where != where.parent:
        where = where.parent
    found = os.statvfs(where)
    return Space(found.f_blocks * found.f_frsize, found.f_bavail * found.f_frsize)


@dataclass(frozen=True)
class Candidate:
    entry: Entry
    last_used: datetime


def evictable(
    entries: Iterable[Entry], *, last_used: dict[str, datetime], kept: frozenset[str]
) -> list[Candidate]:
    """The entries no rule keeps, least recently used first."""
    found = [
        Candidate(entry, last_used[entry.digest])
        for entry in entries
        if entry.digest not in kept and entry.digest in last_used
    ]
    return sorted(found, key=lambda c: (c.last_used, c.entry.digest))


def to_evict(
    candidates: Sequence[Candidate], space: Space, *, high: int, low: int, need: int = 0
) -> list[Candidate]:
    """The candidates to remove, in order: none while the use is below ``high`` and
    ``need`` bytes fit below it; else the least recently used until the use is at ``low``
    (when it was at or above ``high``) and ``need`` fits below ``high``."""
    room_high, room_low = space.room(high), space.room(low)
    to_low = space.above(high)
    if not to_low and need <= room_high:
        return []
    chosen: list[Candidate] = []
    for candidate in candidates:
        if need <= room_high and (not to_low or room_low >= 0):
            break
        chosen.append(candidate)
        room_high += candidate.entry.size
        room_low += candidate.entry.size
    return chosen


def store_reading(
    read: Callable[[], Awaitable[T]],
    generation: Callable[[], int],
    clock: Clock,
    tasks: BackgroundTasks,
) -> KeptReading[T]:
    """The store's reading for health and inventory: kept a second, or until an entry is
    made or taken out (the store's ``generation``)."""
    return KeptReading(
        read,
        ttl_s=READING_TTL_S,
        clock=clock,
        tasks=tasks,
        name="volume store reading",
        generation=generation,
    )
