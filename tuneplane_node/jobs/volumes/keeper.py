"""VolumeKeeper: a launch's volumes, from the rule on their sources to their binds.

The launcher asks it which volumes a launch lacks (it then waits in ``phase: pulling``),
waits for their fills beside the image's pull, and has it open each entry for the
staging (`MountStaging`), which binds it read-only: what the job sees is the file that
was checked, opened without following a link, and no write of the job reaches it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs.mounts import Opened
from tuneplane_node.jobs.volumes.fills import VolumeFill, VolumeFills
from tuneplane_node.jobs.volumes.store import Entry, VolumeStore
from tuneplane_node.runtime.base import Mount, Volume
from tuneplane_node.runtime.fetching import Fetcher
from tuneplane_node.settings import NodeSettings, env_name

log = logging.getLogger(__name__)
FIELD = "container.volumes"
OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class VolumeKeeper:
    def __init__(self, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = VolumeStore(settings.volume_dir)
        fetcher = Fetcher(stall_s=settings.local_image_pull_stall_s)
        self.fills = VolumeFills(self.store, fetcher, limit=settings.volume_fills, clock=clock)
        self.insecure = frozenset(settings.volume_insecure_hosts)

    def vet(self, volumes: Sequence[Volume]) -> None:
        """A 422 naming each volume whose plain-HTTP host the operator did not list."""
        refused = [
            InvalidField(
                f"{FIELD}[{i}].source",
                f"plain http:// only for the hosts in {env_name('volume_insecure_hosts')}",
            )
            for i, volume in enumerate(volumes)
            if not self._secure_enough(volume.source)
        ]
        if refused:
            raise InvalidField.of(refused)

    def _secure_enough(self, source: str) -> bool:
        parts = urlsplit(source)
        if parts.scheme == "https":
            return True
        try:
            port = parts.port or 80
        except ValueError:
            return False
        return f"{(parts.hostname or '').lower()}:{port}" in self.insecure

    async def missing(self, volumes: Sequence[Volume]) -> list[Volume]:
        """The volumes whose entry is not in the store now."""
        return [volume for volume in volumes if await self.fills.entry(volume.sha256) is None]

    def join(self, volumes: Sequence[Volume], listener: Callable[[], None]) -> list[VolumeFill]:
        """The fills of ``volumes`` (one per digest), started where none runs; each tells
        ``listener`` of its progress until `wait_all` leaves it."""
        fills = [self.fills.join(digest, source) for digest, source in _by_digest(volumes)]
        for fill in fills:
            fill.listeners.append(listener)
        return fills

    async def wait_all(self, fills: Sequence[VolumeFill], listener: Callable[[], None]) -> None:
        """Until every fill has its entry; the first failure is raised and every fill
        left (each stops when nobody else waits for it)."""
        waits = [asyncio.ensure_future(self.fills.wait(fill)) for fill in fills]
        try:
            if waits:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
                for each in done:
                    each.result()
        finally:
            for each in waits:
                each.cancel()
            if waits:
                await asyncio.wait(waits)
            for fill in fills:
                if listener in fill.listeners:
                    fill.listeners.remove(listener)

    def open(self, volumes: Sequence[Volume]) -> list[Opened]:
        """Each volume's entry opened without following a link, to be bound read-only at
        its path. Blocking; a 422 naming the volume whose entry is gone."""
        opened: list[Opened] = []
        try:
            for i, volume in enumerate(volumes):
                opened.append(self._opened(volume, f"{FIELD}[{i}]"))
        except BaseException:
            for each in opened:
                each.close()
            raise
        return opened

    def _opened(self, volume: Volume, field: str) -> Opened:
        entry = self.store.entry(volume.sha256)
        if entry is None:
            raise InvalidField(field, f"sha256:{volume.sha256} is not in the volume store")
        fd = os.open(entry.path, OPEN)
        return Opened(Mount(str(entry.path), volume.path, True), fd, False, field)

    async def view(self) -> tuple[list[Entry], list[VolumeFill]]:
        """The store's entries (read in the fills' threads) and the fills under way."""
        entries = await self.fills.entries()
        return entries, list(self.fills.fills.values())

    async def close(self) -> None:
        await self.fills.close()


def _by_digest(volumes: Sequence[Volume]) -> list[tuple[str, str]]:
    """(digest, source) once per digest: two paths of one file are one fill."""
    return list({volume.sha256: volume.source for volume in reversed(volumes)}.items())
