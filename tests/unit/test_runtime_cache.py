"""The state cache's rules, event by event, against the in-memory engine.

Every change to the cache happens on the loop (`on_event`, `on_inspected`,
`replace_all`, `relist`), so these tests call those directly, in the order an engine
would deliver them: no thread, no sleeps. One test at the end runs the real event
thread against the fake engine's event stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from tests.conftest import IMAGE as PRESENT
from tests.fakes.clock import FakeClock
from tests.fakes.containers import brief
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.jobs import job
from tests.support.nodes import fake_node_of
from tests.support.waiting import wait_until
from tuneplane_node.errors import EngineRefused, EngineUnavailable
from tuneplane_node.jobs import Started
from tuneplane_node.runtime.base import EXIT_SIGKILL, ContainerState, EngineEvent
from tuneplane_node.runtime.cache import CachedRuntime, StateCache
from tuneplane_node.runtime.cache import events as cache_events
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import LABEL_RUN_ID, Launch


@pytest.fixture
async def cache(fake: FakeRuntime) -> AsyncIterator[StateCache]:
    """A cache synced once from the fake engine, with no thread and no relist task."""
    state_cache = StateCache(fake, relist_s=3600, sync_timeout=1, clock=fake.clock)
    state_cache.replace_all(fake.list_brief(), fake.clock.monotonic(), 1)
    for state in await fake.ps():  # the fill after the list
        state_cache.on_filled(state, state.id or "", 1)
    yield state_cache


async def running(fake: FakeRuntime) -> str:
    spec = job(["/bin/train"])
    await fake.run(spec)
    return spec.name


def inspected(fake: FakeRuntime, cache: StateCache, name: str) -> None:
    """The inspect the event thread makes after an event, landing now."""
    container = fake.containers.get(name)
    if container is None:
        return
    cache.on_inspected(container.state(), container.id)


def die(fake: FakeRuntime, name: str, code: int) -> EngineEvent:
    return EngineEvent(fake.containers[name].id, "die", code, "2026-11-30T12:00:05Z")


# --- reads ---------------------------------------------------------------------------------


async def test_before_the_first_sync_every_read_is_unavailable(fake: FakeRuntime) -> None:
    cache = StateCache(fake, relist_s=1, sync_timeout=1, clock=fake.clock)
    with pytest.raises(EngineUnavailable, match="the first sync has not finished"):
        cache.get("tuneplane-x")
    with pytest.raises(EngineUnavailable):
        cache.all()
    assert cache.status().synced is False


async def test_a_sync_holds_only_the_nodes_containers(fake: FakeRuntime) -> None:
    ours = await running(fake)
    fake.create_outside(ContainerSpec(name="someones", image="postgres:16"))
    cache = StateCache(fake, relist_s=1, sync_timeout=1, clock=fake.clock)

    cache.replace_all(
        [brief(c.state()) for c in fake.containers.values()], fake.clock.monotonic(), 1
    )

    assert cache.get(ours).status == "running"
    assert cache.get("someones") == ContainerState.missing("someones")
    assert [s.name for s in cache.all()] == [ours]
    assert cache.status().containers == 1 and cache.syncs == 1


async def test_status_ages_come_from_the_clock(cache: StateCache, clock: FakeClock) -> None:
    cache.on_event(EngineEvent("x", "exec_start"))
    clock.advance(2.5)
    status = cache.status()
    assert (status.synced, status.last_event_age_s, status.last_relist_age_s) == (True, 2.5, 2.5)


# --- events --------------------------------------------------------------------------------


async def test_a_die_says_exited_at_once_before_its_inspect(
    fake: FakeRuntime, cache: StateCache
) -> None:
    name = await running(fake)
    inspected(fake, cache, name)

    cache.on_event(die(fake, name, 3))

    state = cache.get(name)
    assert (state.status, state.exit_code) == ("exited", 3)
    assert state.finished_at == "2026-11-30T12:00:05Z"  # the event's own time, for reap
    assert not state.live


async def test_an_inspect_read_before_the_exit_never_brings_the_job_back(
    fake: FakeRuntime, cache: StateCache
) -> None:
    """Seen in CI on podman under load: the inspect after the start event landed after
    the die event's exit, and a console read the exited job running, its exit code gone,
    until the die's own inspect. A container started again after its end is running."""
    name = await running(fake)
    container_id = fake.containers[name].id
    read_running = replace(fake.containers[name].state(), started_at="2026-11-30T12:00:00Z")
    cache.on_inspected(read_running, container_id)
    cache.on_event(die(fake, name, 3))  # ended 12:00:05

    cache.on_inspected(read_running, container_id)  # read at 12:00:01, landing now
    cache.on_inspected(replace(read_running, status="created", started_at=None), container_id)
    assert (cache.get(name).status, cache.get(name).exit_code) == ("exited", 3)

    again = replace(read_running, started_at="2026-11-30T12:01:00.5Z")
    cache.on_inspected(again, container_id)
    assert cache.get(name) is again


