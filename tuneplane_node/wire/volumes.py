"""The volume verbs' answers: ``GET /node/v1/volumes`` (filled by `daemon.render`).

The entries of the node's volume store (each by its sha256, with its size) and the fills
under way, with their bytes, rate and time left (null while unknown, never 0). A fill's
source is shown without its query (a signed URL's token).
"""

from __future__ import annotations

from typing import TypedDict


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
