"""The node's status and inventory: the engine, the cards, pending launches and the disk,
unknown where they cannot be read; a close cancels every pending launch. The job service
against the in-memory engine (tests/jobservice.py says how)."""

from __future__ import annotations

from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    request,
)
from tests.support.waiting import settle
from tuneplane_node.errors import (
    Conflict,
    EngineConflict,
    EngineUnavailable,
    NameTaken,
    NoCapacity,
)
from tuneplane_node.jobs import (
    Node,
)

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
    assert original == request("r1", 1)  # the chosen cards went into a copy


async def test_every_refusal_of_the_node_is_a_conflict() -> None:
    for error in (
        NameTaken(ref="a", run_id="b"),
        NoCapacity(requested=1, free=[], held={}),
        EngineConflict(engine="docker", action="run a", reason="in use"),
    ):
        assert isinstance(error, Conflict) and error.status == 409
