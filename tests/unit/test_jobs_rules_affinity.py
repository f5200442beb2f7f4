"""A job's CPUs and memory next to its cards: where a card's node and CPUs come from (the
simulation file, sysfs), and the rule that turns them into a cpuset, bounded by the
machine. The engines' side is tests/engines/test_daemon_affinity.py."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tests.support.jobs import job
from tuneplane_node.gpu import numa
from tuneplane_node.gpu.probe import CardFacts, GpuSnapshot
from tuneplane_node.gpu.simulation import SimulatedProbe
from tuneplane_node.jobs.rules.affinity import CpuAffinity
from tuneplane_node.runtime.spec import format_cpulist

REPO = Path(__file__).resolve().parents[2]
TWO_NODES: dict[int, tuple[int, ...]] = {0: (0, 1), 1: (2, 3)}  # the machine a test says it is


def snapshot(*cards: CardFacts) -> GpuSnapshot:
    return GpuSnapshot("simulation", True, None, None, None, cards, True, {})


def card(index: int, node: int | None, cpus: tuple[int, ...]) -> CardFacts:
    return CardFacts(index, numa_node=node, cpus=cpus)


GPUS = snapshot(card(0, 0, (0, 1)), card(1, 1, (2, 3)), card(2, None, ()), card(3, 1, (2, 3)))


def affinity(
    tmp_path: Path,
    nodes: dict[int, tuple[int, ...]] = TWO_NODES,
    cpus: tuple[int, ...] | None = None,
    **settings: object,
) -> CpuAffinity:
    return CpuAffinity(fake_settings(tmp_path, **settings), machine_nodes=nodes, machine_cpus=cpus)


def test_a_job_on_one_card_gets_the_cpus_and_memory_of_its_node(tmp_path: Path) -> None:
    spec = affinity(tmp_path).apply(job(["train"], gpus=(1,)), GPUS)
    assert (spec.cpuset_cpus, spec.cpuset_mems) == ((2, 3), (1,))
    assert spec.cpuset() == ("2-3", "1")


def test_a_job_across_two_nodes_gets_both(tmp_path: Path) -> None:
    spec = affinity(tmp_path).apply(job(["train"], gpus=(0, 3)), GPUS)
    assert spec.cpuset() == ("0-3", "0-1")


@pytest.mark.parametrize(
    ("gpus", "limit", "why"),
    [
        ((), None, None),  # no card, no cpuset: nothing to be near
        ((2,), None, "the NUMA node or CPUs of gpu [2] are unknown"),
        ((0, 2), None, "the NUMA node or CPUs of gpu [2] are unknown"),
        ((9,), None, "the NUMA node or CPUs of gpu [9] are unknown"),
        ((1,), 2.5, "cpu_limit 2.5 asks more than the 2 CPUs of NUMA node(s) 1"),
    ],
)
def test_no_cpuset_when_the_cards_place_is_unknown_or_too_small(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    gpus: tuple[int, ...],
    limit: float | None,
    why: str | None,
) -> None:
    caplog.set_level(logging.INFO, "tuneplane_node.jobs.rules.affinity")
    spec = affinity(tmp_path).apply(job(["train"], gpus=gpus, cpu_limit=limit), GPUS)
    assert spec.cpuset() == (None, None)
    said = [r.getMessage() for r in caplog.records]
    assert said == ([f"launch {spec.name}: no cpuset: {why}"] if why else [])


def test_a_cpu_limit_the_node_holds_is_confined(tmp_path: Path) -> None:
    spec = affinity(tmp_path).apply(job(["train"], gpus=(1,), cpu_limit=2), GPUS)
    assert spec.cpuset() == ("2-3", "1")


def test_off_confines_nobody(tmp_path: Path) -> None:
    spec = affinity(tmp_path, cpu_affinity="off").apply(job(["train"], gpus=(1,)), GPUS)
    assert spec.cpuset() == (None, None)


def test_cpus_and_nodes_this_machine_lacks_are_never_named(tmp_path: Path) -> None:
    """A development machine (one node, CPUs 0-1) under a file describing two sockets."""
    small = affinity(tmp_path, nodes={0: (0, 1)}, cpus=(0, 1))
    sim = snapshot(card(0, 0, (0, 1, 2)), card(1, 1, (1, 5)), card(2, 1, (6, 7)))
    assert small.apply(job(["t"], gpus=(0,)), sim).cpuset() == ("0-1", "0")  # CPU 2 dropped
    assert small.apply(job(["t"], gpus=(1,)), sim).cpuset() == ("1", None)  # no node 1 here
    assert small.apply(job(["t"], gpus=(2,)), sim).cpuset() == (None, None)  # no CPU at all
    assert small.placement((2,), sim).why == "none of the CPUs 6-7 is on this machine"


def test_the_limit_counts_the_cpus_that_exist(tmp_path: Path) -> None:
    small = affinity(tmp_path, nodes={0: (0, 1)}, cpus=(0, 1))
    sim = snapshot(card(0, 1, (1, 5)))
    assert small.apply(job(["t"], gpus=(0,), cpu_limit=2), sim).cpuset() == (None, None)


# --- where a card's place comes from ----------------------------------------------------


def test_the_simulation_file_gives_each_card_its_node_and_that_nodes_cpus(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gpus.json"
    cards = [{"index": 0, "numa_node": 0}, {"index": 1, "numa_node": 1}, {"index": 2}]
    cards.append({"index": 3, "numa_node": 7})  # a node the file gives no CPUs
    path.write_text(json.dumps({"cards": cards, "numa_cpus": {"0": [1, 0], "1": [2, 3]}}))
    gpus = SimulatedProbe(path, fake_settings(tmp_path)).snapshot()
    assert gpus.ok, gpus.error
    placed = [(c.numa_node, c.cpus) for c in gpus.cards]
    assert placed == [(0, (0, 1)), (1, (2, 3)), (None, ()), (7, ())]
    assert gpus.numa_nodes() == {0: 0, 1: 1, 3: 7}


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"cards": [{"index": 0, "numa_node": -1}]}, "cards[0].numa_node: needs a node >= 0"),
        ({"cards": [{"index": 0, "numa_node": "0"}]}, "cards[0].numa_node: expected int"),
        ({"numa_cpus": {"zero": [0]}}, "numa_cpus['zero']: a NUMA node is a whole number"),
        ({"numa_cpus": {"0": "0-3"}}, "numa_cpus['0']: expected list"),
        ({"numa_cpus": {"0": [-1]}}, "numa_cpus['0']: CPU numbers are >= 0"),
    ],
)
def test_a_bad_numa_entry_is_named(tmp_path: Path, data: object, said: str) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(data))
    gpus = SimulatedProbe(path, fake_settings(tmp_path)).snapshot()
    assert not gpus.ok and said in (gpus.error or "")


def test_cpu_lists_read_and_written_as_the_kernel_does() -> None:
    assert numa.parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert numa.parse_cpulist("") == ()
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    for bad in ("3-1", "x", "-1"):
        with pytest.raises(ValueError):
            numa.parse_cpulist(bad)


def test_sysfs_gives_the_machines_nodes_and_a_cards_node(tmp_path: Path) -> None:
    nodes = tmp_path / "node"
    for name, cpus in [("node0", "0-1\n"), ("node1", "2-3\n"), ("possible", "0-1\n")]:
        (nodes / name).mkdir(parents=True)
        (nodes / name / "cpulist").write_text(cpus)
    (nodes / "node2").mkdir()  # no cpulist: left out, not empty
    assert numa.node_cpus(nodes) == {0: (0, 1), 1: (2, 3)}
    assert numa.node_cpus(tmp_path / "absent") == {}

    pci = tmp_path / "pci"
    for device, node in [("0000:17:00.0", "1"), ("0000:18:00.0", "-1")]:
        (pci / device).mkdir(parents=True)
        (pci / device / "numa_node").write_text(f"{node}\n")
    assert numa.pci_numa_node("00000000:17:00.0", pci) == 1  # NVML's 8-digit domain
    assert numa.pci_numa_node("00000000:18:00.0", pci) is None  # the kernel does not know
    assert numa.pci_numa_node("00000000:19:00.0", pci) is None
    assert numa.pci_numa_node(None, pci) is None


def test_this_machines_own_lists_are_read() -> None:
    nodes, online = numa.node_cpus(), numa.online_cpus()
    if not nodes or online is None:
        pytest.skip("no NUMA node list in this machine's sysfs")
    assert set(online) <= {cpu for cpus in nodes.values() for cpu in cpus}


def test_the_gpu_check_script_reports_each_cards_node_and_the_cpuset_it_expects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """contrib/dev/gpu_check.py runs only on a GPU machine; its NUMA part is the same
    code on a simulated snapshot, so it is proven to run before that machine is lent."""
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "contrib/dev/gpu_check.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    online = numa.online_cpus() or ()
    if 0 not in online:
        pytest.skip("needs CPU 0")
    path = tmp_path / "gpus.json"
    cards = [{"index": 0, "numa_node": 0, "pci_bus_id": "00000000:17:00.0"}, {"index": 1}]
    path.write_text(json.dumps({"cards": cards, "numa_cpus": {"0": [0, 4096]}}))
    gpus = SimulatedProbe(path, fake_settings(tmp_path)).snapshot()

    assert script.numa_check(gpus) == {0: "0"}  # CPU 4096 is on no machine
    printed = capsys.readouterr().out
    assert "gpu 0: numa_node 0 cpus 0,4096" in printed
    assert "gpu 1: numa_node None cpus unknown" in printed
    assert "FAILED: the driver gives every card a NUMA node and its CPUs" in printed
