"""Whether the store's pressure is explained: by the jobs' writes, their scratches, the
volume store and the images, or by something else on its filesystem (a process of the
host writing beside the store), which no stop and no image removal of the node relieves.

The store's used bytes less what the node can name (the images' sizes as the engine
states them, each running job's last measure, the jobs stopped for their disk, the
scratch files and the volume store where they lie on the store's filesystem, twice the
bytes the pulls under way have downloaded: compressed, then unpacked) is the
**rest**: the OS, the engine's own files, whatever the host wrote. Its smallest value
seen is its baseline (taken at the first pass, then each time the store is under
pressure); the pressure is **unexplained** when the rest has grown past its baseline by
more than the store is over its high threshold: without that growth, no pressure. The
image GC then removes nothing to chase the threshold (only room a pull needs), and
health says ``disk_pressure_unexplained``. The images' sizes count shared layers in each
(an upper bound): the rest is a lower bound, the verdict errs toward "explained".
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from tuneplane_node.jobs.words.images import ImageStore
from tuneplane_node.runtime import diskwalk
from tuneplane_node.runtime.facts import EngineImage

log = logging.getLogger(__name__)
WALK_BUDGET_S = 2.0  # the scratch and volume directories' walk, each pass that asks


class ImageLister(Protocol):
    async def list_images(self) -> list[EngineImage]: ...


class PressureAccount:
    """The rest's baseline and the verdict, pass by pass. Used on the loop only."""

    def __init__(self, runtime: ImageLister, *, dirs: Iterable[Path], high_percent: int) -> None:
        self.runtime = runtime
        self.dirs = tuple(dirs)  # the scratch root, the volume store
        self.high = high_percent
        self.baseline: int | None = None
        self.unexplained: bool | None = None  # None: not known (never under pressure)
        self.pulling: Callable[[], int] = lambda: 0  # the pulls under way's bytes so far

    async def judge(self, store: ImageStore, *, jobs_bytes: int) -> bool | None:
        """The verdict for this pass: asked of the engine and the disk only at the first
        pass and under pressure; False without pressure."""
        if store.pressure is False and self.baseline is not None:
            self._say(False)
            return False
        rest = await self._rest(store, jobs_bytes)
        if rest is None:
            return None
        self.baseline = rest if self.baseline is None else min(self.baseline, rest)
        if not store.pressure:
            self._say(False)
            return False
        room = store.room(self.high)
        over = max(0, -room) if room is not None else 0
        verdict = rest - self.baseline > over
        self._say(verdict, growth=rest - self.baseline, over=over)
        return verdict

    async def _rest(self, store: ImageStore, jobs_bytes: int) -> int | None:
        if store.total_bytes is None or store.free_bytes is None or store.path is None:
            return None
        images = sum(image.size for image in await self.runtime.list_images())
        beside = await asyncio.to_thread(_on_store, store.path, self.dirs)
        pulls = 2 * self.pulling()  # the blobs, and the layers unpacked from them
        return store.total_bytes - store.free_bytes - images - jobs_bytes - beside - pulls

    def _say(self, verdict: bool, *, growth: int = 0, over: int = 0) -> None:
        """One log line when the verdict turns."""
        if verdict and not self.unexplained:
            log.warning(
                "disk pressure not explained by the jobs, their scratches, the volume store "
                "or the images: %d bytes written on the store's filesystem by something else "
                "(%d bytes over the threshold); no image is removed for it",
                growth, over,
            )  # fmt: skip
        elif not verdict and self.unexplained:
            log.info("disk pressure: no longer unexplained")
        self.unexplained = verdict


def _on_store(store_path: str, dirs: Iterable[Path]) -> int:
    """The allocated bytes of ``dirs`` that lie on the store's filesystem (blocking)."""
    try:
        device = os.stat(store_path).st_dev
    except OSError:
        return 0
    mine = []
    for where in dirs:
        try:
            if os.stat(where).st_dev == device:
                mine.append(str(where))
        except OSError:
            continue
    return diskwalk.measure(mine, budget_s=WALK_BUDGET_S).used_bytes or 0
