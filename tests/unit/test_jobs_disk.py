"""Issue 34 against the in-memory engine: a job's disk limit decided at its launch, the
monitor that stops a job past it (observe says why, after a restart too), and a store
under pressure relieved of its filler before the image GC touches another tenant's
cache. No sleeps: a pass of the monitor is called, and the fake engine's layers are the
bytes a test says each job wrote (`FakeRuntime.written`), on its disk."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.engine import MIB
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.nodes import fake_node_of
from tests.support.waiting import wait_until
from tuneplane_node import inventory
from tuneplane_node.daemon.render import (
    state_json,
)
from tuneplane_node.errors import InsufficientStorage, InvalidField
from tuneplane_node.jobs import Node, StoppedView
from tuneplane_node.jobs.disk.accounting import PressureAccount
from tuneplane_node.jobs.disk.monitor import FULL_WALK_S, fair_share
from tuneplane_node.jobs.words import ImageStore
from tuneplane_node.wire.requests import parse_launch
from tuneplane_node.wire.values import (
    LABEL_DISK_LIMIT,
    LABEL_INODE_LIMIT,
    LABEL_MOUNTS,
    Launch,
    PrefetchRequest,
)
from tuneplane_node.wire.values import container_name as named

DISK = 1000 * MIB
IMAGE = "registry.test/team/trainer:1"
OTHER = "registry.test/other/cached:1"
MakeNode = Callable[..., Awaitable[Node]]


@pytest.fixture
async def make_node(
    fake: FakeRuntime, probe: FakeProbe, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[MakeNode]:
    """A job service over a fake engine whose store is 1000 MiB; another from the same
    state directory is the daemon restarted."""
    fake.disk_total = DISK
    fake.image_size = 10 * MIB
    fake.arrived(IMAGE)
    made: list[Node] = []

    async def make(**overrides: Any) -> Node:
        gc = {"image_gc_min_age_s": 0, "image_pin_s": 0, "image_gc": "all"}
        settings = fake_settings(tmp_path, **{**gc, **overrides})
        node = fake_node_of(fake, settings, probe=probe, clock=clock)
        await node.start()
        made.append(node)
        return node

    yield make
    for node in made:
        await node.close()


def launch(run: str, **container: Any) -> Launch:
    return parse_launch({"run_id": run, "container": {"image": IMAGE, **container}})


async def test_a_launch_gets_the_nodes_limit_or_its_own_and_no_more(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()  # 50% of the store by default: 500 MiB
    await node.jobs.launch(launch("default"))
    await node.jobs.launch(launch("own", disk_limit="100m"))
    assert fake.containers[named("default")].labels[LABEL_DISK_LIMIT] == str(DISK // 2)
    assert fake.containers[named("own")].labels[LABEL_DISK_LIMIT] == str(100 * MIB)

    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(launch("greedy", disk_limit="600m"))
    assert refused.value.status == 422 and refused.value.code == "invalid_field"
    assert [e.field for e in refused.value.errors] == ["container.disk_limit"]
    assert "TUNEPLANE_JOB_DISK_LIMIT=50%" in refused.value.message
    assert named("greedy") not in fake.containers  # refused before anything is made


async def test_unlimited_on_the_node_writes_no_limit_and_takes_any(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node(job_disk_limit="unlimited")
    await node.jobs.launch(launch("free"))
    await node.jobs.launch(launch("big", disk_limit="2000g"))
    assert LABEL_DISK_LIMIT not in fake.containers[named("free")].labels
    assert fake.containers[named("big")].labels[LABEL_DISK_LIMIT] == str(2000 * 2**30)


@pytest.mark.parametrize(
    ("field", "limit"),
    [("disk_limit", v) for v in ("x", "0", "1k", True, "-5m")]
    + [("inode_limit", v) for v in ("x", 999, 2**32 + 1, True, 1.5)],  # issue 50
)
def test_an_unreadable_limit_is_a_422_naming_it(field: str, limit: object) -> None:
    with pytest.raises(InvalidField) as refused:
        launch("bad", **{field: limit})
    assert [e.field for e in refused.value.errors] == [f"container.{field}"]


async def test_a_job_past_its_limit_is_stopped_and_observe_says_why_after_a_restart(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()
    await node.jobs.launch(launch("filler", disk_limit="100m"))
    await node.jobs.launch(launch("tenant", disk_limit="100m"))
    fake.written[named("filler")] = 20 * MIB
    fake.deleted_open[named("filler")] = 130 * MIB  # unlinked, its descriptors kept
    fake.written[named("tenant")] = 60 * MIB

    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("filler")].status == "exited")

    assert fake.signals == [(named("filler"), "SIGTERM")]  # its stop signal, as a stop
    assert fake.containers[named("tenant")].status == "running"  # the other tenant runs on
    shown = await node.jobs.observe([named("filler"), named("tenant")])
    filler = state_json(shown[named("filler")])
    assert filler["stop_reason"] == "disk_limit"  # type: ignore[typeddict-item]
    assert filler["disk_used_bytes"] == 150 * MIB  # type: ignore[typeddict-item]
    assert filler["disk_limit_bytes"] == 100 * MIB  # type: ignore[typeddict-item]
    assert filler["disk_deleted_open_bytes"] == 130 * MIB  # type: ignore[typeddict-item]
    tenant = state_json(shown[named("tenant")])
    assert "stop_reason" not in tenant and tenant["disk_used_bytes"] == 60 * MIB  # type: ignore[typeddict-item]

    await node.close()
    restarted = await make_node()  # the reason and the bytes were on disk
    view = (await restarted.jobs.observe([named("filler")]))[named("filler")]
    assert isinstance(view, StoppedView) and view.stop_reason == "disk_limit"
    assert view.disk is not None and view.disk.used_bytes == 150 * MIB
    assert view.disk.deleted_open_bytes == 130 * MIB


async def test_stats_show_a_running_jobs_disk(make_node: MakeNode, fake: FakeRuntime) -> None:
    node = await make_node()
    await node.jobs.launch(launch("job"))
    fake.written[named("job")] = 5 * MIB
    await node.sampler.sample_once()
    await node.monitor.check()
    stats = (await node.jobs.stats([named("job")]))[named("job")]
    assert stats.disk is not None
    assert (stats.disk.used_bytes, stats.disk.limit_bytes) == (5 * MIB, DISK // 2)


async def test_under_pressure_the_filler_goes_and_no_cached_image_with_it(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node(job_disk_limit="unlimited")
    fake.arrived(OTHER)  # another tenant's cache, unused now
    await node.jobs.launch(launch("filler"))
    await node.jobs.launch(launch("tenant"))
    fake.written[named("filler")] = 800 * MIB  # more than its share: 850 / 3
    fake.written[named("tenant")] = 50 * MIB
    assert (await node.jobs.status()).conditions.disk_pressure is True

    with pytest.raises(InsufficientStorage) as refused:  # nothing new meanwhile
        await node.jobs.launch(launch("late"))
    assert refused.value.status == 507 and named("late") not in fake.containers

    run = await node.gc.collect()  # the GC's run: the monitor's steps go first

    assert fake.containers[named("filler")].status == "exited"
    assert fake.containers[named("tenant")].status == "running"
    assert run.removed == () and OTHER in fake.images  # the cache did not pay for it
    view = (await node.jobs.observe([named("filler")]))[named("filler")]
    assert isinstance(view, StoppedView) and view.stop_reason == "disk_pressure"
    again = await node.gc.collect()  # its layer is still the pressure: still none
    assert again.removed == () and (await node.jobs.status()).conditions.disk_pressure

    await node.jobs.remove(named("filler"))  # the console removes it: the disk is free
    assert (await node.gc.store()).pressure is False


async def test_under_pressure_the_largest_writer_goes_whenever_it_was_launched(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    """Issue 52: the first job launched (or listed) was stopped in place of the filler
    and no test failed; the filler launched between two others goes, they stay."""
    node = await make_node(job_disk_limit="unlimited")
    for run in ("first", "filler", "last"):
        await node.jobs.launch(launch(run))
    fake.written[named("first")] = 60 * MIB
    fake.written[named("filler")] = 700 * MIB  # over its share: 850 / 4
    fake.written[named("last")] = 80 * MIB
    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("filler")].status == "exited")
    running = {run for run in ("first", "last") if fake.containers[named(run)].status == "running"}
    assert running == {"first", "last"}


async def test_a_pressure_of_images_is_the_gcs_not_the_jobs(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()
    await node.jobs.launch(launch("small"))
    fake.written[named("small")] = 10 * MIB
    fake.disk_other = 900 * MIB  # not the jobs' bytes
    assert not await node.monitor.check()
    assert fake.containers[named("small")].status == "running"


async def test_a_small_job_stopped_for_its_limit_does_not_keep_the_gc_from_images(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node(image_gc_high_percent=85, image_gc_low_percent=50)
    fake.arrived(OTHER)
    await node.jobs.launch(launch("small", disk_limit="10m"))
    fake.written[named("small")] = 20 * MIB
    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("small")].status == "exited")
    fake.arrived(OTHER, size=900 * MIB)  # the pressure is the images', not its 20 MiB
    run = await node.gc.collect()
    assert OTHER in [image.image for image in run.removed]  # the GC did its part


async def test_a_pressure_nobody_explains_is_said_and_no_image_or_job_pays_for_it(
    make_node: MakeNode, fake: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 50: a file written on the host beside the store emptied the cache."""
    node = await make_node(job_disk_limit="unlimited")
    fake.arrived(OTHER)  # another tenant's cache, unused now
    await node.jobs.launch(launch("writer"))
    fake.written[named("writer")] = 500 * MIB  # the largest job, past its fair share: 850 / 2
    await node.monitor.check()  # the first pass: the rest of the disk's baseline
    assert (await node.jobs.status()).conditions.disk_pressure_unexplained is False

    fake.disk_other = 600 * MIB  # the host writes beside the store
    run = await node.gc.collect()

    assert run.removed == () and OTHER in fake.images  # no image for it
    assert fake.containers[named("writer")].status == "running"  # nor a job
    status = await node.jobs.status()
    assert status.conditions.disk_pressure and status.conditions.disk_pressure_unexplained
    assert not status.ok and status.launch_refused == "disk_pressure"
    said = [r for r in caplog.records if "not explained" in r.getMessage()]
    await node.monitor.check()
    assert len(said) == 1 == len([r for r in caplog.records if "not explained" in r.getMessage()])

    fake.disk_other = 0  # the host's file removed
    await node.monitor.check()
    assert (await node.jobs.status()).conditions.disk_pressure_unexplained is False


