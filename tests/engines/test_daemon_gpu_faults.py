"""A card that fails tells its job first (issue 53), on the real engines through the API:
a simulated 4-card machine (the simulation file, edited live; the engines label the
cards and hand none over), jobs that checkpoint on their warning signal, and the node's
own look at the cards every ``TUNEPLANE_GPU_FAULT_POLL_S``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_signals import (
    ENGINES,
    committed,
    ready,
    remove_images,
    trapping,
)
from tests.gpusimulation import Simulation
from tests.support.console import Console
from tests.support.nodes import storage_root
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.podman import PodmanRuntime

pytestmark = pytest.mark.engine
POLL_S = 0.5
MARGIN_S = 2.0
"""Past the look that finds the fault: the engine's kill call, the job's trap running
once its 0.1 s sleep ends, its checkpoint written, on a busy CI machine."""
SAVE = "'echo saving > /ckpt/{name}; echo saved; exit 0' USR1"
TERM = "'echo got TERM; exit 15' TERM"


async def checkpointing(node: Console, ckpt: Path, name: str) -> tuple[str, int]:
    """A one-card job that writes ``/ckpt/<name>`` and exits 0 on SIGUSR1, its warning."""
    ref, answer = await node.launch(
        trapping(SAVE.format(name=name), TERM), gpus=1, mounts=[[str(ckpt), "/ckpt"]],
        warn_signal="SIGUSR1", warn_s=20,
    )  # fmt: skip
    await ready(node, ref)
    return ref, answer["gpus"][0]


async def machine(make: MakeNode, engine: str, tmp_path: Path) -> tuple[Simulation, Console, Path]:
    """A daemon on ``engine`` whose 4 cards are a simulation file's, looked at every
    `POLL_S`; and the folder its jobs checkpoint to."""
    sim = Simulation(tmp_path / "gpus.json")
    node = await make(
        engine, gpu_simulation_file=sim.path, local_gpu_count=None, gpu_fault_poll_s=POLL_S
    )
    return sim, node, storage_root(tmp_path)


async def until(what: str, check: object, timeout: float) -> float:
    """Seconds until ``check()`` is true."""
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        assert time.monotonic() - started < timeout, what
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_xid_79_warns_every_job_cordons_the_node_and_the_watch_hears_it(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    sim, node, ckpt = await machine(make_node, engine, tmp_path)
    jobs = [await checkpointing(node, ckpt, name) for name in ("first", "second")]
    [(_, card), (_, other)] = jobs
    index = (await node.jobs())["index"]
    watching = asyncio.create_task(node.watch(index, wait=30))
    await asyncio.sleep(0.1)  # the watch waits

    sim.set(other, xid=[79])
    faulted = time.monotonic()
    await asyncio.wait_for(watching, POLL_S + 1.0)  # found within a look; heard within 1 s
    heard_s = time.monotonic() - faulted
    warned_s = heard_s + await until(
        "both checkpoints", lambda: all((ckpt / n).exists() for n in ("first", "second")),
        POLL_S + MARGIN_S,
    )  # fmt: skip

    why = f"gpu_fault: {sim.data['cards'][other]['uuid']} XID 79"
    print(f"{engine}: watch heard {heard_s:.2f} s, both checkpoints {warned_s:.2f} s after")
    health = await node.answered_health()
    assert health["node_state"]["reason"] == why
    assert health["node_state"]["state"] in ("draining", "drained")
    assert health["gpu_detail"][other]["fault"]["scope"] == "node"
    for ref, _ in jobs:
        state = await node.wait_for(ref, "status", "exited", timeout=30)
        assert (state["exit_code"], state["stop_reason"]) == (0, why)
        log = await node.logs(ref)
        assert "saved" in log and "got TERM" not in log
    assert card != other


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_xid_48_stops_its_cards_job_warned_and_an_xid_13_stops_nothing(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    sim, node, ckpt = await machine(make_node, engine, tmp_path)
    (faulty, card), (bystander, other) = [
        await checkpointing(node, ckpt, name) for name in ("faulty", "bystander")
    ]
    sim.set(other, xid=[13])
    sim.set(card, xid=[48], resets=0)
    await until("the checkpoint", lambda: (ckpt / "faulty").exists(), POLL_S + MARGIN_S)

    state = await node.wait_for(faulty, "status", "exited", timeout=30)
    uuid = sim.data["cards"][card]["uuid"]
    assert (state["exit_code"], state["stop_reason"]) == (0, f"gpu_fault: {uuid} XID 48")
    kept = await node.state(bystander)
    assert kept["status"] == "running" and "XID 13" in kept["gpu_fault"]
    assert not (ckpt / "bystander").exists()
    health = await node.answered_health()
    assert str(card) in health["unhealthy"] and health["node_state"]["state"] == "ready"


@pytest.fixture
async def cuda13_image() -> AsyncIterator[Callable[[str], str]]:
    """``image(engine)``: the test image with ``ENV CUDA_VERSION=13.0.1`` (as NVIDIA's CUDA
    images say it), made on that engine for this test and removed after it."""
    made: list[tuple[DockerRuntime | PodmanRuntime, str]] = []

    def image(engine: str) -> str:
        return committed(engine, made, "cuda13", conf={"Env": ["CUDA_VERSION=13.0.1"]},
                         changes=["ENV CUDA_VERSION=13.0.1"])  # fmt: skip

    yield image
    await remove_images(made)


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_image_needing_cuda_13_on_a_cuda_12_4_driver_is_refused(
    make_node: MakeNode, engine: str, tmp_path: Path, cuda13_image: Callable[[str], str]
) -> None:
    sim, node, _ = await machine(make_node, engine, tmp_path)
    sim.data["cuda"] = "12.4"
    sim.write()
    image = cuda13_image(engine)
    _, answer = await node.launch(image=image, gpus=1, expect=409)
    assert answer["code"] == "driver_too_old"
    assert "needs CUDA 13.0; this node's driver gives CUDA 12.4" in answer["detail"]
    assert (await node.answered_health())["gpus_free"] == 4  # nothing was made, no card held
    await node.launch(image=image, gpus=0)  # without a card it needs no driver


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_card_left_holding_memory_drains_until_it_is_back(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    sim, node, _ = await machine(make_node, engine, tmp_path)
    ref, answer = await node.launch(gpus=1)
    [card] = answer["gpus"]
    sim.set(card, processes=[{"pid": 4242, "used_mib": 20480}], memory_used_mib=20480)
    await node.ok("POST", "/node/v1/remove", json={"ref": ref})

    health = await node.answered_health()
    assert "compute process 4242" in health["draining"][str(card)], health
    _, refused = await node.launch(gpus=4, expect=409)
    assert refused["code"] == "no_capacity"
    sim.set(card, processes=[], memory_used_mib=0)
    await node.launch(gpus=4)
