"""The one module for durable file writes: replaced whole, or made once by its first writer."""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
from pathlib import Path

from tuneplane_node.durable import create_once, drop_behind, write_atomically, write_behind


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


def resident_pages(fd: int, size: int) -> int:
    """How many of the file's pages the page cache holds (mincore over a mapping that
    is never touched, so it faults nothing in)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long)  # fmt: skip
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    try:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) == 0
        return sum(byte & 1 for byte in vector)
    finally:
        libc.munmap(ctypes.c_void_p(address), ctypes.c_size_t(size))


def test_bytes_dropped_behind_leave_the_page_cache_and_stay_in_the_file(tmp_path: Path) -> None:
    """A fill lets go of what it wrote once it is on the disk: a 140 GB file passes
    through the page cache without pushing the other tenants' files out of it."""
    path, size = tmp_path / "blob", 4 * 2**20
    data = os.urandom(size)
    with path.open("w+b") as file:  # readable: its pages are mapped to be counted
        file.write(data)
        file.flush()
        pages = size // mmap.PAGESIZE
        assert resident_pages(file.fileno(), size) == pages  # just written: all cached
        drop_behind(file.fileno(), 0, size // 2)
        assert resident_pages(file.fileno(), size) == pages // 2  # the second half stays
        drop_behind(file.fileno(), size // 2, 0)  # nothing asked: nothing done
        os.fsync(file.fileno())
    assert path.read_bytes() == data
    read, write = os.pipe()
    try:
        drop_behind(write, 0, 10)  # a hint: what cannot be dropped is no error
    finally:
        os.close(read)
        os.close(write)
