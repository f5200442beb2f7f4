"""What the machine says about its GPUs: the per-card facts and the probe contract.

Also `Occupancy`, where every card is at one moment (the allocator builds it).

A `GpuProbe` answers one blocking `snapshot()` (called from a worker thread) and never
raises: a driver that does not answer is ``ok=False`` with the reason, because unknown is
not zero. Three probes exist: `NvmlProbe` (`nvml.py`, the only module that imports
``pynvml``), `SimulatedProbe` (`simulation.py`: a JSON file, for development and tests) and
`NoDriverProbe` (here); `factory.make_probe` picks one. Both real probes feed their fault
readings through one `health.HealthTracker`, so ECC, XID and lost-card rules are the same
whichever source answered. This module imports no other probe module: they import it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from tuneplane_node.errors import NoCapacity
from tuneplane_node.gpu.breaker import BreakerState

LINK_KINDS = ("nvlink", "pcie_switch", "numa")
"""Link kinds between two cards, best first; a pair not listed meets across the system."""


JOB, CARD, NODE = "job", "card", "node"
SCOPES = (JOB, CARD, NODE)
"""What a card's fault reaches, narrowest first: the job on it (told, nothing stopped),
the card (out until reset and a clean probe, its job warned and stopped), the machine
(the node cordoned, every job drained)."""


@dataclass(frozen=True)
class CardFault:
    """A card's fault as the node judged it: its `SCOPES` entry, its cause (``XID 48``,
    the driver's recovery action ``GPU_RESET``, ``uncorrectable ECC errors: 2``) and since
    when (RFC 3339 UTC)."""

    scope: str
    cause: str
    since: str


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a card; ``used_mib`` is None when the driver cannot say."""

    pid: int
    used_mib: int | None = None


@dataclass(frozen=True)
class CardFacts:
    """One card as the probe saw it; None means unknown. ``unhealthy`` is the verdict."""

    index: int
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    temperature_c: int | None = None
    utilization_pct: int | None = None  # busy share of the last sample period
    power_w: float | None = None  # drawn now, in watts
    unhealthy: str | None = None
    processes: tuple[GpuProcess, ...] = ()
    numa_node: int | None = None  # the NUMA node whose memory is nearest the card
    cpus: tuple[int, ...] = ()  # the CPUs of that node, as the driver says; (): unknown
    fault: CardFault | None = None  # the widest fault that holds now; ``unhealthy`` is
    # its text where it takes the card out (scope card or node)


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything one probe call learnt. ``processes_ok`` False: processes unknown, not none.

    ``links`` maps ``(lo, hi)`` card indices to a `LINK_KINDS` entry; absent pairs meet
    only across the system.
    """

    source: str
    ok: bool
    error: str | None
    driver: str | None
    cuda: str | None
    cards: tuple[CardFacts, ...]
    processes_ok: bool
    links: Mapping[tuple[int, int], str]
    # The NVSwitch fabric's state as the cards say it (``Completed``, ``In Progress``,
    # ``Not Started``), the least advanced card's; None: not an NVSwitch machine, or unknown.
    fabric: str | None = None
    # The NVIDIA Container Toolkit's version, where the source says it (the simulation
    # file); None: read from the machine (`gpu.toolkit`).
    toolkit: str | None = None

    @classmethod
    def failed(cls, source: str, error: str, *, driver: str | None = None) -> GpuSnapshot:
        """The answer when the source could not be read: no cards, nothing known."""
        return cls(source, False, error, driver, None, (), False, MappingProxyType({}))

    def common_name(self) -> str | None:
        """What the driver calls the cards; on a mixed machine the most common name
        (the first seen on a tie)."""
        names = [card.name for card in self.cards if card.name]
        return Counter(names).most_common(1)[0][0] if names else None

    def numa_nodes(self) -> dict[int, int]:
        """Card index to NUMA node, for the cards whose node is known."""
        return {card.index: card.numa_node for card in self.cards if card.numa_node is not None}

    def pids(self) -> set[int]:
        """Every process seen on any card: what the runtime is asked to place."""
        return {process.pid for card in self.cards for process in card.processes}


class GpuProbe(Protocol):
    blocking: bool
    """True when `snapshot` does I/O (driver calls, a file): it is then read on a worker
    thread. A probe answering from memory is read on the loop: a thread hop would cost
    more than the answer."""

    reading_ttl_s: float
    """How long a blocking probe's reading serves every caller before the next read (0:
    read on every call). The driver's facts move on a scale of seconds; a health call
    does not need its own read."""

    def snapshot(self) -> GpuSnapshot:
        """Read every card now; never raises."""
        ...

    def close(self) -> None: ...


class DistinctWarnings:
    """Logs a problem when it first appears or changes, not on every poll."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._last: dict[object, str] = {}
        self._lock = threading.Lock()

    def warn(self, key: object, message: str) -> None:
        with self._lock:
            if self._last.get(key) == message:
                return
            self._last[key] = message
        self._logger.warning("%s", message)

    def clear(self, key: object) -> None:
        with self._lock:
            self._last.pop(key, None)


