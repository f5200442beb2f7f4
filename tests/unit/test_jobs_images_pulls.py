"""The pull coordinator: one download per image, shared, and stopped when nobody waits."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.runtime import FakeRuntime
from tests.support.waiting import settle
from tuneplane_node.errors import EngineRefused
from tuneplane_node.jobs.images.pulls import PullCoordinator
from tuneplane_node.runtime.base import PullLimits, PullProgress

IMAGE = "registry.test/big:1"


@pytest.fixture
async def pulls(fake: FakeRuntime) -> PullCoordinator:
    return PullCoordinator(fake, PullLimits(3600, 300))


async def test_two_waiters_share_one_pull_and_its_progress(
    fake: FakeRuntime, pulls: PullCoordinator
) -> None:
    first, second = pulls.join(IMAGE), pulls.join(IMAGE)
    waiting = asyncio.gather(pulls.wait(first), pulls.wait(second))
    await fake.pulling.wait()

    assert first is second and first.waiters == 2
    fake.pull_of(IMAGE).report(5, 10, 0, 1)
    assert first.progress == PullProgress(5, 10, 0, 1)
    fake.pull_of(IMAGE).finish()
    await waiting

    assert fake.calls["pull"] == 1
    assert pulls.pulls == {}  # done: the next launch of the image starts afresh


async def test_every_waiter_gets_the_pulls_error(fake: FakeRuntime, pulls: PullCoordinator) -> None:
    shared = pulls.join(IMAGE)
    pulls.join(IMAGE)
    results = asyncio.gather(pulls.wait(shared), pulls.wait(shared), return_exceptions=True)
    await fake.pulling.wait()

    fake.pull_of(IMAGE).fail("manifest unknown")

    assert [type(error) for error in await results] == [EngineRefused, EngineRefused]


async def test_the_download_stops_when_the_last_waiter_leaves(
    fake: FakeRuntime, pulls: PullCoordinator
) -> None:
    shared = pulls.join(IMAGE)
    pulls.join(IMAGE)
    first = asyncio.create_task(pulls.wait(shared))
    second = asyncio.create_task(pulls.wait(shared))
    await fake.pulling.wait()

    first.cancel()
    await settle()
    assert not fake.pull_of(IMAGE).cancelled  # someone still waits

    second.cancel()
    await settle()
    assert fake.pull_of(IMAGE).cancelled
    assert pulls.pulls == {}


async def test_close_cancels_every_pull(fake: FakeRuntime, pulls: PullCoordinator) -> None:
    pulls.join(IMAGE)
    pulls.join("registry.test/other:1")
    await settle()

    await pulls.close()

    assert [pull.cancelled for pull in fake.pulls] == [True, True]
    assert pulls.pulls == {}
