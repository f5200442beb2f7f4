"""The kernel's loop devices, through their ioctls: the only module that attaches one.

A scratch's file is attached to a free device as ``losetup --find --show`` does it
(``LOOP_CTL_GET_FREE`` on /dev/loop-control, then ``LOOP_CONFIGURE``, Linux 5.8), marked
``LO_FLAGS_AUTOCLEAR`` in the same call: the device goes with its last user, the mount
made on it, or this process's descriptor if no mount is made (a daemon killed there
leaves none). A kernel without ``LOOP_CONFIGURE`` gets ``LOOP_SET_FD``, and
``LOOP_CLR_FD`` once the mount is made, which marks a mounted device so (``losetup
--detach``'s call). Not ``LOOP_SET_STATUS64``: it waits for the device's queue to drain
(13 ms here, more than the two programs it replaces). In process, not as ``losetup`` and
``mount`` children, which were half of a scratch's cost on a launch's path (issue 56).
Every call raises `OSError` with the kernel's errno.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

LOOP_CONTROL = "/dev/loop-control"
LOOP_SET_FD, LOOP_CLR_FD, LOOP_CONFIGURE, LOOP_CTL_GET_FREE = 0x4C00, 0x4C01, 0x4C0A, 0x4C82
LO_FLAGS_AUTOCLEAR = 4
LO_NAME_SIZE = 64
TRIES = 16
"""Free devices asked for in turn: another process (a ``losetup``, a second launch) may
take the one the kernel named before this one attaches it (``EBUSY``), as losetup retries."""


class _LoopInfo64(ctypes.Structure):
    """``struct loop_info64`` of <linux/loop.h>."""

    _fields_ = (
        ("lo_device", ctypes.c_uint64),
        ("lo_inode", ctypes.c_uint64),
        ("lo_rdevice", ctypes.c_uint64),
        ("lo_offset", ctypes.c_uint64),
        ("lo_sizelimit", ctypes.c_uint64),
        ("lo_number", ctypes.c_uint32),
        ("lo_encrypt_type", ctypes.c_uint32),
        ("lo_encrypt_key_size", ctypes.c_uint32),
        ("lo_flags", ctypes.c_uint32),
        ("lo_file_name", ctypes.c_char * LO_NAME_SIZE),
        ("lo_crypt_name", ctypes.c_char * LO_NAME_SIZE),
        ("lo_encrypt_key", ctypes.c_char * 32),
        ("lo_init", ctypes.c_uint64 * 2),
    )


class _LoopConfig(ctypes.Structure):
    """``struct loop_config`` of <linux/loop.h>."""

    _fields_ = (
        ("fd", ctypes.c_uint32),
        ("block_size", ctypes.c_uint32),
        ("info", _LoopInfo64),
        ("reserved", ctypes.c_uint64 * 8),
    )


@contextmanager
def attached(image: str) -> Iterator[str]:
    """A loop device backed by ``image`` (its path, ``/dev/loopN``), held while the
    block runs: a mount made on it meanwhile keeps it, else it goes at the block's end."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        device, fd, configured = _attach(backing, image)
    finally:
        os.close(backing)  # the device holds the file now
    try:
        yield device
    finally:
        if not configured:
            _clear(fd)
        os.close(fd)


def _attach(backing: int, image: str) -> tuple[str, int, bool]:
    """The device, its descriptor, and whether it is autoclear already."""
    for _ in range(TRIES):
        device = f"/dev/loop{_free_number()}"
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        try:
            return device, fd, _configure(fd, backing, image)
        except OSError as exc:
            os.close(fd)
            if exc.errno != errno.EBUSY:
                raise
            # taken meanwhile: ask for another
    raise OSError(errno.EBUSY, f"no free loop device after {TRIES} tries", image)


def _free_number() -> int:
    control = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    try:
        return fcntl.ioctl(control, LOOP_CTL_GET_FREE)
    finally:
        os.close(control)


def _configure(fd: int, backing: int, image: str) -> bool:
    """Attach ``backing``, autoclear where the kernel has ``LOOP_CONFIGURE`` (True)."""
    config = _LoopConfig(fd=backing)
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR
    config.info.lo_file_name = os.fsencode(image)[: LO_NAME_SIZE - 1]  # for losetup --list
    try:
        fcntl.ioctl(fd, LOOP_CONFIGURE, config)
        return True
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTTY):
            raise
    fcntl.ioctl(fd, LOOP_SET_FD, backing)  # before 5.8
    return False


def _clear(fd: int) -> None:
    """A mounted device marked to go with its unmount; one not mounted detached now."""
    with contextlib.suppress(OSError):  # a device left attached is the sweep's
        fcntl.ioctl(fd, LOOP_CLR_FD)
