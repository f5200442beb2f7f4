"""What an engine can isolate a job with (`IsolationSupport`): its OCI runtimes and the
arguments each is registered with, per-job user namespaces, id-mapped mounts.

Whether a bind mount can be id-mapped is learnt from the OCI runtime's name and version:
crun maps them, runc from 1.2 (runc 1.1 takes ``idmap`` and leaves the mount unmapped,
so a job's root could not write it).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tuneplane_node.errors import NodeError
from tuneplane_node.runtime.facts import IsolationSupport

T = TypeVar("T")
IDMAP_RUNC = (1, 2)
"""The first runc whose bind mounts can be id-mapped."""
_VERSION = re.compile(r"(\d+)\.(\d+)")


def maps_mount_ids(runtime: str, version: str) -> bool:
    """Whether an OCI runtime of that name and version (its ``--version`` text, or the
    bare number) id-maps bind mounts into a user namespace. Unknown runtimes: no."""
    name = runtime.rsplit("/", 1)[-1]
    if name == "crun":
        return True
    if name != "runc":
        return False
    found = _VERSION.search(version)
    return found is not None and (int(found[1]), int(found[2])) >= IDMAP_RUNC


def registered(runtimes: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """docker's ``Runtimes`` of its info: each name with its ``runtimeArgs``."""
    return {
        str(name): tuple(str(arg) for arg in (entry or {}).get("runtimeArgs") or ())
        for name, entry in runtimes.items()
    }


class EngineIsolation(ABC):
    """An engine runtime's `isolation_support`, from its adapter's `_isolation_support`."""

    @abstractmethod
    async def _call(
        self, action: str, fn: Callable[..., T], *args: Any, read: bool = False
    ) -> T: ...

    @abstractmethod
    def _isolation_support(self) -> IsolationSupport:
        """The engine's info read for its runtimes and namespaces (blocking)."""

    async def isolation_support(self) -> IsolationSupport:
        try:
            return await self._call("report its runtimes", self._isolation_support, read=True)
        except NodeError as exc:
            return IsolationSupport(error=exc.message)
