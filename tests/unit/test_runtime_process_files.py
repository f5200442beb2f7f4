"""The process runtime's job files (`runtime.process.files`): a removal outlasts a file
made while its tree was being deleted."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tuneplane_node.errors import EngineRefused
from tuneplane_node.runtime.process import files
from tuneplane_node.runtime.process.files import JobFiles


def late_writer(job_dir: Path, times: int) -> Any:
    """rmtree as it goes when a file lands in the tree while it deletes: ENOTEMPTY at
    the directory's rmdir, ``times`` times, then the real one."""
    real = shutil.rmtree
    left = [times]

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if left[0]:
            left[0] -= 1
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        real(path, *args, **kwargs)

    return rmtree


def test_a_file_made_while_the_job_was_deleted_is_deleted_on_another_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = tmp_path / "tuneplane-a"
    job_dir.mkdir()
    (job_dir / "rc").write_text("143")
    monkeypatch.setattr(shutil, "rmtree", late_writer(job_dir, 1))
    monkeypatch.setattr(files, "DELETE_PAUSE_S", 0)
    JobFiles(tmp_path).delete("tuneplane-a", job_dir)
    assert not job_dir.exists()


def test_a_tree_that_keeps_filling_is_refused_after_its_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = tmp_path / "tuneplane-a"
    job_dir.mkdir()
    monkeypatch.setattr(shutil, "rmtree", late_writer(job_dir, files.DELETE_PASSES))
    monkeypatch.setattr(files, "DELETE_PAUSE_S", 0)
    with pytest.raises(EngineRefused) as refused:
        JobFiles(tmp_path).delete("tuneplane-a", job_dir)
    assert "Directory not empty" in refused.value.message


def test_an_end_the_file_clock_puts_before_the_start_is_the_start(tmp_path: Path) -> None:
    """A job that ends within a tick of its spawn: the code file's time (the kernel's
    coarse clock) reads earlier than the start the daemon read. The finish never precedes
    the start, and a later finish is given as the file says."""
    rc = tmp_path / "rc"
    rc.write_text("3")
    os.utime(rc, (1_000_000_000.0, 1_000_000_000.0))  # 2001-09-09T01:46:40Z

    assert files.exit_record(rc, "2001-09-09T01:46:40.004000Z") == (
        3, "2001-09-09T01:46:40.004000Z",
    )  # fmt: skip
    assert files.exit_record(rc, "2001-09-09T01:46:39.996000Z") == (3, "2001-09-09T01:46:40Z")
    assert files.exit_record(rc, None) == (3, "2001-09-09T01:46:40Z")
