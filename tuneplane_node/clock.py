"""The node's one clock, and its one time format.

Every reading the node acts on or reports is the `Clock`'s, so a test moves time by
hand (`tests.fakes.clock.FakeClock`) instead of sleeping:

- ``monotonic``: intervals the node decides by (pull deadlines, record expiry, reading
  TTLs, XID quarantine, the relist period, connection ages, a warning's once a second,
  ages in health);
- ``now``: dates for the console and the files (reap ages, RFC 3339 times, a sample's
  moment, the node state's stamp);
- ``sleep`` and ``wait_for``: every wait the node times (the cache's heartbeat and
  relist, a stop's grace, the drain's pauses, the sampler's interval, the wreckage
  sweep, the token file's watch, a guessing peer's delayed 401s, the process runtime's
  polls, the first sync's bound).

Not the clock's, on purpose:

- durations measured for metrics and logs (a request's, an engine call's, a pull's,
  `LoopSlices`' cost per request, the loop's lag): they decide nothing, and on a fake
  clock would only read zero; the loop's lag must read the loop's own time;
- deadlines on real I/O (aiohttp's timeouts, a stalled socket write, the engine's answer
  to a follow, the turns of a pull's watch): no fake clock moves a socket or a thread;
  they use `within`, never `asyncio.wait_for` (below);
- waits on threads (the cache's event thread's backoff, NVML's XID thread) wait on a
  ``threading.Event``: a thread cannot await the loop;
- the process runtime's log stamper, a process of the job's own.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Awaitable
from datetime import datetime, timezone
from typing import TypeVar

T = TypeVar("T")


class Clock:
    """The system's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        """The current moment, in UTC."""
        return datetime.now(timezone.utc)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, awaitable: Awaitable[T], timeout: float) -> T:
        """``awaitable``'s result, or `asyncio.TimeoutError` once ``timeout`` seconds of
        this clock have passed first (it is then cancelled). Built on `sleep` alone, so a
        clock that moves by hand times it too."""
        work = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self.sleep(timeout))
        try:
            await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for step in (work, timer):
                step.cancel()
            await asyncio.wait({work, timer})
        if work.cancelled() and timer.done() and not timer.cancelled():
            raise asyncio.TimeoutError
        return work.result()


SYSTEM_CLOCK = Clock()


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable``'s result, or `asyncio.TimeoutError` after ``seconds`` of real time.

    Not `asyncio.wait_for`: before Python 3.12 it loses a cancellation that arrives as
    its awaitable ends (CPython gh-86296), and a background loop that loses the one
    cancel of a shutdown runs on while the shutdown waits for it, forever. Seen as a
    daemon that did not exit on SIGTERM. Here the awaitable runs in the caller's task
    (3.11's `asyncio.timeout`), so a cancel reaches it as any other await's does."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await _within_310(awaitable, seconds)


async def _within_310(awaitable: Awaitable[T], seconds: float) -> T:
    """`within` where `asyncio.timeout` is missing: the caller's task is cancelled at
    the deadline, and that cancel alone becomes the timeout."""
    task = asyncio.current_task()
    assert task is not None, "within() runs in a task"
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if expired:
            raise asyncio.TimeoutError from None
        raise
    finally:
        timer.cancel()


_FRACTION = re.compile(r"\.(\d+)")


def rfc3339(moment: datetime) -> str:
    """``2026-11-29T21:21:54.164779Z``: UTC, ``Z``, microseconds when there are any."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def parse_rfc3339(value: str | None) -> datetime | None:
    """An engine timestamp (nanoseconds allowed); None for none, junk, or Go's zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    # Python takes at most microseconds, and 3.10 only 3 or 6 digits (docker drops
    # trailing zeros: ".5"): make the fraction exactly 6 digits.
    text = _FRACTION.sub(_six_digits, value.strip().replace("Z", "+00:00"))
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def normalise(value: str | None) -> str | None:
    """An engine timestamp in the node's format, or None."""
    moment = parse_rfc3339(value)
    return rfc3339(moment) if moment is not None else None


def _six_digits(match: re.Match[str]) -> str:
    return "." + match.group(1)[:6].ljust(6, "0")