async def test_a_job_is_walked_again_only_when_it_could_have_passed_its_limit(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """The store's growth bounds every job's: an idle store costs no walk."""
    node = await make_node(job_disk_check_s=5)
    await node.jobs.launch(launch("quiet", disk_limit="100m"))
    fake.written[named("quiet")] = 10 * MIB
    await node.monitor.check()
    walks = fake.calls["disk_usage"]

    for _ in range(3):  # the store idle: nothing to walk
        clock.advance(5)
        await node.monitor.check()
    assert fake.calls["disk_usage"] == walks

    fake.disk_other += 50 * MIB  # it grew, but not by its 90 MiB of room
    await node.monitor.check()
    assert fake.calls["disk_usage"] == walks
    fake.written[named("quiet")] = 150 * MIB  # +140 MiB: it could be past its limit
    await node.monitor.check()
    assert fake.calls["disk_usage"] == walks + 1
    await wait_until(lambda: fake.containers[named("quiet")].status == "exited")


async def test_a_job_near_its_limit_is_walked_again_when_the_store_grows_by_its_room(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """What the job wrote before counts: 90 of its 100 MiB written, 20 MiB more is past
    its limit, whatever the store held (issue 52: a re-walk rule forgetting the job's own
    bytes let it write to 190 MiB unwalked, and no test failed)."""
    node = await make_node(job_disk_check_s=5)
    await node.jobs.launch(launch("near", disk_limit="100m"))
    fake.written[named("near")] = 90 * MIB
    await node.monitor.check()
    walks = fake.calls["disk_usage"]
    fake.written[named("near")] = 110 * MIB  # the store grows by 20 MiB: by its room and more
    clock.advance(5)
    await node.monitor.check()
    assert fake.calls["disk_usage"] == walks + 1
    await wait_until(lambda: fake.containers[named("near")].status == "exited")


async def test_space_freed_before_a_job_grows_hides_none_of_its_growth(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """The store's rises are added up: an image removed an hour ago (the store's net
    figure fell) does not let a job write past its limit unwalked."""
    node = await make_node(job_disk_check_s=5)
    await node.jobs.launch(launch("grower", disk_limit="100m"))
    fake.written[named("grower")] = 10 * MIB
    fake.disk_other = 500 * MIB
    await node.monitor.check()
    walks = fake.calls["disk_usage"]
    fake.disk_other = 200 * MIB  # 300 MiB freed
    clock.advance(5)
    await node.monitor.check()
    assert fake.calls["disk_usage"] == walks  # nothing grew: no walk
    fake.written[named("grower")] = 200 * MIB  # the store is still 110 MiB under its start
    clock.advance(5)
    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("grower")].status == "exited")


async def test_every_job_is_walked_every_hour_whatever_the_store_says(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """What one pass frees can hide as much growth in that pass: the slow floor."""
    node = await make_node(job_disk_check_s=5)
    await node.jobs.launch(launch("hidden", disk_limit="100m"))
    fake.written[named("hidden")] = 10 * MIB
    fake.disk_other = 500 * MIB
    await node.monitor.check()
    fake.written[named("hidden")] = 300 * MIB  # as much freed elsewhere in the same
    fake.disk_other = 210 * MIB  # pass: the store's figure does not move
    clock.advance(5)
    await node.monitor.check()
    assert fake.containers[named("hidden")].status == "running"  # hidden for now
    clock.advance(FULL_WALK_S - 5)
    await node.monitor.check()  # the floor's full walk finds it
    await wait_until(lambda: fake.containers[named("hidden")].status == "exited")


async def test_health_says_what_holds_a_jobs_disk(make_node: MakeNode) -> None:
    node = await make_node(job_disk_limit="20g")
    assert (await node.jobs.status()).job_disk.held_by is None  # not asked yet: unknown
    await node.monitor.check()
    rule = (await node.jobs.status()).job_disk
    assert (rule.limit, rule.held_by) == ("20g", "monitor")  # no project quotas here
    assert (await node.jobs.inventory()).job_disk == rule


def test_the_fair_share_counts_the_cache_as_one_more_tenant() -> None:
    store = ImageStore("/d", 1000, 100, 0.9, True)
    assert fair_share(store, 1, high_percent=80) == 400  # 800 below high, for two
    assert fair_share(store, 4, high_percent=80) == 160
    assert fair_share(ImageStore(), 3, high_percent=80) is None  # unknown size: no one


async def test_a_remote_store_knows_no_disk_and_stops_no_one(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node()
    fake.disk_total = None  # the store's size unknown: no percentage to take
    await node.jobs.launch(launch("job"))
    assert LABEL_DISK_LIMIT not in fake.containers[named("job")].labels
    assert not await node.monitor.check()
    view = (await node.jobs.observe([named("job")]))[named("job")]
    assert not isinstance(view, StoppedView)  # no figure: unknown, never 0


async def test_a_launch_reads_the_store_once_and_a_burst_of_health_the_host_once(
    make_node: MakeNode, fake: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40: a launch's disk limit and room check share one reading of the store; a
    burst of health reads the host's /proc files once, not once per request."""
    node = await make_node()
    before = fake.calls["data_root"]
    await node.jobs.launch(launch("job"))
    assert fake.calls["data_root"] - before == 1

    reads: list[int] = []

    def pid_pressure() -> bool:
        reads.append(1)
        return False

    monkeypatch.setattr(inventory, "pid_pressure", pid_pressure)
    burst = await asyncio.gather(*(node.jobs.status() for _ in range(50)))
    assert len(reads) == 1
    assert {status.conditions.pid_pressure for status in burst} == {False}


async def test_a_burst_after_the_second_is_answered_at_once_while_one_read_runs_behind_it(
    make_node: MakeNode, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 40: no health request waits on the host's /proc read once there is a reading;
    the requests after the read has landed see its figures."""
    node = await make_node()
    await node.jobs.status()  # the first reading, waited for
    held, reads = threading.Event(), []

    def pid_pressure() -> bool:  # the next read hangs on its thread until released
        reads.append(1)
        held.wait(10)
        return True

    monkeypatch.setattr(inventory, "pid_pressure", pid_pressure)
    clock.advance(1.5)
    burst = await asyncio.gather(*(node.jobs.status() for _ in range(50)))
    assert {status.conditions.pid_pressure for status in burst} == {False}  # the last one
    await wait_until(lambda: reads)
    held.set()
    for _ in range(500):  # the requests after it has landed: its figures
        if (await node.jobs.status()).conditions.pid_pressure:
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("the read behind the burst never landed")
    assert len(reads) == 1


async def test_observe_keeps_a_running_jobs_view_until_its_figures_change(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    """Issue 40: a view is made once per state object and its facts (300 running jobs,
    each with its disk's figures, made 300 views per observe); new figures show at once."""
    node = await make_node()
    await node.jobs.launch(launch("job"))
    fake.written[named("job")] = 5 * MIB
    await node.monitor.check()
    first = (await node.jobs.observe([named("job")]))[named("job")]
    assert isinstance(first, StoppedView) and first.disk is not None
    assert first.disk.used_bytes == 5 * MIB
    # the state cache hands out one object per state (the fake copies): asked directly
    assert node.jobs.views.of(first.state, None, None, first.disk) is first
    assert node.jobs.views.of(first.state, None, None, replace(first.disk)) is first

    grown = replace(first.disk, used_bytes=7 * MIB)  # the monitor's next measure
    later = node.jobs.views.of(first.state, None, None, grown)
    assert later is not first and later.disk == grown


# --- issue 50: inodes -------------------------------------------------------------------


async def test_a_launch_gets_the_nodes_inode_limit_or_its_own_and_no_more(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    node = await make_node(job_inode_limit=100_000)
    await node.jobs.launch(launch("default", inode_limit=""))  # "": not given
    await node.jobs.launch(launch("own", inode_limit=50_000))
    assert fake.containers[named("default")].labels[LABEL_INODE_LIMIT] == "100000"
    assert fake.containers[named("own")].labels[LABEL_INODE_LIMIT] == "50000"
    with pytest.raises(InvalidField) as refused:
        await node.jobs.launch(launch("greedy", inode_limit=200_000))
    assert [e.field for e in refused.value.errors] == ["container.inode_limit"]
    assert "TUNEPLANE_JOB_INODE_LIMIT=100000" in refused.value.message


async def test_a_job_past_its_inode_limit_is_stopped_and_observe_says_why(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    fake.inodes_total = 10_000_000
    node = await make_node()
    await node.jobs.launch(launch("maker", inode_limit=50_000))
    await node.jobs.launch(launch("tenant", inode_limit=50_000))
    fake.written[named("maker")] = 2 * MIB  # empty files: few bytes, many inodes
    fake.made[named("maker")] = 200_000
    fake.written[named("tenant")] = MIB
    fake.made[named("tenant")] = 40_000

    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("maker")].status == "exited")

    assert fake.containers[named("tenant")].status == "running"
    shown = await node.jobs.observe([named("maker"), named("tenant")])
    maker = state_json(shown[named("maker")])
    assert maker["stop_reason"] == "inode_limit"  # type: ignore[typeddict-item]
    assert maker["disk_inodes"] == 200_000  # type: ignore[typeddict-item]
    assert maker["inode_limit"] == 50_000  # type: ignore[typeddict-item]
    assert state_json(shown[named("tenant")])["disk_inodes"] == 40_000  # type: ignore[typeddict-item]


async def test_a_job_is_walked_again_when_the_stores_inodes_grew_past_its_room(
    make_node: MakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    fake.inodes_total = 10_000_000
    node = await make_node(job_disk_check_s=5)
    await node.jobs.launch(launch("quiet", inode_limit=50_000))
    fake.written[named("quiet")] = MIB
    fake.made[named("quiet")] = 1000
    await node.monitor.check()
    walks = fake.calls["disk_usage"]
    clock.advance(5)
    await node.monitor.check()
    assert fake.calls["disk_usage"] == walks  # no inode made: nothing to walk

    fake.made[named("quiet")] = 60_000  # its bytes the same: only its inodes grew
    clock.advance(5)
    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("quiet")].status == "exited")


async def test_under_inode_pressure_launches_are_refused_and_the_largest_maker_goes(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    fake.inodes_total = 100_000
    node = await make_node()
    await node.jobs.launch(launch("maker"))
    await node.jobs.launch(launch("tenant"))
    fake.written[named("maker")] = fake.written[named("tenant")] = MIB
    fake.made[named("maker")] = 96_000  # under its own limit, over its share: 95,000 / 3
    fake.made[named("tenant")] = 1000
    status = await node.jobs.status()
    assert status.conditions.inode_pressure is True and status.conditions.disk_pressure is False

    with pytest.raises(InsufficientStorage) as refused:
        await node.jobs.launch(launch("late"))
    assert refused.value.status == 507 and "inode" in refused.value.message
    assert named("late") not in fake.containers

    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("maker")].status == "exited")
    assert fake.containers[named("tenant")].status == "running"
    view = (await node.jobs.observe([named("maker")]))[named("maker")]
    assert isinstance(view, StoppedView) and view.stop_reason == "inode_pressure"


@pytest.mark.slow  # 8 MiB written on this machine's disk, a thread's walk of it
async def test_a_scratch_on_the_stores_filesystem_is_its_jobs_part_of_the_pressure(
    make_node: MakeNode, fake: FakeRuntime, tmp_path: Path
) -> None:
    """Issue 50: the job with the smaller layer and a scratch is the larger holder."""
    fake.root_path = str(tmp_path)  # the store's filesystem: the scratch root's
    fake.disk_other = 300 * MIB  # there from the first pass: the baseline's
    node = await make_node(job_disk_limit="unlimited")
    await node.jobs.launch(launch("layer"))
    await node.jobs.launch(launch("scratch"))
    fake.written[named("layer")] = 300 * MIB
    fake.written[named("scratch")] = 296 * MIB
    key = "tuneplane-scratch.k1"  # as the node names a launch's mounts
    fake.containers[named("scratch")].labels[LABEL_MOUNTS] = key
    scratch_dir = node.settings.scratch_dir
    scratch_dir.mkdir(parents=True)
    (scratch_dir / f"{key}.ext4").write_bytes(os.urandom(8 * MIB))  # 8 MiB written in it

    await node.monitor.check()
    await wait_until(lambda: fake.containers[named("scratch")].status == "exited")
    assert fake.containers[named("layer")].status == "running"
    view = (await node.jobs.observe([named("scratch")]))[named("scratch")]
    assert isinstance(view, StoppedView) and view.stop_reason == "disk_pressure"


async def test_a_pull_under_way_explains_the_growth_it_writes(tmp_path: Path) -> None:
    """Issue 50: a pull's blobs and layers are on the store before its image is listed."""

    class NoImages:
        async def list_images(self) -> list[Any]:
            return []

    account = PressureAccount(NoImages(), dirs=(), high_percent=85)
    calm = ImageStore(str(tmp_path), 1000 * MIB, 500 * MIB, 0.5, False)
    assert await account.judge(calm, jobs_bytes=0) is False  # the baseline: 500 MiB
    full = ImageStore(str(tmp_path), 1000 * MIB, 100 * MIB, 0.9, True)
    account.pulling = lambda: 200 * MIB  # downloaded, and being unpacked
    assert await account.judge(full, jobs_bytes=0) is False
    account.pulling = lambda: 0  # nothing the node knows wrote the 400 MiB
    assert await account.judge(full, jobs_bytes=0) is True


async def test_under_inode_pressure_the_gc_removes_unused_images_after_the_jobs(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    fake.inodes_total = 100_000
    fake.inodes_other = 96_000  # the images' layers, say: no job made them
    node = await make_node()
    fake.arrived(OTHER)
    run = await node.gc.collect()
    assert [(r.image, r.why) for r in run.removed if r.image == OTHER] == [
        (OTHER, "inodes over 90% used (high 95%)")
    ]


async def test_a_prefetch_under_inode_pressure_is_refused_naming_inodes(
    make_node: MakeNode, fake: FakeRuntime
) -> None:
    fake.inodes_total = 100_000
    fake.inodes_other = 96_000
    node = await make_node(image_gc="off")  # nothing a run could free
    with pytest.raises(InsufficientStorage) as refused:
        await node.catalog.prefetch(PrefetchRequest("registry.test/team/next:1"))
    assert refused.value.status == 507 and "inode pressure" in refused.value.message
    assert fake.pulls == []  # refused before the registry was asked for a byte
