"""Issue 34 on the small engine (docker on a 64 MiB tmpfs of its own,
``/run/tuneplane-dev/docker-full.sock``): a filler without a limit is stopped before any
image is removed, and another tenant's cached image stays; health says disk_pressure
while it holds the store, and no longer once its container is removed. The images are
pulled from the suite's registry and forgotten again at the end; nothing else of that
engine is touched (the faults suite fills it with a file of its own: never both at once).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import MakeNode
from tests.support.engines import engine_missing, engine_settings, full_docker_host
from tests.support.images import BIG_IMAGE, REGISTRY, forget_image
from tests.support.runtimes import TrackingRuntime
from tuneplane_node.runtime.base import PullLimits
from tuneplane_node.runtime.engines.docker import DockerRuntime

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.own_engines]  # docker-full
SMALL_IMAGE = f"{REGISTRY}/tuneplane-test/busybox:1"
# 1 MiB every 0.2 s, on and on: slow enough for the monitor's passes to see it cross.
FILL = [
    "/bin/sh",
    "-c",
    "i=0; while true; do dd if=/dev/zero of=/f$i bs=1M count=1 2>/dev/null;"
    " i=$((i+1)); sleep 0.2; done",
]


@pytest.fixture
async def small_docker() -> AsyncIterator[TrackingRuntime]:
    """The small engine with the job's image and another tenant's, unused, cached."""
    address = full_docker_host()
    runtime = DockerRuntime(engine_settings("docker", docker_host=address))
    health = await runtime.health()
    if not health.ok:
        await runtime.close()
        engine_missing("the small docker engine", health.error or "no answer")
    tracking = TrackingRuntime(runtime)
    limits = PullLimits(120, 60)
    try:
        for image in (SMALL_IMAGE, BIG_IMAGE):
            await runtime.pull(image, limits=limits)
        yield tracking
    finally:
        await tracking.cleanup()
        for image in (SMALL_IMAGE, BIG_IMAGE):
            await forget_image(tracking, image)
        await runtime.close()


async def test_the_filler_goes_before_any_image_and_the_pressure_with_it(
    make_node: MakeNode, small_docker: TrackingRuntime
) -> None:
    node = await make_node(
        feed=small_docker,
        docker_host=full_docker_host(),
        job_disk_limit="unlimited",  # no limit: only the pressure can stop it
        job_disk_check_s=0.5,
        local_stop_timeout=2,
        image_gc="all",  # the cached image is the GC's to take, if it were let
        image_gc_min_age_s=0,
        image_gc_interval_s=1,
    )
    assert (await node.health())["conditions"]["disk_pressure"] is False
    filler, answer = await node.launch(FILL, image=SMALL_IMAGE)
    assert answer["phase"] == "running"

    pressed, deadline = False, time.monotonic() + 60
    state = await node.state(filler)
    while state["status"] == "running" and time.monotonic() < deadline:
        pressed = pressed or (await node.health())["conditions"]["disk_pressure"]
        await asyncio.sleep(0.2)
        state = await node.state(filler)

    assert state["status"] == "exited", state
    assert state["stop_reason"] == "disk_pressure"
    assert state["disk_used_bytes"] > 20 * 2**20
    assert pressed or (await node.health())["conditions"]["disk_pressure"]
    await asyncio.sleep(2.5)  # two GC runs while its layer holds the store
    assert await small_docker.image_exists(BIG_IMAGE)  # the other tenant's cache stays

    assert await node.remove(filler) == {"ok": True}
    health = await node.health()
    for _ in range(20):  # health's store reading is at most a second old
        if health["conditions"]["disk_pressure"] is False:
            break
        await asyncio.sleep(0.2)
        health = await node.health()
    assert health["conditions"]["disk_pressure"] is False
    assert await small_docker.image_exists(BIG_IMAGE)


async def test_a_disk_filled_beside_the_store_is_said_unexplained_and_costs_no_image(
    make_node: MakeNode, small_docker: TrackingRuntime
) -> None:
    """Issue 50: a file written on the host beside the store emptied the cache."""
    node = await make_node(
        feed=small_docker,
        docker_host=full_docker_host(),
        job_disk_check_s=0.5,
        image_gc="all",  # the cached images are the GC's to take, if it were let
        image_gc_min_age_s=0,
        image_gc_interval_s=1,
    )
    health = await node.health()
    assert health["conditions"]["disk_pressure"] is False
    root = await small_docker.data_root()
    assert root is not None and root.space is not None
    await asyncio.sleep(1)  # the monitor's first pass: the rest of the disk's baseline
    beside = Path(root.path) / f"host-fill-{os.getpid()}"
    try:
        with beside.open("wb") as fill:  # up to 95% of the store: past its 85%
            fill.write(b"\0" * max(0, root.space.available - root.space.total // 20))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            health = await node.health()
            if health["conditions"]["disk_pressure_unexplained"]:
                break
            await asyncio.sleep(0.2)
        assert health["conditions"]["disk_pressure"] is True, health["conditions"]
        assert health["conditions"]["disk_pressure_unexplained"] is True
        assert health["ok"] is False and health["launch_refused_reason"] == "disk_pressure"
        await asyncio.sleep(2.5)  # two GC runs under the pressure
        assert await small_docker.image_exists(BIG_IMAGE)  # no image paid for it
        assert await small_docker.image_exists(SMALL_IMAGE)
    finally:
        beside.unlink(missing_ok=True)
