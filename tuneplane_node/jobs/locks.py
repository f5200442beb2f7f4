"""RefLocks: one control lock per container name, held by every verb that changes it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class RefLocks:
    """Per-ref locks that vanish when nobody holds or waits for them.

    A daemon that handled a million launches must not keep a million locks.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, ref: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(ref, (asyncio.Lock(), 0))
        self._locks[ref] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[ref]
            if users == 1:
                del self._locks[ref]
            else:
                self._locks[ref] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)
