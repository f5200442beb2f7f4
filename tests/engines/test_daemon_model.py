"""The model walk of `test_jobs_service_model.py` on a real Docker engine (a throwaway one):
1,000 seeded random steps over 20 run ids and 4 simulated cards, the engine restarted
without --live-restore now and then, the daemon restarted and killed between create and
start. After every step the six promises listed in `test_jobs_service_model.py` are checked
against the engine's truth (its own container list and labels); wreckage is allowed
until the periodic sweep is due (the API deadline, 5 s here, plus a relist period).

The engine answers asynchronously (a job exits, a pull ends, an event reaches the cache
while a check reads), so a check that disagrees is read again for up to 5 s; one that
still disagrees fails the walk. ``TUNEPLANE_REAL_MODEL_STEPS`` changes the length.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import faulthandler
import os
import random
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from datetime import datetime, timezone
from typing import Any

import docker
import pytest

from tests.fakes.gpu import FakeProbe
from tests.support.engines import engine_settings
from tests.support.images import BIG_IMAGE, IMAGE, REGISTRY
from tests.support.jobs import unique
from tests.support.nodes import check_promises, fake_node_of
from tests.support.throwaway import ThrowawayDocker
from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.errors import Conflict, NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs import AlreadyRunning, StopPlan
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.labels import job_labels, parse_gpus
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID, Launch, container_name

pytestmark = [pytest.mark.engine, pytest.mark.own_engines]  # a throwaway engine

STEPS = int(os.environ.get("TUNEPLANE_REAL_MODEL_STEPS", "1000"))
SEED = int(os.environ.get("TUNEPLANE_MODEL_SEED", "20261130"))
CARDS = 4
ABSENT = f"{REGISTRY}/tuneplane-test/absent:1"  # the registry has no such image
COMMANDS = [  # jobs end by themselves too, or every card would soon be taken
    ["/bin/sleep", "20"],
    ["/bin/sh", "-c", "trap '' TERM; sleep 20"],
    ["/bin/sh", "-c", "sleep 0.3"],
    ["/bin/sh", "-c", "exit 3"],
]
SETTLE_S = 5.0
STEP_LIMIT_S = 120.0  # an engine restart takes about 10 s; a step never needs minutes


class RealWorld:
    """The job service over the cached Docker runtime, as the daemon builds it."""

    def __init__(self, rng: random.Random, settings: NodeSettings, engine: ThrowawayDocker) -> None:
        self.rng = rng
        self.settings = settings
        self.engine = engine
        self.session = unique("model")
        self.runs = [f"{self.session}-{n}" for n in range(20)]
        self.names = {container_name(run) for run in self.runs}
        self.client = docker.DockerClient(base_url=engine.host, timeout=30)
        self.probe = FakeProbe(cards=CARDS)
        self.done: collections.Counter[str] = collections.Counter()
        self.checks = 0
        self.rereads = 0
        self.doing = ""

    async def open(self) -> None:
        self.inner = DockerRuntime(self.settings)
        self.runtime = CachedRuntime(
            self.inner, relist_s=self.settings.state_relist_s, sync_timeout=10, heartbeat_s=0.5
        )
        await self.runtime.start()
        allocator = GpuAllocator(self.runtime, self.settings, probe=self.probe)
        self.node = fake_node_of(self.runtime, self.settings, allocator=allocator)
        await self.node.jobs.sweep_wreckage(older_than_s=0)
        self.sweeping = asyncio.create_task(self.node.reaper.maintain())  # as the daemon does

    async def close(self) -> None:
        self.sweeping.cancel()
        await asyncio.gather(self.sweeping, return_exceptions=True)
        await self.node.close()
        await self.node.allocator.close()
        await self.runtime.close()

    async def step(self) -> None:
        action = self.rng.choices(
            ["launch", "stop", "remove", "reap", "observe", "forget image", "wait",
             "daemon restart", "crash mid-launch", "engine restart"],
            weights=[40, 14, 12, 4, 10, 2, 10, 3, 3, 0.4],
        )[0]  # fmt: skip
        self.doing = action
        with contextlib.suppress(Conflict):  # a refusal is an answer, not a failure
            await getattr(self, action.replace(" ", "_").replace("-", "_"))()
        self.done[action] += 1

    async def launch(self) -> None:
        run = self.rng.choice(self.runs)
        spec = ContainerSpec(
            name=container_name(run),
            image=self.rng.choice([IMAGE, IMAGE, IMAGE, BIG_IMAGE, ABSENT]),
            command=tuple(self.rng.choice(COMMANDS)),
            labels={LABEL_RUN_ID: run},
        )
        asked = datetime.now(timezone.utc)
        result = await self.node.jobs.launch(Launch(run, self.rng.choice([0, 1, 2]), spec))
        if isinstance(result, AlreadyRunning):  # never "running" for what does not run
            state = await self.inner.inspect(spec.name)
            finished = parse_rfc3339(state.finished_at)  # a short job may end since
            ran_on = state.status == "exited" and finished is not None and finished >= asked
            assert state.status == "running" or ran_on, state

    async def stop(self) -> None:
        await self.node.jobs.stop(container_name(self.rng.choice(self.runs)), StopPlan(grace=0))

    async def remove(self) -> None:
        await self.node.jobs.remove(container_name(self.rng.choice(self.runs)))

    async def reap(self) -> None:  # the walk's own engine: every exited job of it is ours
        await self.node.jobs.reap(self.rng.choice([0, 3600]))

    async def observe(self) -> None:
        await self.node.jobs.observe(container_name(run) for run in self.rng.sample(self.runs, 5))

    async def forget_image(self) -> None:
        """The next launch of the big image pulls it again (unless a container uses it)."""
        with contextlib.suppress(docker.errors.APIError):
            await asyncio.to_thread(self.client.images.remove, BIG_IMAGE)

    async def wait(self) -> None:
        await asyncio.sleep(self.rng.choice([0.1, 0.5]))

    async def daemon_restart(self) -> None:
        """Memory goes (pending launches and their pulls), the containers stay."""
        await self.close()
        await self.open()

    async def crash_mid_launch(self) -> None:
        """The daemon died between create and start: a created container carries cards."""
        run = self.rng.choice(self.runs)
        occupancy = await self.node.allocator.occupancy()
        taken = {c.name for c in await asyncio.to_thread(self.client.containers.list, all=True)}
        if container_name(run) in taken:
            return
        spec = ContainerSpec(
            name=container_name(run),
            image=IMAGE,
            command=("/bin/sleep", "20"),
            gpus=occupancy.available[: self.rng.choice([0, 1, 2])],
            labels={LABEL_RUN_ID: run},
        )
        await asyncio.to_thread(
            self.client.containers.create,
            IMAGE,
            list(spec.command),
            name=spec.name,
            labels=job_labels(spec),
        )
        await self.daemon_restart()

    async def engine_restart(self) -> None:
        """Without live-restore: the running jobs die with the engine."""
        syncs = self.runtime.cache.syncs
        await asyncio.to_thread(self.engine.restart, live_restore=False)
        deadline = time.monotonic() + 60
        while not (self.runtime.cache.synced and self.runtime.cache.syncs > syncs):
            assert time.monotonic() < deadline, "the cache never caught up with the restart"
            await asyncio.sleep(0.1)

    async def check(self) -> None:
        """The node's promises; a disagreement is read again until SETTLE_S passes."""
        self.checks += 1
        deadline = time.monotonic() + SETTLE_S
        while True:
            try:
                await self._check_once()
                return
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                self.rereads += 1
                await asyncio.sleep(0.05)

    async def _check_once(self) -> None:
        listed = await asyncio.to_thread(
            self.client.api.containers, all=True, filters={"label": [LABEL_RUN_ID]}
        )
        truth = {
            e["Names"][0].lstrip("/"): (e["State"], parse_gpus(e["Labels"].get(LABEL_GPUS, "")))
            for e in listed
        }
        # A launch whose start the engine's restart broke leaves one the node could not
        # remove then: the periodic sweep takes it once older than the API deadline.
        grace = self.settings.local_api_timeout + self.settings.state_relist_s + 3
        young = {e["Names"][0].lstrip("/") for e in listed if time.time() - e["Created"] <= grace}
        await check_promises(self.node, truth, cards=CARDS, wrecks_allowed=young)

    async def clean_up(self) -> None:
        """Removes this walk's containers, and no one else's."""
        for container in await asyncio.to_thread(self.client.containers.list, all=True):
            if container.name in self.names:
                with contextlib.suppress(docker.errors.APIError):
                    await asyncio.to_thread(container.remove, force=True)
        self.client.close()


