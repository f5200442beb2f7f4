"""A card that fails tells its job first (issue 53): each fault scoped to the job, the card
or the machine, the circuit breaker on automatic take-outs, and a card back in the pool
only clean. A simulated 4-card machine (the simulation file, edited live) in front of
the fake engine, whose containers end on a signal as a process would (their handlers).
Each look at the cards is asked for directly (`FaultReactor.check`, what the daemon's
task runs every ``TUNEPLANE_GPU_FAULT_POLL_S``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import IMAGE as FAKE_IMAGE
from tests.conftest import MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.gpusimulation import Simulation, simulated_node, try_launch
from tests.support.console import HEADERS, Console
from tests.support.images import IMAGE
from tuneplane_node.daemon.state import NODE

pytestmark = pytest.mark.slow  # each test runs a daemon over a socket


@pytest.fixture
async def fake(clock: FakeClock) -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(clock=clock, images=(IMAGE, FAKE_IMAGE))
    yield runtime
    await runtime.close()


async def look(node: Console) -> None:
    """One look at the cards, as the daemon's task takes every poll period."""
    await node.app[NODE].faults.check()


async def card_job(node: Console, fake: FakeRuntime, run_id: str) -> tuple[str, int]:
    """A one-card job that checkpoints and exits 0 on SIGUSR1, its warning."""
    ref, answer = await node.launch(gpus=1, run_id=run_id, warn_signal="SIGUSR1", warn_s=30)
    fake.containers[ref].handlers["SIGUSR1"] = 0
    return ref, answer["gpus"][0]


def uuid(sim: Simulation, index: int) -> str:
    return str(sim.data["cards"][index]["uuid"])


