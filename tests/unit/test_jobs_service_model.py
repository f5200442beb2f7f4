"""A model-based proof of the job service: a seeded random walk over its verbs, a
restarting daemon and a restarting engine, with the node's promises checked after
every step.

    cards held     == the labels of the live containers, no card on two of them
    cards reserved == the cards of the pending launches, none of them held
    available + held + reserved + unhealthy + external == the card count, each card once
    no ref is both a pending launch and a container
    observe never says exists: false for a container of the node that exists
    no container is left created and never started once a sweep has run

Against the in-memory engine: a short walk of 100 steps in the fast suite, and the long
one (marked slow: 2,000 steps, 10,000 in CI through ``TUNEPLANE_MODEL_STEPS``, set by
``.ci/run``); ``TUNEPLANE_MODEL_SEED`` changes the walk. `test_daemon_model.py` walks
the real Docker engine.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.nodes import check_promises, fake_node_of
from tests.support.waiting import settle
from tuneplane_node.errors import Conflict, NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs import AlreadyRunning, Node, StopPlan
from tuneplane_node.runtime.labels import job_labels
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import LABEL_RUN_ID, Launch, container_name

STEPS = int(os.environ.get("TUNEPLANE_MODEL_STEPS", "2000"))  # CI walks 10,000
SHORT_STEPS = 100
SEED = int(os.environ.get("TUNEPLANE_MODEL_SEED", "20261130"))
RUNS = [f"run-{n}" for n in range(20)]
PRESENT, MISSING = "registry.test/present:1", "registry.test/missing:1"
CARDS = 4


class World:
    """The node under test, the engine under it, and the walk's bookkeeping."""

    def __init__(self, rng: random.Random, settings: NodeSettings) -> None:
        self.rng = rng
        self.settings = settings
        self.clock = FakeClock()
        self.engine = FakeRuntime(clock=self.clock, images=(PRESENT,))
        self.probe = FakeProbe(cards=CARDS)
        self.node = self._service()
        self.done: collections.Counter[str] = collections.Counter()
        self.checks = 0
        self.unswept: set[str] = set()  # wreckage the sweep at start did not reach

    def _service(self) -> Node:
        allocator = GpuAllocator(self.engine, self.settings, probe=self.probe)
        return fake_node_of(self.engine, self.settings, allocator=allocator, clock=self.clock)

    async def step(self) -> None:
        action = self.rng.choices(
            ["launch", "stop", "remove", "reap", "observe", "pull", "exit", "tick",
             "daemon restart", "engine restart", "crash mid-launch", "gpu fault"],
            weights=[30, 10, 8, 4, 8, 15, 10, 8, 2, 1, 2, 3],
        )[0]  # fmt: skip
        with contextlib.suppress(Conflict):  # a refusal is an answer, not a failure
            await getattr(self, action.replace(" ", "_").replace("-", "_"))()
        self.done[action] += 1
        await settle(20)

    async def launch(self) -> None:
        run = self.rng.choice(RUNS)
        spec = ContainerSpec(
            name=container_name(run),
            image=self.rng.choice([PRESENT, PRESENT, MISSING]),
            command=("/bin/train",),
            labels={LABEL_RUN_ID: run},
        )
        result = await self.node.jobs.launch(Launch(run, self.rng.choice([0, 1, 1, 2]), spec))
        container = self.engine.containers.get(spec.name)
        if isinstance(result, AlreadyRunning):  # never "running" for what does not run
            assert container is not None and container.status == "running", container
        if container is not None:
            container.ignores_sigterm = self.rng.random() < 0.3

    async def stop(self) -> None:
        await self.node.jobs.stop(container_name(self.rng.choice(RUNS)), StopPlan(grace=0))

    async def remove(self) -> None:
        await self.node.jobs.remove(container_name(self.rng.choice(RUNS)))

    async def reap(self) -> None:
        await self.node.jobs.reap(self.rng.choice([0, 100]))

    async def observe(self) -> None:
        await self.node.jobs.observe(container_name(run) for run in self.rng.sample(RUNS, 5))

    async def pull(self) -> None:
        pulls = [p for p in self.engine.pulls if not p.done.done() and not p.cancelled]
        if pulls:
            pull = self.rng.choice(pulls)
            roll = self.rng.random()
            if roll < 0.6:
                pull.finish()
            elif roll < 0.8:
                pull.fail("manifest unknown")
            else:
                pull.report(self.rng.randrange(100), 100)

    async def exit(self) -> None:
        running = [c for c in self.engine.containers.values() if c.status == "running"]
        if running:
            self.engine.exit(self.rng.choice(running).spec.name, self.rng.choice([0, 1, 137]))

    async def tick(self) -> None:
        """Time passes; past the API deadline the periodic sweep takes what start missed."""
        seconds = self.rng.choice([1, 30, 600, 2000])
        self.clock.advance(seconds)
        if seconds > self.settings.local_api_timeout:
            await self.node.jobs.sweep_wreckage(older_than_s=self.settings.local_api_timeout)
            self.unswept.clear()

    async def daemon_restart(self, *, swept: bool = True) -> None:
        """Memory goes (pending launches and their pulls), the containers stay. Without
        ``swept`` the sweep at start could not reach the engine."""
        await self.node.close()
        self.node = self._service()
        if swept:
            await self.node.jobs.sweep_wreckage(older_than_s=0)
            self.unswept.clear()

    async def crash_mid_launch(self) -> None:
        """The daemon dies between create and start: a created container holds the cards
        it had claimed; the daemon comes back."""
        occupancy = await self.node.allocator.occupancy()
        run = self.rng.choice(RUNS)
        if occupancy.available and container_name(run) not in self.engine.containers:
            cards = occupancy.available[: self.rng.choice([1, 2])]
            spec = ContainerSpec(
                name=container_name(run), image=PRESENT, gpus=cards, labels={LABEL_RUN_ID: run}
            )
            wreck = self.engine.create_outside(spec, start=False)
            wreck.labels = job_labels(spec)
            swept = self.rng.random() < 0.5
            if not swept:
                self.unswept.add(spec.name)
            await self.daemon_restart(swept=swept)

    async def gpu_fault(self) -> None:
        """A card turns bad (an XID), a process outside the node takes one, or it heals."""
        card, roll = self.rng.randrange(CARDS), self.rng.random()
        if roll < 0.3:
            self.probe.set(card, unhealthy="XID 79: fallen off the bus")
        elif roll < 0.5:
            self.probe.set(card, pids=(4242,))
        else:
            self.probe.set(card)

    async def engine_restart(self) -> None:
        """Without live-restore: every running job dies with the engine."""
        for container in list(self.engine.containers.values()):
            if container.status == "running":
                self.engine.exit(container.spec.name, 143)

    async def check(self) -> None:
        """The node's promises, from the engine's truth and the service's word."""
        self.checks += 1
        truth = {
            name: (container.status, container.state().gpus)
            for name, container in self.engine.containers.items()
            if LABEL_RUN_ID in container.labels
        }
        await check_promises(self.node, truth, cards=CARDS, wrecks_allowed=self.unswept)


@pytest.mark.parametrize(
    "steps",
    [pytest.param(SHORT_STEPS, id="short"), pytest.param(STEPS, id="long", marks=pytest.mark.slow)],
)
async def test_a_random_walk_keeps_every_promise(settings: NodeSettings, steps: int) -> None:
    world = World(random.Random(SEED), replace_settings(settings))
    try:
        for _ in range(steps):
            try:
                await world.step()
            except NodeError as exc:  # the fake engine never fails: nothing else may
                raise AssertionError(f"after {dict(world.done)}: {exc.message}") from exc
            await world.check()
    finally:
        await world.node.close()
        await world.engine.close()
    print(
        f"\nmodel: {steps} steps (seed {SEED}), {world.checks} checks "
        f"of 6 promises: {dict(world.done)}"
    )
    assert world.checks == steps


def replace_settings(settings: NodeSettings) -> NodeSettings:
    return settings.model_copy(update={"local_stop_timeout": 0, "local_container_ttl_s": 60})
