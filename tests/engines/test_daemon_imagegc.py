"""The image GC and pulls that fit, end to end on docker and podman whose data roots are
small tmpfs of their own (`contrib/dev/engines.sh`: docker-gc, podman-gc; nobody else's
images are there, and `all` scope may take any of them).

The images are the test's own, made on the suite's docker with random ballast (so
none shares its bytes), pushed under unique names to the registry, and taken out of it
again at the end. The disk's fill is set with a file beside the engine's data.
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import os
import tarfile
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import MakeNode, open_runtime
from tests.support.engines import TESTS_DOCKER_SOCK
from tests.support.images import IMAGE, REGISTRY
from tests.support.jobs import unique
from tests.support.runtimes import TrackingRuntime
from tuneplane_node.daemon.state import NODE
from tuneplane_node.runtime.base import PullLimits
from tuneplane_node.runtime.engines.engine import EngineRuntime

pytestmark = [pytest.mark.engine, pytest.mark.slow]

GC_ENGINES = {
    "docker": ("docker_host", "unix:///run/tuneplane-dev/docker-gc.sock"),
    "podman": ("podman_url", "unix:///run/tuneplane-dev/podman-gc.sock"),
}
GC_ROOTS = {
    "docker": Path("/var/lib/tuneplane-dev/docker-gc"),
    "podman": Path("/var/lib/tuneplane-dev/podman-gc"),
}
REGISTRY_LOG = Path("/var/lib/tuneplane-dev/log/registry.log")
BALLAST = 6 * 2**20


@dataclass
class GcEngine:
    """One of the GC tests' engines: how a node reaches it, its disk, and a runtime."""

    name: str
    address: dict[str, str]
    root: Path
    runtime: TrackingRuntime
    fillers: list[Path] = field(default_factory=list)

    def total_bytes(self) -> int:
        disk = os.statvfs(self.root)
        return disk.f_blocks * disk.f_frsize

    def used_percent(self) -> float:
        disk = os.statvfs(self.root)
        return 100 * (1 - disk.f_bavail / disk.f_blocks)

    def fill_to(self, percent: float) -> None:
        """A file beside the engine's data, so the disk is this full."""
        disk = os.statvfs(self.root)
        want = int(disk.f_blocks * disk.f_frsize * (percent - self.used_percent()) / 100)
        if want <= 0:
            return
        filler = self.root / f"filler-{unique()}"
        with filler.open("wb") as file:
            os.posix_fallocate(file.fileno(), 0, want)
        self.fillers.append(filler)

    def unfill(self) -> None:
        for filler in self.fillers:
            filler.unlink(missing_ok=True)
        self.fillers.clear()

    @property
    def inner(self) -> Any:
        return self.runtime.inner

    async def images(self) -> set[str]:
        return {ref for image in await self.inner.list_images() for ref in image.refs}


@pytest.fixture(params=["docker", "podman"])
async def gc_engine(request: pytest.FixtureRequest) -> AsyncIterator[GcEngine]:
    variable, address = GC_ENGINES[request.param]
    inner = await open_runtime(request.param, **{variable: address})
    engine = GcEngine(
        request.param, {variable: address}, GC_ROOTS[request.param], TrackingRuntime(inner)
    )
    await clear(inner)  # what an earlier session left
    yield engine
    engine.unfill()
    await engine.runtime.cleanup()
    await clear(inner)
    await inner.close()


async def clear(runtime: EngineRuntime) -> None:
    """Every container and image of the GC tests' engine (only these tests use it)."""
    _, containers = await runtime.pool.call(runtime._image_entries)
    for entry in containers:
        await runtime.remove(str(entry["Id"]))
    for image in await runtime.list_images():
        await runtime.remove_image(image)


@pytest.fixture
def gc_images() -> Iterator[list[str]]:
    """Seven images in the registry, each of the busybox test image and 6 MiB of random
    bytes of its own, under unique names; out of the registry again at the end."""
    client = docker.DockerClient(base_url=f"unix://{TESTS_DOCKER_SOCK}", version="1.41")
    tag = unique("gc")
    names = [f"{REGISTRY}/tuneplane-test/{tag}-{n}:1" for n in range(7)]
    try:
        for name in names:
            context = io.BytesIO()
            with tarfile.open(fileobj=context, mode="w") as tar:
                _add(tar, "Dockerfile", f"FROM {IMAGE}\nCOPY ballast /ballast\n".encode())
                _add(tar, "ballast", os.urandom(BALLAST))
            context.seek(0)
            client.images.build(fileobj=context, custom_context=True, tag=name, rm=True)
            client.images.push(name)
            client.images.remove(name)  # in the registry only: a launch must pull it
        yield names
    finally:
        for name in names:
            _delete_from_registry(name)
        client.close()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _delete_from_registry(image: str) -> None:
    path, _, tag = image.removeprefix(f"{REGISTRY}/").rpartition(":")
    accept = "application/vnd.docker.distribution.manifest.v2+json"
    head = urllib.request.Request(
        f"http://{REGISTRY}/v2/{path}/manifests/{tag}", method="HEAD", headers={"Accept": accept}
    )
    try:
        with urllib.request.urlopen(head, timeout=10) as answer:
            digest = answer.headers["Docker-Content-Digest"]
        delete = urllib.request.Request(
            f"http://{REGISTRY}/v2/{path}/manifests/{digest}", method="DELETE"
        )
        urllib.request.urlopen(delete, timeout=10).close()
    except OSError:
        pass  # never pushed, or gone: nothing to take back


