"""The GPU side of the API, as a console sees it: a simulated machine, the fake engine
behind the state cache, and for what only a real engine shows, Docker.

The simulation file stands in for the driver and is rewritten while the daemon runs, so a
card fails or a foreign process appears between two requests. Which cards a job holds is
checked where it is true: the ``tuneplane.gpus`` labels in the engine. A process on a
card is placed in a container by the fake's ``holders`` (its `holders_of`); on Docker,
by the container's real pid."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE as FAKE_IMAGE
from tests.conftest import MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.gpusimulation import (
    CUDA,
    DRIVER,
    ENGINE_LIVE,
    H100,
    Simulation,
    card,
    race,
    run_id_of,
    simulated_node,
)
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID


@pytest.fixture
async def fake(clock: FakeClock) -> AsyncIterator[FakeRuntime]:
    """The fake engine holding the image the launches here name."""
    runtime = FakeRuntime(clock=clock, images=(IMAGE, FAKE_IMAGE))
    yield runtime
    await runtime.close()


def fake_cards(fake: FakeRuntime, run_ids: set[str]) -> dict[str, list[int]]:
    """Cards per run, read from the labels of the live containers in the fake engine."""
    return {
        container.labels[LABEL_RUN_ID]: [
            int(part) for part in container.labels.get(LABEL_GPUS, "").split(",") if part
        ]
        for container in fake.containers.values()
        if container.labels.get(LABEL_RUN_ID) in run_ids and container.status in ENGINE_LIVE
    }


# --- what the machine has ------------------------------------------------------------


async def test_health_and_inventory_report_the_cards_of_the_file(
    fake_node: MakeFakeNode, sim: Simulation
) -> None:
    sim.data["links"] = [[0, 1, "nvlink"], [2, 3, "nvlink"]]
    sim.write()
    node = await simulated_node(fake_node, sim)

    health = await node.health()
    assert health["gpus_total"] == 4 and health["free_gpus"] == [0, 1, 2, 3]
    assert health["external_probe_ok"] is True
    assert health["unhealthy"] == {} and health["external"] == []
    detail = health["gpu_detail"]
    assert [entry["index"] for entry in detail] == [0, 1, 2, 3]
    for index, entry in enumerate(detail):
        assert entry["name"] == H100
        assert entry["uuid"] == card(index)["uuid"]
        assert entry["pci_bus_id"] == card(index)["pci_bus_id"]
        assert entry["memory_total_mib"] == 81559
        assert entry["state"] == "free"
    assert health["explain"] == [f"gpu {index}: free" for index in range(4)]

    inventory = await node.ok("GET", "/node/v1/inventory")
    assert inventory["accelerator_name"] == H100
    assert inventory["accelerator_count"] == 4
    assert inventory["driver"] == DRIVER
    assert inventory["cuda_version"] == CUDA
    assert [gpu["uuid"] for gpu in inventory["gpus"]] == [card(i)["uuid"] for i in range(4)]


async def test_an_explicit_gpu_count_overrides_the_file(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    sim = Simulation(tmp_path / "two.json", cards=2)
    node = await simulated_node(fake_node, sim, local_gpu_count=4)

    health = await node.health()
    assert health["gpus_total"] == 4 and health["free_gpus"] == [0, 1, 2, 3]
    assert [entry.get("name") for entry in health["gpu_detail"]] == [H100, H100, None, None]
    assert (await node.ok("GET", "/node/v1/inventory"))["accelerator_count"] == 4
    _, answer = await node.launch(gpus=4)
    assert answer["gpus"] == [0, 1, 2, 3]


# --- health of the cards --------------------------------------------------------------


async def test_a_card_turning_unhealthy_mid_run_leaves_the_free_list(
    fake_node: MakeFakeNode, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    ref, answer = await node.launch(gpus=1)
    held = answer["gpus"]
    failing = next(index for index in range(4) if index not in held)

    sim.set(failing, ecc_uncorrected=2)

    health = await node.health()
    reason = "uncorrectable ECC errors: 2"
    assert failing not in health["free_gpus"]
    assert sorted(health["free_gpus"] + held + [failing]) == [0, 1, 2, 3]
    assert health["gpus_free"] == 2
    assert health["unhealthy"] == {str(failing): reason}
    assert f"gpu {failing}: unhealthy: {reason}" in health["explain"]
    assert f"gpu {held[0]}: held by run {run_id_of(ref)}" in health["explain"]
    assert health["gpu_detail"][failing]["unhealthy"] == reason
    _, body = await node.launch(gpus=len(health["free_gpus"]) + 1, expect=409)
    assert "unhealthy" in body["detail"]
    assert (await node.state(ref))["status"] == "running"  # the job itself is untouched

    sim.set(failing, ecc_uncorrected=0)

    health = await node.health()
    assert failing in health["free_gpus"] and health["unhealthy"] == {}
    assert f"gpu {failing}: free" in health["explain"]
    _, answer = await node.launch(gpus=3)
    assert sorted(answer["gpus"] + held) == [0, 1, 2, 3]


async def test_a_critical_xid_marks_the_card_and_an_application_xid_does_not(
    fake_node: MakeFakeNode, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)

    sim.set(1, xid=[79])
    sim.set(2, xid=[13])

    health = await node.health()
    assert list(health["unhealthy"]) == ["1"]
    assert "XID 79" in health["unhealthy"]["1"]
    assert health["free_gpus"] == [0, 2, 3]
    assert any(line.startswith("gpu 1: unhealthy: XID 79") for line in health["explain"])

    sim.set(1, xid=[])  # the event is over; the quarantine (600 s by default) is not
    health = await node.health()
    assert "XID 79" in health["unhealthy"]["1"]
    assert health["free_gpus"] == [0, 2, 3]


async def test_a_card_comes_back_after_its_xid_quarantine(
    fake_node: MakeFakeNode, sim: Simulation, clock: FakeClock
) -> None:
    node = await simulated_node(fake_node, sim, gpu_xid_quarantine_s=600)
    sim.set(3, xid=[79])
    assert "3" in (await node.health())["unhealthy"]
    sim.set(3, xid=[])

    clock.advance(599)
    assert "3" in (await node.health())["unhealthy"]
    clock.advance(2)
    health = await node.health()
    assert "3" not in health["unhealthy"] and health["free_gpus"] == [0, 1, 2, 3]


# --- processes on the cards ------------------------------------------------------------


async def test_a_foreign_process_makes_its_card_external(
    fake_node: MakeFakeNode, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    stranger = os.getpid()  # this test process: in no container of the node

    sim.set(2, processes=[{"pid": stranger, "used_mib": 100}])

    health = await node.health()
    assert health["external_probe_ok"] is True
    assert health["external"] == [2]
    assert health["external_pids"] == {"2": [stranger]}
    assert health["free_gpus"] == [0, 1, 3]
    assert f"gpu 2: external pid {stranger}" in health["explain"]
    _, body = await node.launch(gpus=4, expect=409)
    assert "outside the node" in body["detail"]
    _, answer = await node.launch(gpus=3)
    assert answer["gpus"] == [0, 1, 3]

    sim.set(2, processes=[])
    health = await node.health()
    assert health["external"] == [] and health["free_gpus"] == [2]


async def test_a_process_in_a_container_not_of_the_node_is_external(
    fake_node: MakeFakeNode, sim: Simulation, fake: FakeRuntime
) -> None:
    node = await simulated_node(fake_node, sim)
    # Someone's `docker run` by hand: no run-id label.
    foreign = fake.create_outside(ContainerSpec(name=unique("foreign"), image=IMAGE))
    pid = 4242
    fake.holders[pid] = foreign.id

    sim.set(0, processes=[{"pid": pid, "used_mib": 500}])

    health = await node.health()
    assert (health["external"], health["external_pids"]) == ([0], {"0": [pid]})
    assert health["free_gpus"] == [1, 2, 3]
    _, answer = await node.launch(gpus=1)
    assert answer["gpus"] == [1]


async def test_a_job_running_on_a_card_it_was_not_given_keeps_that_card_busy(
    fake_node: MakeFakeNode, sim: Simulation, fake: FakeRuntime
) -> None:
    """A job's process on someone else's free card makes that card busy all the same.

    Without passthrough (or with an image that asks the runtime for every card) a job
    can reach cards outside its label; handing such a card to the next job puts two
    jobs on one card.
    """
    node = await simulated_node(fake_node, sim)
    ref, answer = await node.launch(gpus=1)
    assert answer["gpus"] == [0]
    pid = 4343
    fake.holders[pid] = fake.containers[ref].id

    sim.set(3, processes=[{"pid": pid, "used_mib": 70000}])

    health = await node.health()
    assert 3 not in health["free_gpus"], health["explain"]
    await node.launch(gpus=3, expect=409)  # two jobs would share card 3


async def test_ten_two_card_launches_racing_for_four_cards(
    fake_node: MakeFakeNode, sim: Simulation, fake: FakeRuntime
) -> None:
    node = await simulated_node(fake_node, sim)

    granted = await race(node, launches=10, gpus=2)

    assert len(granted) == 2
    in_engine = fake_cards(fake, set(granted))
    assert in_engine == granted
    cards = [gpu for gpus in in_engine.values() for gpu in gpus]
    assert sorted(cards) == [0, 1, 2, 3]


# --- topology -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("links", "hold_first", "expected"),
    [
        ([[0, 2, "nvlink"]], 0, [0, 2]),
        ([[1, 3, "pcie_switch"]], 0, [1, 3]),
        ([[0, 3, "numa"], [1, 2, "pcie_switch"]], 0, [1, 2]),
        ([[0, 1, "nvlink"], [2, 3, "nvlink"]], 1, [2, 3]),  # card 0 taken: not [1, 2]
    ],
)
async def test_a_two_card_job_gets_the_best_joined_pair(
    fake_node: MakeFakeNode,
    tmp_path: Path,
    links: list[list[Any]],
    hold_first: int,
    expected: list[int],
) -> None:
    sim = Simulation(tmp_path / "topology.json", links=links)
    node = await simulated_node(fake_node, sim)
    if hold_first:
        _, first = await node.launch(gpus=hold_first)
        assert first["gpus"] == [0]

    ref, answer = await node.launch(gpus=2)

    assert answer["gpus"] == expected
    state = await node.state(ref)
    assert state["labels"][LABEL_GPUS] == ",".join(str(gpu) for gpu in expected)


async def test_one_card_jobs_pack_onto_the_socket_in_use_so_a_four_card_job_finds_a_whole_one(
    fake_node: MakeFakeNode, tmp_path: Path, fake: FakeRuntime
) -> None:
    """Two sockets of four cards (CPU 0 and CPU 1): one-card jobs fill the socket already
    in use, so after the first socket's jobs end, a four-card job still gets all of it."""
    sim = Simulation(tmp_path / "sockets.json", cards=8)
    for index in range(8):
        sim.data["cards"][index]["numa_node"] = index // 4
    sim.data["numa_cpus"] = {"0": [0], "1": [1]}
    sim.write()
    node = await simulated_node(fake_node, sim)

    first = [await node.launch(gpus=1) for _ in range(5)]
    assert [answer["gpus"] for _, answer in first] == [[0], [1], [2], [3], [4]]
    for ref, _ in first[:4]:
        await node.stop(ref, timeout=1)
    then = [(await node.launch(gpus=1))[1]["gpus"] for _ in range(3)]
    assert then == [[5], [6], [7]]  # not 0, 1, 2: socket 0 stays whole

    ref, large = await node.launch(gpus=4)
    assert large["gpus"] == [0, 1, 2, 3]
    assert (await node.state(ref))["labels"][LABEL_GPUS] == "0,1,2,3"
    assert fake.containers[ref].spec.cpuset_cpus == (0,)  # created next to its cards


