"""What a running job uses (CPU, memory, PIDs), for stats: read from its cgroup's files,
located once per container (by its process, checked to hold the container's id), else
the engine's one-shot stats where the files are not this machine's to read (a remote
engine, another pid namespace). A helper of `EngineRuntime`, over its seam. Blocking
reads on the engine's pool."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuneplane_node.runtime import cgroups
from tuneplane_node.runtime.engines import dockerformat as fmt
from tuneplane_node.runtime.engines.seam import EngineSeam
from tuneplane_node.runtime.facts import Usage

MACHINE_MEMORY = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
# Jobs whose cgroup stays located. The sampler asks in slices, so no call names them all:
# the least recently read go first, and one still running is located again (an inspect).
LOCATED_MAX = 2048


class EngineUsage:
    """The running jobs' usage; where each job's figures are, remembered."""

    def __init__(self, seam: EngineSeam, stats: Callable[[str], Mapping[str, Any]]) -> None:
        self.seam, self._stats = seam, stats
        self._cgroups: dict[str, cgroups.CgroupDirs] = {}  # ref -> where its figures are

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        return await self.seam.call("read usage", self._usage_all, list(refs), read=True)

    def _usage_all(self, refs: list[str]) -> dict[str, Usage]:
        found = {ref: self._usage_one(ref) for ref in refs}
        # A read puts its job last (`_usage_one`): the first are the least recently read.
        over = max(0, len(self._cgroups) - LOCATED_MAX)
        for ref in list(itertools.islice(self._cgroups, over)):
            del self._cgroups[ref]
        return {ref: usage for ref, usage in found.items() if usage is not None}

    def _usage_one(self, ref: str) -> Usage | None:
        """From the cgroup files (located once per container), else the engine's one-shot
        stats; None when the container is gone or not running."""
        known = self._cgroups.pop(ref, None)
        if known is not None and (usage := cgroups.read(known)) is not None:
            self._cgroups[ref] = known
            return usage
        doc = self.seam.or_missing(None, self.seam.document, ref)
        state = (doc or {}).get("State") or {}
        if doc is None or not state.get("Running"):
            return None
        dirs = cgroups.locate(int(state.get("Pid") or 0), must_hold=str(doc.get("Id")))
        if dirs is not None and (usage := cgroups.read(dirs)) is not None:
            self._cgroups[ref] = dirs
            return usage
        # Not readable from here (a remote engine, another pid namespace): ask the engine.
        stats = self.seam.or_missing(None, self._stats, ref)
        return fmt.usage_from_stats(stats, machine_memory=MACHINE_MEMORY) if stats else None
