"""The kernel's mount calls, through ctypes: the only module that makes them.

The new mount API (Linux 5.12 for ``mount_setattr``): ``open_tree(OPEN_TREE_CLONE)``
copies the mount of a directory already opened (an ``O_PATH`` descriptor, by
``AT_EMPTY_PATH``: no path is looked up again), ``mount_setattr`` makes the detached copy
read-only, nosuid and nodev before anything can see it, and ``move_mount`` attaches it.
Chosen over a bind of ``/proc/self/fd/N``: that needs /proc and a remount for read-only,
a moment where the bind is writable; here the copy is whole before it is attached. A
scratch's filesystem is mounted by the old ``mount(2)`` (`mount_device`): a new device,
nosuid and nodev from its first moment. Every call raises `OSError` with the kernel's
errno.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

# The same numbers on every architecture but alpha: these calls came after the unification.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE = 1
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MS_NOSUID, MS_NODEV, MS_PRIVATE = 0x2, 0x4, 1 << 18
MNT_DETACH, UMOUNT_NOFOLLOW = 0x2, 0x8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.syscall.restype = ctypes.c_long
# mount(2)'s flags are an unsigned long: said, so no int is passed in a register half set.
_libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _checked(result: int, call: str, path: str = "") -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{call}: {os.strerror(errno)}", path or None)
    return result


def clone(directory_fd: int, *, read_only: bool) -> int:
    """A detached copy of the mount of the opened directory (not its submounts), private,
    nosuid, nodev and read-only when asked; a descriptor the caller closes."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_EMPTY_PATH
    tree = _checked(_libc.syscall(SYS_OPEN_TREE, directory_fd, b"", flags), "open_tree")
    attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if read_only else 0)
    attr = _MountAttr(attr_set=attrs, propagation=MS_PRIVATE)
    try:
        size = ctypes.sizeof(attr)
        result = _libc.syscall(
            SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), size
        )
        _checked(result, "mount_setattr")
    except OSError:
        os.close(tree)
        raise
    return tree


def attach(tree_fd: int, target: str) -> None:
    """Attach a detached copy (`clone`) on the directory ``target``."""
    flags = MOVE_MOUNT_F_EMPTY_PATH
    result = _libc.syscall(SYS_MOVE_MOUNT, tree_fd, b"", -100, target.encode(), flags)  # AT_FDCWD
    _checked(result, "move_mount", target)


def mount_device(device: str, target: str, fstype: str, options: str) -> None:
    """Mount the filesystem on ``device`` at the directory ``target``, nosuid and nodev,
    with the filesystem's own ``options`` (``mount -t fstype -o nosuid,nodev,options``)."""
    flags = MS_NOSUID | MS_NODEV
    args = (device.encode(), target.encode(), fstype.encode(), flags, options.encode())
    _checked(_libc.mount(*args), "mount", target)


def detach(target: str) -> None:
    """Unmount ``target`` lazily (a container's copy of it is its own), without following
    a link there."""
    _checked(_libc.umount2(target.encode(), MNT_DETACH | UMOUNT_NOFOLLOW), "umount2", target)