async def within(seconds: float, work: Coroutine[Any, Any, None], what: str) -> None:
    """``work``, or a failure naming what hung, with every task's and thread's stack:
    a hang must not wedge the suite, and must say where it was."""
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if done:
        return task.result()
    for other in asyncio.all_tasks():
        other.print_stack(file=sys.stderr)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    task.cancel()
    pytest.fail(f"{what} did not end within {seconds:g} s (stacks on stderr)")


@pytest.fixture
async def world(throwaway_docker: ThrowawayDocker) -> AsyncIterator[RealWorld]:
    settings = engine_settings(
        "docker",
        docker_host=throwaway_docker.host,
        local_gpu_passthrough=False,
        local_stop_timeout=0,
        local_container_ttl_s=60,
        local_image_pull_stall_s=10,
        local_api_timeout=5,  # the sweep's age for wreckage, and every call's deadline
        state_relist_s=2,
    )
    # Without live-restore, so that an engine restart takes the jobs.
    await asyncio.to_thread(throwaway_docker.restart, live_restore=False)
    world = RealWorld(random.Random(SEED), settings, throwaway_docker)
    try:
        await world.open()
        yield world
    finally:
        with contextlib.suppress(AttributeError):  # open may have failed midway
            await world.close()
        await world.clean_up()


@pytest.mark.timeout(1800)  # minutes on a quiet machine, several times that on a loaded one
async def test_a_random_walk_on_real_docker_keeps_every_promise(world: RealWorld) -> None:
    started = time.monotonic()
    for _ in range(STEPS):
        try:
            await within(STEP_LIMIT_S, world.step(), f"step {world.done.total()}")
        except NodeError as exc:  # the engine is up between restarts: nothing may fail
            raise AssertionError(f"after {dict(world.done)}: {exc.message}") from exc
        await within(STEP_LIMIT_S, world.check(), f"check after {world.doing}")
    print(
        f"\nreal model: {STEPS} steps (seed {SEED}) in {time.monotonic() - started:.0f} s, "
        f"{world.checks} checks of 6 promises ({world.rereads} re-reads while the engine "
        f"settled): {dict(world.done)}"
    )
    assert world.checks == STEPS