class NoDriverProbe:
    """The probe of a machine whose GPU driver cannot be reached; says why every time,
    with one snapshot object: the allocator keeps its occupancy while the snapshot is
    the same, and a new one each call had it compared field by field on every health."""

    blocking = False
    reading_ttl_s = 0.0

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self._snapshot = GpuSnapshot.failed("none", reason)

    def snapshot(self) -> GpuSnapshot:
        return self._snapshot

    def close(self) -> None:
        return None


class DriverUnavailableError(Exception):
    """The GPU driver could not be initialised; raised by a probe's constructor only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Occupancy:
    """Where every card is, at one moment. Unhealthy and external cards are never free."""

    total: int
    known: bool  # False: no count configured and no driver answer, so total is unknown
    free: tuple[int, ...]  # physically free: no job, no outside process, healthy
    by_job: Mapping[int, str]
    external: Mapping[int, tuple[int, ...]]
    external_probe_ok: bool
    unhealthy: Mapping[int, str]
    claims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # ref -> cards
    gpus: GpuSnapshot | None = None
    draining: Mapping[int, str] = field(default_factory=dict)  # job gone, card not clean yet
    kept_in: Mapping[int, CardFault] = field(default_factory=dict)  # faults past the breaker
    breaker: BreakerState | None = None  # as it stood when this was built

    @functools.cached_property
    def reserved(self) -> frozenset[int]:
        """Cards promised to launches that have no container yet."""
        return frozenset(card for cards in self.claims.values() for card in cards)

    @property
    def available(self) -> tuple[int, ...]:
        """Cards a new launch could take: free and promised to nobody."""
        return tuple(card for card in self.free if card not in self.reserved)

    def available_to(self, ref: str) -> tuple[int, ...]:
        """Free cards not promised to another launch (``ref``'s own claim counts as free)."""
        others = {card for owner, cards in self.claims.items() if owner != ref for card in cards}
        return tuple(card for card in self.free if card not in others)

    def card_kind(self, index: int) -> str:
        """One word per card, each card exactly one: what the metrics count."""
        if index in self.unhealthy:
            return "unhealthy"
        if index in self.draining:
            return "draining"
        if index in self.external and index not in self.by_job:
            return "external"
        if index in self.by_job:
            return "held"
        return "reserved" if index in self.reserved else "free"

    def card_state(self, index: int) -> str:
        if index in self.unhealthy:
            return f"unhealthy: {self.unhealthy[index]}"
        kept = self.kept_in.get(index)
        if kept is not None:
            where = self.card_state_in(index)
            return f"{where}; its {kept.scope} fault {kept.cause} kept in by the GPU breaker"
        return self.card_state_in(index)

    def card_state_in(self, index: int) -> str:
        """Where a card in the pool is (not out for a fault)."""
        if index in self.by_job:
            return f"held by run {self.by_job[index]}"
        if index in self.draining:
            return f"draining: {self.draining[index]}"
        if index in self.external:
            pids = ", ".join(str(pid) for pid in self.external[index])
            return f"external pid {pids}"
        return "free"

    def explain(self) -> list[str]:
        """One readable line per card, and one for the reservations."""
        lines = [f"gpu {index}: {self.card_state(index)}" for index in range(self.total)]
        if self.reserved:
            lines.append(f"{len(self.reserved)} free card(s) reserved for pending launches")
        return lines

    def refusal(self, requested: int) -> NoCapacity:
        return NoCapacity(
            requested=requested,
            free=self.free,
            held=self.by_job,
            reserved=len(self.reserved),
            external=sorted(self.external),
            unhealthy=self.unhealthy,
        )
