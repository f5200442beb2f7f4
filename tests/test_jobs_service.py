"""The job service against the in-memory engine: every rule, no engine, no sleeps.

Time moves only when a test moves the fake clock; a pull ends only when the test ends
it; a container start is held open by a gate. So the four moments a stop can land in a
pending launch, the reservations, reap's rules and record expiry are exact.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes import FakeClock, FakeProbe, FakeRuntime, Gate
from tests.helpers import settle, storage_root
from tuneplane_node.errors import (
    Conflict,
    EngineConflict,
    EngineRefused,
    EngineUnavailable,
    InvalidField,
    NameTaken,
    NoCapacity,
    TooManyFollows,
)
from tuneplane_node.jobs import (
    AlreadyPending,
    AlreadyRunning,
    LaunchRequest,
    Node,
    PendingView,
    Pulling,
    Started,
    StoppedView,
    StopPlan,
    reapable,
)
from tuneplane_node.jobs.drain import DRAIN_AGAIN_S
from tuneplane_node.jobs.pending import FAILED_RECORD_TTL_S
from tuneplane_node.jobs.reservation import Reservation
from tuneplane_node.runtime.base import (
    LABEL_GPUS,
    LABEL_RUN_ID,
    ContainerState,
    LogStream,
    LogText,
    Mount,
)
from tuneplane_node.runtime.facts import REMOTE
from tuneplane_node.runtime.spec import ContainerSpec, container_name
from tuneplane_node.settings import NodeSettings

MISSING = "registry.test/missing:1"


def request(run_id: str, gpus: int = 0, *, image: str = IMAGE, name: str = "") -> LaunchRequest:
    spec = ContainerSpec(
        name=name or container_name(run_id),
        image=image,
        command=("/bin/train",),
        labels={LABEL_RUN_ID: run_id},
    )
    return LaunchRequest(run_id, gpus, spec)


async def launch_pulling(node: Node, fake: FakeRuntime, run_id: str, gpus: int = 0) -> None:
    """A launch of an image the engine lacks, once its pull is under way."""
    await node.jobs.launch(request(run_id, gpus, image=MISSING))
    await fake.pulling.wait()


async def reserved(node: Node) -> frozenset[int]:
    return (await node.allocator.occupancy()).reserved


async def available(node: Node) -> tuple[int, ...]:
    return (await node.allocator.occupancy()).available


async def assert_nothing_left(node: Node, fake: FakeRuntime, ref: str) -> None:
    assert ref not in fake.containers
    assert node.pending.get(ref) is None
    assert await reserved(node) == frozenset()
    assert await available(node) == (0, 1, 2, 3)
    assert len(node.jobs.locks) == 0


# --- launch with the image present -------------------------------------------------------


async def test_a_launch_runs_the_container_with_the_cards_the_node_chose(
    node: Node, fake: FakeRuntime
) -> None:
    result = await node.jobs.launch(request("r1", 2))

    assert isinstance(result, Started)
    assert result.gpus == (0, 1)
    container = fake.containers["tuneplane-r1"]
    assert result.container_id == container.id[:12]
    assert container.status == "running"
    assert container.labels[LABEL_GPUS] == "0,1"
    assert await available(node) == (2, 3)


async def test_a_launch_without_cards_gets_none(node: Node, fake: FakeRuntime) -> None:
    result = await node.jobs.launch(request("r0"))
    assert isinstance(result, Started) and result.gpus == ()
    assert fake.containers["tuneplane-r0"].labels[LABEL_GPUS] == ""


async def test_launching_a_running_run_again_is_idempotent(node: Node, fake: FakeRuntime) -> None:
    first = await node.jobs.launch(request("r1", 1))
    again = await node.jobs.launch(request("r1", 1))

    assert again == AlreadyRunning(gpus=first.gpus)  # type: ignore[union-attr]
    assert fake.calls["run"] == 1
    assert await available(node) == (1, 2, 3)


async def test_a_relaunch_after_exit_replaces_the_exited_container(
    node: Node, fake: FakeRuntime
) -> None:
    first = await node.jobs.launch(request("r1"))
    fake.exit("tuneplane-r1", 0)

    second = await node.jobs.launch(request("r1"))

    assert isinstance(first, Started) and isinstance(second, Started)
    assert second.container_id != first.container_id
    assert fake.containers["tuneplane-r1"].status == "running"


async def test_a_never_started_container_of_the_run_is_wreckage_and_is_replaced(
    node: Node, fake: FakeRuntime
) -> None:
    """A daemon killed between create and start leaves this; never answer 'running'."""
    wreck = fake.create_outside(request("r1").spec, start=False)

    result = await node.jobs.launch(request("r1", 1))

    assert isinstance(result, Started)
    assert fake.containers["tuneplane-r1"].id != wreck.id
    assert fake.containers["tuneplane-r1"].status == "running"


async def test_a_name_held_by_another_run_is_refused_and_left_alone(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("run-a", name="tuneplane-shared"))

    with pytest.raises(NameTaken, match="held by run run-a"):
        await node.jobs.launch(request("run-b", name="tuneplane-shared"))
    fake.exit("tuneplane-shared", 0)
    with pytest.raises(NameTaken):
        await node.jobs.launch(request("run-b", name="tuneplane-shared"))

    container = fake.containers["tuneplane-shared"]
    assert container.labels[LABEL_RUN_ID] == "run-a"
    assert (container.status, container.exit_code) == ("exited", 0)  # its exit code stays


async def test_a_foreign_container_under_the_name_is_refused_by_the_engine(
    node: Node, fake: FakeRuntime
) -> None:
    foreign = fake.create_outside(ContainerSpec(name="tuneplane-r1", image=IMAGE))

    with pytest.raises(EngineConflict, match="already in use"):
        await node.jobs.launch(request("r1", 2))

    assert fake.containers["tuneplane-r1"] is foreign and foreign.status == "running"
    assert await available(node) == (0, 1, 2, 3)


async def test_not_enough_cards_says_where_every_card_is(node: Node) -> None:
    await node.jobs.launch(request("r1", 3))

    with pytest.raises(NoCapacity) as refused:
        await node.jobs.launch(request("r2", 2))

    assert refused.value.message == "not enough GPUs: asked for 2; 1 free [3], 3 held by jobs"


async def test_unhealthy_and_externally_used_cards_are_never_given(
    node: Node, probe: FakeProbe
) -> None:
    probe.set(0, unhealthy="uncorrectable ECC errors: 2")
    probe.set(1, pids=(999_999_999,))  # no such process: in no container of the node

    result = await node.jobs.launch(request("r1", 2))
    assert isinstance(result, Started) and result.gpus == (2, 3)

    with pytest.raises(NoCapacity) as refused:
        await node.jobs.launch(request("r2", 1))
    assert "1 used by processes outside the node [1]" in refused.value.message
    assert "1 unhealthy [0]" in refused.value.message


async def test_the_allocation_lock_is_not_held_across_the_engine_call(
    node: Node, fake: FakeRuntime
) -> None:
    fake.create_gate = gate = Gate()
    slow = asyncio.create_task(node.jobs.launch(request("slow", 1)))
    await gate.entered.wait()  # its create is in the engine now
    fake.create_gate = None

    fast = await node.jobs.launch(request("fast", 1))  # does not wait for the slow create

    assert isinstance(fast, Started) and fast.gpus == (1,)
    gate.open()
    slow_result = await slow
    assert isinstance(slow_result, Started) and slow_result.gpus == (0,)


async def test_racing_launches_never_share_a_card(node: Node, fake: FakeRuntime) -> None:
    results = await asyncio.gather(
        *(node.jobs.launch(request(f"r{i}", 1)) for i in range(6)), return_exceptions=True
    )

    started = [r for r in results if isinstance(r, Started)]
    assert sorted(card for r in started for card in r.gpus) == [0, 1, 2, 3]
    assert sum(isinstance(r, NoCapacity) for r in results) == 2


async def test_a_refused_start_frees_its_cards_and_leaves_no_container(
    node: Node, fake: FakeRuntime
) -> None:
    fake.refuse_start = "invalid mount config"

    with pytest.raises(EngineRefused, match="invalid mount config"):
        await node.jobs.launch(request("r1", 2))

    await assert_nothing_left(node, fake, "tuneplane-r1")


async def test_an_engine_that_is_down_fails_a_launch_as_unavailable(
    node: Node, fake: FakeRuntime
) -> None:
    fake.up = False
    with pytest.raises(EngineUnavailable):
        await node.jobs.launch(request("r1", 1))
    fake.up = True
    assert await reserved(node) == frozenset()


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
    first = Reservation(node.allocator, request("r1", 2))
    assert len(await first.claim()) == 2
    first.release()
    later = Reservation(node.allocator, request("r1", 1))
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
    fake.create_outside(request("wreck").spec, start=False)
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
    fake.create_outside(request("wreck", 2).spec, start=False)
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
        fake.create_outside(request("r1").spec)  # relaunched: running now

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


# --- observe and logs ---------------------------------------------------------------------


async def test_observe_answers_each_ref_once_and_knows_nothing_of_foreign_ones(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.create_outside(ContainerSpec(name="tuneplane-foreign", image=IMAGE))

    views = await node.jobs.observe(
        ["tuneplane-r1", "tuneplane-nobody", "tuneplane-r1", "tuneplane-foreign"]
    )

    assert list(views) == ["tuneplane-r1", "tuneplane-nobody", "tuneplane-foreign"]
    assert views["tuneplane-r1"].exists and views["tuneplane-r1"].status == "running"  # type: ignore[union-attr]
    assert views["tuneplane-nobody"] == ContainerState.missing("tuneplane-nobody")
    assert views["tuneplane-foreign"] == ContainerState.missing("tuneplane-foreign")


async def test_observe_with_the_engine_down_is_unknown_not_gone(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.up = False
    with pytest.raises(EngineUnavailable):
        await node.jobs.observe(["tuneplane-r1"])


async def test_logs_of_a_job_are_its_last_lines(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].output = ["one", "two", "three"]

    text = (await node.jobs.logs("tuneplane-r1", 2)).text

    assert [line.split(" ", 1)[1] for line in text.splitlines()] == ["two", "three"]


async def test_logs_of_a_pending_missing_or_foreign_ref_are_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", image=MISSING))
    fake.create_outside(ContainerSpec(name="tuneplane-foreign", image=IMAGE)).output = ["secret"]

    assert await node.jobs.logs("tuneplane-r1", 10) == LogText(
        f"no logs yet: tuneplane-r1 is pulling ({MISSING})"
    )
    assert (await node.jobs.logs("tuneplane-x", 10)).text == (
        "no logs: container tuneplane-x does not exist"
    )
    assert "secret" not in (await node.jobs.logs("tuneplane-foreign", 10)).text


async def test_logs_the_engine_refuses_to_read_are_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.refuse_logs = "configured logging driver does not support reading"
    text = await node.jobs.logs("tuneplane-r1", 10)
    assert text == LogText(
        "no logs for tuneplane-r1: configured logging driver does not support reading"
    )


async def read_all(stream: LogStream) -> str:
    return b"".join([chunk async for chunk in stream]).decode()


async def test_a_followed_log_gives_the_tail_then_new_lines_until_the_exit(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    job = fake.containers["tuneplane-r1"]
    job.output = ["one", "two", "three"]
    async with node.jobs.follow("tuneplane-r1", 2) as stream:
        first = (await anext(stream)).decode()
        job.output.append("four")
        second = (await anext(stream)).decode()
        fake.exit("tuneplane-r1", 0)
        rest = await read_all(stream)

    assert [line.split(" ", 1)[1] for line in first.splitlines()] == ["two", "three"]
    assert second.endswith(" four\n") and rest == ""
    assert fake.following == 0


@pytest.mark.slow
async def test_an_engine_ending_the_follow_of_a_running_job_is_an_error_not_an_end(
    node: Node, fake: FakeRuntime
) -> None:
    """A clean end means the job stopped: an engine that ends the stream while the job
    runs (podman 4 was seen to) is reported, and the daemon cuts the connection."""
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].output = ["one"]
    fake.end_follows_early = True
    node.reader.end_grace_s = 0.2
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        assert (await anext(stream)).endswith(b" one\n")
        with pytest.raises(EngineUnavailable) as broke:
            await anext(stream)
    assert "ended the log stream of tuneplane-r1 while the job still runs" in str(broke.value)

    fake.exit("tuneplane-r1", 0)  # the same end once the job has stopped: a clean end
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        assert await read_all(stream) != "" and fake.following == 0


async def test_a_followed_log_of_a_pending_missing_or_foreign_ref_is_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", image=MISSING))
    fake.create_outside(ContainerSpec(name="tuneplane-foreign", image=IMAGE)).output = ["secret"]
    said = {}
    for ref in ("tuneplane-r1", "tuneplane-x", "tuneplane-foreign"):
        async with node.jobs.follow(ref, 10) as stream:
            said[ref] = await read_all(stream)

    assert said["tuneplane-r1"] == f"no logs yet: tuneplane-r1 is pulling ({MISSING})"
    assert said["tuneplane-x"] == "no logs: container tuneplane-x does not exist"
    assert said["tuneplane-foreign"] == "no logs: container tuneplane-foreign does not exist"
    assert ("follow_logs", "tuneplane-foreign") not in fake.refs


async def test_follows_past_the_limit_are_refused_and_a_slot_frees_on_leaving(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    assert node.reader.follow_limit == 4  # a quarter of the 16 engine threads
    async with contextlib.AsyncExitStack() as held:
        for _ in range(4):
            await held.enter_async_context(node.jobs.follow("tuneplane-r1", 10))
        with pytest.raises(TooManyFollows) as refused:
            await held.enter_async_context(node.jobs.follow("tuneplane-r1", 10))
        assert refused.value.status == 429 and "already following 4 logs" in refused.value.message
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        assert stream is not None  # every slot came back


async def test_a_followed_log_the_engine_refuses_is_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.refuse_logs = "configured logging driver does not support reading"
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        text = await read_all(stream)
    assert text == "no logs for tuneplane-r1: configured logging driver does not support reading"


# --- the token buys job verbs, never the host -------------------------------------------


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """The node's storage root (the fixtures' settings): its only mount root."""
    return storage_root(tmp_path)


def with_mounts(run_id: str, *mounts: Mount, **env: str) -> LaunchRequest:
    base = request(run_id)
    return replace(base, spec=replace(base.spec, mounts=mounts, env=env))


async def test_a_real_path_under_the_storage_root_reaches_the_engine_as_given(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    (storage / "data").mkdir()

    await node.jobs.launch(with_mounts("r1", Mount(str(storage / "data") + "/", "/data", True)))

    mounts = fake.containers["tuneplane-r1"].spec.mounts
    assert mounts == (Mount(str(storage / "data"), "/data", True),)


async def test_a_link_planted_by_one_tenant_into_anothers_files_is_refused(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    """Tenant A's job leaves tenantA/ckpt -> tenantB/ckpt; A's next launch mounting
    tenantA/ckpt would read and write B's checkpoint: both lie under the storage root."""
    (storage / "tenantB" / "ckpt").mkdir(parents=True)
    (storage / "tenantA").mkdir()
    (storage / "tenantA" / "ckpt").symlink_to(storage / "tenantB" / "ckpt")
    (storage / "linked").symlink_to(storage / "tenantA")  # a link higher up, too

    for host, link in (
        (storage / "tenantA" / "ckpt", "ckpt"),
        (storage / "linked" / "x", "linked"),
    ):
        with pytest.raises(InvalidField) as refused:
            await node.jobs.launch(with_mounts("r1", Mount(str(host), "/ckpt")))
        assert refused.value.field == "container.mounts[0]"
        assert refused.value.reason == f"{host} is not its own real path: {link} is a symlink"

    assert not fake.containers and fake.calls["run"] == 0
    assert list((storage / "tenantB" / "ckpt").iterdir()) == []


