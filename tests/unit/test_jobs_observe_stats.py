"""The stats sampler and the service's stats verb, on the in-memory engine and clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.conftest import IMAGE
from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.jobs import job, unique
from tuneplane_node.gpu.probe import CardFacts, GpuProcess
from tuneplane_node.jobs import Node
from tuneplane_node.jobs.observe.stats import CardSample, ProcessMemory
from tuneplane_node.runtime.facts import Usage
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, Launch, container_name

MIB = 2**20


async def launch(node: Node, gpus: int = 0) -> str:
    spec = job(["/bin/sleep", "300"], image=IMAGE)
    await node.jobs.launch(Launch(spec.labels[LABEL_RUN_ID], gpus, spec))
    return spec.name


async def test_cpu_ratio_is_cores_over_the_period_between_two_samples(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    ref = await launch(node)
    fake.usages[ref] = Usage(cpu_seconds=10.0, memory_bytes=200 * MIB, pids=3)
    await node.sampler.sample_once()
    first = (await node.jobs.stats([ref]))[ref]
    assert first.sample is not None and first.sample.cpu_ratio is None  # one reading: unknown
    assert (first.sample.memory_bytes, first.sample.pids) == (200 * MIB, 3)

    clock.advance(5)
    fake.usages[ref] = Usage(cpu_seconds=27.5, memory_bytes=300 * MIB, pids=4)
    await node.sampler.sample_once()
    second = (await node.jobs.stats([ref]))[ref].sample
    assert second is not None and second.cpu_ratio == 3.5  # 17.5 s of CPU in 5 s
    assert second.sampled_at == "2026-11-30T12:00:05Z" and second.memory_bytes == 300 * MIB


async def test_a_relaunch_under_the_same_name_starts_afresh(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    spec = job(["/bin/sleep", "300"], image=IMAGE)
    request = Launch(spec.labels[LABEL_RUN_ID], 0, spec)
    await node.jobs.launch(request)
    ref = spec.name
    fake.usages[ref] = Usage(cpu_seconds=100.0)
    await node.sampler.sample_once()
    fake.exit(ref, 0)
    await node.jobs.launch(request)  # the same spec, launched again
    clock.advance(5)
    fake.usages[ref] = Usage(cpu_seconds=1.0)
    await node.sampler.sample_once()
    sample = (await node.jobs.stats([ref]))[ref].sample
    assert sample is not None and sample.cpu_ratio is None  # never 100 s of the old one


async def test_not_running_foreign_and_missing_refs_carry_no_figures(
    node: Node, fake: FakeRuntime
) -> None:
    exited = await launch(node)
    fake.exit(exited, 3)
    foreign = fake.create_outside(ContainerSpec("tuneplane-foreign", IMAGE)).spec.name
    await node.sampler.sample_once()
    stats = await node.jobs.stats([exited, foreign, "tuneplane-nobody", exited])
    assert list(stats) == [exited, foreign, "tuneplane-nobody"]
    assert (stats[exited].exists, stats[exited].status, stats[exited].sample) == (
        True,
        "exited",
        None,
    )
    for ref in (foreign, "tuneplane-nobody"):
        assert (stats[ref].exists, stats[ref].status, stats[ref].sample) == (False, None, None)
    assert foreign not in node.sampler.samples  # never sampled: not the node's


async def test_a_pending_launch_reads_created(node: Node, fake: FakeRuntime) -> None:
    run_id = unique("st")
    spec = ContainerSpec(container_name(run_id), "registry.test/absent:1", labels={})
    await node.jobs.launch(Launch(run_id, 1, spec))
    stats = await node.jobs.stats([spec.name])
    assert (stats[spec.name].exists, stats[spec.name].status) == (True, "created")


async def test_a_job_started_since_the_last_sample_reads_unknown_not_zero(
    node: Node, fake: FakeRuntime
) -> None:
    await node.sampler.sample_once()
    ref = await launch(node, gpus=1)
    sample = (await node.jobs.stats([ref]))[ref].sample
    assert sample is not None and sample.sampled_at is None
    assert (sample.cpu_ratio, sample.memory_bytes, sample.pids) == (None, None, None)
    assert sample.gpus == (CardSample(fake.containers[ref].state().gpus[0]),)


async def test_a_job_shows_its_own_cards_and_never_another_jobs(
    node: Node, fake: FakeRuntime, probe: FakeProbe
) -> None:
    mine, theirs = await launch(node, gpus=1), await launch(node, gpus=2)
    my_card = fake.containers[mine].state().gpus[0]
    for index in range(4):
        probe.cards[index] = CardFacts(
            index,
            memory_total_mib=81559,
            memory_used_mib=1000 + index,
            temperature_c=40 + index,
            utilization_pct=10 * (index + 1),
            power_w=100.5 + index,
        )
    await node.sampler.sample_once()
    stats = await node.jobs.stats([mine, theirs])
    mine_sample, their_sample = stats[mine].sample, stats[theirs].sample
    assert mine_sample is not None and their_sample is not None
    (card,) = mine_sample.gpus
    assert card.index == my_card
    assert card.utilization_ratio == (my_card + 1) / 10
    assert card.memory_used_bytes == (1000 + my_card) * MIB
    assert card.memory_total_bytes == 81559 * MIB
    assert (card.power_watts, card.temperature_celsius) == (100.5 + my_card, 40 + my_card)
    their_cards = {c.index for c in their_sample.gpus}
    assert len(their_cards) == 2 and my_card not in their_cards


async def test_processes_on_a_card_are_only_the_jobs_own(
    node: Node, fake: FakeRuntime, probe: FakeProbe
) -> None:
    ref = await launch(node, gpus=1)
    card = fake.containers[ref].state().gpus[0]
    # Its own process is listed under it; another's on its card is not.
    fake.holders[999_999_002] = fake.containers[ref].id
    processes = (GpuProcess(999_999_001, 500), GpuProcess(999_999_002, 700))
    probe.cards[card] = CardFacts(card, processes=processes)
    await node.sampler.sample_once()
    sample = (await node.jobs.stats([ref]))[ref].sample
    assert sample is not None
    assert sample.gpus[0].processes == (ProcessMemory(999_999_002, 700 * MIB),)


async def test_the_table_holds_only_running_containers(node: Node, fake: FakeRuntime) -> None:
    refs = [await launch(node) for _ in range(3)]
    await node.sampler.sample_once()
    assert set(node.sampler.samples) == set(refs)
    fake.exit(refs[0], 0)
    await node.jobs.remove(refs[1])
    await node.sampler.sample_once()
    assert set(node.sampler.samples) == {refs[2]}


async def test_an_engine_down_keeps_the_last_samples_and_the_sampler_going(
    node: Node, fake: FakeRuntime
) -> None:
    ref = await launch(node)
    await node.sampler.sample_once()
    fake.up = False
    interval = node.sampler.interval_s
    task = asyncio.create_task(node.sampler.run())
    for _ in range(3):  # a few intervals, each failing, then waiting for the next
        await fake.clock.sleeping(interval)
        fake.clock.advance(interval)
    await fake.clock.sleeping(interval)
    assert not task.done() and ref in node.sampler.samples
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_no_refs_means_every_running_job(node: Node, fake: FakeRuntime) -> None:
    running = [await launch(node) for _ in range(2)]
    exited = await launch(node)
    fake.exit(exited, 0)
    fake.create_outside(ContainerSpec("tuneplane-foreign", IMAGE))
    await node.sampler.sample_once()
    assert sorted(await node.jobs.stats(None)) == sorted(running)


async def test_many_jobs_are_read_in_slices_spread_over_a_fifth_of_the_interval(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    """A burst of requests meets a slice of the read, never all of it: 70 jobs are read
    32, 32 and 6 at a time, a third of a fifth of the interval apart. Each job's figures
    say when its own slice was read, and the table changes only once the last is in."""
    refs = [await launch(node) for _ in range(70)]
    pause = node.sampler.interval_s * 0.2 / 3
    first = asyncio.create_task(node.sampler.sample_once())
    for _ in range(2):  # the first sample, from 12:00:00 to 12:00:00.666667
        await clock.sleeping(pause)
        clock.advance(pause)
    await first
    clock.advance(5 - 2 * pause)  # the next, from 12:00:05
    before = dict(node.sampler.samples)
    asked: list[list[str]] = []
    real_usage = fake.usage

    async def usage(wanted: Sequence[str]) -> dict[str, Usage]:
        asked.append(list(wanted))
        return await real_usage(wanted)

    fake.usage = usage  # type: ignore[method-assign,assignment]
    sampling = asyncio.create_task(node.sampler.sample_once())
    for _ in range(2):
        await clock.sleeping(pause)
        assert node.sampler.samples == before  # not swapped while a slice is still to read
        clock.advance(pause)
    await sampling

    assert [len(slice_) for slice_ in asked] == [32, 32, 6]
    by_id = {str(sample.id): sample for sample in node.sampler.samples.values()}
    assert sorted(node.sampler.samples) == sorted(refs)  # each job once
    assert sorted(handle for slice_ in asked for handle in slice_) == sorted(by_id)
    moments = [{by_id[handle].sampled_at for handle in slice_} for slice_ in asked]
    assert moments == [
        {"2026-11-30T12:00:05Z"}, {"2026-11-30T12:00:05.333333Z"}, {"2026-11-30T12:00:05.666667Z"},
    ]  # fmt: skip
