"""ImageCatalog: what the node knows of images, for ``GET /node/v1/images``.

The images listed are those the node pulled (its `ImageLedger`) or its own containers
are made from, never every image of the engine (the operator's others are not the
node's business). Each with the engine's size and names, the ledger's times, the node's
containers made from it, and whether it is private (pulled with credentials:
`ImageKeeper`). The pulls are those in flight, shared by launches and prefetches alike,
and the failed prefetches.

A ledger record whose image the engine no longer has is forgotten here: it was removed
behind the node's back, and a record of it would only mislead a collector.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Protocol

from tuneplane_node.clock import parse_rfc3339, rfc3339
from tuneplane_node.jobs.images.keeper import ImageKeeper
from tuneplane_node.jobs.images.ledger import ImageLedger, ImageRecord
from tuneplane_node.jobs.images.prefetch import Prefetcher
from tuneplane_node.jobs.images.pulls import PullCoordinator, SharedPull
from tuneplane_node.jobs.words.images import ImagesView, ImageView, Prefetched, PullView
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.wire.values import PrefetchRequest

log = logging.getLogger(__name__)


class CatalogRuntime(Protocol):
    """What the catalog asks of the engine: the node's containers, and their images."""

    async def ps(self) -> list[ContainerState]: ...
    async def image_info(self, image: str) -> ImageInfo | None: ...


class Waiting(Protocol):
    """A pending launch, as far as the list reads it: its ref and the pull it waits on."""

    @property
    def ref(self) -> str: ...
    @property
    def pull(self) -> SharedPull | None: ...


class WaitingLaunches(Protocol):
    """The pending launches (`PendingTable`), as far as the list reads them."""

    def records(self) -> Iterable[Waiting]: ...


class ImageCatalog:
    """Reads the ledger, the engine, the pulls and the pending launches; changes nothing
    but the ledger's records of images that are gone."""

    def __init__(
        self,
        runtime: CatalogRuntime,
        *,
        ledger: ImageLedger,
        images: ImageKeeper,
        pulls: PullCoordinator,
        prefetcher: Prefetcher,
        pending: WaitingLaunches,
    ) -> None:
        self.runtime = runtime
        self.ledger = ledger
        self.images = images
        self.pulls = pulls
        self.prefetcher = prefetcher
        self.pending = pending

    async def prefetch(self, request: PrefetchRequest) -> Prefetched:
        """`Prefetcher.prefetch`: the verb beside what it shows."""
        return await self.prefetcher.prefetch(request)

    async def view(self) -> ImagesView:
        pulls = tuple(self._pulls())  # before any wait: a pull may end while the engine reads
        users = _users(await self.runtime.ps())
        records = {record.id: record for record in self.ledger.entries()}
        ids = list(dict.fromkeys([*records, *users]))
        infos = await asyncio.gather(*(self.runtime.image_info(i) for i in ids))
        images = []
        for image_id, info in zip(ids, infos, strict=True):
            record = records.get(image_id)
            if info is None:
                if record is not None and not users.get(image_id):
                    self.ledger.forget(image_id)  # removed behind the node's back
                continue
            images.append(self._image(info, record, users.get(image_id, [])))
        return ImagesView(tuple(images), pulls)

    def _image(
        self, info: ImageInfo, record: ImageRecord | None, users: list[ContainerState]
    ) -> ImageView:
        references = record.references if record is not None else ()
        names = [*reversed(references), *info.names]  # the node's newest name first
        created = [parse_rfc3339(state.created_at) for state in users]
        used = [t for t in (record.last_used_at if record else None, *created) if t is not None]
        return ImageView(
            image=names[0] if names else info.id,
            id=info.id,
            size_bytes=info.size_bytes,
            pulled_at=_stamp(record.pulled_at if record else None),
            last_used_at=_stamp(max(used) if used else None),
            in_use_by=tuple(sorted(state.name for state in users)),
            private=self.images.private(names, info.id),
        )

    def _pulls(self) -> Iterable[PullView]:
        for pull in self.pulls.pulls.values():
            yield self._pull(pull, "pulling", *pull.rate_now())
        for record in self.prefetcher.failed():
            if record.pull is not None:  # joined as its task's first step
                yield self._pull(record.pull, "failed", None, None, error=record.error)

    def _pull(
        self,
        pull: SharedPull,
        phase: str,
        rate: float | None,
        eta: float | None,
        *,
        error: str | None = None,
    ) -> PullView:
        waiting = sorted(record.ref for record in self.pending.records() if record.pull is pull)
        return PullView(
            image=pull.image,
            phase=phase,
            progress=pull.progress,
            rate_bytes_per_s=rate,
            eta_s=eta,
            started_at=rfc3339(pull.started_at),
            waiting=tuple(waiting),
            error=error,
        )


def _users(states: Iterable[ContainerState]) -> dict[str, list[ContainerState]]:
    """The node's containers by the id of the image each is made from."""
    users: dict[str, list[ContainerState]] = {}
    for state in states:
        if state.ours and state.image_id:
            users.setdefault(state.image_id, []).append(state)
    return users


def _stamp(moment: datetime | None) -> str | None:
    return rfc3339(moment) if moment is not None else None
