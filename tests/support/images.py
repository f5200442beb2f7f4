"""The test images and the local registry that holds them, and making an engine forget an
image so that a pull really downloads."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from tests.support.runtimes import TrackingRuntime
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.podman import PodmanRuntime

REGISTRY = os.environ.get("TUNEPLANE_TEST_REGISTRY", "127.0.0.1:5000")
IMAGE = "tuneplane-test/busybox:1"
REGISTRY_IMAGE = f"{REGISTRY}/{IMAGE}"
BIG_IMAGE = f"{REGISTRY}/tuneplane-test/big:1"  # in the registry only: a pull downloads ~9 MB


async def forget_image(runtime: ContainerRuntime, image: str) -> None:
    """Make sure the engine does not have the image's layers, so a pull really downloads.

    The image goes under every name it has on the engine, however pulled (the registry's,
    a proxy's): the test images' names (``*/tuneplane-test/...``) are the suite's own.
    Other images are never touched.
    """
    inner = runtime.inner if isinstance(runtime, TrackingRuntime) else runtime
    repository = image.split("/", 1)[1].rsplit(":", 1)[0]  # tuneplane-test/big
    if isinstance(inner, DockerRuntime):
        api = inner.api
        listed = await inner.pool.call(api.images, filters={"reference": f"*/{repository}"})
        for entry in listed:
            await inner.pool.call(_quietly, api.remove_image, entry["Id"], force=True)
    else:
        assert isinstance(inner, PodmanRuntime), inner
        images = await inner.pool.call(inner.client.images.list)
        for entry in images:
            if any(tag.split("/", 1)[-1].startswith(f"{repository}:") for tag in entry.tags):
                await inner.pool.call(_quietly, inner.client.images.remove, entry.id, force=True)


def _quietly(remove: Callable[..., object], ref: str, **options: Any) -> None:
    with contextlib.suppress(Exception):  # gone already
        remove(ref, **options)
