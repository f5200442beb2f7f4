"""BlockingPool: the one bounded thread pool that runs an engine's blocking SDK calls.

The docker and podman SDKs are synchronous. Every call they make goes through one pool
per runtime, sized with the SDK's HTTP connection pool, so parallel calls neither block
the event loop nor queue on sockets.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry

T = TypeVar("T")


class BlockingPool:
    def __init__(self, threads: int, *, name: str, telemetry: Telemetry = NO_TELEMETRY) -> None:
        self.threads = threads
        self.telemetry = telemetry
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on a thread; its time (queueing included) goes to the telemetry
        under the function's own name, a bounded set, never a ref."""
        return await self.call_as(getattr(fn, "__name__", type(fn).__name__), fn, *args, **kwargs)

    async def call_as(self, name: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`call`, reported under ``name`` (a wrapper names the call it wraps). Positional
        only: an SDK call's own ``name=`` keyword passes through."""
        loop = asyncio.get_running_loop()
        started, failed = time.monotonic(), True
        try:
            result = await loop.run_in_executor(
                self._executor, functools.partial(fn, *args, **kwargs)
            )
            failed = False
            return result
        finally:
            self.telemetry.engine_call(name.lstrip("_"), time.monotonic() - started, failed=failed)

    def close(self) -> None:
        # Threads blocked in a call finish on their own; nothing new is started.
        self._executor.shutdown(wait=False, cancel_futures=True)
