"""Reap and the sweep: exited and never-started containers past their age are removed,
foreign, pending and relaunched ones never; the wreckage of a daemon killed between
create and start is swept before the node serves. The job service against the in-memory
engine (tests/jobservice.py says how)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.engine import Gate
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    available,
    launch_pulling,
    request,
)
from tests.support.waiting import settle
from tuneplane_node.jobs import (
    Node,
    Started,
    reapable,
)
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import LABEL_RUN_ID

# --- reap ---------------------------------------------------------------------------------


async def test_reap_takes_exited_containers_past_the_age_and_nothing_else(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    await node.jobs.launch(request("old"))
    await node.jobs.launch(request("young"))
    await node.jobs.launch(request("running"))
    fake.exit("tuneplane-old", 0)
    clock.advance(100)
    fake.exit("tuneplane-young", 1)
    clock.advance(10)

    assert await node.jobs.reap(60) == 1

    assert set(fake.containers) == {"tuneplane-young", "tuneplane-running"}


async def test_reap_takes_never_started_containers_past_the_age(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    fake.create_outside(ContainerSpec.of(request("wreck", 2).container), start=False)
    clock.advance(30)
    assert await node.jobs.reap(60) == 0
    clock.advance(31)
    assert await node.jobs.reap(60) == 1
    assert not fake.containers


async def test_reap_never_touches_foreign_or_pending_containers(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    foreign = fake.create_outside(ContainerSpec(name="tuneplane-mine", image=IMAGE))
    fake.exit("tuneplane-mine", 0)
    await node.jobs.launch(request("pending", image=MISSING))
    clock.advance(10_000)

    assert await node.jobs.reap(0) == 0

    assert fake.containers["tuneplane-mine"] is foreign
    assert node.pending.get("tuneplane-pending") is not None


async def test_reap_without_an_age_uses_the_configured_ttl(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    await node.jobs.launch(request("r1"))
    fake.exit("tuneplane-r1", 0)
    clock.advance(node.settings.local_container_ttl_s - 5)
    assert await node.jobs.reap(None) == 0
    clock.advance(10)
    assert await node.jobs.reap(None) == 1


async def test_reap_skips_a_container_relaunched_while_it_waited(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    await node.jobs.launch(request("r1"))
    fake.exit("tuneplane-r1", 0)
    clock.advance(100)
    async with node.jobs.locks.hold("tuneplane-r1"):  # a launch holds the ref meanwhile
        reaping = asyncio.create_task(node.jobs.reap(60))
        await settle()
        fake.containers.pop("tuneplane-r1")
        fake.create_outside(ContainerSpec.of(request("r1").container))  # relaunched: running now

    assert await reaping == 0
    assert fake.containers["tuneplane-r1"].status == "running"


NOW = FakeClock().now()


def at(seconds_ago: float) -> str:
    from datetime import timedelta

    from tuneplane_node.clock import rfc3339

    return rfc3339(NOW - timedelta(seconds=seconds_ago))


@pytest.mark.parametrize(
    ("state", "reaped"),
    [
        (dict(status="exited", finished_at=at(61), created_at=at(500)), True),
        (dict(status="exited", finished_at=at(59), created_at=at(500)), False),
        (dict(status="dead", finished_at=at(61)), True),
        (dict(status="exited", created_at=at(61)), True),  # no finish time: its creation
        (dict(status="exited"), False),  # no time at all: never guessed
        (dict(status="created", created_at=at(61)), True),
        (dict(status="created", created_at=at(61), started_at=at(60)), False),
        (dict(status="running", created_at=at(1000), started_at=at(1000)), False),
        (dict(status="paused", created_at=at(1000)), False),
        (dict(status="restarting", created_at=at(1000)), False),
    ],
)
def test_reapable(state: dict[str, str], reaped: bool) -> None:
    container = ContainerState(name="x", exists=True, labels={LABEL_RUN_ID: "r"}, **state)  # type: ignore[arg-type]
    assert reapable(container, 60, NOW) is reaped


# --- wreckage of a daemon killed between create and start ---------------------------------


async def test_the_sweep_removes_never_started_containers_past_the_age(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    fake.create_outside(ContainerSpec.of(request("old", 2).container), start=False)
    clock.advance(60)
    fake.create_outside(ContainerSpec.of(request("young").container), start=False)
    await node.jobs.launch(request("running"))
    fake.create_outside(ContainerSpec(name="someones", image=IMAGE), start=False)

    assert await node.jobs.sweep_wreckage(older_than_s=30) == 1

    assert set(fake.containers) == {"tuneplane-young", "tuneplane-running", "someones"}
    assert await node.jobs.sweep_wreckage(older_than_s=0) == 1  # at start-up: any age
    assert "tuneplane-young" not in fake.containers


async def test_the_sweep_asks_the_engine_before_it_removes_a_container(
    node: Node, fake: FakeRuntime, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state cache can lag the engine (the inspect after a job's create lands after
    its start's): a job that ran must not be taken for wreckage on the cache's word."""
    await node.jobs.launch(request("ran"))
    ran = fake.containers["tuneplane-ran"].state()
    lagging = replace(ran, status="created", started_at=None)

    async def cached(*names: str) -> ContainerState:
        return lagging

    async def listed() -> list[ContainerState]:
        return [lagging]

    monkeypatch.setattr(fake, "inspect", cached)
    monkeypatch.setattr(fake, "ps", listed)
    clock.advance(60)

    assert await node.jobs.sweep_wreckage(older_than_s=30) == 0
    assert fake.containers["tuneplane-ran"].status == "running"


