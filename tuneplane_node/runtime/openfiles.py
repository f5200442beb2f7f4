"""The files a container's processes hold open after they were deleted: blocks the
engine's disk gives to the job, which no walk of its directories sees (a file written,
unlinked, its descriptor kept). Kubelet's ``du`` misses them (KEP-1029); the kernel
does not.

The processes are the tasks of the container's cgroup (v2's unified directory, v1's
pids or memory one), its child cgroups with them. Each descriptor of each process
(``/proc/<pid>/fd``) whose link says ``(deleted)`` is stat'ed through the link: a
regular file with no name left (``st_nlink`` 0) on one of ``devices`` (the store's
filesystem, the container's root overlay) counts its allocated blocks, each inode once
however many descriptors hold it. A memfd or a tmpfs file lies on another device: it
is memory, not the store's disk. Blocking, a few small reads per process: callers run
it on the runtime's pool, within the walk's deadline.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from tuneplane_node.runtime.cgroups import PROC_ROOT, CgroupDirs

BLOCK = 512  # st_blocks' unit
DELETED = " (deleted)"
CHECK_EVERY = 256  # descriptors between two looks at the clock
MAX_CGROUPS = 1024  # a job's own cgroups read, its top one included


@dataclass(frozen=True)
class HeldOpen:
    """What the scan found: bytes of deleted files held open (None: the processes
    could not be read here), ``complete`` false when the deadline came first."""

    bytes: int | None
    complete: bool = True
    processes: int = 0
    inodes: int = 0


def procs_dir(dirs: CgroupDirs) -> Path | None:
    """The cgroup directory whose ``cgroup.procs`` lists every process of the container."""
    return dirs.pids if dirs.unified else (dirs.pids or dirs.memory or dirs.cpu)


def processes(top: Path) -> list[int] | None:
    """The processes of ``top`` and of the cgroups under it; None when ``top`` cannot be
    read (gone: the container ended, or not visible from here)."""
    found: list[int] = []
    stack, seen = [top], 0
    while stack and seen < MAX_CGROUPS:
        where = stack.pop()
        seen += 1
        try:
            text = (where / "cgroup.procs").read_text()
            stack.extend(p for p in where.iterdir() if p.is_dir())
        except OSError:
            if where == top:
                return None
            continue  # a child removed under the scan
        found.extend(int(word) for word in text.split() if word.isdigit())
    return found


def held_deleted(
    pids: Collection[int],
    devices: Collection[int],
    *,
    deadline: float,
    proc: Path = PROC_ROOT,
    clock: Callable[[], float] = time.monotonic,
) -> HeldOpen:
    """The allocated bytes of the deleted regular files on ``devices`` that ``pids``
    hold open, each inode once."""
    counted: set[tuple[int, int]] = set()
    total, looked = 0, 0
    for pid in pids:
        for link in _links(proc / str(pid) / "fd"):
            looked += 1
            if looked % CHECK_EVERY == 0 and clock() > deadline:
                return HeldOpen(total, False, len(pids), len(counted))
            if link is None:
                continue
            try:
                info = os.stat(link[1], dir_fd=link[0])  # through the link: the open file
            except OSError:
                continue  # closed since the list
            key = (info.st_dev, info.st_ino)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 0 or key in counted:
                continue
            if info.st_dev in devices:
                counted.add(key)
                total += info.st_blocks * BLOCK
    return HeldOpen(total, processes=len(pids), inodes=len(counted))


def _links(fd_dir: Path) -> Iterator[tuple[int, str] | None]:
    """Each descriptor of one process: (the directory's descriptor, its name) where its
    link names a deleted file, else None (a process that ended since the list has
    none). Names are read relative to the opened directory: no path walk through /proc
    for each descriptor."""
    try:
        directory = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in os.listdir(directory):
            try:
                target = os.readlink(name, dir_fd=directory)
            except OSError:
                target = ""  # closed since the list
            yield (directory, name) if target.endswith(DELETED) else None
    except OSError:
        return
    finally:
        os.close(directory)
