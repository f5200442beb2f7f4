"""The staging tree: each job's mounts, bound by the node, where the engine takes them.

``<state dir>/mounts/<key>/<i>``: one directory per launch (``key``, the container's name
and a random suffix, is written on the container as its ``tuneplane.mounts`` label) and
one mount point per mount, made 0700 by root in the node's own directory: no job can
write there, and no mount may reach it (`MountPolicy` refuses the state directory). Each
is the copy of a mount that `MountPolicy.open` opened (`jobs.mounts.mountapi`): the engine binds a
path nobody can swap. A launch's staging goes when its container is removed (reap,
relaunch and wreckage sweeps all remove through the stopper) or its launch fails, and
`sweep` at start takes what a killed daemon left: the keys no container's label names.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
from collections.abc import Collection, Sequence
from pathlib import Path

from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs.mounts import mountapi
from tuneplane_node.jobs.words.mounts import Opened
from tuneplane_node.wire.values import Mount

log = logging.getLogger(__name__)
DIRECTORY = "mounts"
NO_PRIVILEGE = (
    "the node cannot make mounts ({reason}): it needs CAP_SYS_ADMIN in the engine's mount "
    "namespace (docs/operating.md, 'Mounts'); host mounts are refused until it has it"
)


class MountStaging:
    """The node's staging tree under its state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / DIRECTORY

    @staticmethod
    def new_key(name: str) -> str:
        """A launch's key: its container's name, and a suffix no other launch shares."""
        return f"{name}.{secrets.token_hex(4)}"

    def stage(self, key: str, opened: Sequence[Opened]) -> tuple[Mount, ...]:
        """Each opened mount bound at its staging path, read-only where asked; the mounts
        as the engine must be given them. Blocking. A failure leaves nothing staged and
        is a 422 naming the mount."""
        job = self.root / key
        staged = []
        try:
            job.mkdir(mode=0o700, parents=True)
            for i, each in enumerate(opened):
                field = each.field or f"container.mounts[{i}]"
                staged.append(self._bind(job / str(i), each, field))
        except BaseException:
            self.release(key)
            raise
        return tuple(staged)

    def _bind(self, target: Path, opened: Opened, field: str) -> Mount:
        if opened.directory:
            target.mkdir(mode=0o700)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        try:
            tree = mountapi.clone(opened.fd, read_only=opened.mount.read_only)
            try:
                mountapi.attach(tree, str(target))
            finally:
                os.close(tree)
        except PermissionError as exc:
            raise InvalidField(field, NO_PRIVILEGE.format(reason=exc.strerror)) from None
        except OSError as exc:
            raise InvalidField(field, f"{opened.mount.host}: cannot be mounted: {exc}") from None
        return opened.mount._replace(host=str(target))

    def release(self, key: str) -> None:
        """Unmount and remove a launch's staging; nothing there: nothing to do. Blocking."""
        job = self.root / key
        if not key or os.sep in key or key in (".", ".."):
            return
        try:
            points = list(os.scandir(job))
        except FileNotFoundError:
            return
        # Gone meanwhile is released: the engine's event and a removal may release one
        # launch's staging at once (seen in CI: the second one's rmdir failed).
        for point in points:
            self._unmount(point.path)
            with contextlib.suppress(FileNotFoundError):
                if point.is_dir(follow_symlinks=False):
                    os.rmdir(point.path)
                else:
                    os.unlink(point.path)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(job)

    @staticmethod
    def _unmount(path: str) -> None:
        """EINVAL: not a mount point (the bind failed); EPERM: a node that cannot mount
        made none here. Either way the removal that follows says whether one is left
        (EBUSY), so a refusal is never hidden behind its clean-up."""
        try:
            mountapi.detach(path)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EPERM, errno.ENOENT):  # ENOENT: released
                raise

    def keys(self) -> list[str]:
        try:
            return sorted(entry.name for entry in os.scandir(self.root))
        except FileNotFoundError:
            return []

    def sweep(self, keep: Collection[str]) -> int:
        """Release every launch's staging whose key no container carries: what a daemon
        killed between its staging and its container's removal left. Blocking."""
        gone = [key for key in self.keys() if key not in keep]
        for key in gone:
            log.warning("removing the staged mounts of %s: no container has them", key)
            self.release(key)
        return len(gone)

    def probe(self) -> str | None:
        """Why the node cannot stage a mount (no privilege, no new mount API), or None."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = f".probe.{secrets.token_hex(4)}"
        fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.stage(key, [Opened(Mount(str(self.root), "/probe", True), fd, True)])
        except InvalidField as exc:
            return exc.reason
        finally:
            os.close(fd)
        self.release(key)
        return None