async def test_a_sigkill_exit_waits_for_its_inspect_to_say_whether_it_was_oom(
    fake: FakeRuntime, cache: StateCache
) -> None:
    name = await running(fake)
    inspected(fake, cache, name)
    before = cache.generation

    cache.on_event(die(fake, name, EXIT_SIGKILL))

    assert cache.get(name).status == "running"  # not "exited, not OOM-killed" too early
    assert cache.generation == before
    fake.exit(name, EXIT_SIGKILL, oom=True)
    inspected(fake, cache, name)
    state = cache.get(name)
    assert (state.status, state.exit_code, state.oom_killed) == ("exited", 137, True)


async def test_an_oom_event_before_the_die_marks_the_exit_oom_killed(
    fake: FakeRuntime, cache: StateCache
) -> None:
    name = await running(fake)
    inspected(fake, cache, name)
    container_id = fake.containers[name].id

    cache.on_event(EngineEvent(container_id, "oom"))
    cache.on_event(die(fake, name, EXIT_SIGKILL))

    state = cache.get(name)
    assert (state.status, state.exit_code, state.oom_killed) == ("exited", 137, True)


async def test_a_die_of_an_unknown_or_exited_container_changes_nothing(
    fake: FakeRuntime, cache: StateCache
) -> None:
    name = await running(fake)
    cache.on_event(die(fake, name, 1))  # created after the sync, its inspect not in yet
    assert cache.get(name).exists is False
    inspected(fake, cache, name)
    fake.exit(name, 0)
    inspected(fake, cache, name)

    cache.on_event(die(fake, name, 9))

    assert cache.get(name).exit_code == 0


async def test_a_destroyed_container_reads_gone(fake: FakeRuntime, cache: StateCache) -> None:
    name = await running(fake)
    inspected(fake, cache, name)
    container_id = fake.containers[name].id

    await fake.remove(name)
    cache.on_inspected(ContainerState.missing(container_id), container_id)

    assert cache.get(name).exists is False
    assert container_id not in cache.names


async def test_a_renamed_container_is_found_under_its_new_name_only(
    fake: FakeRuntime, cache: StateCache
) -> None:
    name = await running(fake)
    inspected(fake, cache, name)
    container = fake.containers.pop(name)
    container.spec = replace(container.spec, name="tuneplane-new")
    fake.containers["tuneplane-new"] = container

    inspected(fake, cache, "tuneplane-new")

    assert cache.get(name).exists is False
    assert cache.get("tuneplane-new").status == "running"


async def test_a_broken_stream_makes_every_read_unavailable(cache: StateCache) -> None:
    cache.mark_stale("the engine closed it")
    with pytest.raises(EngineUnavailable, match="event stream broken: the engine closed it"):
        cache.get("tuneplane-a")
    assert cache.status().synced is False


# --- resync and relist ---------------------------------------------------------------------


async def test_a_resync_keeps_what_was_written_after_it_began(
    fake: FakeRuntime, cache: StateCache, clock: FakeClock
) -> None:
    name = await running(fake)
    old = fake.containers[name].state()
    started = clock.monotonic()
    clock.advance(1)
    fake.exit(name, 0)
    inspected(fake, cache, name)  # an event landed while the list was being read

    cache.replace_all([brief(old)], started, 2)

    assert cache.get(name).status == "exited"


async def test_a_resync_drops_what_the_engine_no_longer_has(
    fake: FakeRuntime, cache: StateCache, clock: FakeClock
) -> None:
    name = await running(fake)
    inspected(fake, cache, name)
    clock.advance(1)

    cache.replace_all([], clock.monotonic(), 2)

    assert cache.get(name).exists is False


async def test_the_relist_recovers_dropped_events(
    fake: FakeRuntime, cache: StateCache, clock: FakeClock
) -> None:
    """Deterministic: the events are lost, the relist is called, the truth comes back."""
    stays, dies, goes = [await running(fake) for _ in range(3)]
    for name in (stays, dies, goes):
        inspected(fake, cache, name)
    fake.exit(dies, EXIT_SIGKILL)  # no event reaches the cache
    await fake.remove(goes)
    appears = await running(fake)
    fake.calls.clear()
    clock.advance(1)  # the relist begins after the cache's last write

    await cache.relist()

    assert cache.get(stays).status == "running"
    assert (cache.get(dies).status, cache.get(dies).exit_code) == ("exited", 137)
    assert cache.get(goes).exists is False
    assert cache.get(appears).status == "running"
    # Only what changed or is new was inspected: the list told the rest.
    assert fake.calls["inspect_now"] == 2 and fake.calls["list_brief"] == 1


