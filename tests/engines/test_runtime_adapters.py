"""What only a real engine shows, on Docker AND podman: env, mounts and the entrypoint, and
pulls (progress, deadlines, cancelling). The verbs' contract is
tests/contract/test_runtime_contract.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.support.images import BIG_IMAGE, REGISTRY, forget_image
from tests.support.jobs import job
from tests.support.proxies import ThrottlingProxy
from tests.support.runtimes import TrackingRuntime, log_text
from tests.support.waiting import wait_status
from tuneplane_node.errors import EngineRefused
from tuneplane_node.runtime.base import PullLimits, PullProgress
from tuneplane_node.wire.values import Mount

pytestmark = pytest.mark.engine


async def test_run_binds_a_read_only_mount_and_replaces_the_entrypoint(
    runtime: TrackingRuntime, tmp_path: Path
) -> None:
    """The image's ENTRYPOINT (an echo of its own) never runs: the command is the
    entry argv. Env, workdir and the argv itself: the contract (tests/contract)."""
    (tmp_path / "in.txt").write_text("from-the-host\n")
    spec = job(
        ["/bin/sh", "-c", "cat /data/in.txt; touch /data/x || echo ro"],
        mounts=(Mount(str(tmp_path), "/data", True),),
    )
    await runtime.run(spec)
    state = await wait_status(runtime, spec.name, "exited")
    logs = await log_text(runtime, spec.name, 100)

    assert state.exit_code == 0
    assert "from-the-host" in logs
    assert "ro" in logs.split()  # the read-only mount refused the write
    assert "image-entrypoint-was-not-replaced" not in logs
    assert not (tmp_path / "x").exists()


async def test_pull_reports_progress_and_leaves_the_image(runtime: TrackingRuntime) -> None:
    await forget_image(runtime, BIG_IMAGE)
    seen: list[PullProgress] = []

    await runtime.pull(BIG_IMAGE, limits=PullLimits(120, 30), on_progress=seen.append)

    assert await runtime.image_exists(BIG_IMAGE)
    bytes_done, bytes_total, layers_done, layers_total = seen[-1]
    assert layers_total >= 1 and layers_done == layers_total
    if runtime.name == "docker":  # podman's compat stream reports layers, not bytes
        assert bytes_total > 8_000_000 and bytes_done == bytes_total
    await forget_image(runtime, BIG_IMAGE)


async def test_pull_of_a_missing_image_fails_clearly(runtime: TrackingRuntime) -> None:
    with pytest.raises(EngineRefused) as caught:
        await runtime.pull(f"{REGISTRY}/tuneplane-test/none:1", limits=PullLimits(60, 30))

    assert "tuneplane-test/none" in str(caught.value)
    assert "manifest unknown" in str(caught.value)


async def test_cancelled_pull_returns_promptly_and_closes_the_stream(
    runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await proxy.big_image(runtime, rate=100_000)  # ~90 s for the big image
    task = asyncio.ensure_future(runtime.pull(image, limits=PullLimits(300, 300)))
    while proxy.bytes_sent < 200_000:
        await asyncio.sleep(0.05)

    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    # At once, not at the pull's end (~90 s): a loaded engine takes its time to hang up.
    assert time.monotonic() - started < 10
    assert not await runtime.image_exists(image)


async def test_stalled_pull_is_abandoned_after_the_stall_timeout(
    runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await proxy.big_image(runtime, rate=100_000)
    proxy.pause()
    started = time.monotonic()

    with pytest.raises(EngineRefused) as caught:
        await runtime.pull(image, limits=PullLimits(300, 2))

    assert "no progress for 2 s" in str(caught.value)
    assert time.monotonic() - started < 10
    proxy.resume()


async def test_slow_pull_that_keeps_moving_is_not_killed(
    docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    # Docker only: podman 4's compat stream reports a layer when it is done, not while
    # its bytes arrive (see docs/operating.md, "Image pulls").
    runtime = docker_runtime
    image = await proxy.big_image(runtime, rate=1_500_000)  # ~6 s, far over the stall timeout

    await runtime.pull(image, limits=PullLimits(120, 2))

    assert await runtime.image_exists(image)
    await forget_image(runtime, image)
