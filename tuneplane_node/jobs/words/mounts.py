"""The mount wing's word: a host path opened for a job's mount, which the volume wing
hands the staging too."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tuneplane_node.wire.values import Mount


@dataclass
class Opened:
    """A mount's host path, opened (``fd``, an ``O_PATH`` descriptor the holder closes);
    ``field``: what a refusal names (empty: ``container.mounts[i]``)."""

    mount: Mount
    fd: int
    directory: bool
    field: str = ""

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
