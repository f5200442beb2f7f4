"""A scratch's loop device, attached in process (issue 56): backed by its file, going
with its last user (the mount, else the attaching block's end), on kernels with and
without ``LOOP_CONFIGURE``, past a device another process took meanwhile. Root and
/dev/loop-control (skipped elsewhere); the scratch itself is test_jobs_mounts_scratch.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.loops import loops_backing, loops_left
from tuneplane_node.jobs.mounts import loopdev, mountapi
from tuneplane_node.jobs.mounts.scratch import MKFS

pytestmark = [
    pytest.mark.slow,  # mkfs.ext4 and the kernel's devices: tens of ms a test
    pytest.mark.skipif(
        os.geteuid() != 0 or not os.path.exists(loopdev.LOOP_CONTROL) or not shutil.which(MKFS[0]),
        reason="needs root, /dev/loop-control and mkfs.ext4",
    ),
]


@pytest.fixture(params=["configure", "set_fd"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """This kernel, and one without ``LOOP_CONFIGURE`` (5.7 and older: an unknown loop
    ioctl is EINVAL, as this one answers a number no loop ioctl has)."""
    if request.param == "set_fd":
        monkeypatch.setattr(loopdev, "LOOP_CONFIGURE", 0x4CFF)
    return str(request.param)


@pytest.fixture
def image(tmp_path: Path) -> Path:
    made = tmp_path / "scratch.ext4"
    with open(made, "xb") as sparse:
        sparse.truncate(16 * 2**20)
    subprocess.run([*MKFS, str(made)], check=True, capture_output=True)
    return made


def autoclear(device: str) -> str:
    return Path(f"/sys/block/{Path(device).name}/loop/autoclear").read_text().strip()


def mount_options(point: Path) -> list[str]:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(point):
            return fields[5].split(",")
    return []


@pytest.fixture
def point(tmp_path: Path) -> Iterator[Path]:
    made = tmp_path / "point"
    made.mkdir()
    yield made
    if mount_options(made):
        mountapi.detach(str(made))


def test_a_device_no_mount_took_goes_at_the_blocks_end(
    kernel: str, image: Path, tmp_path: Path
) -> None:
    with loopdev.attached(str(image)) as device:
        assert loops_backing(tmp_path) == [f"{device}: {image}"]
        if kernel == "configure":  # marked in the same call as it was attached
            assert autoclear(device) == "1"
    assert loops_left(tmp_path) == []


def test_a_mounted_device_outlives_the_block_and_goes_with_its_unmount(
    kernel: str, image: Path, point: Path, tmp_path: Path
) -> None:
    with loopdev.attached(str(image)) as device:
        mountapi.mount_device(device, str(point), "ext4", "noinit_itable")
    assert loops_backing(tmp_path) == [f"{device}: {image}"]
    assert autoclear(device) == "1"  # either way, once the block is done
    assert {"nosuid", "nodev", "rw"} <= set(mount_options(point))
    (point / "written").write_bytes(b"x")  # a filesystem the node can write

    mountapi.detach(str(point))
    assert loops_left(tmp_path) == []


def test_a_device_another_took_meanwhile_is_passed_over(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.ext4"
    shutil.copy(image, other)
    with loopdev.attached(str(other)) as taken:
        asked = iter([int(taken.removeprefix("/dev/loop"))])  # the kernel's word, then stale
        real = loopdev._free_number
        monkeypatch.setattr(loopdev, "_free_number", lambda: next(asked, None) or real())
        with loopdev.attached(str(image)) as device:
            assert device != taken
            assert sorted(loops_backing(tmp_path)) == sorted(
                [f"{taken}: {other}", f"{device}: {image}"]
            )
    assert loops_left(tmp_path) == []


def test_a_file_that_cannot_back_a_device_is_an_error_and_attaches_nothing(
    tmp_path: Path,
) -> None:
    with pytest.raises(FileNotFoundError), loopdev.attached(str(tmp_path / "none.ext4")):
        pass
    assert loops_backing(tmp_path) == []
