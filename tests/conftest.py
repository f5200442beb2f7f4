"""Fixtures: the fast ones (a fake engine and clock), the engine ones, and no leaked tasks.

A test that uses an engine fixture must carry the ``engine`` marker, so that
``pytest -m 'not engine'`` never needs an engine; collection fails when one does not.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.metadataserver import Metadata
from tests.ociserver import Registry
from tests.support.console import TOKEN, Console, ServedAsServe
from tests.support.engines import DEV_ROOT, engine_missing, engine_settings, own_docker_host, swept
from tests.support.nodes import fake_node_of, state_dir, storage_root
from tests.support.proxies import ThrottlingProxy
from tests.support.runtimes import TrackingRuntime
from tests.support.throwaway import ThrowawayDocker, ThrowawayPodman
from tests.volumeserver import FileServer
from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.factory import make_probe
from tuneplane_node.gpu.probe import GpuProbe, NoDriverProbe
from tuneplane_node.jobs import Node
from tuneplane_node.jobs.mounts.staging import MountStaging
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.engine import EngineRuntime
from tuneplane_node.runtime.engines.podman import PodmanRuntime
from tuneplane_node.settings import NodeSettings

# What the modules split from one use (its engine tests in test_*_engines.py, a long
# module's verbs each in its own), fixtures included, each in a module of its own here:
# loaded as plugins, so that the fixtures reach every part and the asserts in them are
# rewritten as a test module's are.
pytest_plugins = [
    "tests.checkcommand",
    "tests.ctlcommand",
    "tests.gpusimulation",
    "tests.jobservice",
    "tests.nvmlprobe",
    "tests.openapiserved",
    "tests.scrapes",
    "tests.servecommand",
]

ENGINE_FIXTURES = frozenset(
    {"runtime", "docker_runtime", "make_node", "proxy", "own_docker", "throwaway_docker"}
)


@pytest.fixture
def tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest's ``tmp_path`` (a new directory under the session's), made in constant time:
    pytest numbers each test's directory by listing every one made before it, which cost
    3 ms a test once the fast suite had made 600 of them, and more with each. Here each
    is a unique name, its test's first, in the same session directory."""
    name = re.sub(r"\W", "_", request.node.name)[:30]
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_path_factory.getbasetemp()))


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """`cli.main` run in-process sets the root logger up as `serve` does (a handler on the
    test's captured stderr, closed after it): every test gets back what it had."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    if root.level != level:  # setLevel clears every logger's cache: not on each test
        root.setLevel(level)


FAST_SUITE = "not engine and not slow"  # the README's fast suite, as `-m` spells it
_ALL_MARKED = re.compile(r"^pytestmark = \[?pytest\.mark\.(engine|slow)\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The fast suite does not import a module whose every test its ``pytestmark`` marks
    engine or slow: none of them would run, and importing what they use (hypothesis'
    strategies, the command lines, the client) took half a second of its start."""
    fast = " ".join(str(config.option.markexpr).split()) == FAST_SUITE
    if not fast or not collection_path.name.startswith("test_"):
        return None
    return True if _ALL_MARKED.search(collection_path.read_text()) else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep what the imports and the collection made (modules, the SDKs, hypothesis'
    strategies, every test item) out of each later full collection, as the daemon does
    with what its start made (`server.freeze_start_up`): 17 of them a fast run walked
    265,000 objects each, 2.2 s in all."""
    gc.collect()
    gc.freeze()


FAST_TIMEOUT_S = 60
"""The fast suite's per-test bound (its tests take milliseconds); others have
pyproject.toml's `timeout`, or their own `pytest.mark.timeout`."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = sorted(name for name in ENGINE_FIXTURES if _uses_ours(item, name))
        if used and item.get_closest_marker("engine") is None:
            raise pytest.UsageError(f"{item.nodeid} uses {used}: mark it engine")
        marked = {name for name in ("engine", "slow", "timeout") if item.get_closest_marker(name)}
        if not marked:
            item.add_marker(pytest.mark.timeout(FAST_TIMEOUT_S))


def refuse_engine_tests(item: pytest.Item) -> None:
    """A kind's folder without engines (tests/unit/, tests/http/) holds no test marked
    ``engine``: that one belongs in tests/engines/, which marks each of its own."""
    if item.get_closest_marker("engine") is not None:
        raise pytest.UsageError(f"{item.nodeid} is marked engine: move it to tests/engines/")


