"""The inventory: storage per filesystem, fabrics from sysfs, the node id, collect()."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

import pytest

from tuneplane_node import __version__
from tuneplane_node.errors import ConfigError
from tuneplane_node.gpu.probe import CardFacts, GpuSnapshot
from tuneplane_node.inventory import (
    check_fabrics,
    collect,
    fabrics,
    filesystem_type,
    local_disk,
    node_id,
    read_mounts,
    storage_entries,
)
from tuneplane_node.settings import Fabric, NodeSettings

CONSOLE_FIELDS = {
    "accelerator_series",
    "accelerator_name",
    "accelerator_count",
    "driver",
    "runtime",
    "storage_root_visible",
    "disk_free_bytes",
    "cpu_count",
    "memory_bytes",
}
H100 = "NVIDIA H100 80GB HBM3"


def write_mountinfo(path: Path, mounts: dict[str, str]) -> Path:
    """A mountinfo file declaring each mount point (escaped as the kernel does) with its type."""
    lines = [
        f"{n} 1 0:{n} / {point.replace(' ', chr(92) + '040')} rw,relatime shared:{n}"
        f" - {fs_type} src{n} rw"
        for n, (point, fs_type) in enumerate(mounts.items(), start=20)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_dirs(root: Path, *names: str) -> list[Path]:
    paths = [root / name for name in names]
    for path in paths:
        path.mkdir(parents=True)
    return paths


def total_bytes(path: Path) -> int:
    space = os.statvfs(path)
    return space.f_blocks * space.f_frsize


# --- storage ---------------------------------------------------------------------------


def test_two_directories_on_one_disk_count_once(tmp_path: Path) -> None:
    a, b = make_dirs(tmp_path, "checkpoints", "models")
    mountinfo = write_mountinfo(tmp_path / "mountinfo", {"/": "ext4"})

    entries = storage_entries([a, b], mountinfo=mountinfo)

    assert len(entries) == 1
    assert entries[0]["paths"] == [str(a.resolve()), str(b.resolve())]
    assert entries[0]["fs_type"] == "ext4"
    assert entries[0]["shared"] is False
    assert entries[0]["total_bytes"] == total_bytes(tmp_path)
    assert local_disk(entries) == {
        "free_bytes": entries[0]["free_bytes"],
        "total_bytes": total_bytes(tmp_path),
    }


def test_a_directory_listed_twice_appears_once(tmp_path: Path) -> None:
    (a,) = make_dirs(tmp_path, "data")

    entries = storage_entries([a, tmp_path / "data" / ".." / "data"], mountinfo=tmp_path / "none")

    assert entries[0]["paths"] == [str(a.resolve())]


def test_a_filer_is_shared_and_not_local_disk(tmp_path: Path) -> None:
    (filer,) = make_dirs(tmp_path, "filer")
    mountinfo = write_mountinfo(tmp_path / "mountinfo", {"/": "ext4", str(tmp_path): "nfs4"})

    entries = storage_entries([filer], mountinfo=mountinfo)

    assert [(e["fs_type"], e["shared"]) for e in entries] == [("nfs4", True)]
    assert local_disk(entries) is None


def test_local_disk_sums_only_unshared_filesystems() -> None:
    entries: list[dict[str, object]] = [
        {"paths": ["/scratch"], "shared": False, "free_bytes": 10, "total_bytes": 100},
        {"paths": ["/filer"], "shared": True, "free_bytes": 9000, "total_bytes": 90000},
        {"paths": ["/nvme"], "shared": False, "free_bytes": 5, "total_bytes": 50},
    ]

    assert local_disk(entries) == {"free_bytes": 15, "total_bytes": 150}


def test_a_missing_directory_is_skipped_not_reported_full(tmp_path: Path) -> None:
    (present,) = make_dirs(tmp_path, "present")
    unmounted = tmp_path / "unmounted-filer"

    entries = storage_entries([unmounted, present], mountinfo=tmp_path / "none")

    assert [e["paths"] for e in entries] == [[str(present.resolve())]]


def test_no_directory_at_all_is_unknown(tmp_path: Path) -> None:
    entries = storage_entries([tmp_path / "gone", tmp_path / "also-gone"])

    assert entries == []
    assert local_disk(entries) is None


def test_unreadable_mountinfo_leaves_the_type_unknown(tmp_path: Path) -> None:
    entries = storage_entries([tmp_path], mountinfo=tmp_path / "no-such-mountinfo")

    assert entries[0]["fs_type"] is None
    assert entries[0]["total_bytes"] == total_bytes(tmp_path)


def test_the_deepest_mount_holding_a_path_gives_its_type(tmp_path: Path) -> None:
    mounts = read_mounts(
        write_mountinfo(
            tmp_path / "mountinfo",
            {
                "/": "ext4",
                "/mnt/lab filer": "nfs4",
                "/mnt/lab filer/fast": "lustre",
                "/mnt/l": "xfs",
            },
        )
    )

    assert filesystem_type(Path("/mnt/lab filer/models"), mounts) == "nfs4"
    assert filesystem_type(Path("/mnt/lab filer/fast/ckpt"), mounts) == "lustre"
    assert filesystem_type(Path("/mnt/lab filer"), mounts) == "nfs4"
    assert filesystem_type(Path("/mnt/lab"), mounts) == "ext4"  # /mnt/l is not its parent


def test_of_stacked_mounts_the_last_one_is_on_top(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "20 1 8:1 / /data rw - ext4 /dev/sda1 rw\n21 20 0:50 / /data rw - nfs4 filer:/x rw\n"
    )

    assert filesystem_type(Path("/data/x"), read_mounts(mountinfo)) == "nfs4"


# --- fabrics ---------------------------------------------------------------------------


def add_port(sysfs: Path, hca: str, port: int, state: str, rate: str) -> None:
    directory = sysfs / hca / "ports" / str(port)
    directory.mkdir(parents=True)
    (directory / "state").write_text(state + "\n")
    (directory / "rate").write_text(rate + "\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "infiniband"
    add_port(root, "mlx5_0", 1, "4: ACTIVE", "200 Gb/sec (4X HDR)")
    add_port(root, "mlx5_1", 1, "4: ACTIVE", "100 Gb/sec (4X EDR)")
    add_port(root, "mlx5_1", 2, "1: DOWN", "10 Gb/sec (4X)")
    add_port(root, "mlx5_2", 1, "1: DOWN", "400 Gb/sec (4X NDR)")
    add_port(root, "mlx5_9", 1, "4: ACTIVE", "25 Gb/sec (1X EDR)")
    return root


def test_a_fabric_runs_at_its_slowest_active_port(sysfs: Path) -> None:
    configured = [
        Fabric(name="compute", hcas=["mlx5_0", "mlx5_1"]),
        Fabric(name="storage", hcas=["mlx5_2"]),
    ]

    assert fabrics(configured, sysfs=sysfs) == [
        {"fabric": "compute", "hcas": ["mlx5_0", "mlx5_1"], "rate_gbps": 100.0},
        {"fabric": "storage", "hcas": ["mlx5_2"], "rate_gbps": None},
    ]


def test_no_fabric_configured_reports_none(sysfs: Path) -> None:
    assert fabrics([], sysfs=sysfs) == []


def test_check_fabrics_names_the_missing_hca(sysfs: Path) -> None:
    configured = [Fabric(name="compute", hcas=["mlx5_0", "mlx5_7"])]

    with pytest.raises(ConfigError) as caught:
        check_fabrics(configured, sysfs=sysfs)

    assert "mlx5_7 (fabric compute)" in caught.value.message
    assert "mlx5_0 (fabric" not in caught.value.message
    assert "TUNEPLANE_FABRICS" in caught.value.message


@pytest.mark.parametrize("hca", ["../mlx5_0", "/etc", ".."])
def test_check_fabrics_refuses_a_name_that_is_a_path(sysfs: Path, hca: str) -> None:
    with pytest.raises(ConfigError):
        check_fabrics([Fabric(name="compute", hcas=[hca])], sysfs=sysfs / "mlx5_1")


def test_check_fabrics_passes_when_every_hca_is_there(sysfs: Path, tmp_path: Path) -> None:
    check_fabrics([Fabric(name="compute", hcas=["mlx5_0", "mlx5_2"])], sysfs=sysfs)
    check_fabrics([], sysfs=tmp_path / "no-infiniband-here")


# --- node id ---------------------------------------------------------------------------


def test_node_id_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "not" / "yet" / "made"

    first = node_id(state)
    again = node_id(state)

    assert first is not None
    assert uuid.UUID(first).version == 4
    assert again == first
    assert (state / "node-id").read_text().strip() == first
    assert [p.name for p in state.iterdir()] == ["node-id"]  # no temporary file left


def test_two_starts_at_once_agree_on_one_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    winner = str(uuid.uuid4())
    real_link = os.link

    def another_process_wins(source: str, target: str) -> None:
        Path(target).write_text(winner + "\n")
        real_link(source, target)

    monkeypatch.setattr(os, "link", another_process_wins)

    assert node_id(tmp_path) == winner
    assert [p.name for p in tmp_path.iterdir()] == ["node-id"]


def test_another_state_dir_is_another_node(tmp_path: Path) -> None:
    assert node_id(tmp_path / "a") != node_id(tmp_path / "b")


def test_node_id_is_unknown_when_the_state_dir_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")

    assert node_id(tmp_path / "a-file" / "state") is None


def test_a_damaged_node_id_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "node-id").write_text("not a uuid\n")

    assert node_id(tmp_path) is None
    assert (tmp_path / "node-id").read_text() == "not a uuid\n"


# --- collect ---------------------------------------------------------------------------


def snapshot(*names: str, ok: bool = True) -> GpuSnapshot:
    cards = tuple(
        CardFacts(index=i, uuid=f"GPU-{i}", name=name, memory_total_mib=81559)
        for i, name in enumerate(names)
    )
    return GpuSnapshot(
        source="test",
        ok=ok,
        error=None if ok else "driver gone",
        driver="580.159.03",
        cuda="13.0",
        cards=cards,
        processes_ok=ok,
        links=MappingProxyType({}),
    )


def settings_for(tmp_path: Path, **fields: object) -> NodeSettings:
    values: dict[str, object] = {
        "storage_root": tmp_path / "storage",
        "node_state_dir": tmp_path / "state",
        "cluster_profile": "",
    }
    return NodeSettings(**{**values, **fields})  # type: ignore[arg-type]


def run_collect(tmp_path: Path, settings: NodeSettings, **kwargs: object) -> dict[str, object]:
    arguments: dict[str, object] = {
        "gpus": None,
        "accelerator_count": None,
        "runtime": "docker://20.10.24",
        "sysfs": tmp_path / "no-infiniband",
        "mountinfo": write_mountinfo(tmp_path / "mountinfo", {"/": "ext4"}),
    }
    return collect(settings, **{**arguments, **kwargs})  # type: ignore[arg-type]


def test_collect_reports_the_cards_the_driver_sees(tmp_path: Path) -> None:
    gpus = snapshot("NVIDIA H100 PCIe", H100, H100)

    inventory = run_collect(tmp_path, settings_for(tmp_path), gpus=gpus)

    assert inventory["accelerator_name"] == H100  # the most common, not the first
    assert inventory["accelerator_count"] == 3
    assert inventory["driver"] == "580.159.03"
    assert inventory["cuda_version"] == "13.0"
    assert inventory["gpus"] == [card.to_json() for card in gpus.cards]


def test_the_allocators_count_wins_over_the_drivers(tmp_path: Path) -> None:
    inventory = run_collect(
        tmp_path, settings_for(tmp_path), gpus=snapshot(H100, H100), accelerator_count=1
    )

    assert inventory["accelerator_count"] == 1


def test_a_driver_that_did_not_answer_gives_no_count(tmp_path: Path) -> None:
    inventory = run_collect(tmp_path, settings_for(tmp_path), gpus=snapshot(ok=False))

    assert inventory["accelerator_count"] is None
    assert inventory["accelerator_name"] is None


def test_without_a_snapshot_the_gpus_are_unknown(tmp_path: Path) -> None:
    inventory = run_collect(tmp_path, settings_for(tmp_path), gpus=None)

    assert inventory["accelerator_name"] is None
    assert inventory["accelerator_count"] is None
    assert inventory["driver"] is None
    assert inventory["cuda_version"] is None
    assert inventory["gpus"] == []


def test_the_declared_series_is_reported_lower_cased(tmp_path: Path) -> None:
    declared = run_collect(tmp_path, settings_for(tmp_path, cluster_profile="H100-SXM"))
    undeclared = run_collect(tmp_path, settings_for(tmp_path, cluster_profile=""))

    assert declared["accelerator_series"] == "h100-sxm"
    assert undeclared["accelerator_series"] is None


def test_collect_describes_the_machine(tmp_path: Path) -> None:
    (tmp_path / "storage").mkdir()
    settings = settings_for(
        tmp_path,
        model_dirs=[tmp_path / "storage", tmp_path / "unmounted"],
        fabrics=[Fabric(name="compute", hcas=["mlx5_0"])],
    )

    inventory = run_collect(tmp_path, settings)

    assert inventory.keys() >= CONSOLE_FIELDS
    assert inventory["runtime"] == "docker://20.10.24"
    assert inventory["storage_root_visible"] is True
    assert isinstance(inventory["disk_free_bytes"], int)
    storage = inventory["storage"]
    assert isinstance(storage, list)
    assert [entry["paths"] for entry in storage] == [[str((tmp_path / "storage").resolve())]]
    assert inventory["fabrics"] == [{"fabric": "compute", "hcas": ["mlx5_0"], "rate_gbps": None}]
    assert inventory["node_id"] == node_id(tmp_path / "state")
    assert inventory["agent_version"] == __version__
    assert isinstance(inventory["cpu_count"], int) and inventory["cpu_count"] >= 1
    assert isinstance(inventory["memory_bytes"], int) and inventory["memory_bytes"] > 0
    json.dumps(inventory)  # the console gets it as JSON


def test_a_missing_storage_root_is_unknown_space_not_zero(tmp_path: Path) -> None:
    inventory = run_collect(tmp_path, settings_for(tmp_path))

    assert inventory["storage_root_visible"] is False
    assert inventory["disk_free_bytes"] is None
    assert inventory["storage"] == []
    assert inventory["local_disk"] is None


class BrokenCard(CardFacts):
    def to_json(self) -> dict[str, object]:
        raise RuntimeError("bug in a probe")


def test_one_failing_part_leaves_the_rest_reported(tmp_path: Path) -> None:
    gpus = replace(snapshot(H100), cards=(BrokenCard(index=0, name=H100),))
    (tmp_path / "meminfo").write_text("MemFree: 1 kB\n")

    inventory = run_collect(
        tmp_path, settings_for(tmp_path), gpus=gpus, meminfo=tmp_path / "meminfo"
    )

    assert inventory["gpus"] == []
    assert inventory["memory_bytes"] is None
    assert inventory["accelerator_name"] == H100
    assert inventory["driver"] == "580.159.03"


def test_memory_is_memtotal_in_bytes(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       16316412 kB\nMemFree: 1 kB\n")

    inventory = run_collect(tmp_path, settings_for(tmp_path), meminfo=tmp_path / "meminfo")

    assert inventory["memory_bytes"] == 16316412 * 1024
