"""The jobs' parent cgroup: its form by the engine's driver, its place on cgroup v1 and
v2, the node's figures, and the files the node writes and reads, on a cgroup tree made
of plain files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fake_settings
from tests.support.engines import engine_settings
from tuneplane_node.checks.engine import _parent_finding, parent_fix
from tuneplane_node.errors import ConfigError
from tuneplane_node.runtime.cgroups import Bounds, wanted
from tuneplane_node.runtime.engines.cgroupparent import (
    JobParent,
    ParentReport,
    describe_parent,
    is_unified,
    read,
    slice_path,
    write,
)
from tuneplane_node.runtime.engines.docker import DockerRuntime

GIB = 2**30


@pytest.mark.parametrize(
    ("driver", "form", "path"),
    [
        ("cgroupfs", "/tuneplane-jobs", "/tuneplane-jobs"),
        # systemd nests a slice by its dashes: what docker's systemd driver creates.
        ("systemd", "tuneplane-jobs.slice", "/tuneplane.slice/tuneplane-jobs.slice"),
    ],
)
def test_the_engines_cgroup_driver_decides_the_parents_form(
    driver: str, form: str, path: str
) -> None:
    parent = JobParent("tuneplane-jobs", driver=driver, unified=False)
    assert (parent.engine_form, parent.path) == (form, path)
    assert parent.owned is (driver == "cgroupfs")  # a slice is systemd's to bound


def test_a_slice_without_dashes_sits_at_the_root() -> None:
    assert slice_path("kubepods.slice") == "/kubepods.slice"
    assert slice_path("a-b-c.slice") == "/a.slice/a-b.slice/a-b-c.slice"


def test_v1_has_a_directory_per_controller_and_v2_one(tmp_path: Path) -> None:
    v1 = JobParent("jobs", driver="cgroupfs", unified=False)
    v2 = JobParent("jobs", driver="systemd", unified=True)
    assert v1.dirs(tmp_path) == {"pids": tmp_path / "pids/jobs", "memory": tmp_path / "memory/jobs"}
    assert set(v2.dirs(tmp_path).values()) == {tmp_path / "jobs.slice"}


def test_a_hybrid_host_is_v1(tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()  # v2 mounted beside the v1 controllers, as here
    assert not is_unified(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    assert is_unified(tmp_path)


@pytest.mark.parametrize(
    ("settings", "pids", "memory"),
    [
        ({}, 32768 - 3276, 32 * GIB - 32 * GIB // 20),  # a tenth; 5%
        ({"system_reserved_pids": 768, "system_reserved_memory": "4g"}, 32000, 28 * GIB),
    ],
)
def test_the_parent_takes_pid_max_and_the_machine_less_their_reserves(
    tmp_path: Path, settings: dict[str, Any], pids: int, memory: int
) -> None:
    figures = wanted(fake_settings(tmp_path, **settings), pids=32768, machine_bytes=32 * GIB)
    assert figures == Bounds(pids=pids, memory_bytes=memory)


def test_a_small_pid_max_keeps_at_least_1024_for_the_host(tmp_path: Path) -> None:
    assert wanted(fake_settings(tmp_path), pids=4096, machine_bytes=None) == Bounds(3072, None)


def test_a_reserve_leaving_jobs_no_pids_is_a_config_error(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, system_reserved_pids=32730)
    with pytest.raises(ConfigError, match="leaves all jobs 38 PIDs"):
        wanted(settings, pids=32768, machine_bytes=GIB)


@pytest.mark.parametrize(
    ("held", "within"),
    [
        (Bounds(100, GIB), True),
        (Bounds(50, GIB // 2), True),  # an operator's tighter bound holds too
        (Bounds(101, GIB), False),
        (Bounds(None, GIB), False),  # unbounded
    ],
)
def test_a_parent_is_bounded_when_it_holds_the_figures_or_less(held: Bounds, within: bool) -> None:
    assert held.within(Bounds(100, GIB)) is within


def v1_tree(root: Path) -> Path:
    for controller in ("pids", "memory"):
        (root / controller).mkdir()
    return root


def test_on_v1_the_node_makes_the_parent_and_writes_both_bounds(tmp_path: Path) -> None:
    root = v1_tree(tmp_path)
    parent = JobParent("jobs", driver="cgroupfs", unified=False)
    assert read(parent, root) is None  # not there yet

    write(parent, Bounds(pids=29492, memory_bytes=20 * GIB), root)

    assert (root / "pids/jobs/pids.max").read_text() == "29492"
    assert (root / "memory/jobs/memory.limit_in_bytes").read_text() == str(20 * GIB)
    assert read(parent, root) == Bounds(29492, 20 * GIB)


def test_on_v2_the_node_hands_the_controllers_down_and_writes_the_max_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu io\n")
    parent = JobParent("jobs", driver="cgroupfs", unified=True)

    write(parent, Bounds(pids=500, memory_bytes=GIB), tmp_path)

    assert (tmp_path / "cgroup.subtree_control").read_text() == "+pids +memory"
    assert (tmp_path / "jobs/pids.max").read_text() == "500"
    assert (tmp_path / "jobs/memory.max").read_text() == str(GIB)


@pytest.mark.parametrize("unlimited", ["max", "9223372036854771712", "junk"])
def test_no_limit_reads_as_unbounded(tmp_path: Path, unlimited: str) -> None:
    root = v1_tree(tmp_path)
    parent = JobParent("jobs", driver="cgroupfs", unified=False)
    write(parent, Bounds(pids=10, memory_bytes=None), root)
    (root / "memory/jobs/memory.limit_in_bytes").write_text(unlimited + "\n")
    assert read(parent, root) == Bounds(pids=10, memory_bytes=None)


def test_check_names_a_slices_drop_in_with_the_nodes_exact_figures() -> None:
    parent = JobParent("tuneplane-jobs", driver="systemd", unified=True)
    report = ParentReport(parent, Bounds(29492, 20 * GIB), held=Bounds(None, None))
    assert not report.bounded
    assert parent_fix(report) == (
        "install contrib/systemd/tuneplane-jobs.slice, or give it TasksMax=29492 and "
        f"MemoryMax={20 * GIB} in a drop-in"
    )


def test_check_says_who_cannot_write_a_cgroupfs_parent() -> None:
    parent = JobParent("tuneplane-jobs", driver="cgroupfs", unified=False)
    report = ParentReport(parent, Bounds(100, None), held=None, error="read-only here")
    assert describe_parent(report) == (
        "/tuneplane-jobs (cgroupfs driver, cgroup v1): holds not there yet; the node's "
        "figures: pids 100, memory unbounded; not bounded by the node: read-only here"
    )
    assert "ProtectControlGroups" in parent_fix(report)


async def test_check_says_a_remote_engines_parent_is_its_own_hosts_to_bound() -> None:
    runtime = DockerRuntime(engine_settings("docker", docker_host="tcp://127.0.0.1:9"))
    runtime.jobs_parent.parent = JobParent("tuneplane-jobs", driver="cgroupfs", unified=False)
    try:
        ((level, text),) = await _parent_finding(runtime)
    finally:
        await runtime.close()
    assert level == "warn"
    assert text.startswith("jobs: parent cgroup /tuneplane-jobs (cgroupfs driver, cgroup v1)")
    assert "not bounded by the node: the engine is remote: its cgroups are its own host's" in text
