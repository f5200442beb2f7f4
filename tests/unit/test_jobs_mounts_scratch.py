"""A job's scratch space (issue 34): the launch's field read and bounded, and the
filesystem made, released and swept by its key. The real filesystem tests need root and a
loop device (they skip elsewhere); the engine tests are test_daemon_scratch.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE
from tests.fakes.runtime import FakeRuntime
from tests.support.loops import NOTHING, SETTLE_S, Left, loops_backing
from tests.support.waiting import settled
from tuneplane_node.errors import InvalidField, NodeError
from tuneplane_node.jobs.mounts.scratch import SUFFIX, ScratchSpaces, vet
from tuneplane_node.jobs.node import Node
from tuneplane_node.jobs.rules.confinement import JobRules
from tuneplane_node.runtime.facts import DIRECT, REMOTE, STAGED
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings, load_settings
from tuneplane_node.wire.requests import parse_launch
from tuneplane_node.wire.values import (
    LABEL_MOUNTS,
    LABEL_RUN_ID,
    Launch,
    Mount,
    Scratch,
    container_name,
)

MIB = 2**20


def launch(scratch: Any) -> ContainerSpec:
    return ContainerSpec.of(
        parse_launch({"run_id": "r", "container": {"image": "x", "scratch": scratch}}).container
    )


def refused(scratch: Any) -> list[str]:
    with pytest.raises(InvalidField) as error:
        launch(scratch)
    return [each.field for each in error.value.errors]


def test_a_scratch_is_read_with_its_size_in_bytes_and_empty_is_none() -> None:
    assert launch({"path": "/scratch", "size": "50m"}).scratch == Scratch("/scratch", 50 * MIB)
    assert launch({"path": "/data/tmp", "size": 2 * MIB}).scratch == Scratch("/data/tmp", 2 * MIB)
    assert launch("").scratch is None
    assert launch(None).scratch is None


@pytest.mark.parametrize("size", ["", None, "1k", 1024, "0", "abc", "2p", True, [1]])
def test_a_bad_size_is_named_as_the_size(size: Any) -> None:
    assert refused({"path": "/scratch", "size": size}) == ["container.scratch.size"]


@pytest.mark.parametrize("path", ["", None, "scratch", "/", "/a/../b", "/proc/x", "/etc", 3])
def test_a_bad_path_is_named_as_the_path(path: Any) -> None:
    assert refused({"path": path, "size": "50m"}) == ["container.scratch.path"]


def test_both_bad_are_both_named_and_another_shape_names_the_field() -> None:
    assert refused({"path": "x", "size": "x"}) == [
        "container.scratch.path",
        "container.scratch.size",
    ]
    assert refused({"path": "/s", "size": "1g", "mode": "rw"}) == ["container.scratch"]
    assert refused("/scratch") == ["container.scratch"]


def test_the_node_bounds_the_size_and_the_path_is_no_other_mounts_target() -> None:
    spec = ContainerSpec("j", "x", scratch=Scratch("/scratch", 2 * MIB))
    vet(spec, most=2 * MIB)  # at the bound: taken
    with pytest.raises(InvalidField) as big:
        vet(spec, most=MIB)
    assert big.value.field == "container.scratch.size"
    assert "TUNEPLANE_JOB_SCRATCH_MAX" in big.value.reason
    taken = ContainerSpec(
        "j", "x", mounts=(Mount("/h", "/scratch/"),), scratch=Scratch("/scratch", MIB)
    )
    with pytest.raises(InvalidField) as clash:
        vet(taken, most=MIB)
    assert clash.value.field == "container.scratch.path"


def test_a_read_only_roots_tmp_gives_way_to_a_scratch_there(tmp_path: Path) -> None:
    settings = load_settings(node_token="t" * 16, storage_root=tmp_path, job_read_only_root=True)
    spec = ContainerSpec("j", "x", memory_limit="4g", scratch=Scratch("/tmp", 50 * MIB))
    confined = JobRules(settings).apply(spec)
    assert [each.path for each in confined.tmpfs] == ["/run"]


def test_the_setting_has_bounds_and_the_root_defaults_to_the_state_dir(tmp_path: Path) -> None:
    settings = load_settings(node_token="t" * 16, node_state_dir=tmp_path / "state")
    assert settings.scratch_dir == tmp_path / "state" / "scratch"
    assert settings.job_scratch_max_bytes == 100 * 2**30
    with pytest.raises(Exception, match="TUNEPLANE_JOB_SCRATCH_MAX"):
        load_settings(node_token="t" * 16, job_scratch_max="512k")
    with pytest.raises(Exception, match="TUNEPLANE_SCRATCH_ROOT"):
        load_settings(node_token="t" * 16, storage_root=tmp_path, scratch_root=tmp_path / "scratch")


# --- the filesystem itself -----------------------------------------------------------------

CAN_LOOP = (
    os.geteuid() == 0
    and shutil.which("mkfs.ext4") is not None
    and subprocess.run(["losetup", "-f"], capture_output=True, check=False).returncode == 0
)
needs_loop = pytest.mark.skipif(not CAN_LOOP, reason="needs root, mkfs.ext4 and a loop device")


def left(spaces: ScratchSpaces) -> Left:
    """This node's scratch files, mounts and loop devices."""
    mine = loops_backing(spaces.files)
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if f" {spaces.mounts}/" in line]  # fmt: skip
    files = sorted(os.listdir(spaces.files)) if spaces.files.exists() else []
    return files, mounts, mine


