"""The node's clock (its waits on a clock moved by hand) and its time format: what the
console reads in every state."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.fakes.clock import FakeClock
from tests.support.waiting import settle
from tuneplane_node.clock import Clock, _within_310, normalise, parse_rfc3339, rfc3339, within


def test_engine_times_parse_with_nanoseconds_and_zero() -> None:
    moment = parse_rfc3339("2026-11-29T21:00:00.123456789Z")
    assert moment is not None and moment.microsecond == 123456
    assert parse_rfc3339("0001-01-01T00:00:00Z") is None  # Go's zero time: never happened
    assert parse_rfc3339("garbage") is None
    assert parse_rfc3339(None) is None and parse_rfc3339("") is None


def test_an_offset_is_kept_and_a_naive_time_is_utc() -> None:
    with_offset = parse_rfc3339("2026-11-29T21:00:00.5+01:00")
    assert with_offset == datetime(2026, 11, 29, 20, 0, 0, 500000, tzinfo=timezone.utc)
    assert parse_rfc3339("2026-11-29T21:00:00") == datetime(2026, 11, 29, 21, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (
            datetime(2026, 11, 29, 21, 21, 54, 164779, tzinfo=timezone.utc),
            "2026-11-29T21:21:54.164779Z",
        ),
        (datetime(2026, 11, 29, 21, 21, 54, tzinfo=timezone.utc), "2026-11-29T21:21:54Z"),
        (
            datetime(2026, 11, 29, 22, 0, tzinfo=timezone(timedelta(hours=1))),
            "2026-11-29T21:00:00Z",
        ),
    ],
)
def test_the_node_writes_utc_with_a_z(moment: datetime, text: str) -> None:
    assert rfc3339(moment) == text
    assert parse_rfc3339(text) == moment


def test_normalise_rewrites_an_engine_time_in_the_nodes_format() -> None:
    assert normalise("2026-11-29T21:21:54.164779123Z") == "2026-11-29T21:21:54.164779Z"
    assert normalise("0001-01-01T00:00:00Z") is None


async def test_wait_for_gives_the_result_or_times_out_on_its_own_clock() -> None:
    assert await Clock().wait_for(asyncio.sleep(0, result="done"), 5) == "done"
    with pytest.raises(asyncio.TimeoutError):
        await Clock().wait_for(asyncio.Event().wait(), 0.01)

    clock = FakeClock()
    changed = asyncio.Event()
    waiting = asyncio.ensure_future(clock.wait_for(changed.wait(), 10))
    await clock.sleeping(10)
    clock.advance(9)
    await settle()
    assert not waiting.done()  # real time passes; the clock's does not
    clock.advance(1)
    with pytest.raises(asyncio.TimeoutError):
        await waiting
    assert clock.sleepers == []  # the timer is gone with the wait

    again = asyncio.ensure_future(clock.wait_for(changed.wait(), 10))
    await clock.sleeping(10)
    changed.set()
    assert await again is True and clock.sleepers == []


async def test_a_wait_for_cancelled_leaves_neither_its_work_nor_its_timer() -> None:
    clock = FakeClock()
    waiting = asyncio.ensure_future(clock.wait_for(asyncio.Event().wait(), 10))
    await clock.sleeping(10)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert clock.sleepers == []


# --- within: deadlines on real I/O --------------------------------------------------------

WITHINS = [pytest.param(within, id="within"), pytest.param(_within_310, id="python-3.10")]


@pytest.mark.parametrize("deadline", WITHINS)
async def test_within_gives_the_result_or_times_out(deadline: Any) -> None:
    assert await deadline(asyncio.sleep(0, result="done"), 5) == "done"
    with pytest.raises(asyncio.TimeoutError):
        await deadline(asyncio.Event().wait(), 0.01)


@pytest.mark.parametrize("deadline", WITHINS)
async def test_a_cancel_that_comes_as_the_awaitable_ends_is_not_lost(deadline: Any) -> None:
    """`asyncio.wait_for` before 3.12 returns the result here instead (CPython
    gh-86296): the one cancel of a shutdown lost, the loop that called it ran on, and a
    daemon did not exit on SIGTERM."""
    answer = asyncio.get_running_loop().create_future()
    calls = 0

    async def loop() -> None:  # a background loop's engine calls, as the sampler's
        nonlocal calls
        while calls < 3:  # bounded: a lost cancel ends the task here, not the suite
            calls += 1
            await deadline(answer, 10)

    task = asyncio.ensure_future(loop())
    await settle()
    answer.set_result("inspected")
    task.cancel()  # in the same turn of the loop as the answer
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1


@pytest.mark.parametrize("deadline", WITHINS)
async def test_a_cancel_before_the_deadline_is_a_cancel_not_a_timeout(deadline: Any) -> None:
    task = asyncio.ensure_future(deadline(asyncio.Event().wait(), 10))
    await settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
