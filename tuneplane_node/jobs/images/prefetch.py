"""Prefetcher: pull an image before the launches that will need it.

A prefetch joins the image's pull (`PullCoordinator`) as a launch does, so a launch of the
image that arrives mid-prefetch waits on that same download, and a prefetch arriving
while launches pull the image rides on theirs. It stays a waiter until the pull ends:
the download does not stop when the launches that shared it are stopped. Credentials and
the private-image rule are a launch's (`ImageKeeper`): a wrong password fails it with
the same reason. Cordon does not refuse it: it starts no job. No room for it (the
image GC's pull gate) is a 507, as for a launch. A failed prefetch keeps
its error as long as a failed launch's record (`FAILED_RECORD_TTL_S`), for
``GET /node/v1/images`` to show; every record lives in memory only, as pending launches do.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.jobs.images.gc import ImageCollector
from tuneplane_node.jobs.images.keeper import ImageKeeper
from tuneplane_node.jobs.images.pulls import PullCoordinator, SharedPull
from tuneplane_node.jobs.words.images import Prefetched
from tuneplane_node.jobs.words.views import FAILED_RECORD_TTL_S
from tuneplane_node.references import canonical
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import PRESENT, PULLING, PrefetchRequest, RegistryAuth

log = logging.getLogger(__name__)


class ImageLookup(Protocol):
    """What a prefetch asks of the engine: whether it has the image."""

    async def image_exists(self, image: str) -> bool: ...
    async def image_info(self, image: str) -> ImageInfo | None: ...


@dataclass
class Prefetch:
    """One prefetch: its request (the credentials it pulls with resolved), its pull once
    joined, and how it failed."""

    request: PrefetchRequest
    pull: SharedPull | None = None
    error: str | None = None
    failed_at: float | None = None  # monotonic

    @property
    def image(self) -> str:
        return self.request.image


class Prefetcher:
    """The prefetch verb and its records, by image and credentials (as pulls are)."""

    def __init__(
        self,
        runtime: ImageLookup,
        pulls: PullCoordinator,
        *,
        images: ImageKeeper,
        gc: ImageCollector,
        clock: Clock,
        ttl_s: float = FAILED_RECORD_TTL_S,
    ) -> None:
        self.runtime = runtime
        self.pulls = pulls
        self.images = images
        self.gc = gc
        self.clock = clock
        self.ttl_s = ttl_s
        self._records: dict[tuple[str, RegistryAuth | None], Prefetch] = {}
        self.tasks = BackgroundTasks(log)

    async def prefetch(self, request: PrefetchRequest) -> Prefetched:
        """``present`` when the image is here and the policy does not pull it again (a
        private one only for credentials it admits: else `ImageAccessDenied`); else
        ``pulling``: the pull runs in the background, shared with launches of the image."""
        image = request.image
        self.images.refuse_id(image, field="image")
        auth = await self.images.credentials_for(image, request.auth)
        record = self._records.get((canonical(image), auth))
        if record is not None and record.error is None:
            return Prefetched(image, PULLING)  # under way: the same pull, not a second
        info = await self.runtime.image_info(canonical(image))
        # A runtime without images (the process runtime) has every one "here".
        present = info is not None or await self.runtime.image_exists(canonical(image))
        if info is not None:  # a private one only for credentials it admits, else 403
            await self.images.admit(image, info, auth)
        if present and not self.images.must_pull(image, request.pull_policy):
            return Prefetched(image, PRESENT)
        await self.gc.fit(image, auth, present=present)  # no room: 507
        await self.images.before_pull(image, auth)  # no record, no pull: 507
        self._start(Prefetch(replace(request, auth=auth)))
        return Prefetched(image, PULLING)

    def _start(self, record: Prefetch) -> None:
        key = (canonical(record.image), record.request.auth)
        self._records[key] = record
        self.tasks.spawn(
            self._pull(record),
            name=f"prefetch {record.image}",
            ended=functools.partial(self._ended, key, record),
        )
        log.info("prefetch of %s: pulling in the background", record.image)

    async def _pull(self, record: Prefetch) -> None:
        auth = record.request.auth
        record.pull = self.pulls.join(record.image, auth, prefetch=True)
        await self.pulls.wait(record.pull)
        info = await self.runtime.image_info(canonical(record.image))
        await self.images.pulled(record.image, info, auth)

    def _ended(
        self, key: tuple[str, RegistryAuth | None], record: Prefetch, task: asyncio.Task[None]
    ) -> None:
        """A done callback (a task cancelled before it ran has no ``finally``): a pulled
        or cancelled prefetch's record goes, a failed one keeps its error."""
        error = None if task.cancelled() else task.exception()
        if error is None:
            if self._records.get(key) is record:
                del self._records[key]
            if not task.cancelled():
                log.info("prefetch of %s: done", record.image)
            return
        if isinstance(error, NodeError):
            record.error = error.message
            log.warning("prefetch of %s failed: %s", record.image, error.message)
        else:
            log.error("prefetch of %s failed on a bug", record.image, exc_info=error)
            record.error = f"internal error: {type(error).__name__}: {error}"
        record.failed_at = self.clock.monotonic()

    def failed(self) -> Iterator[Prefetch]:
        """The failed prefetches whose records have not expired (expired ones go)."""
        now = self.clock.monotonic()
        for key, record in list(self._records.items()):
            if record.failed_at is not None and now - record.failed_at > self.ttl_s:
                del self._records[key]
        return iter([r for r in self._records.values() if r.failed_at is not None])

    async def close(self) -> None:
        """Cancel every prefetch (shutdown), before the pulls themselves are."""
        await self.tasks.close()
        self._records.clear()
