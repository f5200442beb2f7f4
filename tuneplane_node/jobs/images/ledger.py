"""ImageLedger: the images the node itself pulled or made containers from, by engine id.

What the engine cannot say: which images are the node's doing (it pulled or prefetched
them) and when the node last made a container from each. `GET /node/v1/images` reads it,
and image garbage collection decides by it (an image the ledger does not hold is the
operator's, never the node's to remove). Kept in ``<state dir>/images.json``, written
atomically (a temporary file, fsync, rename) after each change, so a restart keeps it.
It holds names, ids and times only, never a secret.

The API, for its callers:

- ``record_pull(image, id, at, prefetch=..., private=...)``: a pull of ``image`` (a
  reference) ended with the engine holding ``id``; ``prefetch``: it was a prefetch, not a
  launch's; ``private``: it pulled with credentials.
- ``record_use(id, at)``: the node created a container from it. Only a pull names an
  image: a launch's spelling of it (another tag, an id) never does.
- ``entries()``: every `ImageRecord`, oldest pull first; ``get(id)``: one.
- ``forget(id)``: the image is gone (removed); its record goes too.

Each takes effect in memory at once and is written to disk behind it (``await flush()``
to wait for the disk). A write that fails is logged and the record kept in memory: the
image is there all the same, and the next change writes everything again. Times are
aware UTC datetimes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuneplane_node.clock import parse_rfc3339, rfc3339
from tuneplane_node.durable import remove_leftovers, write_atomically
from tuneplane_node.references import ImageName
from tuneplane_node.tasks import BackgroundTasks

log = logging.getLogger(__name__)

LEDGER_FILE = "images.json"
MAX_IMAGES = 4096  # past it the least recently touched records go: a node holds far fewer
MAX_REFERENCES = 64  # names per image: the newest kept
MAX_FILE_BYTES = 16 * 2**20


@dataclass(frozen=True)
class ImageRecord:
    """One image the node knows. ``references``: the names the node pulled or ran it by,
    newest last (a tag that moved to another image leaves this one). ``pulled_at``: the
    node's newest pull or prefetch of it, None if it never pulled it (the operator's image
    its containers use); ``prefetched_at``: the newest prefetch, None if never;
    ``last_used_at``: the newest creation of one of the node's containers from it;
    ``private``: a pull of it had credentials (the private-image record's backstop)."""

    id: str
    references: tuple[str, ...] = ()
    pulled_at: datetime | None = None
    prefetched_at: datetime | None = None
    last_used_at: datetime | None = None
    private: bool = False

    @property
    def touched(self) -> datetime | None:
        """The newest of its times: what the bound on the ledger's size keeps."""
        times = [t for t in (self.pulled_at, self.last_used_at) if t is not None]
        return max(times) if times else None

    def named(self, image: str) -> ImageRecord:
        kept = [name for name in self.references if name != image]
        return replace(self, references=(*kept, image)[-MAX_REFERENCES:])

    def unnamed(self, image: str) -> ImageRecord:
        return replace(self, references=tuple(n for n in self.references if n != image))


class ImageLedgerFile:
    """The ledger on disk. Small: callers run reads and writes in a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LEDGER_FILE

    def load(self) -> dict[str, ImageRecord]:
        """The saved records; none saved, or a file that cannot be read, is none (said in
        the log): forgetting images only keeps a collector from removing them."""
        try:
            remove_leftovers(self.path)
            with self.path.open("rb") as file:
                raw = file.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.error("image ledger %s cannot be read (%s): starting empty", self.path, exc)
            return {}
        try:
            return _parse(raw)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("image ledger %s is not valid (%s): starting empty", self.path, exc)
            return {}

    def save(self, document: dict[str, Any]) -> None:
        write_atomically(self.path, json.dumps(document, indent=1).encode())


class ImageLedger:
    """The node's image records, in memory and on disk (see the module's docstring).

    A change takes effect in memory at once; the file is written behind it by one writer
    task, every change since its last write at a time, so a launch never waits on a disk
    (``flush`` waits for it; ``close`` too)."""

    def __init__(self, state_dir: Path) -> None:
        self.file = ImageLedgerFile(state_dir)
        self._records: dict[str, ImageRecord] = {}
        self._tasks = BackgroundTasks(log)
        self._writer: asyncio.Task[None] | None = None
        self._dirty = False

    async def load(self) -> None:
        self._records = await asyncio.to_thread(self.file.load)
        if self._records:
            log.info("image ledger: %d images", len(self._records))

    def entries(self) -> list[ImageRecord]:
        """Every record, oldest pull first (never pulled: first of all)."""
        return sorted(self._records.values(), key=_pull_order)

    def get(self, image_id: str) -> ImageRecord | None:
        return self._records.get(image_id)

    def record_pull(
        self, image: str, id: str, at: datetime, *, prefetch: bool, private: bool = False
    ) -> None:
        """A pull (or a prefetch) of ``image`` ended with the engine holding ``id``."""
        record = self._claim(image, id).named(image)
        prefetched = at if prefetch else record.prefetched_at
        private = private or record.private
        self._put(replace(record, pulled_at=at, prefetched_at=prefetched, private=private))

    def record_use(self, id: str, at: datetime) -> None:
        """The node created a container from the image ``id``."""
        self._put(replace(self._records.get(id) or ImageRecord(id=id), last_used_at=at))

    def pulled_repositories(self) -> set[str]:
        """The repositories of every reference the node pulled an image by."""
        return {
            ImageName.parse(name).repository
            for record in self._records.values()
            for name in record.references
        }

    def pulled_privately(self) -> list[tuple[str, tuple[str, ...]]]:
        """(id, references) of each image a pull with credentials left."""
        return [(r.id, r.references) for r in self._records.values() if r.private]

    def forget(self, id: str) -> None:
        """The image is gone from the engine: its record goes."""
        if self._records.pop(id, None) is not None:
            self._changed()

    async def flush(self) -> None:
        """Return once every change so far is on disk (or its write failed, logged)."""
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)

    async def close(self) -> None:
        await self.flush()
        await self._tasks.close()

    def _claim(self, image: str, image_id: str) -> ImageRecord:
        """The record of ``image_id``; the name leaves every other image (a tag points
        at one image: one that moved names the new one now)."""
        for other, record in list(self._records.items()):
            if other != image_id and image in record.references:
                self._records[other] = record.unnamed(image)
        return self._records.get(image_id) or ImageRecord(id=image_id)

    def _put(self, record: ImageRecord) -> None:
        self._records[record.id] = record
        if len(self._records) > MAX_IMAGES:
            oldest = min(self._records.values(), key=_touch_order)
            del self._records[oldest.id]
        self._changed()

    def _changed(self) -> None:
        self._dirty = True
        if self._writer is None or self._writer.done():
            self._writer = self._tasks.spawn(self._write(), name="image ledger write")

    async def _write(self) -> None:
        while self._dirty:
            self._dirty = False
            document = _unparse(self._records)  # on the loop: the thread sees no change
            try:
                await asyncio.to_thread(self.file.save, document)
            except OSError as exc:
                log.error("image ledger %s not written (%s): kept in memory", self.file.path, exc)


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def _pull_order(record: ImageRecord) -> datetime:
    return record.pulled_at or _NEVER


def _touch_order(record: ImageRecord) -> datetime:
    return record.touched or _NEVER


def _time(value: object) -> datetime | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"expected a time, got {type(value).__name__}")
    return parse_rfc3339(value)


def _stamp(moment: datetime | None) -> str | None:
    return rfc3339(moment) if moment is not None else None


def _parse(raw: bytes) -> dict[str, ImageRecord]:
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    images = json.loads(raw)["images"]
    records = {}
    for entry in images:
        references = entry["references"]
        if not isinstance(references, list) or not all(isinstance(r, str) for r in references):
            raise ValueError("'references' must be a list of names")
        record = ImageRecord(
            id=str(entry["id"]),
            references=tuple(references[-MAX_REFERENCES:]),
            pulled_at=_time(entry.get("pulled_at")),
            prefetched_at=_time(entry.get("prefetched_at")),
            last_used_at=_time(entry.get("last_used_at")),
            private=entry.get("private") is True,
        )
        records[record.id] = record
    return records


def _unparse(records: dict[str, ImageRecord]) -> dict[str, Any]:
    return {
        "images": [
            {
                "id": record.id,
                "references": list(record.references),
                "pulled_at": _stamp(record.pulled_at),
                "prefetched_at": _stamp(record.prefetched_at),
                "last_used_at": _stamp(record.last_used_at),
                "private": record.private,
            }
            for record in sorted(records.values(), key=_pull_order)
        ]
    }
