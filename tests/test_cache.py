"""The event-fed state cache, against the real Docker engine (and podman for the basics)."""

from __future__ import annotations

import asyncio
import collections
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TrackingRuntime
from tests.engines import IMAGE, under_ci, unique
from tests.test_daemon import Make, wait_until
from tuneplane_node.daemon.state import RUNTIME
from tuneplane_node.runtime.base import LABEL_RUN_ID, ContainerSpec, container_name
from tuneplane_node.runtime.cache import CachedRuntime, StateCache

ENGINES_SH = Path(__file__).resolve().parent.parent / "contrib" / "dev" / "engines.sh"
DOCKER_PID = Path("/run/tuneplane-dev/docker.pid")


class CountingRuntime(TrackingRuntime):
    """Counts every call that reaches the engine runtime under the cache."""

    def __init__(self, runtime: TrackingRuntime) -> None:
        super().__init__(runtime.inner)
        self.made = runtime.made
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, item: str) -> Any:
        value = getattr(self.inner, item)
        if not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[item] += 1
            return value(*args, **kwargs)

        return counted

    async def inspect(self, name: str) -> Any:
        self.calls["inspect"] += 1
        return await self.inner.inspect(name)

    async def ps(self) -> Any:
        self.calls["ps"] += 1
        return await self.inner.ps()


def cache_of(node: Any) -> StateCache:
    cached = node.app[RUNTIME].inner
    assert isinstance(cached, CachedRuntime)
    return cached.cache


async def sdk(runtime: TrackingRuntime, method: str, *args: Any, **kwargs: Any) -> Any:
    """Act on the engine behind the daemon's back, through the docker SDK."""
    inner = runtime.inner
    return await inner.pool.call(getattr(inner.api, method), *args, **kwargs)  # type: ignore[attr-defined]


