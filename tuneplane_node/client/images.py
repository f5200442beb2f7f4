"""The image verbs' answers as typed objects: ``GET /node/v1/images`` (`Images`: the
node's images and its pulls), a prefetch's (`Prefetch`) and an image GC run's
(`ImageGc`). Read as every answer is (`answers`): tolerant both ways, ``raw`` kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from tuneplane_node.client.answers import Answer, Converters, ImageStore, each, one
from tuneplane_node.client.words import PrefetchPhase, PullPhase, moment, word


@dataclass(frozen=True)
class Image(Answer):
    """An image the node pulled, or that its own containers are made from."""

    image: str = ""
    id: str = ""
    size_bytes: int | None = None
    pulled_at: datetime | None = None  # None: the node never pulled it
    last_used_at: datetime | None = None
    in_use_by: tuple[str, ...] = ()
    private: bool = False

    convert: ClassVar[Converters] = {
        "in_use_by": tuple,
        "pulled_at": moment,
        "last_used_at": moment,
    }


@dataclass(frozen=True)
class ImagePull(Answer):
    """One download, however many launches wait on it: pulling, or failed (``error``)."""

    image: str = ""
    phase: PullPhase | None = None
    bytes_done: int | None = None
    bytes_total: int | None = None
    layers_done: int | None = None
    layers_total: int | None = None
    rate_bytes_per_s: float | None = None
    eta_s: float | None = None
    started_at: datetime | None = None
    waiting: tuple[str, ...] = ()
    error: str | None = None

    convert: ClassVar[Converters] = {
        "waiting": tuple,
        "phase": word(PullPhase),
        "started_at": moment,
    }


@dataclass(frozen=True)
class Images(Answer):
    """``GET /node/v1/images``: the node's images and its pulls."""

    images: tuple[Image, ...] = ()
    pulls: tuple[ImagePull, ...] = ()

    convert: ClassVar[Converters] = {"images": each(Image), "pulls": each(ImagePull)}


@dataclass(frozen=True)
class Prefetch(Answer):
    """A prefetch's answer: ``phase`` present (nothing pulled) or pulling."""

    image: str = ""
    phase: PrefetchPhase | None = None

    convert: ClassVar[Converters] = {"phase": word(PrefetchPhase)}


@dataclass(frozen=True)
class RemovedImage(Answer):
    image: str = ""
    id: str = ""
    size_bytes: int | None = None
    why: str = ""


@dataclass(frozen=True)
class ImageGc(Answer):
    """One image GC run: what it removed (least recently used first) and the store after."""

    scope: str = ""
    freed_bytes: int = 0
    removed: tuple[RemovedImage, ...] = ()
    image_store: ImageStore | None = None

    convert: ClassVar[Converters] = {"removed": each(RemovedImage), "image_store": one(ImageStore)}
