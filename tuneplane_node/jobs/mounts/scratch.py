"""A job's scratch space: a filesystem of its own, of a hard size, bound in as a mount.

``container.scratch`` (``{"path", "size"}``) becomes a sparse file ``<key>.ext4`` in the
scratch root (`NodeSettings.scratch_dir`), formatted ext4, attached to a loop device and
mounted (nosuid, nodev) at ``<state dir>/scratch-mounts/<key>``, whose root is then
bound into the job by the staging routine of host mounts (`MountStaging`), under the same
key (the container's ``tuneplane.mounts`` label). The kernel holds the bound: a write past
the size is ENOSPC in the job, and the host's disk grows by at most the size (the file
is sparse: a block is taken when the job writes it). `release` unmounts, detaches and
deletes; `sweep` at start does so for every key no container names (labels are the
truth, as for staged mounts).

No journal (``-O ^has_journal``): the filesystem dies with its job and a crash deletes it,
so a journal would only take blocks from the job's size and write them twice. Mounted
with ``noinit_itable``: the kernel's lazy init would write every inode table in the
background (some 800 MiB for 50 GiB), for tables the checksums already say are unused.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from collections.abc import Collection
from pathlib import Path

from tuneplane_node.errors import OUT_OF_RANGE, InvalidField
from tuneplane_node.jobs.mounts import loopdev, mountapi
from tuneplane_node.jobs.words.mounts import Opened
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.wire.values import Mount, Scratch

log = logging.getLogger(__name__)
FIELD = "container.scratch"
MOUNTS = "scratch-mounts"
SUFFIX = ".ext4"
MKFS = ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal")
MKFS_OPTIONS = "lazy_itable_init=1,nodiscard"
MOUNT_OPTIONS = "noinit_itable"  # and nosuid, nodev: `mountapi.mount_device`
TOOL_TIMEOUT_S = 60.0


class ScratchError(Exception):
    """A tool failed: its words."""


def vet(spec: ContainerSpec, *, most: int) -> None:
    """A launch's scratch within the node's bounds: at most ``most`` bytes
    (`TUNEPLANE_JOB_SCRATCH_MAX`), its path no other mount's target (a read-only root's
    tmpfs on it gave way to it: `JobRules`); else a 422 naming the part."""
    scratch = spec.scratch
    if scratch is None:
        return
    if scratch.size_bytes > most:
        raise InvalidField(
            f"{FIELD}.size",
            f"at most {most} bytes on this node ({env_name('job_scratch_max')})",
            problem=OUT_OF_RANGE,
        )
    path = os.path.normpath(scratch.path)
    if any(os.path.normpath(mount.container) == path for mount in spec.mounts):
        raise InvalidField(f"{FIELD}.path", f"{scratch.path} is another mount's target")


class ScratchSpaces:
    """The node's scratch files and their mounts, by launch key."""

    def __init__(self, settings: NodeSettings) -> None:
        self.files = settings.scratch_dir
        self.mounts = settings.state_dir / MOUNTS
        self.most = settings.job_scratch_max_bytes

    def vet(self, spec: ContainerSpec) -> ContainerSpec:
        vet(spec, most=self.most)
        return spec

    def file(self, key: str) -> Path:
        return self.files / f"{key}{SUFFIX}"

    def make(self, key: str, scratch: Scratch) -> Opened:
        """The scratch made and mounted, opened as a mount `MountStaging` binds at
        ``scratch.path``. Blocking. A failure leaves nothing and is a 422 naming it."""
        try:
            return self._make(key, scratch)
        except BaseException as exc:
            self.release_quietly(key)
            if isinstance(exc, (OSError, ScratchError)):
                raise InvalidField(FIELD, f"the node could not make it: {exc}") from None
            raise

    def release_quietly(self, key: str) -> None:
        """`release` on a failed launch's path: a failure there is logged (the start's
        sweep takes what is left), never raised over the launch's own error."""
        try:
            self.release(key)
        except (OSError, ScratchError) as exc:
            log.error("could not remove the scratch space %s: %s (swept at next start)", key, exc)

    def _make(self, key: str, scratch: Scratch) -> Opened:
        self.files.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.mounts.mkdir(mode=0o700, parents=True, exist_ok=True)
        image, point = self.file(key), self.mounts / key
        with open(image, "xb") as sparse:  # a new file: a key is never reused
            sparse.truncate(scratch.size_bytes)
        _run(*MKFS, "-E", MKFS_OPTIONS, str(image))
        point.mkdir(mode=0o700)
        # The device goes with its last user: the mount, or the block's end if the mount
        # failed. No loop device outlives the mount.
        with loopdev.attached(str(image)) as device:
            mountapi.mount_device(device, str(point), "ext4", MOUNT_OPTIONS)
        os.chmod(point, 0o1777)  # any user of the job may write; a sticky /tmp's rule
        fd = os.open(point, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return Opened(Mount(str(point), scratch.path, False), fd, True, field=FIELD)

    def release(self, key: str) -> None:
        """Unmount, detach and delete a launch's scratch; nothing there: nothing to do.
        Blocking."""
        if not key or os.sep in key or key in (".", ".."):
            return
        point, image = self.mounts / key, self.file(key)
        if point.exists():
            _unmount(str(point))
            os.rmdir(point)
        if image.exists():
            for device in _devices_of(image):  # a daemon killed before its detach
                _run("losetup", "--detach", device)
            image.unlink()

    def keys(self) -> set[str]:
        found = {p.name for p in _entries(self.mounts)}
        found |= {p.name[: -len(SUFFIX)] for p in _entries(self.files) if p.name.endswith(SUFFIX)}
        return found

    def sweep(self, keep: Collection[str]) -> int:
        """Release every scratch whose key no container carries. Blocking."""
        gone = sorted(key for key in self.keys() if key not in keep)
        for key in gone:
            log.warning("removing the scratch space of %s: no container has it", key)
            self.release(key)
        return len(gone)


def scratch_on_store(store: str) -> str:
    """What check and the start say of a scratch root on the engine's store's disk."""
    return (
        f"on the filesystem of the engine's store ({store}): a job's scratch takes the "
        f"store's room and raises its disk pressure; set {env_name('scratch_root')} to "
        "another disk"
    )


def missing_tools() -> list[str]:
    """The programs a scratch needs that this machine lacks (``check`` says them)."""
    return [tool for tool in (MKFS[0], "losetup") if shutil.which(tool) is None]


def _entries(directory: Path) -> list[Path]:
    try:
        return [Path(entry.path) for entry in os.scandir(directory)]
    except FileNotFoundError:
        return []


def _unmount(path: str) -> None:
    """EINVAL: not mounted (the launch failed before its mount)."""
    try:
        mountapi.detach(path)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def _devices_of(image: Path) -> list[str]:
    """The loop devices backed by ``image`` (``losetup --associated``)."""
    out = _run("losetup", "--noheadings", "--output", "NAME", "--associated", str(image))
    return [line.strip() for line in out.splitlines() if line.strip()]


def _run(*argv: str) -> str:
    """A tool's output; `ScratchError` with its words when it fails."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScratchError(f"{argv[0]}: {exc}") from None
    if done.returncode != 0:
        raise ScratchError(f"{argv[0]}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout
