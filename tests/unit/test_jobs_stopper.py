"""Stop and remove: SIGTERM, the grace period and SIGKILL, and a stop at each of the four
moments of a pending launch (before the pull runs, during it, while the container is
made, once it started). The job service against the in-memory engine (tests/jobservice.py
says how)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.engine import Gate
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    assert_nothing_left,
    available,
    launch_pulling,
    request,
)
from tests.support.waiting import settle
from tuneplane_node.jobs import (
    Node,
    StopPlan,
)
from tuneplane_node.runtime.spec import ContainerSpec

# --- a stop at every moment of a pending launch -------------------------------------------


async def test_a_stop_before_the_pull_task_first_runs(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1", 2, image=MISSING))
    record = node.pending.get("tuneplane-r1")
    assert record is not None and record.task is not None

    await node.jobs.stop(
        "tuneplane-r1", StopPlan(grace=1)
    )  # no await in between has let the task run

    assert record.task.cancelled()
    assert fake.calls["pull"] == 0
    await assert_nothing_left(node, fake, "tuneplane-r1")


async def test_a_stop_during_the_pull_stops_the_download(node: Node, fake: FakeRuntime) -> None:
    await launch_pulling(node, fake, "r1", 2)

    await node.jobs.stop("tuneplane-r1", StopPlan(grace=1))
    await settle()

    assert fake.pull_of(MISSING).cancelled
    assert node.pulls.pulls == {}
    await assert_nothing_left(node, fake, "tuneplane-r1")


async def test_a_stop_while_the_container_is_being_created_removes_it(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1", 2)
    fake.create_gate = gate = Gate()
    fake.pull_of(MISSING).finish()
    await gate.entered.wait()  # created, not yet started: the launch has not heard
    assert "tuneplane-r1" in fake.containers

    stopping = asyncio.create_task(node.jobs.stop("tuneplane-r1", StopPlan(grace=1)))
    await settle()
    gate.open()
    await stopping

    await assert_nothing_left(node, fake, "tuneplane-r1")


async def test_a_stop_after_the_pulled_job_started_stops_it(node: Node, fake: FakeRuntime) -> None:
    await launch_pulling(node, fake, "r1", 2)
    fake.pull_of(MISSING).finish()
    await settle()

    await node.jobs.stop("tuneplane-r1", StopPlan(grace=7))

    assert fake.containers["tuneplane-r1"].status == "exited"
    assert fake.signals == [("tuneplane-r1", "SIGTERM")]
    assert await available(node) == (0, 1, 2, 3)


async def test_stopping_one_of_two_launches_sharing_a_pull_keeps_the_pull(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", 1, image=MISSING))
    await launch_pulling(node, fake, "r2", 1)

    await node.jobs.stop("tuneplane-r1", StopPlan(grace=1))
    await settle()
    assert not fake.pull_of(MISSING).cancelled

    fake.pull_of(MISSING).finish()
    await settle()
    assert "tuneplane-r1" not in fake.containers
    assert fake.containers["tuneplane-r2"].status == "running"


async def test_remove_cancels_a_pending_launch_and_clears_a_failed_record(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1", 1)
    await node.jobs.remove("tuneplane-r1")
    await assert_nothing_left(node, fake, "tuneplane-r1")

    await node.jobs.launch(request("r2", image=MISSING))
    await settle()
    fake.pull_of(MISSING).fail("nope")
    await settle()
    await node.jobs.remove("tuneplane-r2")
    assert node.pending.get("tuneplane-r2") is None


# --- stop and remove ----------------------------------------------------------------------


async def test_a_stop_sends_sigterm_and_a_job_that_heeds_it_gets_no_sigkill(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=5))
    assert fake.signals == [("tuneplane-r1", "SIGTERM")]
    assert fake.containers["tuneplane-r1"].exit_code == 143


async def test_a_job_ignoring_sigterm_gets_sigkill_when_the_grace_period_ends(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", 2))
    fake.containers["tuneplane-r1"].ignores_sigterm = True

    started = asyncio.get_running_loop().time()
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=None))  # the configured grace: 0.05 s here

    assert asyncio.get_running_loop().time() - started >= 0.05
    assert fake.signals == [("tuneplane-r1", "SIGTERM"), ("tuneplane-r1", "SIGKILL")]
    assert fake.containers["tuneplane-r1"].exit_code == 137
    assert await available(node) == (0, 1, 2, 3)


async def test_a_stop_waiting_out_its_grace_holds_no_lock_and_a_remove_kills_at_once(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].ignores_sigterm = True
    stopping = asyncio.create_task(node.jobs.stop("tuneplane-r1", StopPlan(grace=3600)))
    await settle()
    assert len(node.jobs.locks) == 0  # nothing waits on the ref meanwhile

    await node.jobs.remove("tuneplane-r1")
    await asyncio.wait_for(stopping, 1)  # the stop sees its job gone, and is done

    assert "tuneplane-r1" not in fake.containers
    assert ("tuneplane-r1", "SIGKILL") not in fake.signals  # remove killed it, not the stop


@pytest.mark.slow
async def test_a_stop_never_kills_the_container_that_replaced_its_job(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].ignores_sigterm = True
    stopping = asyncio.create_task(node.jobs.stop("tuneplane-r1", StopPlan(grace=0.2)))
    await settle()
    await node.jobs.remove("tuneplane-r1")
    await node.jobs.launch(request("r1"))  # relaunched before the grace period ended
    await stopping

    assert fake.containers["tuneplane-r1"].status == "running"


async def test_stopping_a_created_or_exited_container_signals_nothing(
    node: Node, fake: FakeRuntime
) -> None:
    fake.create_outside(ContainerSpec.of(request("wreck").container), start=False)
    await node.jobs.launch(request("done"))
    fake.exit("tuneplane-done", 0)

    await node.jobs.stop("tuneplane-wreck", StopPlan(grace=1))
    await node.jobs.stop("tuneplane-done", StopPlan(grace=1))

    assert fake.signals == []


async def test_stop_and_remove_of_unknown_refs_succeed_and_do_nothing(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.stop("tuneplane-nobody", StopPlan(grace=1))
    await node.jobs.remove("tuneplane-nobody")
    assert fake.calls["stop"] == fake.calls["remove"] == 0


async def test_a_foreign_container_is_never_stopped_or_removed(
    node: Node, fake: FakeRuntime
) -> None:
    foreign = fake.create_outside(ContainerSpec(name="someones-db", image="postgres:16"))

    await node.jobs.stop("someones-db", StopPlan(grace=0))
    await node.jobs.remove("someones-db")

    assert fake.containers["someones-db"] is foreign and foreign.status == "running"
    assert fake.calls["stop"] == fake.calls["remove"] == 0


async def test_remove_deletes_a_running_container_and_frees_its_cards(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", 4))
    await node.jobs.remove("tuneplane-r1")
    await assert_nothing_left(node, fake, "tuneplane-r1")


async def test_control_locks_do_not_accumulate(node: Node) -> None:
    for i in range(5):
        await node.jobs.launch(request(f"r{i}"))
        await node.jobs.stop(f"tuneplane-r{i}", StopPlan(grace=0))
        await node.jobs.remove(f"tuneplane-r{i}")
    await node.jobs.reap(0)
    assert len(node.jobs.locks) == 0
