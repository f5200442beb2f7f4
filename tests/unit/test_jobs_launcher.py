"""A launch whose image is there: the cards the node chooses, idempotence, the names it
refuses, the engine's refusals and its absence. The job service against the in-memory
engine (tests/jobservice.py says how)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import IMAGE
from tests.fakes.engine import Gate
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    assert_nothing_left,
    available,
    request,
    reserved,
)
from tuneplane_node.errors import (
    EngineConflict,
    EngineRefused,
    EngineUnavailable,
    NameTaken,
    NoCapacity,
    RunConflict,
)
from tuneplane_node.jobs import (
    AlreadyExited,
    AlreadyRunning,
    Node,
    Started,
)
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID, Launch

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
    wreck = fake.create_outside(ContainerSpec.of(request("r1").container), start=False)

    result = await node.jobs.launch(request("r1", 1))

    assert isinstance(result, Started)
    assert fake.containers["tuneplane-r1"].id != wreck.id
    assert fake.containers["tuneplane-r1"].status == "running"


# --- another spec of the run: run_conflict, or a relaunch (issue 52) ---------------------


def other(launch: Launch, *command: str, **changes: Any) -> Launch:
    """The same run's launch with another command (a resume from its checkpoint)."""
    spec = replace(launch.container, command=command or ("/bin/resume",))
    return replace(launch, container=spec, **changes)


async def test_an_exited_run_launched_with_another_spec_runs_the_new_one(
    node: Node, fake: FakeRuntime
) -> None:
    """A 0.3.15 console resumes a run with a new command once its job exited: the node
    removes the exited container and runs the new spec (round 4 answered 409)."""
    await node.jobs.launch(request("r1", 1))
    fake.exit("tuneplane-r1", 3)

    again = await node.jobs.launch(other(request("r1", 2)))

    assert isinstance(again, Started) and again.gpus == (0, 1)
    container = fake.containers["tuneplane-r1"]
    assert (container.status, container.spec.command) == ("running", ("/bin/resume",))
    assert fake.calls["run"] == 2


async def test_another_spec_is_a_run_conflict_while_the_job_runs_pends_or_is_kept(
    node: Node, fake: FakeRuntime
) -> None:
    """Running, pending, or exited under ``relaunch: false``: another spec is refused
    naming what differs, and nothing is done; the same spec is the answer."""
    await node.jobs.launch(request("running"))
    await node.jobs.launch(request("kept"))
    fake.exit("tuneplane-kept", 3)
    await node.jobs.launch(request("pending", image=MISSING))
    cases = [
        other(request("running")),
        other(request("kept"), relaunch=False),
        other(request("pending", image=MISSING)),
    ]
    for launch in cases:
        with pytest.raises(RunConflict, match=r"\(container\.command differ\)"):
            await node.jobs.launch(launch)

    kept = await node.jobs.launch(replace(request("kept"), relaunch=False))
    assert kept == AlreadyExited(3)
    assert fake.calls["run"] == 2 and fake.containers["tuneplane-kept"].status == "exited"


async def test_wreckage_is_replaced_by_a_launch_of_another_spec_even_without_relaunch(
    node: Node, fake: FakeRuntime
) -> None:
    """A container made and never started ran no job: nothing to keep, nothing to
    conflict with."""
    wreck = fake.create_outside(ContainerSpec.of(request("r1").container), start=False)
    result = await node.jobs.launch(other(request("r1"), relaunch=False))
    assert isinstance(result, Started) and fake.containers["tuneplane-r1"].id != wreck.id


@pytest.mark.parametrize("image", [IMAGE, MISSING], ids=["present", "pulled"])
@pytest.mark.parametrize("command", [(), ("/bin/resume",)], ids=["same", "another"])
async def test_a_refused_relaunch_leaves_the_exited_job_its_exit_code_and_logs(
    node: Node, fake: FakeRuntime, image: str, command: tuple[str, ...]
) -> None:
    """The relaunch is checked to its cards before the exited container goes (it went
    first, and a refused relaunch left the run with nothing). ``pulled``: an image
    gone since, which the relaunch would pull."""
    fake.images.add(image)
    await node.jobs.launch(request("r1", 2, image=image))
    exited = fake.containers["tuneplane-r1"]
    exited.output.append("epoch 3 saved")
    fake.exit("tuneplane-r1", 3)
    await node.jobs.launch(request("r2", 3))
    fake.images.discard(MISSING)
    relaunch = request("r1", 2, image=image)

    with pytest.raises(NoCapacity):
        await node.jobs.launch(other(relaunch, *command) if command else relaunch)

    assert fake.containers["tuneplane-r1"] is exited and exited.exit_code == 3
    logs = await node.jobs.logs("tuneplane-r1", tail=10)
    assert logs.text.endswith(" epoch 3 saved\n")
    assert node.pending.get("tuneplane-r1") is None and await reserved(node) == frozenset()


async def test_a_relaunch_whose_exited_container_cannot_go_holds_nothing(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.exit("tuneplane-r1", 3)
    fake.faults["remove"] = EngineUnavailable(engine="fake", reason="down")

    with pytest.raises(EngineUnavailable):
        await node.jobs.launch(other(request("r1", 2)))

    assert fake.containers["tuneplane-r1"].exit_code == 3
    assert await available(node) == (0, 1, 2, 3) and fake.calls["run"] == 1


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
