"""Files the node keeps across restarts, written so that a crash or a full disk never
leaves half of one: a temporary file beside it, fsynced, renamed over it (or linked in
place, for a file only its first writer makes), the directory fsynced. A temporary file
left by a crash mid-write is removed at the next start. The one module that writes a
file so: every other writes through it. And `write_behind` and `drop_behind`: a large
file's bytes started to disk as they are written, so that its fsync has little left to
do, and let go of by the page cache once on disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)
_LIBC = ctypes.CDLL(None, use_errno=True)  # the process's own C library: no search
_SYNC_FILE_RANGE = getattr(_LIBC, "sync_file_range", None)  # Linux's
if _SYNC_FILE_RANGE is not None:
    _SYNC_FILE_RANGE.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
SYNC_FILE_RANGE_WAIT_BEFORE, SYNC_FILE_RANGE_WRITE, SYNC_FILE_RANGE_WAIT_AFTER = 1, 2, 4


def write_atomically(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data``: the old file or the new one, never half of one. A
    failed write (a full disk) leaves no temporary file behind. ``mode``: the file's
    permissions (else the umask's). Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary(path, os.getpid())
    try:
        _write_synced(temporary, data, mode)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_dir(path.parent)  # the rename survives a power cut


def create_once(path: Path, data: bytes, *, mode: int | None = None) -> bytes:
    """Make ``path`` hold ``data`` unless it exists: what the file holds, the first
    writer's. A link, not a rename: it fails when the name exists, so two writers at
    once agree on the first one's bytes instead of each keeping its own. Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary(path, f"{os.getpid()}.{secrets.token_hex(4)}")  # threads too
    try:
        _write_synced(temporary, data, mode)
        os.link(temporary, path)
    except FileExistsError:
        return path.read_bytes()
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
    fsync_dir(path.parent)  # the link survives a power cut
    return data


def _write_synced(path: Path, data: bytes, mode: int | None) -> None:
    with path.open("wb") as file:
        if mode is not None:
            os.fchmod(file.fileno(), mode)
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def remove_leftovers(path: Path) -> int:
    """Remove the temporary files of ``path``'s interrupted writes (any process's): at
    start, before the file is read. Returns how many went. Blocking."""
    removed = 0
    for leftover in path.parent.glob(_temporary(path, "*").name):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
            removed += 1
    if removed:
        log.info("%s: removed %d temporary files of interrupted writes", path, removed)
    return removed


def fsync_dir(directory: Path) -> None:
    """Make a new name in the directory survive a power cut (a rename, a created file)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temporary(path: Path, pid: int | str) -> Path:
    return path.with_name(f".{path.name}.{pid}.tmp")


def write_behind(fd: int, offset: int, length: int) -> None:
    """Start the disk on ``length`` bytes of ``fd`` from ``offset`` now, without waiting
    (Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, as PostgreSQL's ``*_flush_after``
    does): a large file written in one go reaches the disk while it is written instead
    of lying dirty in memory for its fsync to write at the end, and it never holds
    gigabytes of dirty pages that the node's other writers would be throttled behind.
    A hint only: a filesystem that refuses it is written by the fsync all the same.
    Blocking (it lets go of the interpreter's lock)."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)


def drop_behind(fd: int, offset: int, length: int) -> None:
    """Wait until ``length`` bytes of ``fd`` from ``offset`` are on the disk, then drop
    them from the page cache (``sync_file_range`` waiting, then
    ``posix_fadvise(POSIX_FADV_DONTNEED)``, as ``dd oflag=nocache`` does): a file of
    140 GB written once and read later does not push every other tenant's cached files
    out of memory on its way, and its writer reuses the same few pages instead of
    taking new ones (on this project's development VM, 2 GiB into fresh pages cost 5.9
    s of system CPU, into reused ones 0.4 s). Called a batch behind `write_behind`, the
    wait is for bytes the disk has had a batch's time to take. A hint only: an error is
    ignored, and the fsync that follows makes the file durable all the same. Blocking
    (it lets go of the interpreter's lock)."""
    if length <= 0:
        return
    if _SYNC_FILE_RANGE is not None:
        flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
        _SYNC_FILE_RANGE(fd, offset, length, flags)
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
