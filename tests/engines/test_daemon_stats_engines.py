"""``POST /node/v1/stats`` on the real engines: a job burning a core reads about one
core, a job holding 200 MB reads about 200 MB, a card's figures show under the job
holding it and never under another, and a container that is not the node's is absent."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_signals import sdk
from tests.support.console import Console
from tests.support.engines import engine_settings
from tests.support.images import IMAGE
from tests.support.jobs import job, unique
from tests.support.runtimes import TrackingRuntime
from tuneplane_node.jobs.rules.confinement import JobRules
from tuneplane_node.runtime.engines.dockerformat import usage_from_stats
from tuneplane_node.runtime.engines.engine import EngineRuntime
from tuneplane_node.runtime.engines.usage import MACHINE_MEMORY
from tuneplane_node.runtime.spec import ContainerSpec

PAGE = os.sysconf("SC_PAGE_SIZE")

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
HELD = 200 * 2**20
BURN = ["/bin/sh", "-c", "while :; do :; done"]
# A tmpfs file is memory the kernel cannot drop: it stays charged to the container.
HOLD = ["/bin/sh", "-c", "dd if=/dev/zero of=/dev/shm/held bs=1M count=200; sleep 300"]


async def stats(node: Console, *refs: str) -> dict[str, Any]:
    answer = await node.ok("POST", "/node/v1/stats", json={"refs": list(refs)})
    return answer["stats"]  # type: ignore[no-any-return]


async def settled(node: Console, ref: str, *, samples: int = 3, timeout: float = 60) -> Any:
    """The job's figures once the sampler has read it ``samples`` times since asked."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        state = (await stats(node, ref))[ref]
        if state.get("sampled_at") and state["sampled_at"] not in seen:
            seen.append(state["sampled_at"])
        if len(seen) >= samples and state["cpu_ratio"] is not None:
            return state
        assert time.monotonic() < deadline, f"{ref} never sampled {samples} times: {state}"
        await asyncio.sleep(0.1)


def cgroup_cpu_s(pid: int) -> float:
    """The CPU seconds the kernel has charged to the cgroup of ``pid`` (v1's cpuacct, or
    v2's cpu.stat): what the job got, however busy the machine is."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            root = next(
                mount
                for mount in ("/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpuacct")
                if Path(mount).is_dir()
            )
            return int(Path(f"{root}{path}/cpuacct.usage").read_text()) / 1e9
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            stat = Path(f"/sys/fs/cgroup{path}/cpu.stat").read_text()
            return int(stat.split("usage_usec ")[1].split()[0]) / 1e6
    raise AssertionError(f"no CPU accounting for pid {pid}")


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_burning_a_core_reads_what_the_kernel_charged_it(
    make_node: MakeNode, engine: str
) -> None:
    """A job that burns CPU reads the share of a core the kernel gave it: a core on a
    quiet machine, less on a busy one (CI beside other work read 0.4), the same figure
    either way. Its mean over several samples against its cgroup's charge over the same
    window, within 0.15 of a core (the window's two edges are one sample each)."""
    node = await make_node(engine, stats_interval_s=1)
    ref, _ = await node.launch(BURN)
    state = await settled(node, ref)
    assert state["pids"] == 2 and state["gpus"] == []  # the job and its init
    default = JobRules(engine_settings(engine)).memory_limit  # none asked: the node's
    assert default is not None and state["memory_limit_bytes"] == default // PAGE * PAGE
    runtime = sdk(engine)
    try:
        pid = runtime.client.containers.get(ref).attrs["State"]["Pid"]
    finally:
        await runtime.close()
    charged_before, started = cgroup_cpu_s(pid), time.monotonic()
    readings = [(await settled(node, ref, samples=2))["cpu_ratio"] for _ in range(6)]
    charged = (cgroup_cpu_s(pid) - charged_before) / (time.monotonic() - started)
    mean = sum(readings) / len(readings)
    load = Path("/proc/loadavg").read_text()
    assert charged > 0.1, (charged, load)  # it burned
    assert abs(mean - charged) <= 0.15, (readings, charged, load)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_holding_200_mb_reads_about_200_mb(make_node: MakeNode, engine: str) -> None:
    node = await make_node(engine, stats_interval_s=1)
    ref, _ = await node.launch(HOLD, shm_size="256m", memory_limit="512m")
    state = await settled(node, ref)
    assert abs(state["memory_bytes"] - HELD) <= 0.2 * HELD, state
    assert state["memory_limit_bytes"] == 512 * 2**20
    assert state["cpu_ratio"] < 0.3  # it sleeps


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_card_shows_under_its_job_and_never_under_another(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    simulation = tmp_path / "gpus.json"
    cards = [
        {"index": i, "utilization_pct": 10 * (i + 1), "memory_used_mib": 100 * i,
         "memory_total_mib": 81559, "power_w": 100.0 + i, "temperature_c": 40 + i}
        for i in range(4)
    ]  # fmt: skip
    simulation.write_text(json.dumps({"cards": cards}))
    node = await make_node(engine, stats_interval_s=1, gpu_simulation_file=simulation)
    mine, answer = await node.launch(gpus=1)
    theirs, their_answer = await node.launch(gpus=2)
    (card,) = answer["gpus"]
    state = await settled(node, mine, samples=1)
    assert state["gpus"] == [
        {
            "index": card,
            "utilization_ratio": (card + 1) / 10,
            "memory_used_bytes": 100 * card * 2**20,
            "memory_total_bytes": 81559 * 2**20,
            "power_watts": 100.0 + card,
            "temperature_celsius": 40 + card,
            "processes": [],
        }
    ]
    theirs_state = (await stats(node, theirs))[theirs]
    assert sorted(c["index"] for c in theirs_state["gpus"]) == sorted(their_answer["gpus"])
    assert card not in their_answer["gpus"]


@pytest.mark.parametrize("runtime", ENGINES, indirect=True)
async def test_a_container_that_is_not_the_nodes_reads_absent(
    make_node: MakeNode, runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime.name, feed=runtime, stats_interval_s=1)
    foreign = unique("tuneplane-foreign")
    container_id = await runtime.run(ContainerSpec(foreign, IMAGE, ("/bin/sleep", "300")))
    ref, _ = await node.launch(BURN)
    await settled(node, ref, samples=1)
    answer = await stats(node, foreign, container_id, container_id[:12])
    assert all(entry == {"exists": False, "status": None} for entry in answer.values()), answer


@pytest.mark.parametrize("runtime", ENGINES, indirect=True)
async def test_the_engines_one_shot_stats_agree_with_the_cgroup(runtime: TrackingRuntime) -> None:
    """The fallback where the cgroup cannot be read here (a remote engine): same figures."""
    spec = job(HOLD, shm_size="256m")
    container_id = await runtime.run(spec)
    inner = runtime.inner
    assert isinstance(inner, EngineRuntime)
    deadline = time.monotonic() + 20
    while ((cgroup := (await inner.usage([container_id]))[container_id]).memory_bytes or 0) < HELD:
        assert time.monotonic() < deadline, cgroup
        await asyncio.sleep(0.2)
    engine = usage_from_stats(
        await inner.pool.call(inner._stats, container_id), machine_memory=MACHINE_MEMORY
    )
    assert cgroup.source == "cgroup" and engine.source == "engine"
    assert (engine.pids, engine.memory_limit_bytes) == (cgroup.pids, None)
    assert engine.memory_bytes is not None and abs(engine.memory_bytes - HELD) <= 0.2 * HELD
    assert engine.cpu_seconds is not None and engine.cpu_seconds >= 0
