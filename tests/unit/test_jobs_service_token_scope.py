"""The token buys job verbs, never the host: a mount is a real path under the roots the
operator allowed, opened without following links; the node alone chooses the cards a
container sees; the verbs reach only the containers the node holds, by its ids. The job
service against the in-memory engine (tests/jobservice.py says how)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    request,
    reserved,
)
from tests.support.nodes import storage_root
from tuneplane_node.errors import (
    InvalidField,
)
from tuneplane_node.jobs import (
    Node,
    PendingView,
    StopPlan,
)
from tuneplane_node.runtime.facts import REMOTE
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import Launch, Mount

# --- the token buys job verbs, never the host -------------------------------------------


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """The node's storage root (the fixtures' settings): its only mount root."""
    return storage_root(tmp_path)


def with_mounts(run_id: str, *mounts: Mount, **env: str) -> Launch:
    base = request(run_id)
    return replace(base, container=replace(base.container, mounts=mounts, env=env))


async def test_a_real_path_under_the_storage_root_reaches_the_engine_as_given(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    (storage / "data").mkdir()

    await node.jobs.launch(with_mounts("r1", Mount(str(storage / "data") + "/", "/data", True)))

    mounts = fake.containers["tuneplane-r1"].spec.mounts
    assert mounts == (Mount(str(storage / "data"), "/data", True),)


async def test_a_link_planted_by_one_tenant_into_anothers_files_is_refused(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    """Tenant A's job leaves tenantA/ckpt -> tenantB/ckpt; A's next launch mounting
    tenantA/ckpt would read and write B's checkpoint: both lie under the storage root."""
    (storage / "tenantB" / "ckpt").mkdir(parents=True)
    (storage / "tenantA").mkdir()
    (storage / "tenantA" / "ckpt").symlink_to(storage / "tenantB" / "ckpt")
    (storage / "linked").symlink_to(storage / "tenantA")  # a link higher up, too

    for host, link in (
        (storage / "tenantA" / "ckpt", "ckpt"),
        (storage / "linked" / "x", "linked"),
    ):
        with pytest.raises(InvalidField) as refused:
            await node.jobs.launch(with_mounts("r1", Mount(str(host), "/ckpt")))
        assert refused.value.field == "container.mounts[0]"
        assert refused.value.reason == f"{host} is not its own real path: {link} is a symlink"

    assert not fake.containers and fake.calls["run"] == 0
    assert list((storage / "tenantB" / "ckpt").iterdir()) == []


async def test_a_mount_swapped_for_a_link_during_the_pull_fails_the_launch(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    (storage / "mine").mkdir()
    (storage / "theirs").mkdir()
    launch = with_mounts("r1", Mount(str(storage / "mine"), "/ckpt"))
    await node.jobs.launch(replace(launch, container=replace(launch.container, image=MISSING)))
    await fake.pulling.wait()

    (storage / "mine").rmdir()
    (storage / "mine").symlink_to(storage / "theirs")
    record = node.pending.get("tuneplane-r1")
    assert record is not None and record.task is not None
    fake.pull_of(MISSING).finish()
    await asyncio.wait({record.task})  # the mounts are checked in a thread, not on the loop

    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, PendingView) and view.failed
    assert view.error is not None and "mine is a symlink" in view.error
    assert not fake.containers
    assert await reserved(node) == frozenset()


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("/", "/ is /, which a job may never mount; no setting allows it"),
        ("/etc", "/etc is /etc, which a job may never mount; no setting allows it"),
        ("/etc/ssl", "/etc/ssl is in /etc, which a job may never mount; no setting allows it"),
        ("/var/lib", "/var/lib holds /var/lib/docker, which a job may never mount; no setting"),
        ("/opt/datasets", "/opt/datasets is not under an allowed mount root; "
         "TUNEPLANE_ALLOWED_MOUNT_ROOTS would allow it"),
    ],
)  # fmt: skip
async def test_a_mount_outside_the_mount_roots_is_refused_and_starts_nothing(
    node: Node, fake: FakeRuntime, storage: Path, host: str, why: str
) -> None:
    """The refusal offers the setting only where the setting could allow the path: a
    mount root may never be or hold a system directory (finding 16 of issue 25)."""
    fine = Mount(str(storage), "/data")
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_mounts("r1", fine, Mount(host, "/host")))

    assert refused.value.field == "container.mounts[1]"
    assert refused.value.reason.startswith(why)
    assert not fake.containers and fake.calls["run"] == 0
    assert await reserved(node) == frozenset()


