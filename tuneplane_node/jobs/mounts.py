"""Which host paths a job may mount: only real paths under the operator's mount roots.

The console's token buys job verbs, never the host: a mount of ``/``, of the engine's
socket or of ``/etc`` would hand a job the machine. A host path must lie under one of
`NodeSettings.mount_roots` (which start-up has checked hold none of the host's system
directories) and must be its own real path: no component may be a symlink. A job can
plant ``tenantA/ckpt -> ../tenantB/ckpt`` in a shared directory, and a check of the
resolved path alone would then mount tenant B's files into tenant A's next run (kubelet
refuses a subPath the same way since CVE-2017-1002101). A pending launch is checked
again just before its container is made, after its pull.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from tuneplane_node.errors import InvalidField
from tuneplane_node.runtime.base import Mount
from tuneplane_node.settings import env_name

log = logging.getLogger(__name__)
SETTING = env_name("allowed_mount_roots")


class MountPolicy:
    """``never_a_root``: the system path a path is, holds or lies in (the settings' rule
    for a mount root), so a refusal offers the setting only where it could help."""

    def __init__(
        self, roots: Sequence[Path], *, never_a_root: Callable[[Path], Path | None]
    ) -> None:
        self.roots = tuple(roots)
        self.never_a_root = never_a_root

    def check(self, mounts: Sequence[Mount]) -> tuple[Mount, ...]:
        """The mounts with their host paths resolved, or one InvalidField naming every bad
        one. Blocking (it reads the filesystem): run it off the loop."""
        checked, refused = [], []
        for i, mount in enumerate(mounts):
            try:
                checked.append(self._check(mount, f"container.mounts[{i}]"))
            except InvalidField as exc:
                refused.append(exc)
        if refused:
            raise InvalidField.of(refused)
        return tuple(checked)

    def _check(self, mount: Mount, field: str) -> Mount:
        given = Path(os.path.normpath(mount.host))
        resolved = Path(os.path.realpath(given))
        if resolved != given:
            log.warning("refused a mount of %s: a symlink in its path (to %s)", given, resolved)
            raise InvalidField(
                field, f"{mount.host} is not its own real path: a component is a symlink"
            )
        if not any(resolved == root or resolved.is_relative_to(root) for root in self.roots):
            log.warning("refused a mount of %s: outside the mount roots", resolved)
            raise InvalidField(field, self._outside(mount.host, resolved))
        if not resolved.exists():
            raise InvalidField(field, f"{mount.host} does not exist on the node")
        return mount._replace(host=str(resolved))

    def _outside(self, host: str, resolved: Path) -> str:
        system = self.never_a_root(resolved)
        if system is None:
            return f"{host} is not under an allowed mount root; {SETTING} would allow it"
        held = "is in"
        if system == resolved or system.is_relative_to(resolved):
            held = "is" if system == resolved else "holds"
        return f"{host} {held} {system}, which a job may never mount; no setting allows it"
