"""A card that fails tells its job first (issue 53), on the real engines through the API:
a simulated 4-card machine (the simulation file, edited live; the engines label the
cards and hand none over), jobs that checkpoint on their warning signal, and the node's
own look at the cards every ``TUNEPLANE_GPU_FAULT_POLL_S``."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_signals import ENGINES, ready, trapping
from tests.gpusimulation import Simulation
from tests.helpers import Console, storage_root

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
    health = await node.health()
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
    health = await node.health()
    assert str(card) in health["unhealthy"] and health["node_state"]["state"] == "ready"
