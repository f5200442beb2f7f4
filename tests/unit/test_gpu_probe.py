from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.clock import FakeClock
from tests.nvmlprobe import nvml_library_loads, settings
from tuneplane_node.daemon.machine import (
    card_json,
)
from tuneplane_node.gpu.factory import make_probe
from tuneplane_node.gpu.probe import GpuProcess, NoDriverProbe
from tuneplane_node.gpu.simulation import SimulatedProbe
from tuneplane_node.runtime.cgroups import container_id_of_pid

H100 = {
    "name": "NVIDIA H100 80GB HBM3",
    "memory_total_mib": 81559,
    "memory_used_mib": 0,
    "temperature_c": 40,
}


def write(path: Path, cards: list[dict[str, Any]], **top: Any) -> None:
    path.write_text(json.dumps({"driver": "580.159.03", "cuda": "13.0", "cards": cards, **top}))


@pytest.fixture
def sim(tmp_path: Path) -> Path:
    return tmp_path / "gpus.json"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def probe_for(sim: Path, clock: FakeClock, **values: Any) -> SimulatedProbe:
    return SimulatedProbe(sim, settings(gpu_simulation_file=sim, **values), clock=clock)


def unhealthy(probe: SimulatedProbe) -> dict[int, str | None]:
    snap = probe.snapshot()
    assert snap.ok, snap.error
    return {card.index: card.unhealthy for card in snap.cards}


# --- simulation file --------------------------------------------------------------------


def test_simulation_reports_cards_processes_and_links(sim: Path, clock: FakeClock) -> None:
    write(
        sim,
        [
            {"index": 1, "uuid": "GPU-b", **H100},
            {
                "index": 0,
                "uuid": "GPU-a",
                "pci_bus_id": "00000000:17:00.0",
                **H100,
                "processes": [{"pid": 1234, "used_mib": 500}, {"pid": 99}],
            },
        ],
        links=[[1, 0, "nvlink"]],
    )
    snap = probe_for(sim, clock).snapshot()
    assert (snap.ok, snap.error, snap.source) == (True, None, "simulation")
    assert (snap.driver, snap.cuda) == ("580.159.03", "13.0")
    assert [c.index for c in snap.cards] == [0, 1]
    first = snap.cards[0]
    assert first.uuid == "GPU-a" and first.memory_total_mib == 81559 and first.unhealthy is None
    assert first.processes == (GpuProcess(1234, 500), GpuProcess(99, None))
    assert snap.processes_ok is True
    assert dict(snap.links) == {(0, 1): "nvlink"}
    assert card_json(first)["processes"] == [
        {"pid": 1234, "used_mib": 500},
        {"pid": 99, "used_mib": None},
    ]
    assert card_json(snap.cards[1])["pci_bus_id"] is None


def test_file_is_read_again_after_an_edit(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock)
    write(sim, [{"index": 0}])
    assert len(probe.snapshot().cards) == 1
    write(sim, [{"index": 0}, {"index": 1, "processes": [{"pid": 7}]}])
    snap = probe.snapshot()
    assert [c.index for c in snap.cards] == [0, 1]
    assert snap.cards[1].processes == (GpuProcess(7),)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "No such file"),
        ("{not json", "Expecting property name"),
        ('{"cards": [{"name": "x"}]}', "cards[0]: needs an index"),
        ('{"cards": [{"index": true}]}', "cards[0].index: expected int, got True"),
        ('{"cards": [{"index": 0}, {"index": 0}]}', "duplicate index"),
        ('{"cards": [{"index": 0, "memory_total_mib": "lots"}]}', "memory_total_mib"),
        ('{"cards": [{"index": 0, "processes": [{"used_mib": 1}]}]}', "needs a pid"),
        ('{"cards": [{"index": 0}, {"index": 1}], "links": [[0, 1, "fast"]]}', "kind must be"),
        ('{"cards": [{"index": 0}], "links": [[0, 5, "nvlink"]]}', "listed cards"),
        ("[]", "top level: expected dict"),
    ],
)
def test_bad_file_is_not_ok_and_says_why(
    sim: Path, clock: FakeClock, content: str | None, reason: str
) -> None:
    if content is not None:
        sim.write_text(content)
    snap = probe_for(sim, clock).snapshot()
    assert snap.ok is False
    assert snap.error is not None and reason in snap.error and str(sim) in snap.error
    assert snap.cards == () and snap.processes_ok is False