# --- reservations and restarts --------------------------------------------------------


async def test_a_reservation_during_a_slow_pull_holds_against_direct_launches(
    fake_node: MakeFakeNode, sim: Simulation, fake: FakeRuntime
) -> None:
    image = "registry.test/big:1"  # not on the engine: the launch pulls it, until told
    node = await simulated_node(fake_node, sim)
    pending, answer = await node.launch(gpus=3, image=image)
    assert answer["phase"] == "pulling"
    await fake.pulling.wait()

    _, body = await node.launch(gpus=2, expect=409)
    assert "reserved" in body["detail"]
    _, direct = await node.launch(gpus=1)
    assert direct["phase"] == "running" and len(direct["gpus"]) == 1
    health = await node.health()
    assert health["gpus_reserved"] == 3 and health["gpus_free"] == 0
    assert (await node.state(pending))["pending_phase"] == "pulling"

    await node.stop(pending)

    assert fake.pull_of(image).cancelled
    health = await node.health()
    assert health["gpus_reserved"] == 0 and health["gpus_free"] == 3
    _, after = await node.launch(gpus=3)
    assert sorted(after["gpus"] + direct["gpus"]) == [0, 1, 2, 3]


async def test_a_restarted_daemon_rebuilds_by_job_from_the_labels(
    fake_node: MakeFakeNode,
) -> None:
    first = await fake_node()
    one, answer_one = await first.launch(gpus=1)
    two, answer_two = await first.launch(gpus=2)
    await first.client.close()

    second = await fake_node()  # a new daemon, its cache filled from the engine's list
    health = await second.health()

    expected = {str(gpu): run_id_of(one) for gpu in answer_one["gpus"]}
    expected.update({str(gpu): run_id_of(two) for gpu in answer_two["gpus"]})
    assert health["by_job"] == expected
    assert len(expected) == 3
    assert health["gpus_free"] == 1
    _, body = await second.launch(gpus=2, expect=409)
    assert "1 free" in body["detail"]


