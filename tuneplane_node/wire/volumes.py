"""The volume verbs' answers: ``GET /node/v1/volumes``.

The entries of the node's volume store (each by its sha256, with its size) and the fills
under way, with their bytes, rate and time left (null while unknown, never 0). A fill's
source is shown without its query (a signed URL's token).
"""

from __future__ import annotations

from typing import TypedDict

from tuneplane_node.clock import rfc3339
from tuneplane_node.jobs.volumes.fills import VolumeFill
from tuneplane_node.jobs.volumes.store import Entry
from tuneplane_node.runtime.fetching import shown


class VolumeEntryJson(TypedDict):
    sha256: str
    size_bytes: int


class VolumeFillJson(TypedDict):
    sha256: str
    source: str
    bytes_done: int
    bytes_total: int | None
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: int


class VolumesJson(TypedDict):
    entries: list[VolumeEntryJson]
    fills: list[VolumeFillJson]


def volumes_json(entries: list[Entry], fills: list[VolumeFill]) -> VolumesJson:
    return {
        "entries": [{"sha256": e.digest, "size_bytes": e.size} for e in entries],
        "fills": [fill_json(fill) for fill in fills],
    }


def fill_json(fill: VolumeFill) -> VolumeFillJson:
    rate = fill.rate.rate(fill.clock.monotonic())
    left = None if fill.bytes_total is None else fill.bytes_total - fill.bytes_done
    return {
        "sha256": fill.digest,
        "source": shown(fill.source),
        "bytes_done": fill.bytes_done,
        "bytes_total": fill.bytes_total,
        "rate_bytes_per_s": rate,
        "eta_s": None if not rate or left is None else round(left / rate, 3),
        "started_at": rfc3339(fill.started_at),
        "waiting": fill.waiters,
    }
