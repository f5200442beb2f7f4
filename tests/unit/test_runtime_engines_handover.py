"""A writable mount handed to a job's own user namespace (`runtime.engines.handover`);
through a podman job on this machine's runc 1.1 in tests/engines/test_daemon_isolation.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuneplane_node.errors import SpecRefused
from tuneplane_node.runtime.engines.handover import hand_over, hand_over_mounts, root_ids
from tuneplane_node.wire.values import Mount

RANGE = 2_147_483_647  # the first id of the containers ranges engines.sh writes
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")


def owner(path: Path) -> tuple[int, int]:
    found = path.lstat()
    return found.st_uid, found.st_gid


def tree(tmp_path: Path) -> Path:
    """A tenant's directory of root's: a file, a subdirectory with one, and a link to a
    file outside it (a job may plant one)."""
    top = tmp_path / "data"
    (top / "sub").mkdir(parents=True)
    (top / "old").write_text("before")
    (top / "sub" / "deep").write_text("deep")
    (tmp_path / "host-file").write_text("not the job's")
    (top / "link").symlink_to(tmp_path / "host-file")
    return top


def test_the_container_roots_ids_are_read_from_its_mappings() -> None:
    mapped = {"IDMappings": {"UidMap": ["0:2147483647:65536"], "GidMap": ["0:2147549183:65536"]}}
    assert root_ids(mapped) == (2147483647, 2147549183)
    assert root_ids({"IDMappings": {"UidMap": ["1:5:10"], "GidMap": []}}) is None
    assert root_ids({}) is None  # the host's namespace: nothing to hand over


def test_every_entry_is_given_to_the_jobs_root_and_no_link_is_followed(tmp_path: Path) -> None:
    top = tree(tmp_path)
    assert hand_over(str(top), RANGE, RANGE) == 5  # top, sub, old, deep, link
    for path in (top, top / "sub", top / "old", top / "sub" / "deep", top / "link"):
        assert owner(path) == (RANGE, RANGE), path
    assert owner(tmp_path / "host-file") == (0, 0)  # the link's target: untouched


def test_a_tree_whose_top_is_the_jobs_already_is_not_walked(tmp_path: Path) -> None:
    """kubelet's OnRootMismatch: a relaunch given the same range costs no walk."""
    top = tree(tmp_path)
    hand_over(str(top), RANGE, RANGE)
    (top / "later").write_text("root's, made since")
    assert hand_over(str(top), RANGE, RANGE) == 0
    assert owner(top / "later") == (0, 0)
    assert hand_over(str(top), RANGE + 65536, RANGE + 65536) == 6  # another range: all


def test_only_writable_mounts_are_handed_over_and_a_failure_names_the_field(
    tmp_path: Path,
) -> None:
    top, models = tree(tmp_path), tmp_path / "models"
    models.mkdir()
    mapped = {"IDMappings": {"UidMap": [f"0:{RANGE}:65536"], "GidMap": [f"0:{RANGE}:65536"]}}
    hand_over_mounts(mapped, (Mount(str(top), "/data"), Mount(str(models), "/m", True)))
    assert owner(top) == (RANGE, RANGE) and owner(models) == (0, 0)
    with pytest.raises(SpecRefused) as refused:
        hand_over_mounts(mapped, (Mount(str(tmp_path / "gone"), "/gone"),))
    assert refused.value.status == 422 and refused.value.message.startswith("container.mounts: ")
