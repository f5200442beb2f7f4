"""FillLanes: how many fills download at once, and room kept for the small ones.

`limit` slots in all; a fill of over `LARGE_BYTES` (or of a size nobody said) may take
at most ``limit - 1`` of them, so while two or more are allowed a small fill never waits
behind big ones (the hub downloads that starve a tokenizer behind 140 GB of weights).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

LARGE_BYTES = 2**30


class FillLanes:
    def __init__(self, limit: int) -> None:
        self._all = asyncio.Semaphore(limit)
        self._large = asyncio.Semaphore(max(1, limit - 1))

    @contextlib.asynccontextmanager
    async def slot(self, size: int | None) -> AsyncIterator[None]:
        """Held while a fill of ``size`` bytes downloads."""
        large = size is None or size > LARGE_BYTES
        async with contextlib.AsyncExitStack() as held:
            if large:
                await held.enter_async_context(self._large)
            await held.enter_async_context(self._all)
            yield
