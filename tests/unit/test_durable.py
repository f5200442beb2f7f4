"""The one module for durable file writes: replaced whole, or made once by its first writer."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tuneplane_node.durable import create_once, write_atomically, write_behind


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


def test_writing_behind_is_a_hint_that_never_fails_the_write(tmp_path: Path) -> None:
    """A fill's bytes are started to disk as they are written; a file that cannot be (a
    pipe: ESPIPE) is no error, as the fsync after is what makes them durable."""
    path = tmp_path / "blob"
    with path.open("wb") as file:
        file.write(b"x" * 2**20)
        file.flush()
        write_behind(file.fileno(), 0, 2**20)
        os.fsync(file.fileno())
    assert path.read_bytes() == b"x" * 2**20
    read, write = os.pipe()
    try:
        write_behind(write, 0, 10)
    finally:
        os.close(read)
        os.close(write)
