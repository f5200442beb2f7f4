"""GpuAllocator: which cards are free, and the one lock that hands them out.

Labels are the truth: occupancy is rebuilt from the ``tuneplane.gpus`` label of every
live container, so a restarted daemon loses nothing. Memory holds only claims: the card
indices promised to a launch that has no container yet (pulling its image, or being
created right now). The allocation lock covers choosing cards and recording the claim,
never an engine call: a launch claims under the lock, creates its container without it,
and releases its claim once the container's label holds the cards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import GpuNotReady
from tuneplane_node.gpu.breaker import CardBreaker
from tuneplane_node.gpu.cardreturn import CardReturns
from tuneplane_node.gpu.factory import make_probe
from tuneplane_node.gpu.probe import CardFault, GpuProbe, GpuSnapshot, Occupancy
from tuneplane_node.gpu.readiness import GpuReadiness, ReadinessReader
from tuneplane_node.gpu.topology import choose_cards
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import ContainerRuntime, ContainerState
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks, by_awaiters

log = logging.getLogger(__name__)


class GpuAllocator:
    """Occupancy from labels, claims by card index, and the allocation lock."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        settings: NodeSettings,
        *,
        probe: GpuProbe | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.probe = probe if probe is not None else make_probe(settings, clock=clock)
        self.clock = clock
        self.readiness = ReadinessReader(runtime, settings, clock=clock)
        self.breaker = CardBreaker(settings.gpu_breaker_per_hour, clock=clock)
        self.returns = CardReturns(clock=clock, timeout_s=settings.gpu_drain_timeout_s)
        self._reading: tuple[float, GpuSnapshot] | None = None  # (read at, the reading)
        self._read: asyncio.Task[GpuSnapshot] | None = None
        self._tasks = BackgroundTasks(log)  # the probe's read, shared by its callers
        self._claims: dict[str, tuple[int, ...]] = {}
        self._runs: dict[str, str] = {}  # a claim's run id
        self._claims_changed = 0
        self._lock = asyncio.Lock()
        # The last occupancy and what it was built from: health and every scrape ask
        # for it, and rebuilding from 1,000 labels took 300 us a call.
        self._built: tuple[tuple[int, int, GpuSnapshot], Occupancy] | None = None

    async def snapshot(self) -> GpuSnapshot:
        """The probe's reading. One answering from memory is read in place; one doing I/O
        on a worker thread, at most once per its ``reading_ttl_s``, and callers arriving
        while a read runs share it (a burst of health calls is one read, not one each)."""
        if not self.probe.blocking:
            return self.probe.snapshot()
        reading = self._reading
        if reading is not None and self.clock.monotonic() - reading[0] < self.probe.reading_ttl_s:
            return reading[1]
        if self._read is None:
            self._read = self._tasks.spawn(
                self._read_probe(), name="GPU probe read", ended=by_awaiters
            )
        return await asyncio.shield(self._read)

    async def _read_probe(self) -> GpuSnapshot:
        try:
            gpus = await asyncio.to_thread(self.probe.snapshot)
            self._reading = (self.clock.monotonic(), gpus)
            return gpus
        finally:
            self._read = None

    async def occupancy(self, gpus: GpuSnapshot | None = None) -> Occupancy:
        """Occupancy now, from the live containers' labels and the probe (read unless given).

        Built again only when a container, a claim or the probe's reading changed since
        the last one; a runtime without a state cache (no generation) builds every time.
        """
        if gpus is None:
            gpus = await self.snapshot()
        generation, source = self.runtime.cache_generation(), None
        if generation is not None:  # no synced cache: ps() reads (or says why); no old answer
            source = (generation, self._claims_changed, gpus)
        if source is not None and self._built is not None and self._built[0] == source:
            return self._built[1]
        occupancy = self.occupancy_from(await self.runtime.ps(), gpus)
        if source is not None:
            self._built = (source, occupancy)
        return occupancy

    def occupancy_from(self, states: Sequence[ContainerState], gpus: GpuSnapshot) -> Occupancy:
        count = self.card_count(gpus)
        total = count or 0
        live = [state for state in states if state.live and state.ours]
        by_job = {gpu: state.run_id or "" for state in live for gpu in state.gpus if gpu < total}
        holders = {gpu: state.handle for state in live for gpu in state.gpus}
        unhealthy, kept_in = self._taken_out(gpus, total)
        external, probe_ok = self._external(gpus, holders)
        external = {index: pids for index, pids in external.items() if index < total}
        draining = self.returns.draining(by_job, gpus)
        taken = set(by_job) | set(external) | set(unhealthy) | set(draining)
        return Occupancy(
            total=total,
            known=count is not None,
            free=tuple(index for index in range(total) if index not in taken),
            by_job=by_job,
            external=external,
            external_probe_ok=probe_ok,
            unhealthy=unhealthy,
            claims=dict(self._claims),
            gpus=gpus,
            draining=draining,
            kept_in=kept_in,
            breaker=self.breaker.state(),
        )

    def _taken_out(
        self, gpus: GpuSnapshot, total: int
    ) -> tuple[dict[int, str], dict[int, CardFault]]:
        """The unhealthy cards out, and the faulted ones the breaker keeps in."""
        unhealthy: dict[int, str] = {}
        kept_in: dict[int, CardFault] = {}
        keys = []
        for card in gpus.cards:
            if not card.unhealthy or card.index >= total:
                continue
            fault = card.fault
            if fault is not None:  # judged by the node: counted by the breaker
                key = (card.index, fault.scope, fault.since)
                keys.append(key)
                if not self.breaker.admits(key, f"GPU {card.index} ({fault.cause})"):
                    kept_in[card.index] = fault
                    continue
            unhealthy[card.index] = card.unhealthy
        self.breaker.keep_only(keys)
        return unhealthy, kept_in

    def reset_breaker(self) -> None:
        """The operator's reset (`CardBreaker.reset`): occupancy is built again."""
        self.breaker.reset()
        self._built = None

    def card_count(self, gpus: GpuSnapshot) -> int | None:
        """An explicit local_gpu_count wins; else what the driver answered; else unknown."""
        if self.settings.local_gpu_count is not None:
            return self.settings.local_gpu_count
        return len(gpus.cards) if gpus.ok else None

    async def ready(self, gpus: GpuSnapshot | None = None) -> GpuReadiness:
        """Whether the node can run a GPU job now (`readiness`): health's ``gpu_ready``."""
        if gpus is None:
            gpus = await self.snapshot()
        return await self.readiness.read(self.card_count(gpus), gpus.error, gpus)

    def _external(
        self, gpus: GpuSnapshot, holders: Mapping[int, str]
    ) -> tuple[dict[int, tuple[int, ...]], bool]:
        """Cards running a compute process of anyone but the container labelled to hold them.

        A job of ours straying onto a card it was not given counts too: handing that
        card out would put two jobs on it.
        """
        if not (self.settings.local_check_external_gpus and gpus.ok and gpus.processes_ok):
            return {}, False
        on_cards = gpus.pids()
        owners = self.runtime.holders_of(on_cards) if on_cards else {}
        external: dict[int, tuple[int, ...]] = {}
        for card in gpus.cards:
            holder = holders.get(card.index)
            pids = tuple(
                p.pid for p in card.processes if holder is None or owners.get(p.pid) != holder
            )
            if pids:
                external[card.index] = pids
        return external, True

    async def claim(self, ref: str, n: int, *, run_id: str) -> tuple[int, ...]:
        """Choose ``n`` cards for ``ref`` and record the claim, or raise NoCapacity
        (GpuNotReady when the node cannot run a GPU job at all).

        A claim ``ref`` already holds (a pending launch about to start) is kept if its
        cards are all still free, else chosen again. Release it with `release` once the
        container's label holds the cards, or the launch failed.
        """
        if n <= 0:
            return ()
        gpus = await self.snapshot()  # outside the lock: health facts need no ordering
        readiness = await self.ready(gpus)
        if readiness.ready is False:  # the engine would refuse the cards: say why first
            assert readiness.reason is not None
            raise GpuNotReady(reason=readiness.reason)
        async with self._lock:
            occupancy = await self.occupancy(gpus)  # labels are read under the lock
            usable = occupancy.available_to(ref)
            held = self._claims.get(ref, ())
            if len(held) == n and set(held) <= set(usable):
                return held
            if n > len(usable):
                raise occupancy.refusal(n)
            links = occupancy.gpus.links if occupancy.gpus else {}
            nodes = occupancy.gpus.numa_nodes() if occupancy.gpus else {}
            cards = tuple(choose_cards(usable, n, links, nodes=nodes))
            self._claims[ref] = cards
            self._runs[ref] = run_id
            self._claims_changed += 1
        log.info(
            "run %s claims gpus %s", run_id, list(cards),
            extra=job_fields(ref, run_id, gpus=list(cards)),
        )  # fmt: skip
        return cards

    def release(self, ref: str) -> None:
        """The claim is over: its container's label holds the cards now, or the launch
        failed. Either way the cards were the run's: they drain once it is gone."""
        cards = self._claims.pop(ref, None)
        if cards is not None:
            self.returns.handed(cards, self._runs.pop(ref, ""))
            self._claims_changed += 1

    async def close(self) -> None:
        """Cancel a probe read and a readiness look in flight, then close the probe
        (shutdown)."""
        await self._tasks.close()
        await self.readiness.close()
        self.probe.close()
