"""The image verbs' answers: ``POST /node/v1/images/pull`` and ``GET /node/v1/images``.

A prefetch answers ``{"image", "phase"}``: ``pulling`` (202: the pull runs in the
background) or ``present`` (200). The list answers the images the node pulled or its
containers use, and the pulls in flight with their progress, rate and time left (null
while unknown, never 0), and the failed prefetches with their error.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from tuneplane_node.jobs.pending import FAILED, PULLING
from tuneplane_node.jobs.prefetch import PRESENT
from tuneplane_node.jobs.results import ImagesView, ImageView, Prefetched, PullView
from tuneplane_node.wire.fields import Words

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


def prefetch_json(result: Prefetched) -> PrefetchJson:
    return {"image": result.image, "phase": result.phase}


def images_json(view: ImagesView) -> ImagesJson:
    return {
        "images": [image_json(image) for image in view.images],
        "pulls": [pull_json(pull) for pull in view.pulls],
    }


def image_json(image: ImageView) -> ImageJson:
    return {
        "image": image.image,
        "id": image.id,
        "size_bytes": image.size_bytes,
        "pulled_at": image.pulled_at,
        "last_used_at": image.last_used_at,
        "in_use_by": list(image.in_use_by),
        "private": image.private,
    }


def pull_json(pull: PullView) -> PullJson:
    progress = pull.progress
    return {
        "image": pull.image,
        "phase": pull.phase,
        "bytes_done": progress.bytes_done,
        "bytes_total": progress.bytes_total,
        "layers_done": progress.layers_done,
        "layers_total": progress.layers_total,
        "rate_bytes_per_s": pull.rate_bytes_per_s,
        "eta_s": pull.eta_s,
        "started_at": pull.started_at,
        "waiting": list(pull.waiting),
        "error": pull.error,
    }
