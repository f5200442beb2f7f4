"""The allocator: occupancy from labels, claims by card index, the refusal's words."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.jobs import job
from tuneplane_node.errors import EngineUnavailable, GpuNotReady, NoCapacity
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.probe import CardFacts, CardFault, NoDriverProbe
from tuneplane_node.gpu.simulation import SimulatedProbe
from tuneplane_node.runtime.base import CacheStatus
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import LABEL_GPUS


def allocator(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe | NoDriverProbe, **overrides: object
) -> GpuAllocator:
    return GpuAllocator(fake, settings.model_copy(update=overrides), probe=probe)


async def hold(fake: FakeRuntime, *cards: int) -> str:
    """A live container of the node labelled with these cards."""
    spec = job(["/bin/train"], gpus=cards)
    await fake.run(spec)
    return spec.name


async def test_the_lowest_free_cards_are_claimed_and_count_as_reserved(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe)
    await hold(fake, 0)

    assert await gpus.claim("a", 2, run_id="a") == (1, 2)

    occupancy = await gpus.occupancy()
    assert occupancy.free == (1, 2, 3)
    assert occupancy.reserved == {1, 2} and occupancy.available == (3,)
    assert list(occupancy.by_job) == [0]


async def test_a_claim_never_takes_another_claims_cards(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe)
    await gpus.claim("a", 3, run_id="a")

    with pytest.raises(NoCapacity) as refused:
        await gpus.claim("b", 2, run_id="b")

    assert refused.value.message == (
        "not enough GPUs: asked for 2; 4 free [0, 1, 2, 3], 0 held by jobs, "
        "3 reserved for pending launches"
    )
    gpus.release("a")
    assert await gpus.claim("b", 2, run_id="b") == (0, 1)


async def test_a_claim_held_again_keeps_its_cards_while_they_are_free(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe)
    await gpus.claim("other", 1, run_id="o")
    first = await gpus.claim("a", 2, run_id="a")
    gpus.release("other")

    assert await gpus.claim("a", 2, run_id="a") == first == (1, 2)  # not moved to (0, 1)

    probe.set(2, unhealthy="lost: not answering")
    assert await gpus.claim("a", 2, run_id="a") == (0, 1)  # chosen again


async def test_unhealthy_external_and_held_cards_are_never_free(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe)
    probe.set(0, unhealthy="uncorrectable ECC errors: 1")
    probe.set(1, pids=(999_999_999,))
    await hold(fake, 2)

    occupancy = await gpus.occupancy()

    assert occupancy.free == (3,)
    assert [occupancy.card_state(i) for i in range(4)] == [
        "unhealthy: uncorrectable ECC errors: 1",
        "external pid 999999999",
        f"held by run {occupancy.by_job[2]}",
        "free",
    ]
    assert occupancy.external_probe_ok


async def test_a_jobs_own_process_on_its_card_is_not_external(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    # The runtime says which container each process on a card runs in: the holder's own
    # is its job at work; anyone else's on that card (or on a free one) is external.
    gpus = allocator(fake, settings, probe)
    name = await hold(fake, 1)
    fake.holders[4242] = fake.containers[name].id
    fake.holders[4343] = "another-container"
    probe.set(1, pids=(4242,))
    probe.set(2, pids=(4242,))  # the same job straying onto a card it was not given

    occupancy = await gpus.occupancy()
    assert occupancy.external == {2: (4242,)}
    assert occupancy.card_state(1) == f"held by run {occupancy.by_job[1]}"

    probe.set(1, pids=(4242, 4343))
    assert (await gpus.occupancy()).external == {1: (4343,), 2: (4242,)}


async def test_exited_and_foreign_containers_hold_no_card(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe)
    done = await hold(fake, 0)
    fake.exit(done, 0)
    fake.create_outside(ContainerSpec(name="someones", image="x", labels={LABEL_GPUS: "1"}))

    assert (await gpus.occupancy()).free == (0, 1, 2, 3)


async def test_the_best_joined_cards_are_chosen(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    probe.links = {(1, 3): "nvlink", (0, 2): "pcie_switch"}
    gpus = allocator(fake, settings, probe)

    assert await gpus.claim("a", 2, run_id="a") == (1, 3)
    assert await gpus.claim("b", 2, run_id="b") == (0, 2)


async def test_an_unknown_card_count_allocates_nothing(
    fake: FakeRuntime, settings: NodeSettings
) -> None:
    gpus = allocator(fake, settings, NoDriverProbe("no NVML"), local_gpu_count=None)

    occupancy = await gpus.occupancy()
    assert (occupancy.known, occupancy.total, occupancy.free) == (False, 0, ())
    assert await gpus.claim("a", 0, run_id="a") == ()
    # Issue 25: not "0 free []" without a hint of why, but why and the fix.
    with pytest.raises(GpuNotReady, match=r"the card count is unknown: .*LOCAL_GPU_COUNT"):
        await gpus.claim("b", 1, run_id="b")


async def test_the_configured_count_wins_over_the_drivers(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe, local_gpu_count=2)
    assert (await gpus.occupancy()).total == 2
    gpus = allocator(fake, settings, probe, local_gpu_count=None)
    assert (await gpus.occupancy()).total == 4  # the probe's cards


async def test_with_the_external_check_off_outside_processes_are_not_seen(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    probe.set(1, pids=(999_999_999,))
    gpus = allocator(fake, settings, probe, local_check_external_gpus=False)

    occupancy = await gpus.occupancy()

    assert occupancy.external == {} and occupancy.external_probe_ok is False
    assert occupancy.free == (0, 1, 2, 3)


class WhereProbe(FakeProbe):
    """Records the thread each snapshot ran on."""

    def __init__(self, *, blocking: bool) -> None:
        super().__init__()
        self.blocking = blocking
        self.threads: list[str] = []

    def snapshot(self):  # type: ignore[no-untyped-def]
        self.threads.append(threading.current_thread().name)
        return super().snapshot()


@pytest.mark.parametrize(("blocking", "on_loop"), [(False, True), (True, False)])
async def test_only_a_probe_that_does_io_is_read_on_a_worker_thread(
    fake: FakeRuntime, settings: NodeSettings, blocking: bool, on_loop: bool
) -> None:
    probe = WhereProbe(blocking=blocking)
    await allocator(fake, settings, probe).occupancy()
    assert (probe.threads == [threading.main_thread().name]) is on_loop
    assert NoDriverProbe("x").blocking is False  # says why from memory


def test_a_probe_without_a_driver_answers_one_snapshot() -> None:
    # The occupancy is kept while its snapshot is the same: compared by identity at
    # once, where a new snapshot each health was compared field by field.
    probe = NoDriverProbe("no NVML")
    assert probe.snapshot() is probe.snapshot()
    assert probe.snapshot().error == "no NVML" and not probe.snapshot().ok


class DriverLikeProbe(FakeProbe):
    """Blocking, like the NVML probe: read on a worker thread, a reading kept a second."""

    blocking = True
    reading_ttl_s = 1.0

    def snapshot(self):  # type: ignore[no-untyped-def]
        time.sleep(0.02)  # a driver read takes a moment: callers meanwhile share it
        return super().snapshot()


async def test_a_driver_is_read_at_most_once_per_its_reading_time_whoever_asks(
    fake: FakeRuntime, settings: NodeSettings
) -> None:
    """Health, metrics and claims all ask for the probe; with the driver one read a
    second serves them all, and a burst shares the read in flight."""
    clock, probe = FakeClock(), DriverLikeProbe()
    gpus = GpuAllocator(fake, settings, probe=probe, clock=clock)

    burst = await asyncio.gather(*(gpus.occupancy() for _ in range(50)))
    assert probe.reads == 1 and {o.free for o in burst} == {(0, 1, 2, 3)}
    await gpus.occupancy()
    assert probe.reads == 1  # within the second: the same reading

    probe.set(2, unhealthy="XID 79")
    clock.advance(probe.reading_ttl_s)
    assert 2 not in (await gpus.occupancy()).free  # a second on, a new reading
    assert probe.reads == 2


async def test_a_probe_with_no_reading_time_is_read_on_every_call(
    fake: FakeRuntime, settings: NodeSettings
) -> None:
    """The simulation file is edited live by tests: every call reads it."""
    probe = WhereProbe(blocking=True)
    gpus = allocator(fake, settings, probe)
    for _ in range(3):
        await gpus.occupancy()
    assert probe.reads == 3
    assert SimulatedProbe.reading_ttl_s == 0


class GenerationalRuntime(FakeRuntime):
    """The fake behind a state cache: a generation that moves when a container does."""

    generation = 1

    def status(self) -> CacheStatus:
        synced = self.up  # a real cache marks itself unsynced when the engine goes
        return CacheStatus(synced, 0.0, 0.0, len(self.containers), generation=self.generation)

    def cache_generation(self) -> int | None:
        return self.generation if self.up else None


async def test_occupancy_is_built_again_only_when_something_it_reads_changed(
    settings: NodeSettings, probe: FakeProbe
) -> None:
    runtime = GenerationalRuntime()
    gpus = GpuAllocator(runtime, settings, probe=probe)
    await hold(runtime, 0)
    first = await gpus.occupancy()
    assert await gpus.occupancy() is first and runtime.calls["ps"] == 1  # nothing moved

    runtime.generation += 1  # a container changed
    assert (await gpus.occupancy()).by_job == first.by_job and runtime.calls["ps"] == 2
    await gpus.claim("a", 1, run_id="a")  # a claim changed (claim reads it, too)
    assert (await gpus.occupancy()).reserved == {1}
    gpus.release("a")
    assert (await gpus.occupancy()).reserved == frozenset()
    probe.set(3, unhealthy="ECC errors")  # the probe's reading changed
    assert (await gpus.occupancy()).unhealthy == {3: "ECC errors"}
    runtime.up = False  # the cache lost the engine: the truth is unknown, not the last
    with pytest.raises(EngineUnavailable):
        await gpus.occupancy()
    await runtime.close()


def two_sockets(path: Path) -> Path:
    """A simulated 2-socket, 8-card machine: cards 0-3 on NUMA node 0, 4-7 on node 1."""
    cards = [{"index": index, "numa_node": index // 4} for index in range(8)]
    numa = {"0": [0, 1], "1": [2, 3]}
    path.write_text(json.dumps({"cards": cards, "numa_cpus": numa}), encoding="utf-8")
    return path


def socket_launcher(
    fake: FakeRuntime, settings: NodeSettings, path: Path
) -> Callable[[str, int], Awaitable[tuple[int, ...]]]:
    """Launches on the two-socket machine: claim, the container labelled, the claim let go."""
    machine = settings.model_copy(update={"local_gpu_count": None})
    gpus = GpuAllocator(fake, machine, probe=SimulatedProbe(two_sockets(path), machine))

    async def launch(ref: str, n: int) -> tuple[int, ...]:
        cards = await gpus.claim(ref, n, run_id=ref)
        await hold(fake, *cards)  # the container's label holds them now
        gpus.release(ref)
        return cards

    return launch


async def test_after_one_card_jobs_a_four_card_job_gets_a_whole_socket(
    fake: FakeRuntime, settings: NodeSettings, tmp_path: Path
) -> None:
    launch = socket_launcher(fake, settings, tmp_path / "gpus.json")
    assert [await launch(f"small-{i}", 1) for i in range(3)] == [(0,), (1,), (2,)]
    assert await launch("large", 4) == (4, 5, 6, 7)  # not 3-6, across the sockets


async def test_one_card_jobs_fill_the_socket_in_use_and_a_four_card_job_finds_a_whole_one(
    fake: FakeRuntime, settings: NodeSettings, tmp_path: Path
) -> None:
    launch = socket_launcher(fake, settings, tmp_path / "gpus.json")
    first = [await launch(f"first-{i}", 1) for i in range(5)]
    assert first == [(0,), (1,), (2,), (3,), (4,)]  # socket 0 filled before socket 1
    for name in list(fake.containers)[:4]:  # the jobs on socket 0 end
        await fake.remove(name)

    assert [await launch(f"then-{i}", 1) for i in range(3)] == [(5,), (6,), (7,)]
    assert await launch("large", 4) == (0, 1, 2, 3)  # a whole socket


async def test_a_claim_is_logged_with_its_run_and_cards_and_drains_in_its_runs_name(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tuneplane_node.gpu.allocator")
    gpus = allocator(fake, settings, probe)
    assert await gpus.claim("ref-a", 2, run_id="run-a") == (0, 1)
    [record] = caplog.records
    assert record.getMessage() == "run run-a claims gpus [0, 1]"
    assert (record.ref, record.run_id, record.gpus) == ("ref-a", "run-a", [0, 1])  # type: ignore[attr-defined]

    gpus.release("ref-a")  # the launch failed: its cards drain, in its run's name
    gpus.release("ref-a")  # a claim released twice, or never made: nothing
    probe.set(1, pids=(4242,))
    draining = (await gpus.occupancy()).draining
    assert draining == {1: "after run run-a: compute process 4242 still on it"}


async def test_past_the_configured_count_no_card_is_held_external_or_unhealthy(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    """local_gpu_count=3 on a 4-card machine: card 3 is none of the node's business."""
    gpus = allocator(fake, settings, probe, local_gpu_count=3)
    await hold(fake, 2, 3)
    probe.set(3, unhealthy="XID 79", pids=(999_999_999,))

    occupancy = await gpus.occupancy()
    assert (list(occupancy.by_job), occupancy.external, occupancy.unhealthy) == ([2], {}, {})
    assert occupancy.free == (0, 1)
    assert occupancy.breaker == gpus.breaker.state()


