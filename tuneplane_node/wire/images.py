"""The image verbs' answers: ``POST /node/v1/images/pull`` and ``GET /node/v1/images``.

A prefetch answers ``{"image", "phase"}``: ``pulling`` (202: the pull runs in the
background) or ``present`` (200). The list answers the images the node pulled or its
containers use, and the pulls in flight with their progress, rate and time left (null
while unknown, never 0), and the failed prefetches with their error.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from tuneplane_node.wire.fields import Words
from tuneplane_node.wire.values import FAILED, PRESENT, PULLING

PrefetchPhase = Annotated[
    str, Words("PrefetchPhase", (PULLING, PRESENT), "A prefetch: pulling, or present already.")
]
PullPhase = Annotated[str, Words("PullPhase", (PULLING, FAILED), "A pull: under way, or failed.")]


class PrefetchJson(TypedDict):
    image: str
    phase: PrefetchPhase


class ImageJson(TypedDict):
    image: str
    id: str
    size_bytes: int | None
    pulled_at: str | None
    last_used_at: str | None
    in_use_by: list[str]
    private: bool


class PullJson(TypedDict):
    image: str
    phase: PullPhase
    bytes_done: int
    bytes_total: int
    layers_done: int
    layers_total: int
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: list[str]
    error: str | None


class ImagesJson(TypedDict):
    images: list[ImageJson]
    pulls: list[PullJson]
