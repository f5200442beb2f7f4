"""What the job service's tests share (tests/unit/test_jobs_*.py, its verbs a module each):
a launch request, a launch left pulling, the cards the node holds back, and that nothing
is left of a job.

Those tests run the service against the in-memory engine: every rule, no engine, no
sleeps. Time moves only when a test moves the fake clock; a pull ends only when the test
ends it; a container start is held open by a gate. So the four moments a stop can land
in a pending launch, the reservations, reap's rules and record expiry are exact."""

from __future__ import annotations

from tests.conftest import IMAGE
from tests.fakes.runtime import FakeRuntime
from tuneplane_node.jobs import (
    Node,
)
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, Launch, container_name

MISSING = "registry.test/missing:1"


def request(run_id: str, gpus: int = 0, *, image: str = IMAGE, name: str = "") -> Launch:
    spec = ContainerSpec(
        name=name or container_name(run_id),
        image=image,
        command=("/bin/train",),
        labels={LABEL_RUN_ID: run_id},
    )
    return Launch(run_id, gpus, spec)


async def launch_pulling(node: Node, fake: FakeRuntime, run_id: str, gpus: int = 0) -> None:
    """A launch of an image the engine lacks, once its pull is under way."""
    await node.jobs.launch(request(run_id, gpus, image=MISSING))
    await fake.pulling.wait()


async def reserved(node: Node) -> frozenset[int]:
    return (await node.allocator.occupancy()).reserved


async def available(node: Node) -> tuple[int, ...]:
    return (await node.allocator.occupancy()).available


async def assert_nothing_left(node: Node, fake: FakeRuntime, ref: str) -> None:
    assert ref not in fake.containers
    assert node.pending.get(ref) is None
    assert await reserved(node) == frozenset()
    assert await available(node) == (0, 1, 2, 3)
    assert len(node.jobs.locks) == 0