async def test_a_relist_is_not_the_first_sync(fake: FakeRuntime, clock: FakeClock) -> None:
    cache = StateCache(fake, relist_s=1, sync_timeout=1, clock=clock)
    await cache.relist()
    with pytest.raises(EngineUnavailable):
        cache.get("x")


# --- the event thread and CachedRuntime ------------------------------------------------------


@pytest.fixture
async def cached(fake: FakeRuntime) -> AsyncIterator[CachedRuntime]:
    runtime = CachedRuntime(
        fake, relist_s=3600, sync_timeout=5, clock=fake.clock, backoff_s=(0.01, 0.05)
    )
    await runtime.start()
    yield runtime
    await runtime.cache.close()


async def test_the_event_thread_keeps_the_cache_current(
    fake: FakeRuntime, cached: CachedRuntime
) -> None:
    assert cached.status().synced
    name = await running(fake)  # behind the cache's back: only the events tell it

    await wait_until(lambda: cached.cache.states.get(name) is not None, timeout=5)
    fake.exit(name, 4)
    await wait_until(lambda: cached.cache.states[name].status == "exited", timeout=5)
    assert (await cached.inspect(name)).exit_code == 4


class RefusingInspects:
    """The fake engine, refusing the next ``refusals`` inspects as podman 4 refuses one of
    a container mid-exit ("read /proc/<pid>/cgroup: no such process")."""

    def __init__(self, fake: FakeRuntime) -> None:
        self.fake = fake
        self.refusals = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def inspect_now(self, ref: str) -> ContainerState:
        if self.refusals > 0:
            self.refusals -= 1
            reason = "read /proc/11946/cgroup: no such process"
            raise EngineRefused(engine="fake", action=f"inspect {ref}", reason=reason)
        return self.fake.inspect_now(ref)


class WatchedInspects:
    """The fake engine, noting what the cache said of a container as each inspect after
    an event began (read from the event thread: a dict lookup)."""

    def __init__(self, fake: FakeRuntime) -> None:
        self.fake = fake
        self.cache: StateCache | None = None
        self.seen: list[str | None] = []
        self.inspected: list[str] = []  # the refs asked for

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def inspect_now(self, ref: str) -> ContainerState:
        assert self.cache is not None
        known = self.cache.states.get(self.cache.names.get(ref, ""))
        self.seen.append(known.status if known else None)
        self.inspected.append(ref)
        return self.fake.inspect_now(ref)


