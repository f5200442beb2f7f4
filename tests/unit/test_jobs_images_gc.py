"""The image GC's policy against the in-memory engine: least recently used first, every
rule that keeps an image, node and all scopes, the order across a restart, and pulls
that do not fit refused before anything is reserved or downloaded. No sleeps: the
ages pass on the fake clock, and the fake engine's disk is images and a filler."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.engine import MIB
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.nodes import fake_node_of
from tests.support.waiting import settle, wait_until
from tuneplane_node.errors import ConfigError, InsufficientStorage
from tuneplane_node.jobs import Node, Pulling, Started
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import load_settings
from tuneplane_node.wire.values import (
    LABEL_RUN_ID,
    Launch,
    PrefetchRequest,
    RegistryAuth,
    container_name,
)

DISK = 100 * MIB
SIZE = 10 * MIB
GC = {"image_gc_min_age_s": 0, "image_pin_s": 0}  # unless a test says: every rule off but use
MakeNode = Callable[..., Awaitable[Node]]


@pytest.fixture
async def make_node(
    fake: FakeRuntime, probe: FakeProbe, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[MakeNode]:
    """A job service over the fake engine, whose data root is a 100 MiB disk; a second
    one from the same state directory is the daemon restarted."""
    fake.disk_total = DISK
    fake.image_size = SIZE
    made: list[Node] = []

    async def make(**overrides: Any) -> Node:
        settings = fake_settings(tmp_path, **{**GC, **overrides})
        node = fake_node_of(fake, settings, probe=probe, clock=clock)
        node.gc.sizer = lambda image, auth: None  # the registry states no size
        await node.start()
        made.append(node)
        return node

    yield make
    for node in made:
        await node.close()


def pulled(node: Node, fake: FakeRuntime, image: str, *, prefetch: bool = False) -> str:
    """An image the node pulled now (a launch's pull, or a prefetch); its id."""
    fake.arrived(image)
    image_id = fake.image_id(image)
    node.ledger.record_pull(image, image_id, fake.clock.now(), prefetch=prefetch)
    return image_id


def used(node: Node, fake: FakeRuntime, image: str) -> None:
    """A container of the node was made from the image now (and is gone again)."""
    node.ledger.record_use(fake.image_id(image), fake.clock.now())


def spec(run: str, image: str) -> ContainerSpec:
    return ContainerSpec(name=container_name(run), image=image, labels={LABEL_RUN_ID: run})


def fill(fake: FakeRuntime, percent: float) -> None:
    """Fill the disk with other bytes until it is this full, images included."""
    fake.disk_other = int(DISK * percent / 100) - fake.images_bytes()


def images(n: int) -> list[str]:
    return [f"registry.test/team/image-{i}:1" for i in range(n)]


async def test_a_run_removes_the_least_recently_used_until_the_disk_is_at_low(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    names = images(5)
    ids = []
    for name in names:
        ids.append(pulled(node, fake, name))
        clock.advance(60)
    used(node, fake, names[0])  # the oldest pull, the newest use
    fill(fake, 95)

    run = await node.gc.collect()

    # 95% -> 75%: two images of 10% each, the least recently used (1 and 2, not 0).
    assert [r.id for r in run.removed] == [ids[1], ids[2]]
    assert fake.image_removals == [ids[1], ids[2]]
    assert [r.image for r in run.removed] == [names[1], names[2]]
    assert all("freeing to low 80%" in r.why for r in run.removed)
    assert run.freed_bytes == 2 * SIZE
    assert run.store.used_ratio == 0.75 and run.store.pressure is False
    assert run.store.free_bytes == DISK - (DISK * 95 // 100 - 2 * SIZE)
    assert node.ledger.get(ids[1]) is None  # the record goes with the image
    assert names[0] in fake.images and names[3] in fake.images


async def test_below_high_nothing_is_removed_and_the_store_is_said(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()
    pulled(node, fake, images(1)[0])
    fill(fake, 84)
    run = await node.gc.collect()
    assert run.removed == () and fake.image_removals == []
    assert run.store.path == "/fake/data-root" and run.store.total_bytes == DISK
    assert run.store.pressure is False and run.store.used_ratio == 0.84
    fill(fake, 85)
    assert (await node.gc.store()).pressure is True  # at high is pressure


async def test_an_image_any_container_uses_stays_whoever_made_it(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    old, ours, newest = images(3)
    for name in (old, ours, newest):
        pulled(node, fake, name)
        clock.advance(60)
    fake.create_outside(spec("someone", old), start=False)  # a person's, never started
    await node.jobs.launch(Launch("run-a", 0, spec("run-a", ours)))
    fake.exit(container_name("run-a"), 0)  # exited, not removed: it still uses its image
    fill(fake, 95)

    run = await node.gc.collect()

    assert [r.image for r in run.removed] == [newest]
    assert old in fake.images and ours in fake.images
    assert fake.calls["remove_image"] == 1  # the node never asked the engine for them


async def test_an_image_a_pending_launch_waits_for_stays(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    waited, other = images(2)
    pulled(node, fake, waited)
    pulled(node, fake, other)
    clock.advance(60)
    # A launch pulls its image again (policy always): it waits, and the image is here.
    request = Launch("run-a", 0, spec("run-a", waited), pull_policy="always")
    assert isinstance(await node.jobs.launch(request), Pulling)
    await fake.pulling.wait()
    await settle()
    fill(fake, 95)

    run = await node.gc.collect()

    assert [r.image for r in run.removed] == [other]  # the older pull, and free
    assert waited in fake.images and run.store.pressure is True


async def test_an_image_being_pulled_or_launched_right_now_is_held() -> None:
    from tuneplane_node.jobs.images.gc import ImageHolds

    holds = ImageHolds()
    with holds.hold("team/a:1"):
        # podman's name for it (localhost/) and docker's (the hub's) are one image here.
        assert holds.held(["localhost/team/a:1"]) and holds.held(["docker.io/team/a:1"])
        assert not holds.held(["team/a:2"])
        with holds.hold("team/a:1"):
            pass
        assert holds.held(["team/a:1"])
    assert not holds.held(["team/a:1"])


async def test_a_fresh_prefetch_is_pin_expires_at_used_or_its_pin_passes(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node(image_pin_s=3600)
    prefetched, old = images(2)
    pulled(node, fake, old)
    clock.advance(60)
    pulled(node, fake, prefetched, prefetch=True)
    clock.advance(60)
    fake.disk_other = DISK - fake.images_bytes()  # full

    run = await node.gc.collect()
    assert [r.image for r in run.removed] == [old]  # the prefetch stays, full or not

    clock.advance(3600)  # the pin passes, unused
    fill(fake, 95)
    assert [r.image for r in (await node.gc.collect()).removed] == [prefetched]


async def test_a_prefetch_used_since_is_no_longer_pinned(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node(image_pin_s=3600)
    (prefetched,) = images(1)
    pulled(node, fake, prefetched, prefetch=True)
    clock.advance(10)
    used(node, fake, prefetched)
    clock.advance(10)
    fill(fake, 95)
    assert [r.image for r in (await node.gc.collect()).removed] == [prefetched]


async def test_an_image_younger_than_the_minimum_age_stays(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node(image_gc_min_age_s=120)
    young, old = images(2)
    pulled(node, fake, old)
    clock.advance(200)
    pulled(node, fake, young)
    clock.advance(60)
    fill(fake, 99)
    assert [r.image for r in (await node.gc.collect()).removed] == [old]
    clock.advance(60)  # now 120 s old
    assert [r.image for r in (await node.gc.collect()).removed] == [young]


async def test_node_scope_leaves_the_operators_image_and_all_scope_takes_it_oldest_first(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    loaded = "docker.io/operator/tools:1"
    fake.arrived(loaded)  # loaded by hand: the node never pulled it nor ran it
    node = await make_node()
    await node.gc.collect()  # the node sees it first now: its age starts here
    clock.advance(60)
    (ours,) = images(1)
    pulled(node, fake, ours)
    clock.advance(60)
    fake.disk_other = DISK - fake.images_bytes()  # full

    run = await node.gc.collect()
    assert [r.image for r in run.removed] == [ours] and loaded in fake.images
    assert run.store.pressure is True  # it stays full: nothing else is the node's

    everything = await make_node(image_gc="all")
    run = await everything.gc.collect()
    assert [r.image for r in run.removed] == [loaded] and run.scope == "all"


async def test_the_order_survives_a_restart(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    first = await make_node()
    names = images(3)
    for name in reversed(names):  # pulled newest name first...
        pulled(first, fake, name)
        clock.advance(60)
    used(first, fake, names[2])  # ...and the first pulled used since
    await first.ledger.flush()
    await first.close()

    restarted = await make_node()
    fill(fake, 100)  # two to go to reach 80%
    run = await restarted.gc.collect()
    assert [r.image for r in run.removed][:2] == [names[1], names[0]]


async def test_a_removal_the_engine_refuses_is_skipped_and_the_run_goes_on(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    first, second = images(2)
    refused = pulled(node, fake, first)
    clock.advance(60)
    pulled(node, fake, second)
    fake.refuse_image_removal.add(refused)  # a container came between the list and it
    fill(fake, 90)

    run = await node.gc.collect()

    assert [r.image for r in run.removed] == [second]
    assert first in fake.images and node.ledger.get(refused) is not None


async def test_an_image_unused_past_the_max_age_goes_whatever_the_disk(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node(image_gc_max_unused_s=3600)
    stale, fresh = images(2)
    pulled(node, fake, stale)
    clock.advance(3000)
    pulled(node, fake, fresh)
    clock.advance(600)  # stale: unused 3600 s; fresh: 600 s
    run = await node.gc.collect()
    assert [r.image for r in run.removed] == [stale]
    assert run.removed[0].why.startswith("unused for 3600 s")
    assert run.store.pressure is False


async def test_off_removes_nothing(make_node: MakeNode, fake: FakeRuntime) -> None:
    node = await make_node(image_gc="off")
    pulled(node, fake, images(1)[0])
    fake.disk_other = DISK - fake.images_bytes()
    run = await node.gc.collect()
    assert run.removed == () and run.store.pressure is True and run.scope == "off"


def test_low_must_be_below_high() -> None:
    with pytest.raises(ConfigError, match=r"TUNEPLANE_IMAGE_GC_LOW_PERCENT .*must be below"):
        load_settings(node_token="t", image_gc_high_percent=80, image_gc_low_percent=80)


# --- pulls that fit -------------------------------------------------------------------


async def test_a_launch_onto_a_full_disk_answers_507_and_holds_nothing(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()
    fill(fake, 90)  # not the node's to free
    request = Launch("run-a", 2, spec("run-a", "registry.test/team/new:1"))

    with pytest.raises(InsufficientStorage) as refused:
        await node.jobs.launch(request)

    assert refused.value.status == 507 and refused.value.code == "insufficient_storage"
    assert refused.value.free_bytes == DISK // 10 and refused.value.high_percent == 85
    assert f"{DISK // 10} bytes free" in refused.value.message and "85%" in refused.value.message
    assert not fake.pulls and len(node.pending) == 0
    assert not (await node.allocator.occupancy()).reserved  # no card held for it


async def test_a_launch_whose_image_is_here_is_refused_under_disk_pressure(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    """Issue 34: its writable layer would fill a store that is full already."""
    node = await make_node()
    fake.arrived("registry.test/team/here:1")
    fake.disk_other = DISK - fake.images_bytes()
    request = Launch("run-a", 0, spec("run-a", "registry.test/team/here:1"))
    with pytest.raises(InsufficientStorage) as refused:
        await node.jobs.launch(request)
    assert refused.value.code == "insufficient_storage" and "disk pressure" in str(refused.value)
    assert not fake.containers and not fake.pulls  # before anything is made

    fake.disk_other = 0  # the pressure gone, the same launch runs
    assert isinstance(await node.jobs.launch(request), Started)


async def test_a_pull_too_big_for_the_room_below_high_has_it_freed_as_its_bytes_come(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    asked: list[tuple[str, RegistryAuth | None]] = []

    def sizer(image: str, auth: RegistryAuth | None) -> int:
        asked.append((image, auth))
        return 25 * MIB

    node.gc.sizer = sizer
    old = images(4)
    for name in old:
        pulled(node, fake, name)
        clock.advance(60)
    fill(fake, 70)  # room below 85%: 15 MiB, the image needs 25
    auth = RegistryAuth(username="u", password="p")
    request = Launch("run-a", 0, spec("run-a", "registry.test/team/big:1"), auth=auth)

    assert isinstance(await node.jobs.launch(request), Pulling)
    assert asked == [("registry.test/team/big:1", auth)]  # with the pull's credentials
    await fake.pulling.wait()
    await settle()
    assert fake.image_removals == []  # nothing goes for a size the registry claims

    fake.pull_of("registry.test/team/big:1").report(2 * MIB, 25 * MIB)  # its bytes come
    await wait_until(lambda: fake.image_removals == [fake.image_id(old[0])])
    assert len(fake.image_removals) == 1  # 10 MiB more room: the 23 left fit


async def test_a_size_claim_that_just_fits_removes_nothing_its_bytes_did_not_need(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """Issue 49, finding 7: a manifest claiming room + 40 MB had the GC remove three
    cached images before its pull failed. Images now go a window ahead of the bytes."""
    node = await make_node()
    node.gc.ahead_bytes = 5 * MIB  # the window, at the fake disk's scale
    node.gc.sizer = lambda image, auth: 50 * MIB  # fits with every image gone, claims it
    for name in images(4):
        pulled(node, fake, name)
        clock.advance(60)
    fill(fake, 70)  # room below 85%: 15 MiB
    request = Launch("run-a", 0, spec("run-a", "registry.test/team/liar:1"))

    assert isinstance(await node.jobs.launch(request), Pulling)
    await fake.pulling.wait()
    fake.pull_of("registry.test/team/liar:1").report(MIB, 50 * MIB)  # a MiB came
    await settle()
    fake.pull_of("registry.test/team/liar:1").fail("manifest unknown: the blob was a lie")
    await settle()

    assert fake.image_removals == []  # 15 MiB of room was ahead of 1 MiB of bytes


async def test_a_pull_that_would_not_fit_after_a_run_removes_nothing_and_says_the_figures(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    node.gc.sizer = lambda image, auth: 60 * MIB  # a manifest that claims too much
    for name in images(4):
        pulled(node, fake, name)
        clock.advance(60)
    fill(fake, 70)  # 15 MiB below high, and 40 MiB of images the node may remove
    free = fake.disk_total - fake.disk_other - fake.images_bytes()  # type: ignore[operator]
    request = Launch("run-a", 0, spec("run-a", "registry.test/team/claims-a-lot:1"))

    with pytest.raises(InsufficientStorage) as refused:
        await node.jobs.launch(request)

    assert refused.value.figures() == {
        "needed_bytes": 60 * MIB,
        "free_bytes": free,
        "freeable_bytes": None,  # what the node could free is not the tenant's to learn
        "high_percent": 85,
    }
    assert fake.image_removals == [] and not fake.pulls  # the cache is untouched
    assert "nothing was removed" in refused.value.message


async def test_a_pull_that_cannot_fit_is_refused_naming_what_it_needs(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()
    node.gc.sizer = lambda image, auth: 40 * MIB
    fill(fake, 70)
    request = Launch("run-a", 1, spec("run-a", "registry.test/team/huge:1"))

    with pytest.raises(InsufficientStorage) as refused:
        await node.jobs.launch(request)

    room = DISK * 85 // 100 - DISK * 70 // 100  # below 85%: what a size would probe for
    assert refused.value.needed_bytes == 40 * MIB and refused.value.room_bytes is None
    assert f"{40 * MIB} bytes compressed" in refused.value.message
    assert "below its 85% threshold" in refused.value.message
    assert str(room) not in refused.value.message
    assert not fake.pulls and len(node.pending) == 0  # no byte downloaded


async def test_a_pull_that_filled_the_disk_runs_the_gc(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node()
    (old,) = images(1)
    pulled(node, fake, old)
    clock.advance(60)
    request = Launch("run-a", 0, spec("run-a", "registry.test/team/new:1"))
    assert isinstance(await node.jobs.launch(request), Pulling)
    await fake.pulling.wait()
    await settle()
    fill(fake, 99)  # the pull wrote until the disk was full
    fake.pull_of("registry.test/team/new:1").fail(
        "the engine's disk is full: write /var/lib/docker/tmp: no space left on device"
    )
    # The run asks the disk monitor first, which reads the disk in a thread (issue 50).
    await wait_until(lambda: fake.image_removals == [fake.image_id(old)])


async def test_a_prefetch_onto_a_full_disk_is_refused_and_a_fresh_one_is_pinned(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node(image_pin_s=3600)
    fill(fake, 90)
    with pytest.raises(InsufficientStorage):
        await node.catalog.prefetch(PrefetchRequest("registry.test/team/next:1"))
    assert not fake.pulls  # nothing started

    fill(fake, 50)
    prefetched = await node.catalog.prefetch(PrefetchRequest("registry.test/team/next:1"))
    assert prefetched.phase == "pulling"
    await fake.pulling.wait()
    fake.pull_of("registry.test/team/next:1").finish()
    await settle()
    await node.ledger.flush()
    record = node.ledger.get(fake.image_id("registry.test/team/next:1"))
    assert record is not None and record.prefetched_at is not None
    clock.advance(60)
    fill(fake, 99)
    run = await node.gc.collect()
    assert "registry.test/team/next:1" in fake.images and run.store.pressure is True


async def test_a_run_comes_every_interval_and_before_every_pull(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await make_node(image_gc_max_unused_s=600, image_gc_interval_s=300)
    first, second = images(2)
    pulled(node, fake, first)
    loop = asyncio.create_task(node.gc.maintain())
    try:
        await clock.sleeping(300)
        clock.advance(600)  # past the max unused age, and the interval
        await wait_until(lambda: first not in fake.images)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    pulled(node, fake, second)
    clock.advance(600)  # no interval runs now: only a pull does
    await node.jobs.launch(Launch("run-a", 0, spec("run-a", "registry.test/team/x:1")))
    await wait_until(lambda: second not in fake.images)