async def test_a_job_fault_is_shown_on_its_job_and_stops_nothing(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    ref, index = await card_job(node, fake, "r1")
    assert "gpu_fault" not in await node.state(ref)  # and asked again below: the fault
    sim.set(index, xid=[13])  # is a change of its own, though the engine's is none
    await look(node)

    state = await node.state(ref)
    assert state["status"] == "running" and fake.signals == []
    assert state["gpu_fault"].startswith(f"{uuid(sim, index)} XID 13 since ")
    await node.app[NODE].sampler.sample_once()
    usage = (await node.ok("POST", "/node/v1/stats", json={"refs": [ref]}))["stats"][ref]
    assert usage["gpu_fault"] == state["gpu_fault"]
    health = await node.health()
    assert health["gpu_detail"][index]["fault"]["scope"] == "job"
    assert str(index) not in health["unhealthy"] and health["by_job"][str(index)] == "r1"


async def test_a_card_fault_warns_and_stops_its_job_and_the_card_is_out_until_reset(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    for index in range(4):
        sim.set(index, resets=0)
    ref, index = await card_job(node, fake, "r1")
    other, other_index = await card_job(node, fake, "r2")
    sim.set(index, xid=[48])
    await look(node)

    state = await node.wait_for(ref, "status", "exited", timeout=10)
    assert fake.signals == [(ref, "SIGUSR1")]  # warned: it checkpointed and ended itself
    assert (state["exit_code"], state["stop_reason"]) == (
        0,
        f"gpu_fault: {uuid(sim, index)} XID 48",
    )
    assert (await node.state(other))["status"] == "running"
    health = await node.health()
    assert health["gpu_detail"][index]["fault"]["scope"] == "card"
    assert str(index) in health["unhealthy"] and index not in health["free_gpus"]
    assert (await try_launch(node, 3))[0] == 409  # 4 cards less the faulted one, one held

    sim.set(index, xid=[])  # the event is read; the card is still not reset
    assert str(index) in (await node.health())["unhealthy"]
    sim.set(index, resets=1)  # a reset, then a clean probe
    health = await node.health()
    assert str(index) not in health["unhealthy"] and index in health["free_gpus"]
    assert other_index not in health["free_gpus"]


async def test_a_node_fault_cordons_the_node_and_drains_every_job_warned(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    first, index = await card_job(node, fake, "r1")
    second, _ = await card_job(node, fake, "r2")
    since = (await node.jobs())["index"]
    watching = asyncio.create_task(node.watch(since, wait=30))
    await asyncio.sleep(0.05)  # the watch waits
    sim.set(index, xid=[79])
    looked = time.monotonic()
    await look(node)
    await watching
    heard_s = time.monotonic() - looked

    why = f"gpu_fault: {uuid(sim, index)} XID 79"
    assert heard_s < 1.0  # the change log wakes the watch at once; 1 s: the bound
    node_state = (await node.health())["node_state"]
    assert (node_state["state"], node_state["reason"]) in {("draining", why), ("drained", why)}
    for ref in (first, second):
        state = await node.wait_for(ref, "status", "exited", timeout=10)
        assert (state["exit_code"], state["stop_reason"]) == (0, why)
    assert sorted(fake.signals) == sorted([(first, "SIGUSR1"), (second, "SIGUSR1")])
    assert (await try_launch(node, 0))[0] == 409  # cordoned


async def test_the_breaker_keeps_cards_in_past_its_rate_until_an_operator_resets_it(
    fake_node: MakeFakeNode, tmp_path: Any
) -> None:
    sim = Simulation(tmp_path / "nine.json", cards=9)
    node = await simulated_node(fake_node, sim, gpu_breaker_per_hour=2)
    for index in range(9):
        sim.set(index, xid=[48])

    health = await node.health()
    assert len(health["unhealthy"]) == 2 and len(health["free_gpus"]) == 7
    assert health["gpu_breaker"] == {"limit": 2, "taken": 2, "kept_in": 7, "tripped": True}
    assert all(card["fault"]["scope"] == "card" for card in health["gpu_detail"])
    kept = [line for line in health["explain"] if "kept in by the GPU breaker" in line]
    assert len(kept) == 7 and kept[0].endswith(
        ": free; its card fault XID 48 kept in by the GPU breaker"
    )
    metrics = await (await node.client.get("/metrics", headers=HEADERS)).text()
    assert "tuneplane_node_gpu_breaker_tripped 1.0" in metrics

    reset = await node.ok("POST", "/node/v1/gpus/reset-breaker", json={})
    assert reset == {"limit": 2, "taken": 0, "kept_in": 0, "tripped": False}
    health = await node.health()
    assert health["gpu_breaker"]["tripped"] is False and len(health["unhealthy"]) == 2


async def test_a_card_whose_job_is_gone_drains_until_its_memory_is_back(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    ref, index = await card_job(node, fake, "r1")
    leftover = [{"pid": 4242, "used_mib": 20480}]
    sim.set(index, processes=leftover, memory_used_mib=20480)
    await node.ok("POST", "/node/v1/remove", json={"ref": ref})

    health = await node.health()
    assert "compute process 4242" in health["draining"][str(index)]
    assert index not in health["free_gpus"]
    assert health["gpu_detail"][index]["state"].startswith("draining: after run r1")
    inventory = await node.ok("GET", "/node/v1/inventory")
    assert inventory["gpus_draining"] == health["draining"]
    assert (await try_launch(node, 4))[0] == 409

    sim.set(index, processes=[])  # the process is gone; its memory is not yet
    assert "20480 MiB" in (await node.health())["draining"][str(index)]
    sim.set(index, memory_used_mib=0)
    health = await node.health()
    assert health["draining"] == {} and index in health["free_gpus"]


async def test_a_node_fault_leaves_a_drain_under_way_as_it_is(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation
) -> None:
    node = await simulated_node(fake_node, sim)
    await node.ok("POST", "/node/v1/drain", json={"reason": "kernel"})
    sim.set(2, xid=[79])
    await look(node)
    node_state = (await node.health())["node_state"]
    assert node_state["reason"] == "kernel" and node_state["state"] in ("draining", "drained")
