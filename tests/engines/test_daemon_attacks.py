"""A token holder's attacks on the host and on other jobs, replayed on docker and podman.

Each of these worked once (README, "Only job verbs"): now each must fail, and leave the
other container, the host and the node's cards as they were.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tests.support.nodes import storage_root
from tests.support.runtimes import TrackingRuntime
from tuneplane_node.runtime.spec import ContainerSpec

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]


@pytest.fixture
async def foreign(runtime: TrackingRuntime) -> Any:
    """Somebody's own container on the engine: no run-id label, a name of its own."""
    spec = ContainerSpec(
        name=unique("someones"), image=IMAGE, command=("/bin/sh", "-c", "echo secret; sleep 300")
    )
    await runtime.run(spec)
    return await runtime.inspect(spec.name)


async def test_a_foreign_container_cannot_be_reached_by_its_id(
    make_node: MakeNode, runtime: TrackingRuntime, foreign: Any
) -> None:
    node = await make_node(runtime.inner.name)
    _, body = await node.launch(run_id=unique("hijack"), name=foreign.id, expect=422)
    assert body["detail"].startswith("container.name: must not look like a container id")

    for ref in (foreign.id, foreign.id[:12]):
        assert "does not exist" in await node.logs(ref)
        assert (await node.state(ref))["exists"] is False
        await node.stop(ref, timeout=0)
        await node.remove(ref)

    assert (await runtime.inspect(foreign.name)).status == "running"


@pytest.mark.parametrize("engine", ENGINES)
async def test_one_run_cannot_take_another_runs_container(make_node: MakeNode, engine: str) -> None:
    node = await make_node(engine)
    run_a = unique("run-a")
    shared, _ = await node.launch(["/bin/sh", "-c", "sleep 2; exit 5"], run_id=run_a)

    _, body = await node.launch(run_id=unique("run-b"), name=shared, expect=409)
    assert body["detail"] == f"the container name {shared} is held by run {run_a}"
    state = await node.wait_for(shared, "status", "exited")
    await node.launch(run_id=unique("run-b"), name=shared, expect=409)

    after = await node.state(shared)
    assert after["labels"]["tuneplane.run-id"] == run_a
    # The same run's container, never relaunched. Not finished_at: podman 4 revises it
    # by some milliseconds once its cleanup has read the exit file (seen 1 run in 3).
    started = (after["exit_code"], after["created_at"], after["started_at"])
    assert started == (5, state["created_at"], state["started_at"])


@pytest.mark.parametrize(
    ("container", "field"),
    [
        ({"mounts": [["/", "/host", False]]}, "container.mounts[0]"),
        ({"mounts": [["/etc", "/etc2", True]]}, "container.mounts[0]"),
        (
            {"mounts": [["/run/tuneplane-dev/docker.sock", "/var/run/docker.sock", False]]},
            "container.mounts[0]",
        ),
        (
            {"mounts": [["/run/podman/podman.sock", "/run/podman.sock", False]]},
            "container.mounts[0]",
        ),
        ({"network": "container:someones-db"}, "container.network"),
        ({"privileged": True}, "container.privileged"),
        ({"image": "../containers/someones-db"}, "container.image"),
    ],
)
async def test_the_token_does_not_buy_the_host(
    make_node: MakeNode, container: dict[str, Any], field: str
) -> None:
    node = await make_node(local_gpu_count=2)
    name, body = await node.launch(gpus=1, expect=422, **container)
    assert body["detail"].startswith(f"{field}: ")
    assert (await node.state(name))["exists"] is False
    assert (await node.answered_health())["gpus_free"] == 2


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_sees_only_the_cards_the_node_chose(make_node: MakeNode, engine: str) -> None:
    node = await make_node(engine)
    ref, _ = await node.launch(
        ["/bin/sh", "-c", "echo cards=$NVIDIA_VISIBLE_DEVICES; sleep 300"],
        env={"NVIDIA_VISIBLE_DEVICES": "all"},
    )
    await node.wait_for(ref, "status", "running")
    logs = ""
    for _ in range(100):
        logs = await node.logs(ref)
        if "cards=" in logs:
            break
        await asyncio.sleep(0.05)
    assert "cards=void" in logs and "cards=all" not in logs


async def test_a_mount_of_the_storage_root_works_and_one_beside_it_does_not(
    make_node: MakeNode, tmp_path: Any
) -> None:
    data = storage_root(tmp_path) / "run-data"
    data.mkdir()
    (data / "in.txt").write_text("from-the-root\n")
    node = await make_node()
    ref, _ = await node.launch(["/bin/cat", "/data/in.txt"], mounts=[[str(data), "/data", True]])
    await node.wait_for(ref, "status", "exited")
    assert "from-the-root" in await node.logs(ref)

    _, body = await node.launch(mounts=[[str(tmp_path.parent), "/data", True]], expect=422)
    assert "TUNEPLANE_ALLOWED_MOUNT_ROOTS" in body["detail"]