def nothing_left(spaces: ScratchSpaces) -> Left:
    """`left`, once empty (a released device goes at its last close: `settled`)."""
    return settled(lambda: left(spaces), NOTHING, SETTLE_S)


def spaces_in(tmp_path: Path) -> ScratchSpaces:
    settings = load_settings(node_token="t" * 16, node_state_dir=tmp_path / "state")
    return ScratchSpaces(settings)


@needs_loop
def test_a_scratch_holds_its_size_and_leaves_nothing_once_released(tmp_path: Path) -> None:
    spaces = spaces_in(tmp_path)
    opened = spaces.make("job.1", Scratch("/scratch", 8 * MIB))
    try:
        point = Path(opened.mount.host)
        assert opened.field == "container.scratch" and opened.directory
        assert (point.stat().st_mode & 0o7777) == 0o1777
        with pytest.raises(OSError) as full, open(point / "fill", "wb") as fill:
            for _ in range(16):
                fill.write(b"\1" * MIB)
                fill.flush()
                os.fsync(fill.fileno())
        assert full.value.errno == 28  # ENOSPC
        assert 6 * MIB < (point / "fill").stat().st_size <= 8 * MIB
        assert spaces.file("job.1").stat().st_blocks * 512 <= 8 * MIB
        assert left(spaces)[1], "mounted"
    finally:
        opened.close()
        spaces.release("job.1")
    assert nothing_left(spaces) == ([], [], [])


@needs_loop
def test_the_sweep_takes_every_key_no_container_names(tmp_path: Path) -> None:
    spaces = spaces_in(tmp_path)
    for key in ("kept.1", "gone.1"):
        spaces.make(key, Scratch("/scratch", 2 * MIB)).close()
    assert spaces.sweep({"kept.1", ""}) == 1
    assert left(spaces)[0] == ["kept.1.ext4"]
    spaces.release("kept.1")
    assert nothing_left(spaces) == ([], [], [])


@needs_loop
def test_a_scratch_that_cannot_be_made_is_a_422_and_leaves_nothing(tmp_path: Path) -> None:
    spaces = spaces_in(tmp_path)
    spaces.make("taken.1", Scratch("/scratch", 2 * MIB)).close()
    with pytest.raises(InvalidField) as again:  # the same key: its file is there
        spaces.make("taken.1", Scratch("/scratch", 2 * MIB))
    assert again.value.field == "container.scratch"
    assert nothing_left(spaces) == ([], [], [])


# --- the launch's lifecycle, on the in-memory engine -----------------------------------------


def with_scratch(run_id: str, size: int = 2 * MIB) -> Launch:
    spec = ContainerSpec(
        container_name(run_id), IMAGE, labels={LABEL_RUN_ID: run_id},
        scratch=Scratch("/scratch", size),
    )  # fmt: skip
    return Launch(run_id, 0, spec)


@pytest.mark.parametrize(("mode", "words"), [(DIRECT, "mounts nothing"), (REMOTE, "another")])
async def test_a_runtime_that_takes_no_mount_refuses_a_scratch(
    node: Node, fake: FakeRuntime, mode: str, words: str
) -> None:
    """The process runtime mounts nothing; an engine on another machine cannot be handed
    a path of this one: a 422 naming the field, nothing made."""
    fake.mount_mode = mode
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_scratch("r1"))
    assert refused.value.field == "container.scratch" and words in refused.value.reason
    assert not fake.containers


async def test_a_scratch_over_the_nodes_bound_is_refused_before_anything_is_made(
    node: Node, fake: FakeRuntime
) -> None:
    fake.mount_mode = STAGED
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_scratch("r1", size=200 * 2**30))  # the default: 100g
    assert refused.value.field == "container.scratch.size"
    assert not fake.containers


@needs_loop
async def test_a_scratch_goes_with_its_container_and_with_a_failed_launch(
    node: Node, fake: FakeRuntime, settings: NodeSettings
) -> None:
    fake.mount_mode = STAGED
    spaces = ScratchSpaces(settings)
    await node.jobs.launch(with_scratch("r1"))
    made = fake.containers["tuneplane-r1"]
    (mount,) = made.spec.mounts
    assert mount.container == "/scratch" and not mount.read_only
    assert made.labels[LABEL_MOUNTS] + SUFFIX in left(spaces)[0]
    await node.jobs.remove("tuneplane-r1")
    assert nothing_left(spaces) == ([], [], [])

    fake.refuse_start = "no such user"
    with pytest.raises(NodeError):
        await node.jobs.launch(with_scratch("r2"))
    assert nothing_left(spaces) == ([], [], [])
