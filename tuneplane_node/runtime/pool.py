"""BlockingPool: the one bounded thread pool that runs an engine's blocking SDK calls.

The docker and podman SDKs are synchronous. Every call they make goes through one pool
per runtime, sized with the SDK's HTTP connection pool, so parallel calls neither block
the event loop nor queue on sockets.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class BlockingPool:
    def __init__(self, threads: int, *, name: str) -> None:
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        # Threads blocked in a call finish on their own; nothing new is started.
        self._executor.shutdown(wait=False, cancel_futures=True)
