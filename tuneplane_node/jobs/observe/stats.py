"""StatsSampler: what each running job of the node uses, sampled in the background.

Every ``TUNEPLANE_STATS_INTERVAL_S`` the sampler reads the node's running containers
(the cache's list), their CPU time, memory and pids (one runtime call per slice of
`SLICE_JOBS`, the slices spread over a fifth of the interval),
and, when one holds cards, the GPU probe once. A stats request is answered from the
latest samples, never by sampling: a console polling 300 jobs costs the engine nothing.

The table holds exactly the running containers of the last sample: one that stopped or
went is dropped by the next. A job's cards are the ones its own ``tuneplane.gpus`` label
names, so a card of another job never shows under it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, rfc3339
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.probe import CardFacts, GpuSnapshot
from tuneplane_node.jobs.words.views import DiskFigures
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.facts import Usage

log = logging.getLogger(__name__)
MIB = 2**20
SLICE_JOBS = 32  # jobs read in one pool call: about 3 ms of CPU
SPREAD = 0.2  # of the interval, over which a sample's slices are spread

Reading = tuple[Usage | None, float, str]  # usage, and when it was read (monotonic, RFC 3339)


class SampledRuntime(Protocol):
    """What the sampler asks of the engine: the running jobs, their use, the cards' holders."""

    async def ps(self) -> list[ContainerState]: ...
    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]: ...
    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]: ...


@dataclass(frozen=True)
class ProcessMemory:
    """A process of the job on one of its cards, and the card memory it holds."""

    pid: int
    memory_used_bytes: int | None


@dataclass(frozen=True)
class CardSample:
    """One card the job holds; None where the driver (or simulation file) did not say.
    ``processes`` None: the driver does not list them (or the job's id is unknown)."""

    index: int
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: int | None = None
    processes: tuple[ProcessMemory, ...] | None = None


@dataclass(frozen=True)
class JobSample:
    """One running job at one moment. ``cpu_ratio`` is cores in use over the period
    since the previous sample (None on the first); ``sampled_at`` None: not sampled yet.
    ``cpu_seconds`` and ``taken`` are kept for the next sample's difference."""

    id: str | None
    run_id: str | None = None
    cpu_ratio: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    pids: int | None = None
    gpus: tuple[CardSample, ...] = ()
    sampled_at: str | None = None
    cpu_seconds: float | None = None
    taken: float | None = None

    @classmethod
    def blank(cls, state: ContainerState) -> JobSample:
        """A running job the sampler has not seen yet: its cards, every figure unknown."""
        return cls(state.id, state.run_id, gpus=tuple(CardSample(index) for index in state.gpus))


@dataclass(frozen=True)
class JobStats:
    """What stats says of one ref: figures only while it runs."""

    exists: bool
    status: str | None
    sample: JobSample | None = None
    disk: DiskFigures | None = None  # the disk monitor's latest measure
    gpu_fault: str | None = None  # a job-scope fault of a card it holds


