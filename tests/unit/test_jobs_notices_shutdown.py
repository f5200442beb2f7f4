"""The OS's shutdown (issue 54): with a fake systemd-logind on a private bus, the node
takes the delay lock at start, drains on ``PrepareForShutdown`` within logind's delay and
lets the lock go, and takes it again when the shutdown is cancelled; `check` warns of a
delay shorter than the node's stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import request
from tests.logindfake import FakeLogind, PrivateBus, has_dbus
from tests.support.engines import under_ci
from tests.support.waiting import settle
from tests.unit.test_jobs_drain import drained
from tuneplane_node.checks.notices import check_notices
from tuneplane_node.jobs import Node, StoppedView
from tuneplane_node.jobs.notices.shutdown import ShutdownWatcher

pytestmark = pytest.mark.slow  # a dbus-daemon and a thread of its own


async def until(done: Callable[[], bool], failure: str, clock: FakeClock | None = None) -> None:
    """Until ``done()``, moving ``clock`` on past the watcher's pauses: the bus's round
    trips take milliseconds, 10 s is the margin of a busy machine."""
    deadline = asyncio.get_running_loop().time() + 10
    while not done():
        assert asyncio.get_running_loop().time() < deadline, failure
        if clock is not None:
            clock.advance(0.05)
        await asyncio.sleep(0.01)
        await settle()


@pytest.fixture
def bus(tmp_path: Path) -> Iterator[PrivateBus]:
    if not has_dbus():  # engines.sh installs it: missing under CI is a broken build
        if under_ci():
            pytest.fail("dbus-daemon is missing (Debian package dbus-daemon)")
        pytest.skip("dbus-daemon is missing (apt-get install dbus-daemon)")
    made = PrivateBus(tmp_path)
    yield made
    made.close()


@pytest.fixture
def logind(bus: PrivateBus) -> Iterator[FakeLogind]:
    fake = FakeLogind(bus.address, delay_s=30)
    yield fake
    fake.close()


async def test_a_shutdown_is_drained_within_loginds_delay_and_the_lock_let_go(
    node: Node, fake: FakeRuntime, bus: PrivateBus, logind: FakeLogind
) -> None:
    await node.jobs.launch(request("r1", 1))
    watcher = ShutdownWatcher(node.notices, clock=fake.clock, bus=bus.address)
    running = asyncio.create_task(watcher.run())
    try:
        assert await asyncio.to_thread(logind.inhibited.wait, 10), "no delay lock at start"
        assert watcher.delay_s == 30
        logind.prepare(True)
        await until(lambda: node.jobs.node.state in ("draining", "drained"), "no drain")
        await asyncio.wait_for(drained(node, fake.clock), 10)
        await until(logind.released, "the lock was kept", fake.clock)
        view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
        assert isinstance(view, StoppedView) and view.stop_reason == "shutdown: logind"
        [standing] = node.notices.current()
        assert standing.notice.kind == "shutdown" and standing.notice.ends_jobs

        logind.inhibited.clear()
        logind.prepare(False)  # cancelled: the node takes launches, and the lock again
        assert await asyncio.to_thread(logind.inhibited.wait, 10)
        await until(lambda: node.jobs.node.state == "ready", "still cordoned")
        assert node.notices.current() == ()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


def test_check_warns_of_a_delay_shorter_than_the_nodes_stop(
    bus: PrivateBus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", bus.address)
    settings = fake_settings(tmp_path, cloud_notices="off", local_stop_timeout=30)
    for delay, level in ((5, "warn"), (120, "ok")):
        fake = FakeLogind(bus.address, delay_s=delay)
        try:
            [cloud, shutdown] = check_notices(settings)
        finally:
            fake.close()
        assert shutdown[0] == level, shutdown
        assert (f"InhibitDelayMaxSec is {delay} s" in shutdown[1]) == (level == "warn")
    assert cloud == ("ok", "cloud notices: none watched (TUNEPLANE_CLOUD_NOTICES=off)")
