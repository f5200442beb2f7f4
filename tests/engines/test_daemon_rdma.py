"""RDMA into the job on the real engines: a 1-card job sees the machine's verbs devices
under /dev/infiniband, may lock all the memory it registers and holds IPC_LOCK; a job
without a card, or that opts out, sees none. The devices are mknod clones of /dev/null
in a test directory (`TUNEPLANE_RDMA_DEVICE_DIR`): no InfiniBand here."""

from __future__ import annotations

import asyncio
import resource
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.console import Console
from tests.unit.test_jobs_rules_confinement_rdma import rdma_dir

pytestmark = pytest.mark.engine
# The node's default is unlimited; an engine in a sandbox may not raise the hard limit
# (this machine's is 8 MiB, which is also what its jobs get by default), so here the
# tests ask for half of it: a limit the job gets only from the node.
_HARD = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
MEMLOCK = "unlimited" if _HARD == resource.RLIM_INFINITY else str(_HARD // 2)
WANTED = "unlimited" if _HARD == resource.RLIM_INFINITY else str(_HARD // 2048)
IPC_LOCK_BIT = 14
PROBE = [
    "/bin/sh",
    "-c",
    "echo devices: $(ls /dev/infiniband 2>/dev/null); echo memlock: $(ulimit -l); "
    "echo caps: $(grep CapEff /proc/self/status | cut -f2); echo probed",
]


async def probed(node: Console, **fields: Any) -> dict[str, str]:
    """What the probe job printed, as ``{"devices": ..., "memlock": ..., "caps": ...}``."""
    ref, _ = await node.launch(PROBE, **fields)
    deadline = time.monotonic() + 30
    while "probed" not in (log := await node.logs(ref)):
        assert time.monotonic() < deadline, log
        await asyncio.sleep(0.1)
    lines = [line.split(" ", 1)[1] for line in log.splitlines() if " " in line]  # no stamp
    return {key.strip(): value.strip() for key, _, value in (ln.partition(":") for ln in lines)}


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_job_with_a_card_gets_the_rdma_devices_memlock_and_ipc_lock_and_no_more(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    node = await make_node(engine, rdma_device_dir=rdma_dir(tmp_path), rdma_memlock=MEMLOCK)
    with_card = await probed(node, gpus=1)
    assert with_card["devices"] == "rdma_cm uverbs0 uverbs1"  # no umad0, no plain file
    assert with_card["memlock"] == WANTED
    assert int(with_card["caps"], 16) & (1 << IPC_LOCK_BIT)

    without = await probed(node)  # no card: under auto, no RDMA
    assert without["devices"] == "" and without["memlock"] != WANTED
    assert not int(without["caps"], 16) & (1 << IPC_LOCK_BIT)
    opted_out = await probed(node, gpus=1, rdma=False)
    assert opted_out["devices"] == "" and opted_out["memlock"] != WANTED


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_unlimited_memlock_on_an_engine_that_cannot_give_it_is_a_409_not_a_502(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    """The development engines' own hard limit is this machine's (8 MiB, as a stock engine
    under systemd): the default ``unlimited`` is refused before the engine is asked, and
    health says why card jobs cannot start."""
    node = await make_node(engine, rdma_device_dir=rdma_dir(tmp_path))  # memlock unlimited
    if _HARD == resource.RLIM_INFINITY:
        pytest.skip("this machine's hard memlock is unlimited: the engine's may be too")
    _, refused = await node.launch(gpus=1, expect=409)
    assert refused["code"] == "memlock_unavailable", refused
    assert "LimitMEMLOCK=infinity" in refused["detail"]
    assert f"hard limit is {_HARD} bytes" in refused["detail"]

    health = await node.answered_health()
    assert health["gpu_ready"] is False
    assert "cannot lock their memory" in health["gpu_not_ready_reason"]
    await node.launch(gpus=0)  # no card under auto: no RDMA, no memlock, it runs
