"""The event-fed state cache against the real Docker engine (and podman for the basics):
real events, real inspects, the daemon in front. The cache's rules themselves are
proven event by event in `test_runtime_cache.py`."""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tests.support.runtimes import TrackingRuntime
from tests.support.waiting import wait_until
from tuneplane_node.daemon.state import NODE
from tuneplane_node.errors import EngineUnavailable
from tuneplane_node.runtime.cache import CachedRuntime, StateCache
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, container_name

pytestmark = pytest.mark.engine


class CountingRuntime(TrackingRuntime):
    """Counts every call that reaches the engine runtime under the cache."""

    def __init__(self, runtime: TrackingRuntime) -> None:
        super().__init__(runtime.inner, runtime.made)
        self.calls: collections.Counter[str] = collections.Counter()
        self.inspected: collections.Counter[str] = collections.Counter()  # inspect_now, by id

    def __getattr__(self, item: str) -> Any:
        value = getattr(self.inner, item)
        if not callable(value):
            return value

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[item] += 1
            if item == "inspect_now":
                self.inspected[args[0]] += 1
            return value(*args, **kwargs)

        return counted

    async def inspect(self, name: str) -> Any:
        self.calls["inspect"] += 1
        return await self.inner.inspect(name)

    async def ps(self) -> Any:
        self.calls["ps"] += 1
        return await self.inner.ps()


def cache_of(node: Any) -> StateCache:
    cached = node.app[NODE].runtime
    assert isinstance(cached, CachedRuntime)
    return cached.cache


async def sdk(runtime: TrackingRuntime, method: str, *args: Any, **kwargs: Any) -> Any:
    """Act on the engine behind the daemon's back, through the docker SDK."""
    inner = runtime.inner
    return await inner.pool.call(getattr(inner.api, method), *args, **kwargs)  # type: ignore[attr-defined]


async def test_observe_makes_no_engine_call(
    make_node: MakeNode, docker_runtime: TrackingRuntime
) -> None:
    counting = CountingRuntime(docker_runtime)
    node = await make_node(feed=counting)
    refs = [(await node.launch(["/bin/sleep", "300"]))[0] for _ in range(3)]
    ids = [str((await counting.inner.inspect(ref)).id) for ref in refs]
    # The launches' own events taken: docker tells each in two the cache watches (create,
    # start), and the cache's event thread inspects the container after each.
    await wait_until(lambda: all(counting.inspected[i] >= 2 for i in ids), timeout=30)
    await node.health()  # the engine's version is asked once
    counting.calls.clear()
    counting.inspected.clear()

    for _ in range(20):
        states = await node.observe(*refs, "tuneplane-unknown")
        await node.health()

    assert all(states[ref]["status"] == "running" for ref in refs)
    assert states["tuneplane-unknown"]["exists"] is False
    assert counting.calls["inspect"] == 0 and counting.calls["ps"] == 0
    # (Other containers' events on the shared engine still cost the cache an inspect.)
    assert not set(counting.inspected) & set(ids) and counting.calls["list_brief"] == 0
    assert counting.calls["health"] == 0, counting.calls


async def test_a_launch_is_visible_to_observe_at_once(make_node: MakeNode) -> None:
    node = await make_node()
    ref, _ = await node.launch(["/bin/sleep", "300"])
    assert (await node.state(ref))["status"] == "running"
    await node.remove(ref)
    assert (await node.state(ref))["exists"] is False


