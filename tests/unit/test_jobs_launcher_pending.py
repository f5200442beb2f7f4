"""A launch whose image is missing: the pending launch answers `pulling` at once, holds
its cards while the pull runs, and leaves a failed record when the pull or the start
fails. The job service against the in-memory engine (tests/jobservice.py says how)."""

from __future__ import annotations

import asyncio

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    launch_pulling,
    request,
    reserved,
)
from tests.support.waiting import settle
from tuneplane_node.errors import (
    NameTaken,
    NoCapacity,
)
from tuneplane_node.jobs import (
    AlreadyPending,
    Node,
    PendingView,
    Pulling,
    Started,
)
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.jobs.reservation import Reservation
from tuneplane_node.jobs.words import FAILED_RECORD_TTL_S
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID

# --- launch with the image missing: the pending launch -----------------------------------


async def test_a_missing_image_answers_pulling_at_once_and_reserves_the_cards(
    node: Node, fake: FakeRuntime
) -> None:
    result = await node.jobs.launch(request("r1", 2, image=MISSING))

    assert result == Pulling(image=MISSING, requested_gpus=2)
    assert await reserved(node) == {0, 1}
    with pytest.raises(NoCapacity, match="2 reserved for pending launches"):
        await node.jobs.launch(request("r2", 3))
    assert isinstance(await node.jobs.launch(request("r3", 2)), Started)  # the others are free


async def test_observe_follows_the_pull_then_reads_the_container(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    await launch_pulling(node, fake, "r1", 2)
    pull = fake.pull_of(MISSING)
    clock.advance(3)
    pull.report(500, 2000)

    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, PendingView)
    assert (view.phase, view.image, view.requested_gpus) == ("pulling", MISSING, 2)
    assert (view.progress.bytes_done, view.progress.bytes_total) == (500, 2000)
    assert view.elapsed_s == 3.0
    assert view.labels[LABEL_RUN_ID] == "r1"

    pull.finish()
    await settle()
    state = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(state, ContainerState) and state.status == "running"
    assert state.gpus == (0, 1)  # the cards it reserved
    assert await reserved(node) == frozenset()
    assert node.pending.get("tuneplane-r1") is None


async def test_a_pulled_launch_takes_other_cards_when_its_own_turned_bad(
    node: Node, fake: FakeRuntime, probe: FakeProbe
) -> None:
    await launch_pulling(node, fake, "r1", 1)
    probe.set(0, unhealthy="lost: not answering")  # its reserved card died meanwhile

    fake.pull_of(MISSING).finish()
    await settle()

    assert fake.containers["tuneplane-r1"].labels[LABEL_GPUS] == "1"


async def test_a_pending_launch_is_idempotent(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1", 1, image=MISSING))

    again = await node.jobs.launch(request("r1", 1, image=MISSING))

    assert again == AlreadyPending(phase="pulling", image=MISSING)
    assert await reserved(node) == {0}
    await fake.pulling.wait()
    assert fake.calls["pull"] == 1


async def test_a_pending_launch_of_another_run_under_the_name_is_refused(
    node: Node,
) -> None:
    await node.jobs.launch(request("run-a", image=MISSING, name="tuneplane-x"))
    with pytest.raises(NameTaken, match="run-a"):
        await node.jobs.launch(request("run-b", image=MISSING, name="tuneplane-x"))


async def test_a_failed_pull_leaves_a_failed_record_and_frees_the_cards(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1", 2)

    fake.pull_of(MISSING).fail("manifest unknown")
    await settle()

    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, PendingView) and view.failed
    assert view.error == f"fake refused to pull {MISSING}: manifest unknown"
    assert await reserved(node) == frozenset()
    status = await node.jobs.status()
    assert status.pending["tuneplane-r1"].phase == "failed"
    assert "tuneplane-r1" not in fake.containers


async def test_a_failed_record_stays_half_an_hour_then_expires(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    await launch_pulling(node, fake, "r1")
    fake.pull_of(MISSING).fail("manifest unknown")
    await settle()

    clock.advance(FAILED_RECORD_TTL_S - 1)
    assert isinstance((await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"], PendingView)
    clock.advance(2)

    assert (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"].exists is False
    assert "tuneplane-r1" not in (await node.jobs.status()).pending


async def test_a_retry_replaces_a_failed_record_with_a_new_pull(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1", 1)
    fake.pull_of(MISSING).fail("registry down")
    await settle()

    assert await node.jobs.launch(request("r1", 1, image=MISSING)) == Pulling(MISSING, 1)
    await settle()
    assert fake.calls["pull"] == 2
    fake.pull_of(MISSING).finish()
    await settle()
    assert fake.containers["tuneplane-r1"].status == "running"


async def test_a_start_that_fails_after_the_pull_leaves_a_failed_record(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1", 1)
    fake.refuse_start = "no such device"

    fake.pull_of(MISSING).finish()
    await settle()

    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, PendingView) and view.failed
    assert "no such device" in (view.error or "")
    await assert_nothing_left_but_the_record(node, fake)


async def assert_nothing_left_but_the_record(node: Node, fake: FakeRuntime) -> None:
    assert not fake.containers
    assert await reserved(node) == frozenset()


async def test_a_pulled_launch_failing_on_a_bug_says_so_and_frees_its_cards(
    node: Node, fake: FakeRuntime
) -> None:
    await launch_pulling(node, fake, "r1", 2)
    record = node.pending.get("tuneplane-r1")
    assert record is not None and record.task is not None
    fake.faults["run"] = KeyError("spec")

    fake.pull_of(MISSING).finish()
    await asyncio.wait({record.task})

    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, PendingView) and view.error == "internal error: KeyError: 'spec'"
    await assert_nothing_left_but_the_record(node, fake)


async def test_a_reservation_lets_go_once_and_never_of_a_later_claim_of_its_ref(
    node: Node,
) -> None:
    """The allocator keeps claims by ref: a stale release must not free the next launch's."""
    first = Reservation(node.allocator, launch_request(request("r1", 2)))
    assert len(await first.claim()) == 2
    first.release()
    later = Reservation(node.allocator, launch_request(request("r1", 1)))
    cards = await later.claim()

    first.release()

    assert await reserved(node) == frozenset(cards)
    later.release()
    assert await reserved(node) == frozenset()


async def test_two_launches_of_one_image_share_one_pull(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1", 1, image=MISSING))
    await node.jobs.launch(request("r2", 1, image=MISSING))
    await settle()

    assert fake.calls["pull"] == 1
    assert await reserved(node) == {0, 1}
    fake.pull_of(MISSING).report(10, 10, 1, 1)
    views = await node.jobs.observe(["tuneplane-r1", "tuneplane-r2"])
    assert all(v.progress.bytes_done == 10 for v in views.values())  # type: ignore[union-attr]

    fake.pull_of(MISSING).finish()
    await settle()
    assert {fake.containers[n].status for n in ("tuneplane-r1", "tuneplane-r2")} == {"running"}