async def test_the_sweep_never_takes_a_container_a_launch_is_making(
    node: Node, fake: FakeRuntime
) -> None:
    fake.create_gate = gate = Gate()
    launching = asyncio.create_task(node.jobs.launch(request("r1", 1)))
    await gate.entered.wait()  # created, not started: it looks like wreckage
    sweeping = asyncio.create_task(node.jobs.sweep_wreckage(older_than_s=0))
    await settle()
    gate.open()

    assert isinstance(await launching, Started)
    assert await sweeping == 0
    assert fake.containers["tuneplane-r1"].status == "running"


async def test_the_sweep_never_takes_a_pulled_launch_being_started(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1")
    fake.create_gate = gate = Gate()
    fake.pull_of(MISSING).finish()
    await gate.entered.wait()

    assert await node.jobs.sweep_wreckage(older_than_s=0) == 0
    gate.open()
    await settle()
    assert fake.containers["tuneplane-r1"].status == "running"


async def test_the_wreckage_of_a_start_the_engine_broke_is_swept_despite_its_failed_record(
    node: Node, fake: FakeRuntime, clock: FakeClock, settings: NodeSettings
) -> None:
    """The engine goes away between the create and the start of a pulled launch: the
    node cannot remove what it created, and the failed record stays for the console.
    The periodic sweep removes the container all the same once it is old enough."""
    await launch_pulling(node, fake, "r1", 2)
    fake.create_gate = gate = Gate()
    fake.pull_of(MISSING).finish()
    await gate.entered.wait()
    fake.up = False
    gate.open()
    await settle()
    record = node.pending.get("tuneplane-r1")
    assert record is not None and record.phase == "failed"
    assert fake.containers["tuneplane-r1"].status == "created"  # it could not be removed

    fake.up = True
    clock.advance(settings.local_api_timeout + 1)
    assert await node.jobs.sweep_wreckage(older_than_s=settings.local_api_timeout) == 1

    assert "tuneplane-r1" not in fake.containers
    assert await available(node) == (0, 1, 2, 3)


async def test_a_node_starting_up_removes_wreckage_before_it_serves(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    fake.create_outside(ContainerSpec.of(request("wreck", 2).container), start=False)
    clock.advance(61)  # older than the periodic sweep's grace: a younger one is let be
    node = await fake_node()
    assert "tuneplane-wreck" not in fake.containers
    assert (await node.health())["gpus_free"] == 4
