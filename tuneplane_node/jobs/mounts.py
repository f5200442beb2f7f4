"""Which host paths a job may mount: only what lies under the operator's mount roots.

The console's token buys job verbs, never the host: a mount of ``/``, of the engine's
socket or of ``/etc`` would hand a job the machine. Every host path is resolved through
its symlinks (a job could have left one in a shared directory, pointing at ``/``) and
must lie under one of `NodeSettings.mount_roots`, which start-up has checked hold none
of the host's system directories. The engine is given the resolved path, so a link
swapped after the check is not followed by name.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from tuneplane_node.errors import InvalidField
from tuneplane_node.runtime.base import Mount
from tuneplane_node.settings import env_name

log = logging.getLogger(__name__)
SETTING = env_name("allowed_mount_roots")


class MountPolicy:
    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = tuple(roots)

    def check(self, mounts: Sequence[Mount]) -> tuple[Mount, ...]:
        """The mounts with their host paths resolved, or InvalidField naming the first bad
        one. Blocking (it reads the filesystem): run it off the loop."""
        return tuple(self._check(mount, f"container.mounts[{i}]") for i, mount in enumerate(mounts))

    def _check(self, mount: Mount, field: str) -> Mount:
        resolved = Path(os.path.realpath(mount.host))
        if not any(resolved == root or resolved.is_relative_to(root) for root in self.roots):
            shown = mount.host if str(resolved) == mount.host else f"{mount.host} ({resolved})"
            log.warning("refused a mount of %s: outside the mount roots", shown)
            raise InvalidField(
                field, f"{shown} is not under an allowed mount root; {SETTING} would allow it"
            )
        if not resolved.exists():
            raise InvalidField(field, f"{mount.host} does not exist on the node")
        return mount._replace(host=str(resolved))
