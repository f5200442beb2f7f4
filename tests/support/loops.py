"""The loop devices a test's scratch files back, read as the kernel lists them (sysfs).

Never by opening a device (`losetup -a` opens each attached one): a scratch's device goes
at its last close (autoclear), so a device held open a moment by another process (a
test's listing in another lane, a launch asking for a free device) at the unmount goes a
moment after it. Tests that say "nothing left" wait that moment (`settled`).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.waiting import settled

Left = tuple[list[str], list[str], list[str]]
"""A test's files, mounts and loop devices."""
NOTHING: Left = ([], [], [])
SETTLE_S = 5.0
"""How long a device released may take to go: another process's open of it is a read of
its status, milliseconds; 5 s is a loaded machine's margin, never waited when it is gone."""


def loops_backing(directory: Path) -> list[str]:
    """``/dev/loopN: <file>`` for each loop device backed by a file under ``directory``
    (a deleted one too: it ends ``(deleted)``)."""
    found = []
    for backing in sorted(Path("/sys/block").glob("loop*/loop/backing_file")):
        try:
            name = backing.read_text().rstrip("\n")
        except OSError:
            continue  # detached meanwhile
        if name.startswith(f"{directory}/"):
            found.append(f"/dev/{backing.parent.parent.name}: {name}")
    return found


def loops_left(directory: Path) -> list[str]:
    """`loops_backing`, once none is (a released device goes at its last close)."""
    none: list[str] = []
    return settled(lambda: loops_backing(directory), none, SETTLE_S)