# --- a simulation file that cannot be read ----------------------------------------------


@pytest.mark.parametrize("content", [None, "{not json", '{"cards": [{"name": "no index"}]}'])
async def test_an_unreadable_simulation_file_leaves_the_node_working(
    fake_node: MakeFakeNode, tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "gpus.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    node = await fake_node(gpu_simulation_file=path, local_gpu_count=4)

    status, health = await node.call("GET", "/node/v1/health")

    assert status == 200
    assert health["ok"] is True  # the engine answers; only the cards' facts are unknown
    assert health["gpus_total"] == 4 and health["free_gpus"] == [0, 1, 2, 3]
    assert health["external_probe_ok"] is False  # "cannot see", not "nobody"
    assert health["unhealthy"] == {}
    _, answer = await node.launch(gpus=1)
    assert answer["gpus"] == [0]


async def test_inventory_without_a_readable_gpu_source_says_unknown_not_zero(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    node = await fake_node(gpu_simulation_file=tmp_path / "missing.json", local_gpu_count=None)

    inventory = await node.ok("GET", "/node/v1/inventory")

    assert inventory["accelerator_count"] is None
    assert inventory["accelerator_name"] is None and inventory["driver"] is None
    assert inventory["gpus"] == []


async def test_operators_can_turn_the_health_and_external_checks_off(
    fake_node: MakeFakeNode, sim: Simulation
) -> None:
    node = await simulated_node(
        fake_node, sim, local_check_gpu_health=False, local_check_external_gpus=False
    )
    sim.set(0, ecc_uncorrected=5)
    sim.set(1, processes=[{"pid": os.getpid(), "used_mib": 100}])

    health = await node.health()

    assert health["unhealthy"] == {} and health["external"] == []
    assert health["external_probe_ok"] is False  # not checked: unknown, not "nobody"
    assert health["free_gpus"] == [0, 1, 2, 3]
