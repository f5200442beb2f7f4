"""Fixtures shared by every test: engines, runtimes that clean up, no leaked tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from tests.engines import docker_host, engine_missing, podman_url
from tests.proxy import ThrottlingProxy
from tuneplane_node.runtime.base import ContainerRuntime, ContainerState
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.runtime.docker import DockerRuntime
from tuneplane_node.runtime.podman import PodmanRuntime
from tuneplane_node.settings import NodeSettings


def engine_settings(engine: str, **overrides: object) -> NodeSettings:
    base: dict[str, object] = {
        "local_runtime": engine,
        "docker_host": docker_host(),
        "podman_url": podman_url(),
        "local_api_timeout": 30,
        "runtime_threads": 8,
    }
    base.update(overrides)
    return NodeSettings(**base)  # type: ignore[arg-type]


class TrackingRuntime:
    """Wraps a real runtime and force-removes every container a test made through it."""

    def __init__(self, runtime: ContainerRuntime) -> None:
        self.inner = runtime
        self.made: list[str] = []

    def __getattr__(self, item: str) -> object:
        return getattr(self.inner, item)

    async def run(self, spec):  # type: ignore[no-untyped-def]
        self.made.append(spec.name)
        return await self.inner.run(spec)

    async def cleanup(self) -> None:
        for name in self.made:
            await self.inner.remove(name)


async def wait_status(
    runtime: ContainerRuntime,
    name: str,
    wanted: str,
    timeout: float = 20,
    poll: float = 0.1,
) -> ContainerState:
    """The container's state once it reads ``wanted``, or as it is when time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        state = await runtime.inspect(name)
        if state.status == wanted or time.monotonic() > deadline:
            return state
        await asyncio.sleep(poll)


async def open_runtime(engine: str, **overrides: object) -> ContainerRuntime:
    settings = engine_settings(engine, **overrides)
    runtime: ContainerRuntime = (
        DockerRuntime(settings) if engine == "docker" else PodmanRuntime(settings)
    )
    health = await runtime.health()
    if not health.ok:
        await runtime.close()
        engine_missing(engine, health.error or "no answer")
    return runtime


@pytest.fixture(params=["docker", "podman"])
async def runtime(request: pytest.FixtureRequest) -> AsyncIterator[TrackingRuntime]:
    inner = await open_runtime(request.param)
    tracking = TrackingRuntime(inner)
    yield tracking
    await tracking.cleanup()
    await inner.close()


@pytest.fixture
async def docker_runtime() -> AsyncIterator[TrackingRuntime]:
    inner = await open_runtime("docker", local_gpu_passthrough=False)
    tracking = TrackingRuntime(inner)
    yield tracking
    await tracking.cleanup()
    await inner.close()


@pytest.fixture
async def proxy() -> AsyncIterator[ThrottlingProxy]:
    server = await ThrottlingProxy().start()
    yield server
    await server.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        if function is not None and asyncio.iscoroutinefunction(function):
            item.add_marker(pytest.mark.usefixtures("no_leaked_tasks"))


@pytest.fixture
async def no_leaked_tasks() -> AsyncIterator[None]:
    """Fail a test that leaves a background task running (kopf's discipline)."""
    before = asyncio.all_tasks()
    yield
    await asyncio.sleep(0)
    leaked = [
        task
        for task in asyncio.all_tasks() - before
        if not task.done() and task is not asyncio.current_task()
    ]
    for _ in range(20):
        if not leaked:
            break
        await asyncio.sleep(0.05)
        leaked = [task for task in leaked if not task.done()]
    assert not leaked, f"test left tasks running: {leaked}"


@pytest.fixture
async def make_node(aiohttp_client, tmp_path):  # type: ignore[no-untyped-def]
    """Build daemons on a real engine, reachable over a socket; clean up their jobs."""
    from tests.console import TOKEN, Console
    from tuneplane_node.daemon.app import create_node_app
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.gpu.probe import NoDriverProbe, make_probe

    made: list[TrackingRuntime] = []
    caches: list[CachedRuntime] = []

    async def make(engine: str = "docker", *, runtime=None, **overrides):  # type: ignore[no-untyped-def]
        options = {
            "node_token": TOKEN,
            "local_gpu_passthrough": False,  # no GPU here: label the cards, hand none over
            "local_gpu_count": 4,
            "storage_root": tmp_path,
            "node_state_dir": tmp_path / "state",
            **overrides,
        }
        settings = engine_settings(engine, **options)
        if runtime is None:
            runtime = TrackingRuntime(await open_runtime(engine, **options))
            made.append(runtime)
        if not isinstance(runtime.inner, CachedRuntime):
            # The daemon reads states from the event-fed cache, as in production.
            cached = CachedRuntime(runtime, relist_s=settings.state_relist_s, sync_timeout=10)
            await cached.start()
            caches.append(cached)
            tracking = TrackingRuntime(cached)
            tracking.made = runtime.made
            runtime = tracking
        probe = make_probe(settings) if settings.gpu_simulation_file else NoDriverProbe("test")
        allocator = GpuAllocator(runtime, settings, probe=probe)
        app = create_node_app(settings, runtime=runtime, allocator=allocator)
        return Console(await aiohttp_client(app))

    yield make
    for cached in caches:
        await cached.cache.close()  # the engine runtime under it is closed below
    for runtime in made:
        await runtime.cleanup()
        await runtime.inner.close()
