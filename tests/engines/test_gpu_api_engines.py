"""The GPU side of the API, as a console sees it: a simulated machine, the fake engine
behind the state cache, and for what only a real engine shows, Docker.

This module holds the ones that need an engine; tests/http/test_gpu_api.py has the rest."""

from __future__ import annotations

import asyncio

import pytest

from tests.gpusimulation import (
    ENGINE_LIVE,
    Make,
    Simulation,
    race,
    run_id_of,
    simulated_node,
)
from tests.support.runtimes import TrackingRuntime
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID


async def engine_cards(runtime: TrackingRuntime, run_ids: set[str]) -> dict[str, list[int]]:
    """Cards per run, read from the labels of the live containers in the engine itself."""
    inner = runtime.inner
    assert isinstance(inner, DockerRuntime)
    listed = await asyncio.to_thread(
        inner.api.containers, all=True, filters={"label": LABEL_RUN_ID}
    )
    return {
        entry["Labels"][LABEL_RUN_ID]: [
            int(part) for part in entry["Labels"].get(LABEL_GPUS, "").split(",") if part
        ]
        for entry in listed
        if entry["Labels"][LABEL_RUN_ID] in run_ids and entry["State"] in ENGINE_LIVE
    }


async def container_pid(runtime: TrackingRuntime, name: str) -> int:
    inner = runtime.inner
    assert isinstance(inner, DockerRuntime)
    info = await asyncio.to_thread(inner.api.inspect_container, name)
    pid = int(info["State"]["Pid"])
    assert pid > 0, info["State"]
    return pid


@pytest.mark.engine
async def test_a_process_of_the_job_holding_the_card_is_not_external(
    make_node: Make, sim: Simulation, docker_runtime: TrackingRuntime
) -> None:
    node = await simulated_node(make_node, sim)
    ref, answer = await node.launch(gpus=1)
    [held] = answer["gpus"]

    sim.set(held, processes=[{"pid": await container_pid(docker_runtime, ref), "used_mib": 500}])

    health = await node.answered_health()
    assert health["external_probe_ok"] is True
    assert health["external"] == [] and health["external_pids"] == {}
    assert health["by_job"] == {str(held): run_id_of(ref)}
    assert f"gpu {held}: held by run {run_id_of(ref)}" in health["explain"]


@pytest.mark.engine
async def test_twenty_launches_racing_for_four_cards_never_share_one(
    make_node: Make, sim: Simulation, docker_runtime: TrackingRuntime
) -> None:
    node = await simulated_node(make_node, sim)

    granted = await race(node, launches=20, gpus=1)

    assert len(granted) == 4
    in_engine = await engine_cards(docker_runtime, set(granted))
    assert in_engine == granted
    cards = [gpu for gpus in in_engine.values() for gpu in gpus]
    assert sorted(cards) == [0, 1, 2, 3]  # each card once
    health = await node.answered_health()
    assert health["free_gpus"] == [] and len(health["by_job"]) == 4