async def test_observe_makes_no_engine_call(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    counting = CountingRuntime(docker_runtime)
    node = await make_node(runtime=counting)
    refs = [(await node.launch(["/bin/sleep", "300"]))[0] for _ in range(3)]
    await asyncio.sleep(0.3)  # let the launches' own events settle
    await node.health()  # the engine's version is asked once
    counting.calls.clear()

    for _ in range(20):
        states = await node.observe(*refs, "tuneplane-unknown")
        await node.health()

    assert all(states[ref]["status"] == "running" for ref in refs)
    assert states["tuneplane-unknown"]["exists"] is False
    assert counting.calls["inspect"] == 0 and counting.calls["ps"] == 0
    assert counting.calls["inspect_now"] == 0 and counting.calls["list_brief"] == 0
    assert counting.calls["health"] == 0, counting.calls


async def test_a_launch_is_visible_to_observe_at_once(make_node: Make) -> None:
    node = await make_node()
    ref, _ = await node.launch(["/bin/sleep", "300"])
    assert (await node.state(ref))["status"] == "running"
    await node.remove(ref)
    assert (await node.state(ref))["exists"] is False


async def test_a_kill_outside_the_daemon_is_seen_without_any_verb(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime)
    ref, _ = await node.launch(["/bin/sleep", "300"], gpus=2)

    await sdk(docker_runtime, "kill", ref, signal="SIGKILL")

    state = await node.wait_for(ref, "status", "exited", timeout=5)
    assert state["exit_code"] == 137
    assert (await node.health())["gpus_free"] == 4  # its cards are free again


async def test_a_removal_outside_the_daemon_reads_gone(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime)
    ref, _ = await node.launch(["/bin/sleep", "300"])

    await sdk(docker_runtime, "remove_container", ref, force=True)

    await node.wait_for(ref, "exists", False, timeout=5)


async def test_a_job_exiting_by_itself_is_seen(make_node: Make) -> None:
    node = await make_node("podman")
    ref, _ = await node.launch(["/bin/sh", "-c", "sleep 0.5; exit 7"])
    state = await node.wait_for(ref, "status", "exited", timeout=10)
    assert state["exit_code"] == 7


async def test_dropped_events_are_recovered_by_the_relist(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime, state_relist_s=0.5)
    ref, _ = await node.launch(["/bin/sleep", "300"])
    cache = cache_of(node)
    cache._on_event = lambda *event: None  # type: ignore[method-assign]  # events lost
    cache._on_die = lambda *event: None  # type: ignore[method-assign]

    await sdk(docker_runtime, "kill", ref, signal="SIGKILL")
    await asyncio.sleep(0.3)
    assert (await node.state(ref))["status"] == "running"  # the cache did not hear it

    state = await node.wait_for(ref, "status", "exited", timeout=5)
    assert state["exit_code"] == 137
    assert (await node.health())["state_cache"]["last_relist_age_s"] < 2


async def test_a_broken_stream_makes_reads_503_until_resynced(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime)
    ref, _ = await node.launch(["/bin/sleep", "300"])
    cache = cache_of(node)
    cache._stopping.wait = lambda timeout=None: time.sleep(1.0) or False  # type: ignore[method-assign]

    cache.break_stream()
    await wait_until(lambda: not cache.synced, timeout=5)
    status, body = await node.call("POST", "/node/v1/observe", json={"refs": [ref]})
    assert status == 503 and "unreachable" in body["detail"]
    assert (await node.health())["state_cache"]["synced"] is False

    await wait_until(lambda: cache.synced, timeout=10)
    assert (await node.state(ref))["status"] == "running"


def restart_docker_engine() -> None:
    if not (DOCKER_PID.exists() and ENGINES_SH.exists()):
        if under_ci():
            pytest.fail("the test bed's dockerd (contrib/dev/engines.sh) is not running")
        pytest.skip("needs the dockerd started by contrib/dev/engines.sh")
    pid = int(DOCKER_PID.read_text())
    subprocess.run(["kill", str(pid)], check=True)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


async def test_an_engine_restart_goes_stale_then_shows_the_truth(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime)
    ref, answer = await node.launch(["/bin/sleep", "300"], gpus=2)
    done, _ = await node.launch(["/bin/sh", "-c", "exit 0"])
    await node.wait_for(done, "status", "exited")
    cache = cache_of(node)
    try:
        await asyncio.to_thread(restart_docker_engine)
        await wait_until(lambda: not cache.synced, timeout=10)
        status, _ = await node.call("POST", "/node/v1/observe", json={"refs": [ref]})
        assert status == 503
    finally:
        await asyncio.to_thread(
            subprocess.run, [str(ENGINES_SH), "up"], check=True, capture_output=True
        )

    await wait_until(lambda: cache.synced, timeout=30)
    states = await node.observe(ref, done)
    assert states[ref]["status"] == "running"  # --live-restore kept the job running
    assert states[done]["status"] == "exited"
    health = await node.health()
    assert health["by_job"] == {
        str(card): ref.removeprefix("tuneplane-") for card in answer["gpus"]
    }


async def test_the_cache_holds_only_labelled_containers(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime)
    foreign = unique("foreign")
    await docker_runtime.run(ContainerSpec(name=foreign, image=IMAGE, command=("/bin/sleep", "30")))
    ours = container_name(unique("ours"))
    await docker_runtime.run(
        ContainerSpec(
            name=ours, image=IMAGE, command=("/bin/sleep", "30"), labels={LABEL_RUN_ID: "x"}
        )
    )
    cache = cache_of(node)

    await wait_until(lambda: ours in cache.states, timeout=5)  # seen by its events alone
    assert foreign not in cache.states


def test_a_die_event_carries_its_exit_code_and_time() -> None:
    from tuneplane_node.runtime.cache import event_from_docker

    event = event_from_docker(
        {
            "Action": "die",
            "id": "abc",
            "Actor": {"ID": "abc", "Attributes": {"exitCode": "137", "tuneplane.run-id": "r"}},
            "timeNano": 1_795_987_084_207_204_451,
        }
    )
    assert (event.id, event.action, event.exit_code) == ("abc", "die", 137)
    assert event.at is not None and event.at.startswith("2026-")
    assert event_from_docker({"status": "start", "id": "x"}).exit_code is None
