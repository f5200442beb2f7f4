"""What an engine can isolate a job with (`IsolationSupport`): its OCI runtimes and the
arguments each is registered with, per-job user namespaces, id-mapped mounts; and what
this machine sees of the jobs' processes (`EngineProcesses`).

Whether a bind mount can be id-mapped is learnt from the OCI runtime's name and version:
crun maps them, runc from 1.2 (runc 1.1 takes ``idmap`` and leaves the mount unmapped,
so a job's root could not write it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

from tuneplane_node.errors import NodeError
from tuneplane_node.runtime import cgroups, sigcatch
from tuneplane_node.runtime.engines.seam import EngineSeam
from tuneplane_node.runtime.facts import IsolationSupport
from tuneplane_node.signals import JOB_SIGNALS

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


class EngineIsolation:
    """An engine runtime's `isolation_support`: its adapter's ``info`` read (blocking) on
    the seam; an engine that does not answer is the answer's ``error``."""

    def __init__(self, seam: EngineSeam, info: Callable[[], IsolationSupport]) -> None:
        self.seam, self.info = seam, info

    async def support(self) -> IsolationSupport:
        try:
            return await self.seam.call("report its runtimes", self.info, read=True)
        except NodeError as exc:
            return IsolationSupport(error=exc.message)


class EngineProcesses:
    """What this machine sees of the jobs' processes, for an engine on it: the container
    a process is in, and whether a job catches a signal (`sigcatch`), its pid read from
    the seam's inspect document."""

    def __init__(self, seam: EngineSeam) -> None:
        self.seam = seam

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        return {pid: cgroups.container_id_of_pid(pid) for pid in pids}

    async def catches(self, ref: str, signal: str) -> bool | None:
        return await self.seam.call(
            "read the caught signals", self._catches, ref, JOB_SIGNALS[signal], read=True
        )

    def _catches(self, ref: str, number: int) -> bool | None:
        doc = self.seam.or_missing(None, self.seam.document, ref)
        pid = int(((doc or {}).get("State") or {}).get("Pid") or 0)
        # The engine's pid is a process of this machine only when it is in the container.
        if doc is None or not pid or cgroups.container_id_of_pid(pid) != doc.get("Id"):
            return None
        return sigcatch.caught(pid, number)
