"""What a job wrote, as the disk monitor counts it on a real directory tree: allocated
blocks (a sparse file counts what was written into it), a file of several links once,
no link followed, a walk cut at its budget a lower bound; and the project-quota
decision, which this machine's kernel (no CONFIG_QUOTA) can only be asked of on paper."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tuneplane_node import inventory
from tuneplane_node.runtime import diskwalk, openfiles
from tuneplane_node.runtime.engines import store

MIB = 2**20


def test_written_blocks_count_and_a_sparse_files_size_does_not(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "data").write_bytes(os.urandom(2 * MIB))
    with (tmp_path / "sparse").open("wb") as sparse:
        sparse.truncate(10 * 2**30)  # 10 GiB apparent, nothing written
        sparse.write(b"x" * MIB)
    used = diskwalk.measure([str(tmp_path)], budget_s=5).used_bytes
    assert used is not None and 3 * MIB <= used < 4 * MIB


def test_no_link_is_followed_and_a_hard_link_counts_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(4 * MIB))
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "host").symlink_to(outside)  # a job's link to what is not its own
    (layer / "one").write_bytes(os.urandom(MIB))
    os.link(layer / "one", layer / "two")
    used = diskwalk.measure([str(layer)], budget_s=5).used_bytes
    assert used is not None and MIB <= used < 2 * MIB


def test_a_walk_past_its_budget_is_a_lower_bound(tmp_path: Path) -> None:
    for i in range(600):
        (tmp_path / f"f{i}").write_bytes(b"x")
    ticks = iter(range(10_000))
    cut = diskwalk.measure([str(tmp_path)], budget_s=1, clock=lambda: next(ticks))
    whole = diskwalk.measure([str(tmp_path)], budget_s=60)
    assert not cut.complete and whole.complete
    assert cut.used_bytes is not None and whole.used_bytes is not None
    assert 0 < cut.used_bytes < whole.used_bytes


def test_a_layer_gone_counts_nothing(tmp_path: Path) -> None:
    assert diskwalk.measure([str(tmp_path / "gone")], budget_s=1).used_bytes == 0


def test_the_written_dirs_are_the_upper_dir_and_the_volumes() -> None:
    doc = {
        "GraphDriver": {"Name": "overlay2", "Data": {"UpperDir": "/e/overlay2/abc/diff"}},
        "Mounts": [
            {"Type": "volume", "Source": "/e/volumes/f00/_data"},
            {"Type": "bind", "Source": "/data/team"},  # the host's, not the job's writing
        ],
    }
    assert diskwalk.written_dirs(doc) == ("/e/overlay2/abc/diff", "/e/volumes/f00/_data")
    assert diskwalk.written_dirs({"GraphDriver": {"Name": "vfs", "Data": None}}) == ()


@pytest.mark.parametrize(
    ("backing", "options", "enforced"),
    [
        ("xfs", "rw,relatime,attr2,inode64,prjquota", True),
        ("xfs", "rw,pquota", True),
        ("xfs", "rw,pqnoenforce", False),  # counts, never refuses
        ("xfs", "rw,relatime", False),
        ("extfs", "rw,prjquota", False),  # the engines bound overlay on xfs only
        (None, "rw,pquota", None),
        ("xfs", None, None),
    ],
)
def test_project_quotas_are_xfs_with_pquota(
    backing: str | None, options: str | None, enforced: bool | None
) -> None:
    assert store.project_quotas(backing, options) is enforced


def test_both_engines_say_their_backing_filesystem() -> None:
    docker = [["Backing Filesystem", "xfs"], ["Supports d_type", "true"]]
    podman = {"Backing Filesystem": "extfs", "Native Overlay Diff": "true"}
    assert store.backing_filesystem(docker) == "xfs"
    assert store.backing_filesystem(podman) == "extfs"
    assert store.backing_filesystem(None) is None


def test_the_size_option_only_with_a_limit_and_quotas() -> None:
    assert store.size_option(100 * MIB, True) == {"storage_opt": {"size": str(100 * MIB)}}
    assert store.size_option(100 * MIB, False) == {}
    assert store.size_option(None, True) == {}


def test_pid_and_memory_pressure_from_proc(tmp_path: Path) -> None:
    proc = tmp_path
    (proc / "loadavg").write_text("0.10 0.20 0.30 2/29600 1234\n")
    (proc / "pid_max").write_text("32768\n")
    assert inventory.pid_pressure(proc / "loadavg", proc / "pid_max") is True
    (proc / "loadavg").write_text("0.10 0.20 0.30 2/3000 1234\n")
    assert inventory.pid_pressure(proc / "loadavg", proc / "pid_max") is False
    assert inventory.pid_pressure(proc / "none", proc / "pid_max") is None
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 50000 kB\n")
    assert inventory.memory_pressure(proc / "meminfo") is True
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 5000000 kB\n")
    assert inventory.memory_pressure(proc / "meminfo") is False
    assert inventory.memory_pressure(proc / "none") is None


def test_a_mounts_options_are_read_for_the_path_under_it(tmp_path: Path) -> None:
    proc = tmp_path
    (proc / "mountinfo").write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw,errors=remount-ro\n"
        "40 22 8:16 / /var/lib/docker rw,relatime - xfs /dev/sdb rw,attr2,prjquota\n"
    )
    found = inventory.superoptions(Path("/var/lib/docker/overlay2"), proc / "mountinfo")
    assert found == "rw,attr2,prjquota"
    assert inventory.superoptions(Path("/home"), proc / "mountinfo") == "rw,errors=remount-ro"


def test_a_deleted_file_held_open_counts_once_and_memory_files_do_not(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    (cgroup / "child").mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text("")
    (cgroup / "child" / "cgroup.procs").write_text(f"{os.getpid()}\n")  # a job's own cgroup
    kept = tmp_path / "kept"
    kept.write_bytes(os.urandom(MIB))
    with (tmp_path / "gone").open("wb") as gone, kept.open("rb"):
        gone.write(os.urandom(2 * MIB))
        gone.flush()
        twice = os.dup(gone.fileno())
        memory = os.memfd_create("not-the-store")
        os.write(memory, os.urandom(MIB))
        os.unlink(tmp_path / "gone")
        try:
            pids = openfiles.processes(cgroup)
            assert pids == [os.getpid()]
            devices = {os.stat(tmp_path).st_dev}
            held = openfiles.held_deleted(pids, devices, deadline=time.monotonic() + 30)
        finally:
            os.close(twice)
            os.close(memory)
    assert held.complete and held.bytes == 2 * MIB
    assert openfiles.processes(tmp_path / "no-such-cgroup") is None  # unknown, not zero


def test_every_entry_is_an_inode_and_a_hard_link_one(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"empty{i}").touch()  # no blocks, an inode each
    os.link(tmp_path / "d" / "empty0", tmp_path / "again")
    (tmp_path / "link").symlink_to("d")
    assert diskwalk.measure([str(tmp_path)], budget_s=5).inodes == 7  # d, 5 files, the link
