"""The volume verbs' answers: ``POST /node/v1/volumes/pull``, ``GET /node/v1/volumes`` and
``POST /node/v1/volumes/gc`` (filled by `daemon.render`).

The entries of the node's volume store (each by its sha256, with its size, last use,
the containers that bind it and its pin) and the fills under way or failed, with their
bytes, rate and time left (null while unknown, never 0); the store's filesystem. A fill's
source is shown without its query (a signed URL's token). A prefetch answers its entry
(``present``, 200) or its fill (``filling``, 202).
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from tuneplane_node.wire.fields import Words
from tuneplane_node.wire.values import FAILED, PRESENT

FILLING = "filling"
VolumePhase = Annotated[
    str,
    Words(
        "VolumePhase",
        (PRESENT, FILLING, FAILED),
        "An entry: present (complete, checked); a fill: filling, or failed.",
    ),
]


class VolumeStoreJson(TypedDict):
    """The volume store's filesystem (each null when it cannot be read) and the bytes of
    the store's own entries and partial files."""

    path: str
    total_bytes: int | None
    free_bytes: int | None
    used_bytes: int | None
    high_percent: int
    low_percent: int


class VolumeEntryJson(TypedDict):
    sha256: str
    size_bytes: int
    phase: VolumePhase
    last_used_at: str | None
    in_use_by: list[str] | None  # null: the engine did not say
    pin_expires_at: str | None


class VolumeFillJson(TypedDict):
    sha256: str
    source: str
    phase: VolumePhase
    bytes_done: int
    bytes_total: int | None
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: int
    error: str | None


class VolumesJson(TypedDict):
    entries: list[VolumeEntryJson]
    fills: list[VolumeFillJson]
    volume_store: VolumeStoreJson


class VolumePullJson(TypedDict):
    sha256: str
    phase: VolumePhase
    pin_expires_at: str
    size_bytes: int | None  # the entry's; null while it fills
    fill: VolumeFillJson | None  # the fill's progress; null once present


class EvictedVolumeJson(TypedDict):
    sha256: str
    size_bytes: int
    last_used_at: str


class VolumeGcJson(TypedDict):
    """One eviction run: what it removed, least recently used first, and the store after."""

    removed: list[EvictedVolumeJson]
    freed_bytes: int
    volume_store: VolumeStoreJson
