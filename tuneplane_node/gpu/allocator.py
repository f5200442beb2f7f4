"""GpuAllocator: which cards are free, and the one lock that hands them out.

Labels are the truth: occupancy is rebuilt on every call from the ``tuneplane.gpus`` label
of every live container, so a restarted daemon loses nothing. Memory holds only
reservations, counts of cards promised to launches still pulling their image.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tuneplane_node.errors import NoCapacity
from tuneplane_node.gpu.probe import GpuProbe, GpuSnapshot, container_id_of_pid, make_probe
from tuneplane_node.gpu.topology import choose_cards
from tuneplane_node.runtime.base import ContainerRuntime, ContainerState
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Occupancy:
    """Where every card is, at one moment. Unhealthy and external cards are never free."""

    total: int
    known: bool  # False: no count configured and no driver answer, so total is unknown
    free: tuple[int, ...]
    by_job: Mapping[int, str]
    external: Mapping[int, tuple[int, ...]]
    external_probe_ok: bool
    unhealthy: Mapping[int, str]
    reserved: Mapping[str, int] = field(default_factory=dict)
    gpus: GpuSnapshot | None = None

    @property
    def reserved_total(self) -> int:
        return sum(self.reserved.values())

    @property
    def available(self) -> int:
        """Cards a new direct launch could take: free minus what is promised."""
        return max(0, len(self.free) - self.reserved_total)

    def card_state(self, index: int) -> str:
        if index in self.unhealthy:
            return f"unhealthy: {self.unhealthy[index]}"
        if index in self.by_job:
            return f"held by run {self.by_job[index]}"
        if index in self.external:
            pids = ", ".join(str(pid) for pid in self.external[index])
            return f"external pid {pids}"
        return "free"

    def explain(self) -> list[str]:
        """One readable line per card."""
        lines = [f"gpu {index}: {self.card_state(index)}" for index in range(self.total)]
        if self.reserved_total:
            lines.append(f"{self.reserved_total} free card(s) reserved for pending launches")
        return lines

    def refusal(self, requested: int) -> NoCapacity:
        return NoCapacity(
            requested=requested,
            free=self.free,
            held=self.by_job,
            reserved=self.reserved_total,
            external=sorted(self.external),
            unhealthy=self.unhealthy,
        )


class GpuAllocator:
    """Occupancy from labels, reservations, and the allocation lock."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        settings: NodeSettings,
        *,
        probe: GpuProbe | None = None,
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.probe = probe if probe is not None else make_probe(settings)
        self._reservations: dict[str, int] = {}
        # Spans choosing the cards AND creating+starting the container, or two
        # launches read the same free card before either label exists.
        self._lock = asyncio.Lock()

    async def snapshot(self) -> GpuSnapshot:
        return await asyncio.to_thread(self.probe.snapshot)

    async def occupancy(self, states: Sequence[ContainerState] | None = None) -> Occupancy:
        """Rebuild occupancy from the live containers (listed now unless given)."""
        if states is None:
            states = await self.runtime.ps()
        return self.occupancy_from(states, await self.snapshot())

    def occupancy_from(self, states: Sequence[ContainerState], gpus: GpuSnapshot) -> Occupancy:
        count = self.card_count(gpus)
        total = count or 0
        live = [state for state in states if state.live and state.run_id]
        by_job = {gpu: state.run_id or "" for state in live for gpu in state.gpus if gpu < total}
        holders = {gpu: state.id for state in live for gpu in state.gpus if state.id}
        unhealthy = {c.index: c.unhealthy for c in gpus.cards if c.unhealthy and c.index < total}
        external, probe_ok = self._external(gpus, holders)
        external = {index: pids for index, pids in external.items() if index < total}
        taken = set(by_job) | set(external) | set(unhealthy)
        return Occupancy(
            total=total,
            known=count is not None,
            free=tuple(index for index in range(total) if index not in taken),
            by_job=by_job,
            external=external,
            external_probe_ok=probe_ok,
            unhealthy=unhealthy,
            reserved=dict(self._reservations),
            gpus=gpus,
        )

    def card_count(self, gpus: GpuSnapshot) -> int | None:
        """An explicit local_gpu_count wins; else what the driver answered; else unknown."""
        if self.settings.local_gpu_count is not None:
            return self.settings.local_gpu_count
        return len(gpus.cards) if gpus.ok else None

    def _external(
        self, gpus: GpuSnapshot, holders: Mapping[int, str]
    ) -> tuple[dict[int, tuple[int, ...]], bool]:
        """Cards running a compute process of anyone but the container labelled to hold them.

        A job of ours straying onto a card it was not given counts too: handing that
        card out would put two jobs on it.
        """
        if not (self.settings.local_check_external_gpus and gpus.ok and gpus.processes_ok):
            return {}, False
        external: dict[int, tuple[int, ...]] = {}
        for card in gpus.cards:
            holder = holders.get(card.index)
            pids = tuple(
                p.pid
                for p in card.processes
                if holder is None or container_id_of_pid(p.pid) != holder
            )
            if pids:
                external[card.index] = pids
        return external, True

    async def reserve(self, ref: str, n: int) -> None:
        """Promise n currently free cards to a pending launch, or refuse with NoCapacity."""
        if n <= 0:
            return
        async with self._lock:
            occupancy = await self.occupancy()
            if n > occupancy.available:
                raise occupancy.refusal(n)
            self._reservations[ref] = n

    def release(self, ref: str) -> None:
        self._reservations.pop(ref, None)

    def reserved(self) -> dict[str, int]:
        return dict(self._reservations)

    async def allocate_and_run(
        self,
        run_id: str,
        n: int,
        run: Callable[[list[int]], Awaitable[T]],
        reservation: str | None = None,
    ) -> tuple[list[int], T]:
        """Choose n cards and call ``run(cards)`` under the allocation lock.

        A reservation named here is consumed: its cards count as this launch's own, and
        it is released whatever ``run`` does.
        """
        if n <= 0 and reservation is None:
            return [], await run([])
        try:
            async with self._lock:
                cards = await self._choose(run_id, n, reservation)
                return cards, await run(cards)
        finally:
            if reservation is not None:
                self.release(reservation)

    async def _choose(self, run_id: str, n: int, reservation: str | None) -> list[int]:
        if n <= 0:
            return []
        occupancy = await self.occupancy()
        own = self._reservations.get(reservation, 0) if reservation else 0
        if n > len(occupancy.free) - (occupancy.reserved_total - own):
            raise occupancy.refusal(n)
        cards = choose_cards(occupancy.free, n, occupancy.gpus.links if occupancy.gpus else {})
        log.info("run %s gets gpus %s", run_id, cards)
        return cards

    def close(self) -> None:
        self.probe.close()
