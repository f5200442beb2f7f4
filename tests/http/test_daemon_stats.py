"""``POST /node/v1/stats`` and the per-job series, over a socket, in front of the
in-memory engine: the shape a console reads, the refusals, and the metrics switch."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.console import TOKEN, Console
from tuneplane_node.daemon.state import NODE
from tuneplane_node.gpu.probe import CardFacts
from tuneplane_node.runtime.facts import Usage
from tuneplane_node.runtime.spec import ContainerSpec

# Slow: stats end to end over a real socket.
pytestmark = pytest.mark.slow

MIB = 2**20
FIGURES = ["cpu_ratio", "memory_bytes", "memory_limit_bytes", "pids", "sampled_at", "gpus"]
FIGURES += ["disk_used_bytes", "disk_limit_bytes"]  # issue 34: the disk monitor's
FIGURES += ["gpu_fault"]  # issue 53: a job-scope fault of its card
FIGURES += ["disk_deleted_open_bytes", "disk_inodes", "inode_limit"]  # issue 50
CARD = [
    "index",
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "temperature_celsius",
    "processes",
]


async def stats(node: Console, body: dict[str, Any]) -> dict[str, Any]:
    answer = await node.ok("POST", "/node/v1/stats", json=body)
    assert list(answer) == ["stats"]
    return answer["stats"]  # type: ignore[no-any-return]


async def sampled(node: Console) -> None:
    await node.app[NODE].sampler.sample_once()


async def test_a_running_job_reads_its_figures_and_cards(
    fake_node: MakeFakeNode, fake: FakeRuntime, probe: FakeProbe
) -> None:
    node = await fake_node()
    ref, answer = await node.launch(gpus=1, image=IMAGE)
    card = answer["gpus"][0]
    probe.cards[card] = CardFacts(card, memory_total_mib=80, memory_used_mib=40, utilization_pct=87)
    fake.usages[ref] = Usage(cpu_seconds=1.0, memory_bytes=5 * MIB, memory_limit_bytes=8 * MIB)
    await sampled(node)
    state = (await stats(node, {"refs": [ref]}))[ref]
    assert list(state) == ["exists", "status", *FIGURES]
    assert (state["exists"], state["status"], state["cpu_ratio"]) == (True, "running", None)
    assert (state["memory_bytes"], state["memory_limit_bytes"], state["pids"]) == (
        5 * MIB,
        8 * MIB,
        None,
    )
    assert state["sampled_at"].endswith("Z")
    assert (state["disk_used_bytes"], state["disk_limit_bytes"]) == (None, None)  # not measured
    (gpu,) = state["gpus"]
    assert list(gpu) == CARD
    assert gpu == {
        "index": card,
        "utilization_ratio": 0.87,
        "memory_used_bytes": 40 * MIB,
        "memory_total_bytes": 80 * MIB,
        "power_watts": None,
        "temperature_celsius": None,
        "processes": [],
    }


async def test_other_refs_read_exists_and_status_only(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    exited, _ = await node.launch(image=IMAGE)
    fake.exit(exited, 1)
    fake.create_outside(ContainerSpec("tuneplane-foreign", IMAGE))
    foreign_id = fake.containers["tuneplane-foreign"].id
    await sampled(node)
    answer = await stats(node, {"refs": [exited, "tuneplane-foreign", foreign_id, "nobody"]})
    assert answer == {
        exited: {"exists": True, "status": "exited"},
        "tuneplane-foreign": {"exists": False, "status": None},
        foreign_id: {"exists": False, "status": None},
        "nobody": {"exists": False, "status": None},
    }


async def test_no_refs_answers_every_running_job(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    refs = [(await node.launch(image=IMAGE))[0] for _ in range(2)]
    await sampled(node)
    assert sorted(await stats(node, {})) == sorted(refs)


@pytest.mark.parametrize(
    "body",
    [
        {"refs": "tuneplane-a"},
        {"refs": [""]},
        {"refs": [1]},
        {"refs": ["x" * 301]},
        {"refs": ["a"] * 10_001},
    ],
)
async def test_bad_refs_are_a_422_naming_the_field(
    fake_node: MakeFakeNode, body: dict[str, Any]
) -> None:
    node = await fake_node()
    status, answer = await node.call("POST", "/node/v1/stats", json=body)
    assert status == 422 and answer["detail"].startswith("refs: "), answer


async def test_a_stats_request_never_samples(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE)
    await sampled(node)
    before = fake.calls["usage"]
    for _ in range(5):
        await stats(node, {"refs": [ref]})
    assert fake.calls["usage"] == before


# --- the per-job series --------------------------------------------------------------------


async def job_series(node: Console) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with node.client.get("/metrics", headers=headers) as response:
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("tuneplane_node_job_")
    }


async def test_per_job_series_are_labelled_by_run_id_when_asked(
    fake_node: MakeFakeNode, fake: FakeRuntime, probe: FakeProbe
) -> None:
    node = await fake_node(metrics_per_job=True)
    ref, answer = await node.launch(gpus=1, image=IMAGE, run_id="r-7")
    card = answer["gpus"][0]
    probe.cards[card] = CardFacts(card, utilization_pct=50, power_w=300.0)
    fake.usages[ref] = Usage(cpu_seconds=1.0, memory_bytes=5 * MIB, pids=2)
    await sampled(node)
    series = await job_series(node)
    run = (("run_id", "r-7"),)
    assert series[("tuneplane_node_job_memory_bytes", run)] == 5 * MIB
    assert series[("tuneplane_node_job_pids", run)] == 2
    assert ("tuneplane_node_job_cpu_ratio", run) not in series  # unknown: no series, not 0
    assert ("tuneplane_node_job_memory_limit_bytes", run) not in series  # no limit
    on_card = (("gpu", str(card)), ("run_id", "r-7"))
    assert series[("tuneplane_node_job_gpu_utilization_ratio", on_card)] == 0.5
    assert series[("tuneplane_node_job_gpu_power_watts", on_card)] == 300.0
    await node.remove(ref)
    await sampled(node)
    assert await job_series(node) == {}  # a job gone is no series


async def test_no_per_job_series_by_default(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE)
    fake.usages[ref] = Usage(cpu_seconds=1.0, memory_bytes=5 * MIB, pids=2)
    await sampled(node)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with node.client.get("/metrics", headers=headers) as response:
        assert "tuneplane_node_job_" not in await response.text()