def test_a_bad_file_warns_once_until_it_changes(
    sim: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    probe = probe_for(sim, clock)
    with caplog.at_level(logging.WARNING, logger="tuneplane_node.gpu.simulation"):
        probe.snapshot()
        probe.snapshot()
        sim.write_text("{")
        probe.snapshot()
        write(sim, [{"index": 0}])
        assert probe.snapshot().ok
        sim.unlink()
        probe.snapshot()
    assert len(caplog.records) == 3


# --- health -----------------------------------------------------------------------------


def test_uncorrectable_ecc_marks_the_card_until_it_reads_zero(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock)
    write(sim, [{"index": 0, "ecc_uncorrected": 3}, {"index": 1, "ecc_uncorrected": 0}])
    assert unhealthy(probe) == {0: "uncorrectable ECC errors: 3", 1: None}
    write(sim, [{"index": 0, "ecc_uncorrected": 0}, {"index": 1}])
    assert unhealthy(probe) == {0: None, 1: None}


def test_retired_pages_pending_marks_the_card_while_it_reads(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock)
    write(sim, [{"index": 0, "retired_pages_pending": True}])
    assert "retired pages pending" in (unhealthy(probe)[0] or "")
    write(sim, [{"index": 0, "retired_pages_pending": False}])
    assert unhealthy(probe) == {0: None}


def test_lost_card_is_unhealthy_while_it_does_not_answer(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock)
    write(sim, [{"index": 0}, {"index": 1, "lost": True}])
    assert unhealthy(probe) == {0: None, 1: "lost: not answering"}
    write(sim, [{"index": 0}, {"index": 1}])
    assert unhealthy(probe) == {0: None, 1: None}


@pytest.mark.parametrize(("xid", "ignore"), [(13, None), (43, None), (79, [79])])
def test_application_xid_leaves_the_card_healthy(
    sim: Path, clock: FakeClock, xid: int, ignore: list[int] | None
) -> None:
    extra = {} if ignore is None else {"gpu_xid_ignore": ignore}
    write(sim, [{"index": 0, "xid": [xid]}])
    assert unhealthy(probe_for(sim, clock, **extra)) == {0: None}


def test_critical_xid_quarantines_the_card_then_releases_it(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock, gpu_xid_quarantine_s=600)
    write(sim, [{"index": 0, "xid": [13, 79]}, {"index": 1}])
    reason = unhealthy(probe)[0]
    assert reason is not None and reason.startswith("XID 79 at 20")
    write(sim, [{"index": 0}, {"index": 1}])  # the event was read; it does not repeat
    clock.t += 599
    assert unhealthy(probe) == {0: reason, 1: None}
    clock.t += 2
    assert unhealthy(probe) == {0: None, 1: None}


def test_new_critical_xid_restarts_the_quarantine(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock, gpu_xid_quarantine_s=600)
    write(sim, [{"index": 0, "xid": [48]}])
    assert unhealthy(probe)[0] is not None
    clock.t += 500
    write(sim, [{"index": 0, "xid": [79]}])
    assert "XID 79" in (unhealthy(probe)[0] or "")
    write(sim, [{"index": 0}])
    clock.t += 500  # 1000 s after the first, 500 after the second
    assert "XID 79" in (unhealthy(probe)[0] or "")
    clock.t += 101
    assert unhealthy(probe) == {0: None}


def test_health_check_off_never_marks_a_card(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock, local_check_gpu_health=False)
    write(sim, [{"index": 0, "ecc_uncorrected": 5, "xid": [79]}, {"index": 1, "lost": True}])
    assert unhealthy(probe) == {0: None, 1: None}


def test_several_faults_are_all_named(sim: Path, clock: FakeClock) -> None:
    write(sim, [{"index": 0, "ecc_uncorrected": 1, "retired_pages_pending": True}])
    reason = unhealthy(probe_for(sim, clock))[0] or ""
    assert "uncorrectable ECC errors: 1" in reason and "retired pages pending" in reason


def test_simulation_file_setting_gives_the_simulated_probe(sim: Path) -> None:
    write(sim, [{"index": 0}])
    probe = make_probe(settings(gpu_simulation_file=sim))
    try:
        assert isinstance(probe, SimulatedProbe)
        assert probe.snapshot().cards[0].index == 0
    finally:
        probe.close()


@pytest.mark.skipif(nvml_library_loads(), reason="this machine has an NVIDIA driver")
def test_no_driver_gives_a_probe_that_says_why(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tuneplane_node.gpu.factory"):
        probe = make_probe(settings())
    try:
        assert isinstance(probe, NoDriverProbe)
        snap = probe.snapshot()
        assert (snap.ok, snap.source, snap.cards, snap.processes_ok) == (False, "none", (), False)
        assert snap.error is not None and "NVML" in snap.error
        assert [r.getMessage() for r in caplog.records] == [f"GPU probe: none ({snap.error})"]
    finally:
        probe.close()


def test_an_nvml_affinity_mask_is_read_as_cpu_numbers() -> None:
    nvml = pytest.importorskip("tuneplane_node.gpu.nvml")
    assert nvml.mask_numbers(None) == ()
    assert nvml.mask_numbers([0b1011, 0, 1]) == (0, 1, 3, 128)  # word 2, bit 0: CPU 128


# --- which container a process belongs to ---------------------------------------------

ID = "4f3c2b1a" * 8
OTHER = "0123abcd" * 8


@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::/system.slice/docker-{ID}.scope\n",
        f"12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n",
        f"0::/machine.slice/libpod-{ID}.scope/container\n",
        f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n",
        f"5:memory:/libpod_parent/libpod-{ID}\n",
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/"
        f"cri-containerd-{ID}.scope\n",
        f"0::/kubepods/burstable/pod6f1c9a3e-1b2c-4d5e-8f90-123456789abc/{ID}\n",
        f"0::/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope\n",
        f"0::/docker/{ID}/docker/{OTHER}\n",  # nested: the host's engine knows the outer one
    ],
)
def test_container_id_found_in_cgroup(tmp_path: Path, cgroup: str) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(cgroup)
    assert container_id_of_pid(4242, proc_root=tmp_path) == ID


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        f"0::/system.slice/libpod-conmon-{ID[:12]}.scope\n",
        f"0::/system.slice/docker-{ID}x.scope\n",
        "",
    ],
)
def test_host_process_has_no_container(tmp_path: Path, cgroup: str) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(cgroup)
    assert container_id_of_pid(7, proc_root=tmp_path) is None


def test_missing_process_has_no_container(tmp_path: Path) -> None:
    assert container_id_of_pid(31337, proc_root=tmp_path) is None
