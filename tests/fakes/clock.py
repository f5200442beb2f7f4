"""A clock moved by hand: both clocks of the node, and sleeps that end only when the test
moves it on."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from tuneplane_node.clock import Clock

EPOCH = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)


class FakeClock(Clock):
    """Both clocks, moved only by `advance`; a `sleep` (and so `wait_for`) ends when
    `advance` has moved the clock past it, never by itself."""

    def __init__(self, start: float = 1000.0) -> None:
        self.start = start
        self.t = start
        self.sleepers: list[tuple[float, asyncio.Future[None]]] = []  # (until, waker)
        self.slept = asyncio.Event()  # set by every new sleeper

    def monotonic(self) -> float:
        return self.t

    def now(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t - self.start)

    def advance(self, seconds: float) -> None:
        """Move the clock on, waking every sleep that ends by then (on the next turns)."""
        self.t += seconds
        for until, waker in self.sleepers:
            if until <= self.t and not waker.done():
                waker.set_result(None)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        sleeper = (self.t + seconds, asyncio.get_running_loop().create_future())
        self.sleepers.append(sleeper)
        self.slept.set()
        try:
            await sleeper[1]
        finally:
            self.sleepers.remove(sleeper)

    async def sleeping(self, within: float, timeout: float = 5) -> None:
        """Until something sleeps on the clock that `advance` by ``within`` wakes (a
        timer is armed); a failure after ``timeout`` real seconds, never a hang."""

        async def armed() -> None:
            while not any(t <= self.t + within and not w.done() for t, w in self.sleepers):
                self.slept.clear()
                await self.slept.wait()

        await asyncio.wait_for(armed(), timeout)