async def test_a_die_is_on_the_loop_before_its_inspect_takes_the_thread(
    fake: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The inspect's Python would hold the GIL the loop needs to tell the exit: the loop
    takes the die first, so a waiting watch hears of it without waiting on the inspect."""
    monkeypatch.setattr(cache_events, "HANDOVER_S", 5.0)  # a loaded machine's loop too
    feed = WatchedInspects(fake)
    cached = CachedRuntime(feed, relist_s=3600, sync_timeout=5, clock=fake.clock)
    feed.cache = cached.cache
    await cached.start()
    try:
        name = await running(fake)
        await wait_until(lambda: cached.cache.states.get(name) is not None, timeout=5)
        feed.seen.clear()
        fake.exit(name, 4)
        await wait_until(lambda: len(feed.seen) == 1, timeout=5)
        assert feed.seen == ["exited"]  # the provisional exit was written first
    finally:
        await cached.cache.close()


@pytest.mark.slow  # the event thread's inspects of three containers, waited for
async def test_a_docker_stops_four_events_cost_one_inspect(fake: FakeRuntime) -> None:
    """Docker's stop is kill, kill, die, stop: only the die changes what a state says, and
    in a burst of stops each other inspect was 18 ms more of the event thread's queue."""
    feed = WatchedInspects(fake)
    cached = CachedRuntime(feed, relist_s=3600, sync_timeout=5, clock=fake.clock)
    feed.cache = cached.cache
    inspected = feed.inspected
    await cached.start()
    try:
        name = await running(fake)
        # Its start's inspect may still be queued when its create's has landed (seen under
        # load: counted after the clear): a later container's inspect says none is.
        settled = await running(fake)
        await wait_until(lambda: fake.containers[settled].id in inspected, timeout=30)
        container = fake.containers[name]
        inspected.clear()
        for action in ("kill", "kill"):
            fake._emit(container, action)
        fake.exit(name, 143)
        fake._emit(container, "stop")
        after = await running(fake)  # its events come last: every inspect before is done
        await wait_until(lambda: fake.containers[after].id in inspected, timeout=30)
        assert inspected.count(container.id) == 1
        assert cached.cache.states[name].exit_code == 143
    finally:
        await cached.cache.close()


@pytest.mark.slow
@pytest.mark.parametrize(("refusals", "stale"), [(2, False), (3, True)])
async def test_an_inspect_refused_after_an_event_is_asked_again_before_the_stream_breaks(
    fake: FakeRuntime, refusals: int, stale: bool
) -> None:
    feed = RefusingInspects(fake)
    cached = CachedRuntime(
        feed,  # the fake as EngineFeed, its inspect refusing
        relist_s=3600,
        sync_timeout=5,
        clock=fake.clock,
        backoff_s=(30, 30),  # no resync within the test: the break stays seen
    )
    await cached.start()
    try:
        name = await running(fake)
        await wait_until(lambda: cached.cache.states.get(name) is not None, timeout=5)
        feed.refusals = refusals
        fake.exit(name, 4)
        if stale:
            await wait_until(lambda: not cached.status().synced, timeout=5)
            with pytest.raises(EngineUnavailable, match="no such process"):
                await cached.inspect(name)
        else:
            await wait_until(lambda: cached.cache.states[name].status == "exited", timeout=5)
            assert (await cached.inspect(name)).exit_code == 4 and cached.status().synced
    finally:
        await cached.cache.close()


async def test_a_relaunch_asks_the_engine_before_it_answers_running(
    fake: FakeRuntime, cached: CachedRuntime, probe: FakeProbe, settings: NodeSettings
) -> None:
    """The job ended a moment ago and its event is still on the way: the cache says
    running, and a re-launch must not answer "running" on the cache's word."""
    node = fake_node_of(cached, settings, probe=probe)
    spec = job(["/bin/train"], image=PRESENT)
    run = spec.labels[LABEL_RUN_ID]
    first = await node.jobs.launch(Launch(run, 0, spec))
    assert isinstance(first, Started)
    seen = cached.cache.states.get
    await wait_until(lambda: (state := seen(spec.name)) and state.status == "running", timeout=5)
    container = fake.containers[spec.name]
    container.status, container.exit_code = "exited", 0  # no event: the cache lags

    assert (await cached.inspect(spec.name)).status == "running"
    again = await node.jobs.launch(Launch(run, 0, spec))

    assert isinstance(again, Started) and fake.containers[spec.name] is not container
    assert (await cached.inspect(spec.name)).status == "running"  # the new one
    await node.close()


async def test_an_engine_restart_goes_stale_then_resyncs(
    fake: FakeRuntime, cached: CachedRuntime
) -> None:
    name = await running(fake)
    fake.up = False
    fake.close_streams()
    await wait_until(lambda: not cached.cache.synced, timeout=5)
    with pytest.raises(EngineUnavailable):
        await cached.inspect(name)
    health = await cached.health()
    assert not health.ok

    fake.up = True
    await wait_until(lambda: cached.cache.synced, timeout=10)  # after the backoff
    assert (await cached.inspect(name)).status == "running"


async def test_the_node_sees_its_own_verbs_at_once(
    fake: FakeRuntime, cached: CachedRuntime
) -> None:
    spec = job(["/bin/train"])
    await cached.run(spec)
    assert (await cached.inspect(spec.name)).status == "running"  # no event awaited
    await cached.kill(spec.name, "SIGTERM")
    assert await cached.wait_exited(spec.name, 5)  # the die event reached the cache
    assert (await cached.inspect(spec.name)).status == "exited"
    await cached.remove(spec.name)
    assert (await cached.inspect(spec.name)).exists is False
    assert [s.name for s in await cached.ps()] == []


async def test_health_asks_the_engine_once_per_sync(
    fake: FakeRuntime, cached: CachedRuntime
) -> None:
    for _ in range(5):
        health = await cached.health()
    assert (health.ok, health.version) == (True, "1.0-fake")
    assert fake.calls["health"] == 1


async def test_a_stale_cache_is_not_healthy_even_when_the_engine_answers(
    fake: FakeRuntime, cached: CachedRuntime
) -> None:
    cached.cache.mark_stale("lost events")
    health = await cached.health()
    assert not health.ok and health.error == "event stream broken: lost events"


async def test_an_engine_that_stops_answering_makes_the_cache_stale_until_it_answers(
    fake: FakeRuntime,
) -> None:
    """A wedged engine sends no event and no error: the heartbeat finds it out."""
    runtime = CachedRuntime(
        fake,
        relist_s=3600,
        sync_timeout=5,
        clock=fake.clock,
        backoff_s=(0.01, 0.05),
        heartbeat_s=0.05,
    )
    await runtime.start()
    name = await running(fake)
    await wait_until(lambda: runtime.cache.states.get(name) is not None, timeout=5)
    assert (await runtime.health()).ok

    fake.up = False  # the stream stays open and silent; every call fails
    await wait_until(lambda: not runtime.cache.synced, timeout=5)
    with pytest.raises(EngineUnavailable):
        await runtime.inspect(name)
    health = await runtime.health()
    assert not health.ok and health.version == "1.0-fake"  # at once, and still named

    fake.up = True
    await wait_until(lambda: runtime.cache.synced, timeout=5)
    assert (await runtime.inspect(name)).status == "running"
    await runtime.cache.close()


@pytest.mark.slow
async def test_the_reconnect_backoff_starts_again_once_a_stream_has_synced(
    fake: FakeRuntime,
) -> None:
    """Finding 12 of issue 25: each engine restart cost more 503s than the last, the
    backoff doubling across restarts. An engine down for the same time each restart
    costs the same time each restart."""
    runtime = CachedRuntime(
        fake, relist_s=3600, sync_timeout=5, clock=fake.clock, backoff_s=(0.01, 5.0)
    )
    await runtime.start()
    outages = []
    try:
        for _ in range(5):
            fake.up = False
            await wait_until(lambda: not runtime.cache.synced, timeout=5)
            await asyncio.sleep(0.025)  # down a while: two tries fail (0.01 s, then 0.02 s)
            fake.up = True
            back = time.monotonic()
            await wait_until(lambda: runtime.cache.synced, timeout=10)
            outages.append(time.monotonic() - back)
    finally:
        await runtime.cache.close()
    # Without the reset the fifth waits 0.01 * 2**7 s = 1.28 s.
    assert max(outages) < 0.5, outages


# --- the fill after a sync: the list answers at once, a read never answers from it --------


async def test_the_list_makes_the_cache_answer_and_a_read_asks_the_engine_for_the_rest(
    fake: FakeRuntime,
) -> None:
    name = await running(fake)
    runtime = CachedRuntime(fake, relist_s=3600, sync_timeout=1, clock=fake.clock)
    runtime.cache.replace_all(fake.list_brief(), fake.clock.monotonic(), 1)  # no fill yet
    fake.calls.clear()

    assert [s.status for s in await runtime.ps()] == ["running"]  # health and the cards
    state = await runtime.inspect(name)  # observe: never the list's partial word
    assert state == fake.containers[name].state() and state.started_at is not None
    assert fake.calls["inspect_now"] == 1
    await runtime.inspect(name)
    assert fake.calls["inspect_now"] == 1  # read once: the cache answers from then on


async def test_a_read_of_many_asks_the_engine_only_for_those_not_yet_filled(
    fake: FakeRuntime,
) -> None:
    """observe reads many refs in one call: still never the list's partial word."""
    first, second = await running(fake), await running(fake)
    runtime = CachedRuntime(fake, relist_s=3600, sync_timeout=1, clock=fake.clock)
    runtime.cache.replace_all(fake.list_brief(), fake.clock.monotonic(), 1)  # no fill yet
    await runtime.inspect(first)  # read once: from the engine, then from memory
    fake.calls.clear()

    states = await runtime.inspect_many([second, "nobody", first])

    assert [s.name for s in states] == [second, "nobody", first]
    assert states[0] == fake.containers[second].state() and states[0].started_at is not None
    assert states[1].exists is False and states[2].started_at is not None
    assert fake.calls["inspect_now"] == 1  # the unread one only


async def test_a_late_fill_never_overwrites_what_an_event_said_since(
    fake: FakeRuntime, clock: FakeClock
) -> None:
    name = await running(fake)
    cache = StateCache(fake, relist_s=3600, sync_timeout=1, clock=clock)
    cache.replace_all(fake.list_brief(), clock.monotonic(), 1)
    stale = fake.containers[name].state()  # the fill's inspect, read before the exit
    fake.exit(name, 3)
    inspected(fake, cache, name)  # the exit's event lands first

    cache.on_filled(stale, stale.id or "", 1)
    assert (cache.get(name).status, cache.get(name).exit_code) == ("exited", 3)

    other = await running(fake)
    cache.replace_all(fake.list_brief(), clock.monotonic(), 2)  # a resync began since
    cache.on_filled(fake.containers[other].state(), fake.containers[other].id, 1)
    assert other in cache.unread  # the old fill's word was not taken