async def test_a_mount_swapped_for_a_link_during_the_pull_fails_the_launch(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    (storage / "mine").mkdir()
    (storage / "theirs").mkdir()
    launch = with_mounts("r1", Mount(str(storage / "mine"), "/ckpt"))
    await node.jobs.launch(replace(launch, spec=replace(launch.spec, image=MISSING)))
    await fake.pulling.wait()

    (storage / "mine").rmdir()
    (storage / "mine").symlink_to(storage / "theirs")
    record = node.pending.get("tuneplane-r1")
    assert record is not None and record.task is not None
    fake.pull_of(MISSING).finish()
    await asyncio.wait({record.task})  # the mounts are checked in a thread, not on the loop

    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, PendingView) and view.failed
    assert view.error is not None and "mine is a symlink" in view.error
    assert not fake.containers
    assert await reserved(node) == frozenset()


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("/", "/ is /, which a job may never mount; no setting allows it"),
        ("/etc", "/etc is /etc, which a job may never mount; no setting allows it"),
        ("/etc/ssl", "/etc/ssl is in /etc, which a job may never mount; no setting allows it"),
        ("/var/lib", "/var/lib holds /var/lib/docker, which a job may never mount; no setting"),
        ("/opt/datasets", "/opt/datasets is not under an allowed mount root; "
         "TUNEPLANE_ALLOWED_MOUNT_ROOTS would allow it"),
    ],
)  # fmt: skip
async def test_a_mount_outside_the_mount_roots_is_refused_and_starts_nothing(
    node: Node, fake: FakeRuntime, storage: Path, host: str, why: str
) -> None:
    """The refusal offers the setting only where the setting could allow the path: a
    mount root may never be or hold a system directory (finding 16 of issue 25)."""
    fine = Mount(str(storage), "/data")
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_mounts("r1", fine, Mount(host, "/host")))

    assert refused.value.field == "container.mounts[1]"
    assert refused.value.reason.startswith(why)
    assert not fake.containers and fake.calls["run"] == 0
    assert await reserved(node) == frozenset()