async def test_a_link_out_of_the_storage_root_is_refused(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    (storage / "escape").symlink_to("/etc")  # a job with a writable mount left this

    with pytest.raises(InvalidField, match=r"^container\.mounts\[0\]: .*escape is not its own"):
        await node.jobs.launch(with_mounts("r1", Mount(str(storage / "escape"), "/x")))

    assert not fake.containers


async def test_every_bad_mount_is_named_in_one_refusal(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    fine = Mount(str(storage), "/data")
    missing, outside = Mount(str(storage / "nope"), "/x"), Mount("/var/lib", "/y")
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_mounts("r1", missing, fine, outside))
    assert refused.value.message.startswith("container.mounts[0]: ")
    assert [error.field for error in refused.value.errors] == [
        "container.mounts[0]",
        "container.mounts[2]",
    ]
    assert not fake.containers


async def test_a_mount_that_does_not_exist_is_a_422_not_an_engine_refusal(
    node: Node, storage: Path
) -> None:
    with pytest.raises(InvalidField, match=r"^container\.mounts\[0\]: .* does not exist"):
        await node.jobs.launch(with_mounts("r1", Mount(str(storage / "nope"), "/x")))


async def test_the_node_alone_says_which_cards_a_container_sees(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(with_mounts("r1", NVIDIA_VISIBLE_DEVICES="all", EPOCHS="3"))
    assert fake.containers["tuneplane-r1"].spec.env == {"EPOCHS": "3"}


async def test_the_verbs_act_on_the_id_the_node_holds(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1"))
    container_id = fake.containers["tuneplane-r1"].id

    await node.jobs.logs("tuneplane-r1", 10)
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=1))
    await node.jobs.remove("tuneplane-r1")

    assert fake.refs == [
        ("logs", container_id),
        ("SIGTERM", container_id),
        ("remove", container_id),
    ]


async def test_an_id_given_as_a_ref_reaches_nothing(node: Node, fake: FakeRuntime) -> None:
    """Refs are names: a foreign container's id, or even our own, names no container."""
    foreign = fake.create_outside(ContainerSpec(name="someones", image=IMAGE))
    await node.jobs.launch(request("r1"))
    ours = fake.containers["tuneplane-r1"]

    for ref in (foreign.id, foreign.id[:12], ours.id):
        await node.jobs.stop(ref, StopPlan(grace=0))
        await node.jobs.remove(ref)
        assert "does not exist" in (await node.jobs.logs(ref, 10)).text
        assert (await node.jobs.observe([ref]))[ref].exists is False

    assert foreign.status == ours.status == "running"
    assert fake.refs == []


async def test_an_engine_on_another_machine_takes_no_host_mount(
    node: Node, fake: FakeRuntime, storage: Path
) -> None:
    """A path of this machine means nothing there, and a staged one cannot be handed
    over: a 422 for each mount, never the path as given (issue 33)."""
    fake.mount_mode = REMOTE
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(with_mounts("r1", Mount(str(storage), "/a"), Mount("/x", "/b")))
    assert [error.field for error in refused.value.errors] == [
        "container.mounts[0]",
        "container.mounts[1]",
    ]
    assert "engine is on another machine" in refused.value.reason
    assert not fake.containers
    await node.jobs.launch(with_mounts("r2"))  # without mounts it runs
    assert "tuneplane-r2" in fake.containers
