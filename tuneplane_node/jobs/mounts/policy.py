"""Which host paths a job may mount, opened the way they will be mounted.

The console's token buys job verbs, never the host: a mount of ``/``, of the engine's
socket or of ``/etc`` would hand a job the machine. A host path must lie under one of
`NodeSettings.mount_roots` (which start-up has checked hold none of the host's system
directories nor the node's own files) and is opened from that root one component at a
time, ``O_PATH | O_NOFOLLOW``, each relative to the one before: a symlink, ``..``, or a
step onto another filesystem is refused, and what was opened is what `staging` mounts.
A check of the path and a later mount of the path would see it at different times: a job
swapping ``tenantA/ckpt`` with a link to ``tenantB/ckpt`` in a loop wins that race
(kubelet's CVE-2021-25741). Every refusal, races included, is a 422 naming the mount.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs.words.mounts import Opened
from tuneplane_node.settings import env_name
from tuneplane_node.wire.values import Mount

log = logging.getLogger(__name__)
SETTING = env_name("allowed_mount_roots")
STEP = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class MountPolicy:
    """``never_a_root``: the system path a path is, holds or lies in (the settings' rule
    for a mount root), so a refusal offers the setting only where it could help.
    ``node_files``: the node's own paths (its token, TLS key, state directory, the
    engine's data root...) with what each is; a mount that is, holds or lies in one is
    refused. `forbid` adds the engine's, learnt at start."""

    def __init__(
        self,
        roots: Sequence[Path],
        *,
        never_a_root: Callable[[Path], Path | None],
        node_files: Iterable[tuple[Path, str]] = (),
    ) -> None:
        self.roots = tuple(roots)
        self.never_a_root = never_a_root
        self.node_files: list[tuple[Path, str]] = []
        self.forbid(node_files)

    def forbid(self, files: Iterable[tuple[Path, str]]) -> None:
        """Never mount these (each as given and resolved: a link names the same file)."""
        for path, what in files:
            for form in dict.fromkeys((Path(os.path.normpath(path)), Path(os.path.realpath(path)))):
                self.node_files.append((form, what))

    def root_holding(self, engine_dirs: Iterable[str], *, engine: str) -> str | None:
        """Why the mount roots cannot be used with this engine (start-up's refusal and
        check's line): one that is or holds one of its own directories; None if none."""
        dirs = [Path(path) for path in engine_dirs]
        for root in self.roots:
            held = next((path for path in dirs if path.is_relative_to(root)), None)
            if held is not None:
                return (
                    f"{SETTING}: {root} is or holds {held} (the {engine} engine's own "
                    "directory), which a job may never mount; keep it out of the mount roots"
                )
        return None

    def open(self, mounts: Sequence[Mount]) -> list[Opened]:
        """Every mount's host path opened, or one InvalidField naming every bad one (and
        nothing left open). Blocking (it reads the filesystem): run it off the loop."""
        opened: list[Opened] = []
        refused: list[InvalidField] = []
        for i, mount in enumerate(mounts):
            try:
                opened.append(self._open(mount, f"container.mounts[{i}]"))
            except InvalidField as exc:
                refused.append(exc)
        if refused:
            for each in opened:
                each.close()
            raise InvalidField.of(refused)
        return opened

    def vet(self, mounts: Sequence[Mount]) -> tuple[Mount, ...]:
        """`open`'s refusals at once, for a launch opened for good later (or never: the
        process runtime); the mounts with their host paths normalised."""
        for each in self.open(mounts):
            each.close()
        return tuple(m._replace(host=os.path.normpath(m.host)) for m in mounts)

    def _open(self, mount: Mount, field: str) -> Opened:
        given = Path(os.path.normpath(mount.host))
        if ".." in Path(mount.host).parts:
            raise InvalidField(field, f"{mount.host}: '..' is not allowed in a mount")
        root = next((r for r in self.roots if given == r or given.is_relative_to(r)), None)
        if root is None:
            log.warning("refused a mount of %s: outside the mount roots", given)
            raise InvalidField(field, self._outside(mount.host, given))
        self._not_the_nodes(mount.host, given, field)
        try:
            fd = walk(root, given.relative_to(root).parts)
        except Refused as exc:
            log.warning("refused a mount of %s: %s", given, exc.reason)
            raise InvalidField(field, f"{mount.host}{exc.reason}") from None
        return Opened(mount, fd, stat.S_ISDIR(os.fstat(fd).st_mode))

    def _not_the_nodes(self, host: str, given: Path, field: str) -> None:
        for path, what in self.node_files:
            if given == path or path.is_relative_to(given) or given.is_relative_to(path):
                held = "is" if given == path else "holds" if path.is_relative_to(given) else "is in"
                log.warning("refused a mount of %s: it %s %s (%s)", given, held, path, what)
                raise InvalidField(
                    field,
                    f"{host} {held} {path} ({what}), which a job may never mount; "
                    "no setting allows it",
                )

    def _outside(self, host: str, resolved: Path) -> str:
        system = self.never_a_root(resolved)
        if system is None:
            return f"{host} is not under an allowed mount root; {SETTING} would allow it"
        held = "is in"
        if system == resolved or system.is_relative_to(resolved):
            held = "is" if system == resolved else "holds"
        return f"{host} {held} {system}, which a job may never mount; no setting allows it"


class Refused(Exception):
    """Why a walk stopped: the rest of a sentence after the host path."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def walk(root: Path, parts: Sequence[str]) -> int:
    """An ``O_PATH`` descriptor of ``root/parts...``, each part opened relative to the one
    before without following a link, all on the root's filesystem. Raises `Refused`:
    a link, ``..``, another filesystem, or any `OSError` (a race: the path changed under
    the walk) in plain words."""
    try:
        fd = os.open(root, STEP | os.O_DIRECTORY)
    except OSError as exc:
        raise Refused(f": its mount root {root} cannot be opened: {exc.strerror}") from None
    try:
        device = os.fstat(fd).st_dev
        for part in parts:
            found = _step(fd, part, device)
            os.close(fd)
            fd = found
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step(parent: int, part: str, device: int) -> int:
    """The next component, opened relative to ``parent``, or `Refused`."""
    if part in ("..", "."):
        raise Refused(f": '{part}' is not allowed in a mount")
    try:
        fd = os.open(part, STEP, dir_fd=parent)
    except FileNotFoundError:
        raise Refused(" does not exist on the node") from None
    except OSError as exc:
        raise Refused(f": cannot open {part}: {exc.strerror}") from None
    try:
        found = os.fstat(fd)
        if stat.S_ISLNK(found.st_mode):
            raise Refused(f" is not its own real path: {part} is a symlink")
        if found.st_dev != device:
            raise Refused(
                f": {part} is on another filesystem than its mount root; "
                f"{SETTING} may list it as a root of its own"
            )
        if not (stat.S_ISDIR(found.st_mode) or stat.S_ISREG(found.st_mode)):
            raise Refused(f": {part} is neither a directory nor a file")
    except BaseException:
        os.close(fd)
        raise
    return fd