async def test_a_link_out_of_the_storage_root_is_refused(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    (storage / "escape").symlink_to("/etc")  # a job with a writable mount left this

    with pytest.raises(InvalidField, match=r"^container\.mounts\[0\]: .*escape is not its own"):
        await node.jobs.launch(with_mounts("r1", Mount(str(storage / "escape"), "/x")))

    assert not fake.containers


async def test_every_bad_mount_is_named_in_one_refusal(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    fine = Mount(str(storage), "/data")
    missing, outside = Mount(str(storage / "nope"), "/x"), Mount("/var/lib", "/y")
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_mounts("r1", missing, fine, outside))
    assert refused.value.message.startswith("container.mounts[0]: ")
    assert [error.field for error in refused.value.errors] == [
        "container.mounts[0]",
        "container.mounts[2]",
    ]
    assert not fake.containers


async def test_a_mount_that_does_not_exist_is_a_422_not_an_engine_refusal(
    node: Node, storage: Path
) -> None:
    with pytest.raises(InvalidField, match=r"^container\.mounts\[0\]: .* does not exist"):
        await node.jobs.launch(with_mounts("r1", Mount(str(storage / "nope"), "/x")))


async def test_the_node_alone_says_which_cards_a_container_sees(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(with_mounts("r1", NVIDIA_VISIBLE_DEVICES="all", EPOCHS="3"))
    assert fake.containers["tuneplane-r1"].spec.env == {"EPOCHS": "3"}


async def test_the_verbs_act_on_the_id_the_node_holds(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1"))
    container_id = fake.containers["tuneplane-r1"].id

    await node.jobs.logs("tuneplane-r1", 10)
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=1))
    await node.jobs.remove("tuneplane-r1")

    assert fake.refs == [
        ("logs", container_id),
        ("SIGTERM", container_id),
        ("remove", container_id),
    ]


async def test_an_id_given_as_a_ref_reaches_nothing(node: Node, fake: FakeRuntime) -> None:
    """Refs are names: a foreign container's id, or even our own, names no container."""
    foreign = fake.create_outside(ContainerSpec(name="someones", image=IMAGE))
    await node.jobs.launch(request("r1"))
    ours = fake.containers["tuneplane-r1"]

    for ref in (foreign.id, foreign.id[:12], ours.id):
        await node.jobs.stop(ref, StopPlan(grace=0))
        await node.jobs.remove(ref)
        assert "does not exist" in (await node.jobs.logs(ref, 10)).text
        assert (await node.jobs.observe([ref]))[ref].exists is False

    assert foreign.status == ours.status == "running"
    assert fake.refs == []


# --- wreckage of a daemon killed between create and start ---------------------------------


async def test_the_sweep_removes_never_started_containers_past_the_age(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    fake.create_outside(request("old", 2).spec, start=False)
    clock.advance(60)
    fake.create_outside(request("young").spec, start=False)
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
    fake.create_outside(request("wreck", 2).spec, start=False)
    clock.advance(61)  # older than the periodic sweep's grace: a younger one is let be
    node = await fake_node()
    assert "tuneplane-wreck" not in fake.containers
    assert (await node.health())["gpus_free"] == 4


# --- the node's status and inventory ------------------------------------------------------


async def test_status_reports_engine_cards_pending_and_disk(
    node: Node, fake: FakeRuntime, tmp_path: object
) -> None:
    await node.jobs.launch(request("r1", 1))
    await node.jobs.launch(request("r2", 1, image=MISSING))

    status = await node.jobs.status()

    assert status.ok and status.error is None
    assert (status.engine.engine, status.engine.version) == ("fake", "1.0-fake")
    assert status.occupancy is not None
    assert dict(status.occupancy.by_job) == {0: "r1"}
    assert status.occupancy.reserved == {1}
    assert list(status.pending) == ["tuneplane-r2"]
    assert status.disk is not None and status.disk.space.total > 0
    assert status.cache is None  # the fake reads on every call


async def test_status_with_the_engine_down_knows_nothing_of_the_cards(
    node: Node, fake: FakeRuntime
) -> None:
    fake.up = False
    status = await node.jobs.status()
    assert not status.ok
    assert status.occupancy is None
    assert status.error == "engine unreachable: fake: down"


async def test_status_when_the_cards_cannot_be_read_says_why(node: Node, fake: FakeRuntime) -> None:
    fake.ps_error = EngineUnavailable(engine="fake", reason="list timed out")
    status = await node.jobs.status()
    assert not status.ok and status.occupancy is None
    assert status.error == "engine unreachable: fake: list timed out"


async def test_inventory_puts_machine_cards_and_engine_together(node: Node) -> None:
    facts = await node.jobs.inventory()

    assert facts.runtime == "fake://1.0-fake"
    assert facts.accelerator_count == 4
    assert facts.gpus is not None and facts.gpus.common_name() == "NVIDIA H100"
    assert facts.machine.storage_root_visible is True


async def test_close_cancels_every_pending_launch_and_pull(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1", 1, image=MISSING))
    await node.jobs.launch(request("r2", 1, image="registry.test/other:2"))
    await settle()

    await node.close()

    assert all(pull.cancelled for pull in fake.pulls)
    assert node.pulls.pulls == {}


async def test_a_launch_request_keeps_its_spec_apart_from_the_cards(node: Node) -> None:
    original = request("r1", 1)
    await node.jobs.launch(original)
    assert original.spec.gpus == ()  # the chosen cards went into a copy
    assert replace(original.spec, gpus=(0,)).gpus == (0,)


async def test_every_refusal_of_the_node_is_a_conflict() -> None:
    for error in (
        NameTaken(ref="a", run_id="b"),
        NoCapacity(requested=1, free=[], held={}),
        EngineConflict(engine="docker", action="run a", reason="in use"),
    ):
        assert isinstance(error, Conflict) and error.status == 409


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


async def test_an_engine_on_another_machine_takes_no_host_mount(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    """A path of this machine means nothing there, and a staged one cannot be handed
    over: a 422 for each mount, never the path as given (issue 33)."""
    fake.mount_mode = REMOTE
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_mounts("r1", Mount(str(storage), "/a"), Mount("/x", "/b")))
    assert [error.field for error in refused.value.errors] == [
        "container.mounts[0]",
        "container.mounts[1]",
    ]
    assert "engine is on another machine" in refused.value.reason
    assert not fake.containers
    await node.jobs.launch(with_mounts("r2"))  # without mounts it runs
    assert "tuneplane-r2" in fake.containers
