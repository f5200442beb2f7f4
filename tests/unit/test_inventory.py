"""The machine's facts: storage per filesystem, the node id, collect(); the fabrics' are
test_fabrics.py's."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.clock import FakeClock
from tests.support.waiting import settle, wait_until
from tuneplane_node import __version__
from tuneplane_node.fabrics import FabricFacts
from tuneplane_node.inventory import (
    DiskGauge,
    Filesystem,
    LocalDisk,
    collect,
    filesystem_type,
    local_disk,
    node_id,
    read_mounts,
    space,
    storage_entries,
)
from tuneplane_node.settings import Fabric, NodeSettings


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
    assert entries[0].paths == (str(a.resolve()), str(b.resolve()))
    assert entries[0].fs_type == "ext4"
    assert entries[0].shared is False
    assert entries[0].total_bytes == total_bytes(tmp_path)
    assert local_disk(entries) == LocalDisk(entries[0].free_bytes, total_bytes(tmp_path))


def test_a_directory_listed_twice_appears_once(tmp_path: Path) -> None:
    (a,) = make_dirs(tmp_path, "data")

    entries = storage_entries([a, tmp_path / "data" / ".." / "data"], mountinfo=tmp_path / "none")

    assert entries[0].paths == (str(a.resolve()),)


def test_a_filer_is_shared_and_not_local_disk(tmp_path: Path) -> None:
    (filer,) = make_dirs(tmp_path, "filer")
    mountinfo = write_mountinfo(tmp_path / "mountinfo", {"/": "ext4", str(tmp_path): "nfs4"})

    entries = storage_entries([filer], mountinfo=mountinfo)

    assert [(e.fs_type, e.shared) for e in entries] == [("nfs4", True)]
    assert local_disk(entries) is None


def test_local_disk_sums_only_unshared_filesystems() -> None:
    entries = [
        Filesystem(("/scratch",), "ext4", False, free_bytes=10, total_bytes=100),
        Filesystem(("/filer",), "nfs4", True, free_bytes=9000, total_bytes=90000),
        Filesystem(("/nvme",), None, False, free_bytes=5, total_bytes=50),
    ]

    assert local_disk(entries) == LocalDisk(free_bytes=15, total_bytes=150)


def test_a_missing_directory_is_skipped_not_reported_full(tmp_path: Path) -> None:
    (present,) = make_dirs(tmp_path, "present")
    unmounted = tmp_path / "unmounted-filer"

    entries = storage_entries([unmounted, present], mountinfo=tmp_path / "none")

    assert [e.paths for e in entries] == [(str(present.resolve()),)]


def test_no_directory_at_all_is_unknown(tmp_path: Path) -> None:
    entries = storage_entries([tmp_path / "gone", tmp_path / "also-gone"])

    assert entries == []
    assert local_disk(entries) is None


def test_unreadable_mountinfo_leaves_the_type_unknown(tmp_path: Path) -> None:
    entries = storage_entries([tmp_path], mountinfo=tmp_path / "no-such-mountinfo")

    assert entries[0].fs_type is None
    assert entries[0].total_bytes == total_bytes(tmp_path)


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


def settings_for(tmp_path: Path, **fields: object) -> NodeSettings:
    values: dict[str, object] = {
        "storage_root": tmp_path / "storage",
        "node_state_dir": tmp_path / "state",
        "cluster_profile": "",
    }
    return NodeSettings(**{**values, **fields})  # type: ignore[arg-type]


def run_collect(tmp_path: Path, settings: NodeSettings, **kwargs: Path):  # type: ignore[no-untyped-def]
    arguments = {
        "sysfs": tmp_path / "no-infiniband",
        "mountinfo": write_mountinfo(tmp_path / "mountinfo", {"/": "ext4"}),
        **kwargs,
    }
    return collect(settings, **arguments)


def test_the_declared_series_is_reported_lower_cased(tmp_path: Path) -> None:
    declared = run_collect(tmp_path, settings_for(tmp_path, cluster_profile="H100-SXM"))
    undeclared = run_collect(tmp_path, settings_for(tmp_path, cluster_profile=""))

    assert declared.series == "h100-sxm"
    assert undeclared.series is None


def test_collect_describes_the_machine(tmp_path: Path) -> None:
    (tmp_path / "storage").mkdir()
    settings = settings_for(
        tmp_path,
        model_dirs=[tmp_path / "storage", tmp_path / "unmounted"],
        fabrics=[Fabric(name="compute", hcas=["mlx5_0"])],
    )

    facts = run_collect(tmp_path, settings)

    assert facts.storage_root_visible is True
    assert isinstance(facts.disk_free_bytes, int) and facts.disk_free_bytes > 0
    assert [entry.paths for entry in facts.storage] == [(str((tmp_path / "storage").resolve()),)]
    assert facts.fabrics == (FabricFacts("compute", ("mlx5_0",), None),)
    assert facts.node_id == node_id(tmp_path / "state")
    assert facts.agent_version == __version__
    assert isinstance(facts.cpu_count, int) and facts.cpu_count >= 1
    assert isinstance(facts.memory_bytes, int) and facts.memory_bytes > 0


def test_a_missing_storage_root_is_unknown_space_not_zero(tmp_path: Path) -> None:
    facts = run_collect(tmp_path, settings_for(tmp_path))

    assert facts.storage_root_visible is False
    assert facts.disk_free_bytes is None
    assert facts.storage == ()
    assert facts.local_disk is None


def test_one_failing_part_leaves_the_rest_reported(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemFree: 1 kB\n")
    (tmp_path / "state").write_text("a file where the state directory should be")

    facts = run_collect(tmp_path, settings_for(tmp_path), meminfo=tmp_path / "meminfo")

    assert facts.memory_bytes is None
    assert facts.node_id is None
    assert facts.cpu_count is not None and facts.hostname


def test_memory_is_memtotal_in_bytes(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       16316412 kB\nMemFree: 1 kB\n")

    facts = run_collect(tmp_path, settings_for(tmp_path), meminfo=tmp_path / "meminfo")

    assert facts.memory_bytes == 16316412 * 1024


# --- the disk health reports ---------------------------------------------------------------


def test_space_is_one_statvfs_in_bytes(tmp_path: Path) -> None:
    stat = os.statvfs(tmp_path)
    measured = space(tmp_path)
    assert measured is not None
    assert measured.total == stat.f_blocks * stat.f_frsize
    assert measured.available <= measured.free <= measured.total
    assert space(tmp_path / "nope") is None


async def test_the_disk_gauge_reads_at_most_once_a_second(tmp_path: Path) -> None:
    clock = FakeClock()
    gauge = DiskGauge(tmp_path / "root", clock=clock)
    assert await gauge.read() is None  # not there yet: unknown
    (tmp_path / "root").mkdir()
    assert await gauge.read() is None  # still the reading of a moment ago
    clock.advance(1.5)
    assert await gauge.read() is None  # the old reading at once; a refresh behind it
    reading = await settled(gauge)
    assert reading is not None and reading.path == str((tmp_path / "root").resolve())


async def settled(gauge: DiskGauge) -> Any:
    deadline = time.monotonic() + 5
    while (reading := await gauge.read()) is None:
        assert time.monotonic() < deadline, "the refresh never landed"
        await asyncio.sleep(0.01)
    return reading


async def test_a_burst_of_health_calls_measures_the_disk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Health never waits for statvfs but the first time, and 100 calls at once after
    the reading aged start one measurement, not 100 thread hops."""
    clock = FakeClock()
    gauge = DiskGauge(tmp_path, clock=clock)
    measured = 0
    real = gauge._measure

    def counted() -> Any:
        nonlocal measured
        measured += 1
        return real()

    monkeypatch.setattr(gauge, "_measure", counted)
    first = await asyncio.gather(*(gauge.read() for _ in range(100)))
    assert measured == 1 and all(reading is first[0] is not None for reading in first)
    clock.advance(1.5)
    again = await asyncio.gather(*(gauge.read() for _ in range(100)))
    assert all(reading is first[0] for reading in again)  # answered from the last reading
    await wait_until(lambda: measured == 2, timeout=5)  # the one refresh, on its thread
    await settle()
    assert measured == 2