def blob_requests(image: str) -> int:
    """How many blob downloads of the image's repository the registry has logged."""
    path = image.removeprefix(f"{REGISTRY}/").rpartition(":")[0]
    text = REGISTRY_LOG.read_bytes().decode(errors="replace")
    return sum(1 for line in text.splitlines() if f"GET /v2/{path}/blobs/" in line)


async def run_to_end(node: Any, image: str) -> Any:
    """A job of the image run to its end and removed: its image used, then unused."""
    ref, _ = await node.launch(["/bin/true"], image=image)
    await node.wait_for(ref, "status", "exited", timeout=120)
    await node.remove(ref)
    return ref


async def gc(node: Any) -> dict[str, Any]:
    return await node.ok("POST", "/node/v1/images/gc", json={})  # type: ignore[no-any-return]


async def test_a_series_of_pulls_stays_under_low_removing_the_oldest_use_first(
    make_node: MakeNode,
    gc_engine: GcEngine,
    gc_images: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = gc_engine
    running_image, foreign_image, *series = gc_images
    setup = await make_node(engine.name, feed=engine.runtime, image_gc="off", **engine.address)
    running, _ = await setup.launch(["/bin/sleep", "300"], image=running_image)
    await setup.wait_for(running, "status", "running", timeout=120)
    await run_to_end(setup, foreign_image)
    foreign = unique("foreign")  # a person's container, not the node's, never started
    await engine.inner.pool.call(
        engine.inner.client.containers.create,
        image=foreign_image,
        command=["/bin/true"],
        name=foreign,
    )
    engine.runtime.track(foreign)

    # Room for two images between here and low; one more image goes past high.
    image_percent = (
        100
        * (BALLAST + 2**19)
        / (os.statvfs(engine.root).f_blocks * os.statvfs(engine.root).f_frsize)
    )
    engine.fill_to(40)
    low = math.ceil(engine.used_percent() + 2.2 * image_percent)
    high = low + 1
    node = await make_node(  # the daemon again, from the same state: its records kept
        engine.name,
        feed=engine.runtime,
        image_gc="node",
        image_gc_min_age_s=0,
        image_pin_s=3600,
        image_gc_high_percent=high,
        image_gc_low_percent=low,
        **engine.address,
    )
    # Whether a pressure is the GC's to chase (issue 50's accounting) is not this test's:
    # at this 192 MiB store the engine's own files of each pulled image (not in its size)
    # grew the rest past the few hundred KB a pull went over high, and the GC, told the
    # pressure was unexplained, removed nothing (2 runs of 5). The accounting's verdict
    # has its tests (test_daemon_disk_full.py); here every pressure is chased.
    node.app[NODE].gc.chase = lambda: True
    caplog.set_level(logging.INFO, logger="tuneplane_node.audit")
    # The oldest of all but fresh from a prefetch: pinned for the hour.
    *series, prefetched = series
    status, _ = await node.call("POST", "/node/v1/images/pull", json={"image": prefetched})
    assert status == 202
    deadline = asyncio.get_running_loop().time() + 120
    while prefetched not in await engine.images():
        assert asyncio.get_running_loop().time() < deadline, "the prefetch never ended"
        await asyncio.sleep(0.2)
    for image in series:
        await run_to_end(node, image)
        run = await gc(node)
        store = run["image_store"]
        used = store["used_ratio"] * 100
        # Never left at high; freed to low whenever a run (this one, or the one before
        # the pull) found it at high.
        assert used < high and store["pressure"] is False, (run, low, high)
        assert used <= low or not run["removed"], (run, low, high)
        assert store["path"] == str(engine.root) + ("/storage" if engine.name == "podman" else "")
    # Every removal, the runs before each pull included: their audit lines, in order.
    audit = [
        r
        for r in caplog.records
        if getattr(r, "action", "") == "image gc" and getattr(r, "result", "") == "removed"
    ]
    removed = [r.image for r in audit]  # type: ignore[attr-defined]
    here = await engine.images()
    assert running_image in here and foreign_image in here  # in use, whoever's
    assert prefetched in here  # pinned
    assert len(removed) >= 2, "the series went past high once at most"
    assert all(r.size_bytes > 0 and r.image_id.startswith("sha256:") for r in audit)  # type: ignore[attr-defined]
    # Oldest use first: the series' images, in the order they ran.
    assert removed == [image for image in series if image in removed][: len(removed)]
    assert removed == series[: len(removed)]
    health = await node.health()
    assert (
        health["image_store"]["total_bytes"]
        == os.statvfs(engine.root).f_blocks * os.statvfs(engine.root).f_frsize
    )
    await node.stop(running, timeout=0)


async def test_node_scope_leaves_an_image_loaded_by_hand_and_all_takes_it(
    make_node: MakeNode, gc_engine: GcEngine, gc_images: list[str]
) -> None:
    engine = gc_engine
    loaded = gc_images[0]
    # By hand: the engine's pull, not the node's (whose records would hold it).
    await engine.inner.pull(loaded, limits=PullLimits(300, 120))
    assert loaded in await engine.images()
    options = {"image_gc_min_age_s": 0, "image_pin_s": 0, **engine.address}
    engine.fill_to(60)
    high = math.floor(engine.used_percent()) - 1  # at or above high: pressure
    options |= {"image_gc_high_percent": high, "image_gc_low_percent": high - 1}

    node = await make_node(engine.name, feed=engine.runtime, image_gc="node", **options)
    run = await gc(node)
    assert run["removed"] == [] and run["image_store"]["pressure"] is True
    assert loaded in await engine.images()

    everything = await make_node(engine.name, feed=engine.runtime, image_gc="all", **options)
    run = await gc(everything)
    assert loaded in [entry["image"] for entry in run["removed"]], run
    assert loaded not in await engine.images()


async def test_a_pull_that_cannot_fit_is_refused_with_507_before_any_blob_is_asked_for(
    make_node: MakeNode, gc_engine: GcEngine, gc_images: list[str]
) -> None:
    engine = gc_engine
    image = gc_images[0]
    engine.fill_to(60)
    disk = os.statvfs(engine.root)
    total, free = disk.f_blocks * disk.f_frsize, disk.f_bavail * disk.f_frsize
    # Room below high: 2 MiB, the image is 6 MiB compressed.
    high = math.ceil(100 * (total - free + 2 * 2**20) / total)
    node = await make_node(
        engine.name,
        feed=engine.runtime,
        image_gc_high_percent=high,
        image_gc_low_percent=high - 5,
        **engine.address,
    )
    before = blob_requests(image)

    ref, answer = await node.launch(image=image, gpus=1, expect=507)

    assert "bytes compressed" in answer["detail"] and f"threshold {high}%" in answer["detail"]
    # Its figures as fields; what a GC run could free is not the tenant's to learn.
    assert answer["needed_bytes"] > 2 * 2**20 and answer["high_percent"] == high
    assert answer["freeable_bytes"] is None and answer["free_bytes"] > 0
    assert (await node.observe(ref))[ref]["exists"] is False  # nothing created
    health = await node.answered_health()
    assert (health["gpus_reserved"], health["gpus_free"]) == (0, 4)  # nothing reserved
    assert blob_requests(image) == before  # no byte of it downloaded

    engine.fill_to(high + 1)  # now at or above high itself
    _, answer = await node.launch(image=image, expect=507)
    assert "at or above its" in answer["detail"] and "bytes free" in answer["detail"]
    assert blob_requests(image) == before
    assert image not in await engine.images()


async def test_the_engine_lists_images_with_their_users_and_never_removes_one_in_use(
    gc_engine: GcEngine, gc_images: list[str]
) -> None:
    engine, image = gc_engine, gc_images[0]
    inner = engine.inner
    await inner.pull(image, limits=PullLimits(300, 120))
    second = f"{image.rpartition(':')[0]}-again"
    await inner.pool.call(lambda: inner.client.images.get(image).tag(second, "2"))
    (listed,) = [i for i in await inner.list_images() if image in i.refs]
    assert f"{second}:2" in listed.refs and listed.id.startswith("sha256:")
    assert listed.size > BALLAST and listed.in_use is False
    root = await inner.data_root()
    assert root is not None and root.path.startswith(str(engine.root))
    assert root.space is not None and root.space.total == engine.total_bytes()

    user = unique("user")  # anybody's container, never started
    await inner.pool.call(
        inner.client.containers.create, image=image, command=["/bin/true"], name=user
    )
    engine.runtime.track(user)
    (listed,) = [i for i in await inner.list_images() if image in i.refs]
    assert listed.in_use is True
    assert await inner.remove_image(listed) is False  # the engine's conflict: skipped
    assert image in await engine.images()

    await inner.remove(user)
    assert await inner.remove_image(listed) is True
    here = await engine.images()
    assert image not in here and f"{second}:2" not in here  # every name, then the image
    assert await inner.remove_image(listed) is True  # gone already: the goal is met
