"""The volume verbs' answers as typed objects: ``GET /node/v1/volumes`` (`Volumes`: the
store's entries, its fills, the store), a volume prefetch's (`VolumePull`) and an
eviction run's (`VolumeGc`). Read as every answer is (`answers`): tolerant both ways,
``raw`` kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from tuneplane_node.client.answers import Answer, Converters, VolumeStore, each, one
from tuneplane_node.client.words import VolumePhase, moment, word


@dataclass(frozen=True)
class VolumeEntry(Answer):
    """An entry of the volume store: its size, last use, the containers that bind it
    (None: the engine did not say) and its prefetch's pin."""

    sha256: str = ""
    size_bytes: int | None = None
    phase: VolumePhase | None = None
    last_used_at: datetime | None = None
    in_use_by: tuple[str, ...] | None = None
    pin_expires_at: datetime | None = None

    convert: ClassVar[Converters] = {
        "phase": word(VolumePhase),
        "last_used_at": moment,
        "in_use_by": tuple,
        "pin_expires_at": moment,
    }


@dataclass(frozen=True)
class VolumeFill(Answer):
    """One fill, however many launches wait on it: filling, or failed (``error``)."""

    sha256: str = ""
    source: str = ""
    phase: VolumePhase | None = None
    bytes_done: int | None = None
    bytes_total: int | None = None
    rate_bytes_per_s: float | None = None
    eta_s: float | None = None
    started_at: datetime | None = None
    waiting: int | None = None
    error: str | None = None

    convert: ClassVar[Converters] = {"phase": word(VolumePhase), "started_at": moment}


@dataclass(frozen=True)
class Volumes(Answer):
    """``GET /node/v1/volumes``: the store's entries, its fills, the store."""

    entries: tuple[VolumeEntry, ...] = ()
    fills: tuple[VolumeFill, ...] = ()
    volume_store: VolumeStore | None = None

    convert: ClassVar[Converters] = {
        "entries": each(VolumeEntry),
        "fills": each(VolumeFill),
        "volume_store": one(VolumeStore),
    }


@dataclass(frozen=True)
class VolumePull(Answer):
    """A volume prefetch's answer: present (``size_bytes``) or filling (``fill``)."""

    sha256: str = ""
    phase: VolumePhase | None = None
    pin_expires_at: datetime | None = None
    size_bytes: int | None = None
    fill: VolumeFill | None = None

    convert: ClassVar[Converters] = {
        "phase": word(VolumePhase),
        "pin_expires_at": moment,
        "fill": one(VolumeFill),
    }


@dataclass(frozen=True)
class EvictedVolume(Answer):
    sha256: str = ""
    size_bytes: int | None = None
    last_used_at: datetime | None = None

    convert: ClassVar[Converters] = {"last_used_at": moment}


@dataclass(frozen=True)
class VolumeGc(Answer):
    """One eviction run: what it removed (least recently used first) and the store after."""

    freed_bytes: int = 0
    removed: tuple[EvictedVolume, ...] = ()
    volume_store: VolumeStore | None = None

    convert: ClassVar[Converters] = {
        "removed": each(EvictedVolume),
        "volume_store": one(VolumeStore),
    }
