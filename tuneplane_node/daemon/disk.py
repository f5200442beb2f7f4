"""The storage root's usage, as health reports it."""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import Any


class DiskGauge:
    """The storage root's usage, read at most once per ``ttl`` seconds.

    statvfs runs on a worker thread (a hung filer must not stall the loop), and a console
    polling health many times a second does not need it fresher than that.
    """

    def __init__(self, path: Path, *, ttl: float = 1.0) -> None:
        self.path = path
        self.ttl = ttl
        self._value: dict[str, Any] | None = None
        self._read_at = -math.inf

    async def read(self) -> dict[str, Any] | None:
        if time.monotonic() - self._read_at > self.ttl:
            self._value = await asyncio.to_thread(disk, self.path)
            self._read_at = time.monotonic()
        return self._value


def disk(path: Path) -> dict[str, Any] | None:
    """Usage of the storage root's filesystem; null when the root is not there."""
    try:
        space = os.statvfs(path)
    except OSError:
        return None
    total = space.f_blocks * space.f_frsize
    free = space.f_bavail * space.f_frsize
    used_pct = round(100.0 * (total - space.f_bfree * space.f_frsize) / total, 1) if total else None
    return {"path": str(path.resolve()), "used_pct": used_pct, "free_gib": round(free / 2**30, 2)}
