"""Files the node keeps across restarts, written so that a crash or a full disk never
leaves half of one: a temporary file beside it, fsynced, renamed over it, the directory
fsynced. A temporary file left by a crash mid-write is removed at the next start.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: the old file or the new one, never half of one. A
    failed write (a full disk) leaves no temporary file behind. Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _temporary(path, os.getpid())
    try:
        with temporary.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_dir(path.parent)  # the rename survives a power cut


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
