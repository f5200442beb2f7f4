"""CPUs next to the cards, on the real engines and the process runtime: with a simulation
file putting card 0 on NUMA node 0 (CPU 0) and card 1 on node 1 (CPU 1), a job on card 1
runs on CPU 1 alone, a job without a card and one whose cpu_limit its node cannot hold run
on every CPU. What the job sees is read in the job itself (``/proc/self/status``).

This machine has one NUMA node: node 1's job gets no memory node (it would name one the
machine does not have), node 0's gets node 0."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode, fake_settings
from tests.support.console import Console
from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.gpu import numa
from tuneplane_node.runtime.spec import format_cpulist

pytestmark = pytest.mark.engine
PROBE = [
    "/bin/sh",
    "-c",
    "grep -E '^(Cpus|Mems)_allowed_list' /proc/self/status; echo probed; exec sleep 300",
]
EVERY_CPU = format_cpulist(numa.online_cpus() or ())


def two_nodes(path: Path) -> Path:
    cards = [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": 1}]
    path.write_text(json.dumps({"cards": cards, "numa_cpus": {"0": [0], "1": [1]}}))
    return path


async def allowed(node: Console, **fields: Any) -> tuple[str, list[int], dict[str, str]]:
    """(ref, its cards, ``{"Cpus_allowed_list": ..., "Mems_allowed_list": ...}``)."""
    ref, answer = await node.launch(PROBE, **fields)
    deadline = time.monotonic() + 30
    while "probed" not in (log := await node.logs(ref)):
        assert time.monotonic() < deadline, log
        await asyncio.sleep(0.1)
    lines = [line.split(" ", 1)[1] for line in log.splitlines() if "_allowed_list" in line]
    return ref, answer["gpus"], dict(line.replace("\t", "").split(":", 1) for line in lines)


async def confined_as_the_issue_says(node: Console) -> list[str]:
    """The three cases, on one node; the refs launched (for a runtime without clean-up)."""
    if len(numa.online_cpus() or ()) < 2 or 1 not in (numa.online_cpus() or ()):
        pytest.skip("needs CPUs 0 and 1")
    first, cards, on_0 = await allowed(node, gpus=1)
    assert cards == [0] and on_0 == {"Cpus_allowed_list": "0", "Mems_allowed_list": "0"}
    second, cards, on_1 = await allowed(node, gpus=1)
    assert cards == [1] and on_1["Cpus_allowed_list"] == "1"  # CPU 1 alone

    no_card = (await allowed(node))[2]
    assert no_card["Cpus_allowed_list"] == EVERY_CPU  # not confined
    await node.stop(first, timeout=1)
    await node.remove(first)
    wide, cards, too_wide = await allowed(node, gpus=1, cpu_limit=2)  # node 0 has 1 CPU
    assert cards == [0] and too_wide["Cpus_allowed_list"] == EVERY_CPU
    return [second, wide]


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_job_runs_on_the_cpus_of_its_cards_node_on_the_engines(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    sim = two_nodes(tmp_path / "gpus.json")
    node = await make_node(engine, gpu_simulation_file=sim, local_gpu_count=None)
    await confined_as_the_issue_says(node)  # the fixture removes what was launched


@pytest.fixture
async def process_node(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[Console]:
    settings = fake_settings(
        tmp_path,
        local_runtime="process",
        local_gpu_count=None,
        gpu_simulation_file=two_nodes(tmp_path / "gpus.json"),
        local_gpu_passthrough=False,
    )
    node = Console(await aiohttp_client(create_node_app(settings)), made=[])
    yield node
    for ref in node.made or ():
        await node.call("POST", "/node/v1/stop", json={"ref": ref, "timeout": 1})
        await node.call("POST", "/node/v1/remove", json={"ref": ref})


async def test_a_job_runs_on_the_cpus_of_its_cards_node_on_the_process_runtime(
    process_node: Console,
) -> None:
    await confined_as_the_issue_says(process_node)
