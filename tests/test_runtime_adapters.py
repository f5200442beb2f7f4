"""Every runtime verb against the real Docker engine AND the real podman service."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.helpers import (
    BIG_IMAGE,
    IMAGE,
    REGISTRY,
    ThrottlingProxy,
    TrackingRuntime,
    forget_image,
    job,
    log_text,
    unique,
    wait_status,
)
from tuneplane_node.errors import EngineConflict, EngineRefused
from tuneplane_node.runtime.base import (
    LABEL_RUN_ID,
    ContainerSpec,
    ContainerState,
    LogQuery,
    Mount,
    PullLimits,
    PullProgress,
    container_name,
)

pytestmark = pytest.mark.engine


async def test_run_passes_env_labels_mounts_workdir_and_replaces_entrypoint(
    runtime: TrackingRuntime, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("from-the-host\n")
    spec = job(
        ["/bin/sh", "-c", 'echo "foo=$FOO"; pwd; cat /data/in.txt; touch /data/x || echo ro'],
        env={"FOO": "bar baz"},
        labels={"tuneplane.user": "alice"},
        mounts=(Mount(str(tmp_path), "/data", True),),
        workdir="/tmp",
    )
    container_id = await runtime.run(spec)
    state = await wait_status(runtime, spec.name, "exited")
    logs = await log_text(runtime, spec.name, 100)

    assert len(container_id) == 64
    assert state.exit_code == 0
    assert "foo=bar baz" in logs
    assert "\n" in logs and "/tmp" in logs
    assert "from-the-host" in logs
    assert "ro" in logs.split()  # the read-only mount refused the write
    assert "image-entrypoint-was-not-replaced" not in logs
    assert state.labels["tuneplane.user"] == "alice"
    assert state.run_id == spec.labels[LABEL_RUN_ID]
    assert not (tmp_path / "x").exists()


async def test_job_exit_code_and_times_are_reported(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sh", "-c", "exit 3"])
    await runtime.run(spec)
    state = await wait_status(runtime, spec.name, "exited")

    assert (state.status, state.exit_code, state.oom_killed) == ("exited", 3, False)
    assert state.started_at and state.finished_at and state.created_at
    assert not state.never_started


async def test_running_job_has_no_exit_code_and_gpu_label(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sleep", "300"])
    await runtime.run(spec)
    state = await runtime.inspect(spec.name)

    assert state.status == "running"
    assert state.exit_code is None
    assert state.gpus == ()
    assert "tuneplane.gpus" in state.labels


async def test_sigterm_reaches_the_job_and_its_exit_is_awaited(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sh", "-c", "trap 'exit 42' TERM; while true; do sleep 0.1; done"])
    await runtime.run(spec)
    await wait_status(runtime, spec.name, "running")
    await asyncio.sleep(0.3)  # let the shell install its trap

    await runtime.kill(spec.name, "SIGTERM")

    assert await runtime.wait_exited(spec.name, 10)
    state = await runtime.inspect(spec.name)
    assert (state.status, state.exit_code) == ("exited", 42)


async def test_a_job_ignoring_sigterm_runs_on_until_sigkill(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"])
    await runtime.run(spec)
    await wait_status(runtime, spec.name, "running")
    await asyncio.sleep(0.3)

    await runtime.kill(spec.name, "SIGTERM")
    assert not await runtime.wait_exited(spec.name, 1)  # it ignored it

    await runtime.kill(spec.name, "SIGKILL")
    assert await runtime.wait_exited(spec.name, 10)
    assert (await runtime.inspect(spec.name)).exit_code == 137
    await runtime.kill(spec.name, "SIGKILL")  # not running any more: nothing to do


async def test_remove_deletes_the_container(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sleep", "300"])
    await runtime.run(spec)

    await runtime.remove(spec.name)

    assert not (await runtime.inspect(spec.name)).exists


async def test_signalling_and_removing_a_missing_container_succeed(
    runtime: TrackingRuntime,
) -> None:
    name = container_name(unique("absent"))

    await runtime.kill(name, "SIGTERM")
    await runtime.remove(name)

    assert await runtime.wait_exited(name, 1)
    assert await runtime.inspect(name) == ContainerState.missing(name)


async def test_logs_carry_timestamps_from_both_streams(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sh", "-c", "echo to-stdout; echo to-stderr >&2"])
    await runtime.run(spec)
    await wait_status(runtime, spec.name, "exited")

    lines = (await log_text(runtime, spec.name, 10)).splitlines()

    assert {line.split(" ", 1)[1] for line in lines} == {"to-stdout", "to-stderr"}
    for line in lines:
        assert line[:4].isdigit() and "T" in line.split(" ")[0]


async def test_logs_tail_and_missing_container(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sh", "-c", "for i in 1 2 3 4 5; do echo line$i; done"])
    await runtime.run(spec)
    await wait_status(runtime, spec.name, "exited")

    tail = await log_text(runtime, spec.name, 2)
    missing = await runtime.logs(container_name(unique("absent")), LogQuery(10, 1024))

    assert tail is not None
    assert [line.split(" ", 1)[1] for line in tail.splitlines()] == ["line4", "line5"]
    assert missing is None


async def test_ps_lists_only_labelled_containers_exited_included(
    runtime: TrackingRuntime,
) -> None:
    ours = job(["/bin/sh", "-c", "exit 0"])
    foreign = ContainerSpec(name=unique("foreign"), image=IMAGE, command=("/bin/sleep", "300"))
    await runtime.run(ours)
    await runtime.run(foreign)
    await wait_status(runtime, ours.name, "exited")

    names = {state.name for state in await runtime.ps()}

    assert ours.name in names
    assert foreign.name not in names


async def test_failed_start_leaves_no_container(runtime: TrackingRuntime) -> None:
    spec = job(["/no/such/binary"])

    with pytest.raises(EngineRefused):
        await runtime.run(spec)

    assert not (await runtime.inspect(spec.name)).exists


async def test_a_name_in_use_is_a_conflict(runtime: TrackingRuntime) -> None:
    spec = job(["/bin/sleep", "300"])
    await runtime.run(spec)

    with pytest.raises(EngineConflict, match="already in use"):
        await runtime.run(spec)


async def test_image_exists(runtime: TrackingRuntime) -> None:
    assert await runtime.image_exists(IMAGE)
    assert not await runtime.image_exists(f"{REGISTRY}/tuneplane-test/none:1")


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

    assert time.monotonic() - started < 1.0
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