async def test_a_kill_outside_the_daemon_is_seen_without_any_verb(
    make_node: MakeNode, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(feed=docker_runtime)
    ref, _ = await node.launch(["/bin/sleep", "300"], gpus=2)

    await sdk(docker_runtime, "kill", ref, signal="SIGKILL")

    # By its events (or the relist, every 30 s): a loaded engine's event may
    # come seconds late, so the bound is 20 s.
    state = await node.wait_for(ref, "status", "exited", timeout=20)
    assert state["exit_code"] == 137
    assert (await node.answered_health())["gpus_free"] == 4  # its cards are free again


async def test_a_removal_outside_the_daemon_reads_gone(
    make_node: MakeNode, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(feed=docker_runtime)
    ref, _ = await node.launch(["/bin/sleep", "300"])

    await sdk(docker_runtime, "remove_container", ref, force=True)

    await node.wait_for(ref, "exists", False, timeout=20)  # its event, however late


@pytest.mark.podman
async def test_a_job_exiting_by_itself_is_seen(make_node: MakeNode) -> None:
    node = await make_node("podman")
    ref, _ = await node.launch(["/bin/sh", "-c", "sleep 0.5; exit 7"])
    state = await node.wait_for(ref, "status", "exited", timeout=10)
    assert state["exit_code"] == 7


async def test_dropped_events_are_recovered_by_the_relist(
    make_node: MakeNode, docker_runtime: TrackingRuntime
) -> None:
    """Deterministic: no periodic relist races the test; it calls the relist itself."""
    node = await make_node(feed=docker_runtime, state_relist_s=3600)
    ref, _ = await node.launch(["/bin/sleep", "300"])
    cache = cache_of(node)
    lost: list[Any] = []  # what the engine said, dropped on the floor
    cache.on_event = lambda event: None  # type: ignore[method-assign]
    cache.on_inspected = lambda state, container_id: lost.append(state)  # type: ignore[method-assign]

    await sdk(docker_runtime, "kill", ref, signal="SIGKILL")
    await wait_until(lambda: any(s.name == ref and s.status == "exited" for s in lost), 10)
    assert (await node.state(ref))["status"] == "running"  # the cache did not hear it

    await cache.relist()

    state = await node.state(ref)
    assert (state["status"], state["exit_code"]) == ("exited", 137)
    # This relist's, not the start's (relist_s is an hour): seconds at most, under load.
    assert (await node.health())["state_cache"]["last_relist_age_s"] < 30


class HeldStream(TrackingRuntime):
    """A real engine whose event stream cannot be reopened while ``held`` is set."""

    def __init__(self, runtime: TrackingRuntime) -> None:
        super().__init__(runtime.inner, runtime.made)
        self.held = threading.Event()

    def open_events(self) -> Any:
        if self.held.is_set():
            raise EngineUnavailable(engine="docker", reason="held by the test")
        # The inner runtime is a TrackingRuntime over an engine adapter: an EngineFeed.
        return self.inner.open_events()  # type: ignore[attr-defined]


async def test_a_broken_stream_makes_reads_503_until_resynced(
    make_node: MakeNode, docker_runtime: TrackingRuntime
) -> None:
    feed = HeldStream(docker_runtime)
    node = await make_node(feed=feed)
    ref, _ = await node.launch(["/bin/sleep", "300"])
    cache = cache_of(node)
    feed.held.set()

    cache.break_stream()
    await wait_until(lambda: not cache.synced, timeout=5)
    status, body = await node.call("POST", "/node/v1/observe", json={"refs": [ref]})
    assert status == 503 and "unreachable" in body["detail"]
    assert (await node.health())["state_cache"]["synced"] is False

    feed.held.clear()
    await wait_until(lambda: cache.synced, timeout=15)
    assert (await node.state(ref))["status"] == "running"


async def test_the_cache_holds_only_labelled_containers(
    make_node: MakeNode, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(feed=docker_runtime)
    foreign = unique("foreign")
    await docker_runtime.run(ContainerSpec(name=foreign, image=IMAGE, command=("/bin/sleep", "30")))
    ours = container_name(unique("ours"))
    await docker_runtime.run(
        ContainerSpec(
            name=ours, image=IMAGE, command=("/bin/sleep", "30"), labels={LABEL_RUN_ID: "x"}
        )
    )
    cache = cache_of(node)

    await wait_until(lambda: ours in cache.states, timeout=20)  # seen by its events alone
    assert foreign not in cache.states


async def test_fifty_launch_exit_remove_cycles_on_podman_answer_no_false_503(
    make_node: MakeNode,
) -> None:
    """podman says 'no such container' with a 500 when a removed container's event is
    inspected: that is a removal, never a broken stream (every verb would answer 503)."""
    node = await make_node("podman")
    answers: collections.Counter[int] = collections.Counter()
    for _ in range(50):
        ref, _ = await node.launch(["/bin/sh", "-c", "exit 0"])
        for _ in range(500):
            status, body = await node.call("POST", "/node/v1/observe", json={"refs": [ref]})
            answers[status] += 1
            if status != 200 or body["states"][ref]["status"] == "exited":
                break
            await asyncio.sleep(0.01)
        status, _ = await node.call("POST", "/node/v1/remove", json={"ref": ref})
        answers[status] += 1
        status, _ = await node.call("POST", "/node/v1/observe", json={"refs": [ref]})
        answers[status] += 1
    assert set(answers) == {200}, answers