def _uses_ours(item: pytest.Item, name: str) -> bool:
    """Whether the test uses this module's fixture of that name (not a local one)."""
    definitions = getattr(item, "_fixtureinfo", None)
    defs = definitions.name2fixturedefs.get(name) if definitions else None
    return defs is not None and bool(defs) and defs[-1].func.__module__ == __name__


# pytest-asyncio's runner of a function-scoped loop: the loop every async test and
# fixture here runs on (its name is the plugin's; a rename fails every async test loudly).
_TEST_RUNNER = "_function_scoped_runner"


@pytest.fixture(autouse=True)
def no_leaked_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail an async test that leaves a task running once it and its fixtures are done
    (kopf's discipline), naming each. Set up before the test's other fixtures, so checked
    after they have closed what they made, on the test's loop, which it holds open until
    then. The loop runs again only when a task is left: one cancelled but not yet ended
    gets a few turns, one waiting on a pool thread a second (the time a thread takes to
    let go). (Checked here, not in an async fixture: that cost 2 ms of every async test.)
    """
    if not asyncio.iscoroutinefunction(getattr(request, "function", None)):
        yield
        return
    runner = request.getfixturevalue(_TEST_RUNNER)
    before = asyncio.all_tasks(runner.get_loop())
    yield
    leaked = [task for task in asyncio.all_tasks(runner.get_loop()) - before if not task.done()]
    if leaked and (left := runner.run(_still_running(leaked))):
        pytest.fail("test left tasks running: " + "; ".join(map(_described, left)))


async def _still_running(tasks: list[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    for turn in range(40):
        tasks = [task for task in tasks if not task.done()]
        if not tasks:
            break
        await asyncio.sleep(0 if turn < 20 else 0.05)
    return tasks


def _described(task: asyncio.Task[Any]) -> str:
    return f"{task.get_name()!r} ({task.get_coro()!r})"


# --- fast: a fake engine, a clock moved by hand ----------------------------------------

IMAGE = "registry.test/trainer:1"


class _GivenSettings(NodeSettings):
    """The node's settings from the arguments alone: the fast suite's nodes read no
    environment or `.env` (a developer's TUNEPLANE_ variables cannot change a test).
    Validation is the same, the model's own; only pydantic-settings' sources are skipped,
    whose building was three quarters of each of the suite's 600 settings (1 ms)."""

    def __init__(self, **values: Any) -> None:
        BaseModel.__init__(self, **values)


def fake_settings(tmp_path: Any, **overrides: Any) -> NodeSettings:
    base: dict[str, Any] = {
        "node_token": TOKEN,
        "local_runtime": "docker",
        "local_gpu_count": 4,
        "storage_root": storage_root(tmp_path),
        "node_state_dir": state_dir(tmp_path),
        "local_stop_timeout": 0.05,  # real seconds: a grace period is waited, not faked
    }
    return _GivenSettings(**{**base, **overrides})


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def fake(clock: FakeClock) -> AsyncIterator[FakeRuntime]:
    runtime = FakeRuntime(clock=clock, images=(IMAGE,))
    yield runtime
    await runtime.close()


@pytest.fixture
def probe() -> FakeProbe:
    return FakeProbe(cards=4)


@pytest.fixture
def settings(tmp_path: Any) -> NodeSettings:
    return fake_settings(tmp_path)


@pytest.fixture
async def node(
    fake: FakeRuntime, probe: FakeProbe, settings: NodeSettings, clock: FakeClock
) -> AsyncIterator[Node]:
    """The node's services over the fake engine, built as the daemon builds them."""
    built = fake_node_of(fake, settings, probe=probe, clock=clock)
    yield built
    await built.close()


MakeFakeNode = Callable[..., Awaitable[Console]]


@pytest.fixture
async def fake_node(
    aiohttp_client: Any, fake: FakeRuntime, probe: FakeProbe, clock: FakeClock, tmp_path: Any
) -> AsyncIterator[MakeFakeNode]:
    """The real daemon over a real socket, in front of the fake engine, behind the
    event-fed state cache as in production. With a simulation file in the settings, the
    cards are the file's (the probe the daemon itself would make), else ``probe``'s.
    Every request waits until the cache has taken the engine's events (`cache_settled`).
    ``as_served``: a handler is not cancelled when its client goes (`ServedAsServe`)."""
    caches: list[CachedRuntime] = []

    async def make(
        *, as_served: bool = False, port_held: bool = False, **overrides: Any
    ) -> Console:
        settings = fake_settings(tmp_path, **overrides)
        cached = await fake_cache(fake, settings, clock)
        caches.append(cached)
        cards = make_probe(settings, clock=clock) if settings.gpu_simulation_file else probe
        allocator = GpuAllocator(cached, settings, probe=cards)
        app = create_node_app(
            settings, runtime=cached, allocator=allocator, clock=clock, port_held=port_held
        )
        server = ServedAsServe(app) if as_served else app
        return Console(await aiohttp_client(server), settle=lambda: cache_settled(fake, cached))

    yield make
    for cached in caches:
        await cached.cache.close()  # the fake under it is the `fake` fixture's to close


async def fake_cache(fake: FakeRuntime, settings: NodeSettings, clock: FakeClock) -> CachedRuntime:
    """The state cache over the fake engine, synced; a broken stream reopens within 50 ms."""
    cached = CachedRuntime(
        fake,
        relist_s=settings.state_relist_s,
        sync_timeout=5,
        clock=clock,
        backoff_s=(0.01, 0.05),
    )
    await cached.start()
    return cached


async def cache_settled(fake: FakeRuntime, cached: CachedRuntime, timeout: float = 5) -> None:
    """Until the cache has taken every event the fake sent, and knows whether the engine
    is up: stale once it went down, synced again once it came back."""
    await fake.delivered(timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while cached.cache.synced != fake.up and loop.time() < deadline:
        await asyncio.sleep(0.002)


# --- engines ------------------------------------------------------------------------------


async def open_runtime(engine: str, **overrides: object) -> EngineRuntime:
    settings = engine_settings(engine, **overrides)
    runtime: EngineRuntime = (
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


_OWN_ENGINE_CLEARED: list[bool] = []  # once per session


@pytest.fixture
async def own_docker() -> AsyncIterator[TrackingRuntime]:
    """The suite's own Docker engine: nobody else's jobs are on it (reap takes them all)."""
    inner = await open_runtime("docker", docker_host=own_docker_host(), local_gpu_passthrough=False)
    if not _OWN_ENGINE_CLEARED:
        await clear_own_engine(inner)
        _OWN_ENGINE_CLEARED.append(True)
    tracking = TrackingRuntime(inner)
    yield tracking
    await tracking.cleanup()
    await inner.close()


async def clear_own_engine(runtime: EngineRuntime) -> None:
    """Remove what an interrupted earlier session left on the suite's own engine (its data
    root outlives the engine), so that reap's and the walks' counts start from nothing."""
    assert isinstance(runtime, DockerRuntime)
    left = await runtime.pool.call(runtime.api.containers, all=True)
    for entry in left:
        await runtime.pool.call(runtime.api.remove_container, entry["Id"], force=True)


@pytest.fixture
async def throwaway_docker() -> AsyncIterator[ThrowawayDocker]:
    """A Docker engine of this test's own, with the test image, for a test that restarts
    or freezes its engine; removed with all it holds after the test. Asked for before
    `make_node`, so that the nodes' clean-up comes first, while the engine is there."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        engine_missing("a throwaway docker engine", "dockerd and root are needed to start one")
    await asyncio.to_thread(ThrowawayDocker.clear_stale)
    engine = ThrowawayDocker()
    try:
        await asyncio.to_thread(engine.start)
        await asyncio.to_thread(engine.load_test_image)
        yield engine
    finally:
        await asyncio.to_thread(engine.close)


@pytest.fixture
async def netns_docker() -> AsyncIterator[ThrowawayDocker]:
    """A Docker engine with its bridge and firewall rules, in network namespaces of its
    own (`ThrowawayDocker` ``netns=True``), the outside world's servers listening."""
    if os.geteuid() != 0 or not (shutil.which("dockerd") and shutil.which("nsenter")):
        engine_missing("a docker engine in a network namespace", "root, dockerd, nsenter")
    await asyncio.to_thread(ThrowawayDocker.clear_stale)
    engine = ThrowawayDocker(netns=True)
    try:
        await asyncio.to_thread(engine.start)
        await asyncio.to_thread(engine.load_test_image)
        await asyncio.to_thread(engine.listen_outside)
        yield engine
    finally:
        await asyncio.to_thread(engine.close)


def podman_in_namespaces(beside: ThrowawayDocker | None = None) -> ThrowawayPodman:
    """A podman service of its own in network namespaces (its own, or ``beside``'s), the
    test image loaded and, in namespaces of its own, the outside world's servers
    listening; the caller closes it."""
    if os.geteuid() != 0 or not (shutil.which("podman") and shutil.which("nsenter")):
        engine_missing("a podman service in a network namespace", "root, podman, nsenter")
    ThrowawayPodman.clear_stale()
    engine = ThrowawayPodman(beside=beside)
    try:
        engine.start()
        engine.load_test_image()
        if beside is None:
            engine.net.listen()
    except BaseException:
        engine.close()
        raise
    return engine


@pytest.fixture
async def proxy() -> AsyncIterator[ThrottlingProxy]:
    server = await ThrottlingProxy().start()
    yield server
    await server.close()


MakeNode = Callable[..., Awaitable[Console]]


@pytest.fixture
async def make_node(aiohttp_client: Any, tmp_path: Any) -> AsyncIterator[MakeNode]:
    """Daemons on a real engine, behind the event-fed cache as in production, reachable
    over a socket. What their consoles launched is removed at the end, nothing else."""
    opened: list[tuple[EngineRuntime, list[str]]] = []
    caches: list[CachedRuntime] = []
    made_by: dict[int, list[str]] = {}  # a cache's id -> names launched through it
    consoles: list[Console] = []

    async def make(
        engine: str = "docker",
        *,
        feed: TrackingRuntime | None = None,
        cached: CachedRuntime | None = None,
        probe: GpuProbe | None = None,
        heartbeat_s: float = 2.0,
        port_held: bool = False,
        **overrides: Any,
    ) -> Console:
        """``feed``: an engine runtime whose owner (another fixture, or the test itself)
        removes what was made; ``cached``: the cache of an earlier node, for a restarted
        daemon; ``port_held``: as `serve` under systemd's socket unit."""
        options = {
            "node_token": TOKEN,
            "local_gpu_passthrough": False,  # no GPU here: label the cards, hand none over
            "local_gpu_count": 4,
            "storage_root": storage_root(tmp_path),
            "node_state_dir": state_dir(tmp_path),
            **overrides,
        }
        settings = engine_settings(engine, **options)
        if cached is None:
            if feed is None:
                runtime = await open_runtime(engine, **options)
                feed = TrackingRuntime(runtime)
                opened.append((runtime, feed.made))
            cached = CachedRuntime(
                feed,
                relist_s=settings.state_relist_s,
                sync_timeout=10,
                heartbeat_s=heartbeat_s,
            )
            await cached.start()
            caches.append(cached)
            made_by[id(cached)] = feed.made
        if probe is None:
            probe = make_probe(settings) if settings.gpu_simulation_file else NoDriverProbe("test")
        allocator = GpuAllocator(cached, settings, probe=probe)
        # The suite's shared engines hold the nodes of many tests at once: only the
        # engines one test has to itself (own, throwaway) are swept of wreckage.
        own = engine == "docker" and swept(settings.docker_host)
        app = create_node_app(
            settings, runtime=cached, allocator=allocator, sweep=own, port_held=port_held
        )
        consoles.append(Console(await aiohttp_client(app), made=made_by[id(cached)]))
        return consoles[-1]

    yield make
    # The apps shut down first, as in production: a pull finishing meanwhile still has its
    # runtime (aiohttp_client would close them only after this teardown).
    for console in consoles:
        await console.client.close()
    for cache in caches:
        await cache.cache.close()  # the engine runtime under it is closed below
    for runtime, names in opened:
        for name in names:
            await runtime.remove(name)
        await runtime.close()
    MountStaging(state_dir(tmp_path)).sweep(())  # the staged mounts of what was removed


@pytest.fixture
def login() -> dict[str, str]:
    """The password registry's user and password (engines.sh wrote them)."""
    try:
        user, password = (DEV_ROOT / "private-registry.auth").read_text().strip().split(":", 1)
    except OSError as exc:
        engine_missing("the private registry", str(exc))
    return {"username": user, "password": password}


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every line the node logs, DEBUG's access lines and the audit log included."""
    caplog.set_level(logging.DEBUG)
    return caplog


@pytest.fixture
async def metadata() -> AsyncIterator[Metadata]:
    """A fake cloud metadata service of the test's own (tests/metadataserver.py)."""
    served = Metadata()
    await served.start()
    yield served
    await served.close()


@pytest.fixture
async def oci_registry() -> AsyncIterator[Registry]:
    """A fake OCI registry of the test's own (tests/ociserver.py), closed at the end."""
    served = Registry()
    await served.start()
    yield served
    await served.close()


@pytest.fixture
async def file_server() -> AsyncIterator[FileServer]:
    """A file server of the test's own (tests/volumeserver.py), closed at the end."""
    files = FileServer()
    await files.start()
    yield files
    await files.close()
