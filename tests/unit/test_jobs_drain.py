"""Cordon and drain: a drain stops the jobs and observe pairs each with why. The job
service against the in-memory engine (tests/jobservice.py says how)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    launch_pulling,
    request,
    reserved,
)
from tests.support.waiting import settle
from tuneplane_node.errors import (
    Conflict,
)
from tuneplane_node.jobs import (
    Node,
    Started,
    StoppedView,
    StopPlan,
)
from tuneplane_node.jobs.drain import DRAIN_AGAIN_S

# --- cordon and drain -----------------------------------------------------------------------


async def test_a_drain_stops_the_jobs_and_observe_pairs_each_with_why(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", 1))
    await launch_pulling(node, fake, "r2", 1)

    assert (await node.jobs.drain("kernel", StopPlan(grace=0))).state == "draining"
    await asyncio.wait_for(drained(node, fake.clock), 5)

    assert fake.containers["tuneplane-r1"].status == "exited"
    assert "tuneplane-r2" not in fake.containers and node.pending.get("tuneplane-r2") is None
    assert await reserved(node) == frozenset()
    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, StoppedView) and view.stop_reason == "drain: kernel"
    assert view.state == await fake.inspect("tuneplane-r1")  # the runtime's state, unchanged
    with pytest.raises(Conflict):
        await node.jobs.launch(request("r3"))


async def test_removing_a_job_the_drain_stopped_forgets_why(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1"))
    await node.jobs.drain(None, StopPlan(grace=0))
    await asyncio.wait_for(drained(node, fake.clock), 5)
    assert list(node.jobs.node.stop_reasons.values()) == ["drain: no reason given"]

    await node.jobs.remove("tuneplane-r1")

    assert node.jobs.node.stop_reasons == {}
    assert (await node.jobs.uncordon()).state == "ready"
    assert isinstance(await node.jobs.launch(request("r1")), Started)


async def drained(node: Node, clock: FakeClock) -> None:
    """Until the drain is done, moving the clock past each pause between its passes."""
    while node.jobs.node.state != "drained":
        clock.advance(DRAIN_AGAIN_S)
        await settle()
