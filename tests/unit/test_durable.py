"""The one module for durable file writes: replaced whole, or made once by its first writer."""

from __future__ import annotations

import stat
from pathlib import Path

from tuneplane_node.durable import create_once, write_atomically


def test_a_write_replaces_the_file_whole_with_the_mode_asked(tmp_path: Path) -> None:
    path = tmp_path / "state" / "profile.json"
    write_atomically(path, b"old")
    write_atomically(path, b"new", mode=0o644)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == ["profile.json"]  # no temporary left


def test_a_file_made_once_keeps_its_first_writers_bytes(tmp_path: Path) -> None:
    path = tmp_path / "node-id"
    assert create_once(path, b"first\n", mode=0o640) == b"first\n"
    assert create_once(path, b"second\n") == b"first\n"  # the name exists: the first's
    assert path.read_bytes() == b"first\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["node-id"]
