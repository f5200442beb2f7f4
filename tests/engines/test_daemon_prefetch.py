"""Prefetch end to end, docker and podman, against the local registries: what a console
would notice. A prefetch shows its bytes, rate and time left in GET /node/v1/images while
it pulls; a launch made meanwhile starts when it ends, and the registry served each blob
once; wrong credentials fail it at once with the launch's reason, the password nowhere.

The image is the suite's own: a unique random layer on the shared busybox, built on the
suite's own docker engine and pushed once to 127.0.0.1:5000 as
``tuneplane-test/prefetch-big:1`` (never the shared big:1, which other tests pull). Each
test removes it from its node's engine, before (a pull must download) and after.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_private_images import (
    PRIVATE_REGISTRY,
    everything_shown,
    own_docker,
)
from tests.support.console import HEADERS, Console
from tests.support.engines import DEV_ROOT, OWN_DOCKER_SOCK, engine_missing
from tests.support.images import IMAGE, REGISTRY, forget_image
from tests.support.jobs import unique
from tests.support.nodes import node_cache
from tests.support.proxies import ThrottlingProxy

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
REPOSITORY = "tuneplane-test/prefetch-big"
LAYER_BYTES = 24 * 2**20  # random: the engines cannot compress it away
RATE = 4_000_000  # bytes a second through the proxy: the pull takes ~6 s
REGISTRY_LOG = DEV_ROOT / "log"
BLOB_GET = re.compile(rf'"GET /v2/{REPOSITORY}/blobs/(sha256:[0-9a-f]+) HTTP/[0-9.]+" 20[06] ')


def prefetch_image(tmp_path: Path) -> str:
    """The suite's prefetch image in the registry, built and pushed when it is not there."""
    image = f"{REGISTRY}/{REPOSITORY}:1"
    url = f"http://{REGISTRY}/v2/{REPOSITORY}/manifests/1"
    accept = "application/vnd.docker.distribution.manifest.v2+json"
    try:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}), timeout=5)
        return image
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    except OSError as exc:
        engine_missing("the registry", str(exc))
    if not OWN_DOCKER_SOCK.exists():
        engine_missing("the suite's own docker engine", f"no {OWN_DOCKER_SOCK}")
    (tmp_path / "blob").write_bytes(os.urandom(LAYER_BYTES))
    (tmp_path / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY blob /blob\n")
    own_docker("build", "-q", "-t", image, str(tmp_path), config=tmp_path)
    own_docker("push", image, config=tmp_path)
    own_docker("rmi", "-f", image, config=tmp_path)
    return image


def log_mark() -> int:
    return (REGISTRY_LOG / "registry.log").stat().st_size


def blob_downloads(since: int) -> Counter[str]:
    """The registry's full downloads of the prefetch image's blobs since ``since``."""
    with (REGISTRY_LOG / "registry.log").open("rb") as log:
        log.seek(since)
        text = log.read().decode("utf-8", "replace")
    return Counter(match.group(1) for match in BLOB_GET.finditer(text))


async def images(node: Console) -> Any:
    return await node.ok("GET", "/node/v1/images")


async def pull_of(node: Console, image: str) -> dict[str, Any] | None:
    pulls = [p for p in (await images(node))["pulls"] if p["image"] == image]
    return pulls[0] if pulls else None


async def wait_for_pull(node: Console, image: str, ready: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        pull = await pull_of(node, image)
        if pull is not None and ready(pull):
            return pull
        assert time.monotonic() < deadline, f"the pull of {image} never got there: {pull}"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_prefetch_shows_its_rate_and_a_launch_made_meanwhile_shares_its_download(
    make_node: MakeNode, proxy: ThrottlingProxy, engine: str, tmp_path: Path
) -> None:
    prefetch_image(tmp_path)
    image = f"{proxy.address()}/{REPOSITORY}:1"
    node = await make_node(engine)
    engine_runtime = node_cache(node).inner
    await forget_image(engine_runtime, image)
    proxy.rate = RATE
    mark = log_mark()
    try:
        status, answer = await node.call("POST", "/node/v1/images/pull", json={"image": image})
        assert (status, answer) == (202, {"image": image, "phase": "pulling"})
        moving = await wait_for_pull(
            node, image, lambda p: p["bytes_done"] > 0 and p["eta_s"] is not None
        )
        assert moving["phase"] == "pulling" and moving["bytes_total"] >= LAYER_BYTES // 2
        assert 0 < moving["rate_bytes_per_s"] < RATE * 3, moving

        ref, launched = await node.launch(["/bin/sleep", "300"], image=image)
        assert launched["phase"] == "pulling"
        shared = await pull_of(node, image)
        assert shared is not None and shared["waiting"] == [ref]
        state = await node.state(ref)
        assert state["pending_bytes_done"] > 0 and "pending_rate_bytes_per_s" in state
        await node.wait_for(ref, "status", "running", timeout=120)

        async with node.client.get("/metrics", headers=HEADERS) as response:
            metrics = await response.text()
        assert 'tuneplane_node_image_pulls_total{result="ok"} 1.0' in metrics  # one pull
        downloads = blob_downloads(mark)
        assert downloads and max(downloads.values()) == 1, downloads  # one download
        listed = [i for i in (await images(node))["images"] if i["image"] == image]
        assert listed and listed[0]["in_use_by"] == [ref] and listed[0]["pulled_at"]
        assert (await pull_of(node, image)) is None
    finally:
        for ref in node.made or ():
            await node.remove(ref)
        await forget_image(engine_runtime, image)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_private_prefetch_with_a_wrong_password_fails_at_once_and_leaks_nothing(
    make_node: MakeNode,
    engine: str,
    login: dict[str, str],
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    image = f"{PRIVATE_REGISTRY}/tuneplane-test/trainer:{unique('absent')}"  # on no engine
    wrong = {"username": login["username"], "password": f"wrong-{unique('secret')}"}
    node = await make_node(engine)
    started = time.monotonic()

    body = {"image": image, "registry_auth": wrong}
    assert await node.call("POST", "/node/v1/images/pull", json=body) == (
        202,
        {"image": image, "phase": "pulling"},
    )
    failed = await wait_for_pull(node, image, lambda p: p["phase"] == "failed", timeout=30)

    assert time.monotonic() - started < 20  # at once: no retry loop, far from a stall
    assert f"the registry refused access to {image}" in failed["error"], failed
    ref, _ = await node.launch(["/bin/true"], image=image, registry_auth=wrong)
    assert (await node.failed(ref))["pending_error"] == failed["error"]  # a launch's reason
    shown = await everything_shown(node, debug_logs, ref) + json.dumps(await images(node))
    assert wrong["password"] not in shown and login["password"] not in shown
    assert [i for i in (await images(node))["images"] if i["image"] == image] == []
