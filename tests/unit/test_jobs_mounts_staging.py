"""A launch's staged mounts released twice at once: the engine's destroy event and a
removal (or a sweep) may both release one launch's staging; the second finds parts of it
gone and is a release all the same (seen in CI: its `rmdir` failed a test's teardown)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuneplane_node.jobs.mounts import mountapi
from tuneplane_node.jobs.mounts.staging import MountStaging

KEY = "tuneplane-job-r1.0123abcd"


def staged(tmp_path: Path) -> tuple[MountStaging, Path]:
    made = MountStaging(tmp_path)
    job = made.root / KEY
    (job / "0").mkdir(parents=True)  # a mount point (a directory's bind)
    (job / "1").write_text("")  # and a file's
    return made, job


def test_a_release_that_meets_another_halfway_is_a_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, job = staged(tmp_path)
    remove = os.rmdir

    def raced(path: str | Path) -> None:
        """The other release took this launch's points first, and its directory."""
        for point in (job / "0", job / "1"):
            if point.is_dir():
                remove(point)
            elif point.exists():
                point.unlink()
        if job.exists():
            remove(job)
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(os, "rmdir", raced)
    monkeypatch.setattr(mountapi, "detach", lambda path: None)
    made.release(KEY)
    assert not job.exists()
    made.release(KEY)  # and once more: nothing there, nothing to do


def test_a_point_gone_before_its_unmount_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made, job = staged(tmp_path)

    def gone(path: str) -> None:
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(mountapi, "detach", gone)
    made.release(KEY)
    assert not job.exists() and made.keys() == []