async def test_each_claim_is_seen_by_an_occupancy_built_from_the_cache(
    settings: NodeSettings, probe: FakeProbe
) -> None:
    runtime = GenerationalRuntime()
    gpus = GpuAllocator(runtime, settings, probe=probe)
    for n, ref in enumerate(("a", "b", "c"), start=1):
        await gpus.claim(ref, 1, run_id=ref)
        assert len((await gpus.occupancy()).reserved) == n
    await runtime.close()


async def test_past_the_breakers_limit_each_faulted_card_is_kept_in_until_its_reset(
    settings: NodeSettings, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """One card an hour may be taken out (`gpu_breaker_per_hour=1`): the first fault
    takes its card out, every later one is kept in and said, each decided once."""
    runtime = GenerationalRuntime()
    gpus = GpuAllocator(
        runtime, settings.model_copy(update={"gpu_breaker_per_hour": 1}), probe=probe
    )
    faults = {i: CardFault("card", f"XID {79 + i}", "2026-01-01T00:00:00Z") for i in (0, 1, 2)}
    for index, fault in faults.items():
        probe.cards[index] = CardFacts(index, unhealthy=fault.cause, fault=fault)

    for _ in range(2):  # decided once: the same answer again
        occupancy = await gpus.occupancy()
        assert occupancy.unhealthy == {0: "XID 79"} and occupancy.free == (1, 2, 3)
        assert occupancy.kept_in == {1: faults[1], 2: faults[2]}
        assert occupancy.breaker is not None and occupancy.breaker.kept_in == 2
        runtime.generation += 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(said) == 2 and said[0].startswith("GPU circuit breaker: GPU 1 (XID 80) kept in")

    gpus.reset_breaker()
    breaker = (await gpus.occupancy()).breaker  # built again, not the last one
    assert breaker is not None and breaker.kept_in == 0
    await runtime.close()


async def test_readiness_reads_the_driver_and_says_its_error(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe, local_gpu_count=None)
    assert (await gpus.ready()).ready is not False
    probe.ok = False
    readiness = await gpus.ready()  # read now, not given
    assert readiness.ready is False and "the test says no" in (readiness.reason or "")


async def test_a_claim_reads_the_driver_once(
    fake: FakeRuntime, settings: NodeSettings, probe: FakeProbe
) -> None:
    gpus = allocator(fake, settings, probe)
    await gpus.claim("a", 1, run_id="a")
    assert probe.reads == 1  # readiness and occupancy judge the same reading


async def test_without_a_probe_given_the_settings_make_one(
    fake: FakeRuntime, settings: NodeSettings, tmp_path: Path
) -> None:
    update = {"gpu_simulation_file": two_sockets(tmp_path / "sim.json"), "local_gpu_count": None}
    gpus = GpuAllocator(fake, settings.model_copy(update=update))
    assert (await gpus.occupancy()).total == 8