class StatsSampler:
    """The latest sample of every running container of the node, refreshed in the
    background. Mutated on the loop only, by `sample_once`."""

    def __init__(
        self,
        runtime: SampledRuntime,
        allocator: GpuAllocator,
        *,
        interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.runtime = runtime
        self.allocator = allocator
        self.interval_s = interval_s
        self.clock = clock
        self.samples: dict[str, JobSample] = {}  # container name -> its latest sample
        self._failing = False

    def latest(self, state: ContainerState) -> JobSample:
        """The container's sample, if it is of this very container (a relaunch under
        the same name starts afresh)."""
        sample = self.samples.get(state.name)
        return sample if sample is not None and sample.id == state.id else JobSample.blank(state)

    async def run(self) -> None:
        """Sample now, then every interval, as long as the node runs."""
        while True:
            try:
                await self.sample_once()
            except NodeError as exc:
                self._warn(f"sampling the jobs failed: {exc.message}")
            await self.clock.sleep(self.interval_s)

    def _warn(self, message: str) -> None:
        """Once per outage, not once per interval: the engine may be down for hours."""
        if not self._failing:
            log.warning("%s; the last samples stay until one succeeds", message)
        self._failing = True

    async def sample_once(self) -> None:
        running = [s for s in await self.runtime.ps() if s.ours and s.status == "running"]
        read = await self._read(running)
        gpus, owners = await self._cards(running)
        self.samples = {
            state.name: self._sample(state, *read[state.handle], gpus, owners) for state in running
        }
        if self._failing:
            log.info("sampling the jobs works again")
        self._failing = False

    async def _read(self, running: list[ContainerState]) -> dict[str, Reading]:
        """Each job's usage with the moments it was read at, in slices of `SLICE_JOBS`
        spread over a `SPREAD` of the interval: a slice is a few ms of a pool thread, and
        no burst of requests meets the whole read (300 jobs: 25 ms of CPU, most of it
        the kernel's, which a daemon on one core would take from the requests)."""
        handles = [state.handle for state in running]
        slices = [handles[at : at + SLICE_JOBS] for at in range(0, len(handles), SLICE_JOBS)]
        pause = self.interval_s * SPREAD / max(1, len(slices))
        read: dict[str, Reading] = {}
        for index, refs in enumerate(slices):
            if index:
                await self.clock.sleep(pause)
            usage = await self.runtime.usage(refs)
            now, at = self.clock.monotonic(), rfc3339(self.clock.now())  # when the CPU was read
            read.update((ref, (usage.get(ref), now, at)) for ref in refs)
        return read

    async def _cards(
        self, running: list[ContainerState]
    ) -> tuple[GpuSnapshot | None, dict[int, str | None]]:
        """The probe's snapshot, when a job holds a card, and which container each
        process on a card belongs to (read from /proc, off the loop)."""
        if not any(state.gpus for state in running):
            return None, {}
        gpus = await self.allocator.snapshot()
        pids = gpus.pids()
        owners = await asyncio.to_thread(self.runtime.holders_of, pids) if pids else {}
        return gpus, owners

    def _sample(
        self,
        state: ContainerState,
        usage: Usage | None,
        now: float,
        at: str,
        gpus: GpuSnapshot | None,
        owners: Mapping[int, str | None],
    ) -> JobSample:
        usage = usage or Usage()
        cards = {card.index: card for card in gpus.cards} if gpus and gpus.ok else {}
        known = gpus is not None and gpus.ok and gpus.processes_ok
        return JobSample(
            id=state.id,
            run_id=state.run_id,
            cpu_ratio=self._cpu_ratio(state, usage, now),
            memory_bytes=usage.memory_bytes,
            memory_limit_bytes=usage.memory_limit_bytes,
            pids=usage.pids,
            gpus=tuple(
                card_sample(cards.get(index, CardFacts(index)), state.handle, owners, known=known)
                for index in state.gpus
            ),
            sampled_at=at,
            cpu_seconds=usage.cpu_seconds,
            taken=now,
        )

    def _cpu_ratio(self, state: ContainerState, usage: Usage, now: float) -> float | None:
        """Cores in use since the previous sample of this very container."""
        before = self.samples.get(state.name)
        if (
            before is None
            or before.id != state.id
            or before.cpu_seconds is None
            or before.taken is None
            or usage.cpu_seconds is None
            or now <= before.taken
        ):
            return None
        used = usage.cpu_seconds - before.cpu_seconds
        return round(max(0.0, used) / (now - before.taken), 3)


def card_sample(
    card: CardFacts, job_id: str | None, owners: Mapping[int, str | None], *, known: bool
) -> CardSample:
    """A card's figures in the API's units; its processes that are the job's own."""
    processes = None
    if known:
        processes = tuple(
            ProcessMemory(p.pid, p.used_mib * MIB if p.used_mib is not None else None)
            for p in card.processes
            if owners.get(p.pid) == job_id
        )
    return CardSample(
        index=card.index,
        utilization_ratio=card.utilization_pct / 100 if card.utilization_pct is not None else None,
        memory_used_bytes=_bytes(card.memory_used_mib),
        memory_total_bytes=_bytes(card.memory_total_mib),
        power_watts=card.power_w,
        temperature_celsius=card.temperature_c,
        processes=processes,
    )


def _bytes(mib: int | None) -> int | None:
    return mib * MIB if mib is not None else None
