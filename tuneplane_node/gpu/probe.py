"""What the machine says about its GPUs: the per-card facts and the probes that read them.

A `GpuProbe` answers one blocking `snapshot()` (called from a worker thread) and never
raises: a driver that does not answer is ``ok=False`` with the reason, because unknown is
not zero. Three probes exist: `NvmlProbe` (in `nvml.py`, the only module that imports
``pynvml``), `SimulatedProbe` (a JSON file, for development and tests) and `NoDriverProbe`.
Both real probes feed their fault readings through one `HealthTracker`, so ECC, XID and
lost-card rules are the same whichever source answered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, TypeVar

from tuneplane_node.clock import SYSTEM_CLOCK, rfc3339
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

LINK_KINDS = ("nvlink", "pcie_switch", "numa")
"""Link kinds between two cards, best first; a pair not listed meets across the system."""
LOST = "lost: not answering"


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

    @classmethod
    def failed(cls, source: str, error: str, *, driver: str | None = None) -> GpuSnapshot:
        """The answer when the source could not be read: no cards, nothing known."""
        return cls(source, False, error, driver, None, (), False, MappingProxyType({}))

    def common_name(self) -> str | None:
        """What the driver calls the cards; on a mixed machine the most common name
        (the first seen on a tie)."""
        names = [card.name for card in self.cards if card.name]
        return Counter(names).most_common(1)[0][0] if names else None

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


# --- health -------------------------------------------------------------------------


@dataclass(frozen=True)
class CardFaults:
    """Fault signals read from one card in one probe, before any quarantine logic.

    ``xids`` are the XID events seen since the previous probe.
    """

    ecc_uncorrected: int | None = None
    retired_pages_pending: bool = False
    row_remap_failure: bool = False
    lost: bool = False
    xids: tuple[int, ...] = ()


class HealthTracker:
    """Turns fault readings into a verdict per card, remembering XID quarantines.

    Standing faults (ECC, pending retirement, remap failure, lost) count only while they
    read so. A critical XID is an event, not a state: the card stays out for
    ``quarantine_s`` after the last one. Thread-safe: two snapshots may run at once.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        ignore_xids: Iterable[int],
        quarantine_s: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._enabled = enabled
        self._ignore = frozenset(ignore_xids)
        self._quarantine_s = quarantine_s
        self._now = now
        self._lock = threading.Lock()
        self._quarantined: dict[int, tuple[float, str]] = {}  # index -> (until, reason)

    @classmethod
    def from_settings(
        cls, settings: NodeSettings, *, now: Callable[[], float] = time.monotonic
    ) -> HealthTracker:
        return cls(
            enabled=settings.local_check_gpu_health,
            ignore_xids=settings.gpu_xid_ignore,
            quarantine_s=settings.gpu_xid_quarantine_s,
            now=now,
        )

    def judge(self, card: CardFacts, faults: CardFaults) -> CardFacts:
        """The card with ``unhealthy`` set to the reasons that hold now (None: healthy)."""
        if not self._enabled:
            return replace(card, unhealthy=None)
        reasons = standing_faults(faults)
        xid = self._xid_verdict(card.index, faults.xids)
        if xid is not None:
            reasons.append(xid)
        return replace(card, unhealthy="; ".join(reasons) or None)

    def _xid_verdict(self, index: int, xids: Sequence[int]) -> str | None:
        critical = sorted({x for x in xids if x not in self._ignore})
        now = self._now()
        with self._lock:
            if critical:
                codes = ", ".join(str(x) for x in critical)
                reason = f"XID {codes} at {_wall_clock()}"
                self._quarantined[index] = (now + self._quarantine_s, reason)
                log.warning("GPU %d: %s, quarantined for %gs", index, reason, self._quarantine_s)
                return reason
            until, reason = self._quarantined.get(index, (0.0, ""))
            if now < until:
                return reason
            if self._quarantined.pop(index, None) is not None:
                log.info("GPU %d: XID quarantine over, no new fault", index)
            return None


def standing_faults(faults: CardFaults) -> list[str]:
    """Reasons that hold exactly as long as the driver keeps reporting them."""
    if faults.lost:
        return [LOST]
    reasons = []
    if faults.ecc_uncorrected:
        reasons.append(f"uncorrectable ECC errors: {faults.ecc_uncorrected}")
    if faults.retired_pages_pending:
        reasons.append("retired pages pending (reset required)")
    if faults.row_remap_failure:
        reasons.append("row remapping failed")
    return reasons


def _wall_clock() -> str:
    return rfc3339(SYSTEM_CLOCK.now().replace(microsecond=0))


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


# --- the simple probes ------------------------------------------------------------------


class NoDriverProbe:
    """The probe of a machine whose GPU driver cannot be reached; says why every time."""

    blocking = False
    reading_ttl_s = 0.0

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot.failed("none", self.reason)

    def close(self) -> None:
        return None


class SimulationError(ValueError):
    """The simulation file cannot be used; the message names the file and the entry."""


class SimulatedProbe:
    """Reads a JSON file instead of the driver, again on every snapshot (tests edit it live).

    The format mirrors what `NvmlProbe` reads; only ``cards[].index`` is required::

        {"driver": "580.159.03", "cuda": "13.0",
         "cards": [{"index": 0, "name": "...", "uuid": "GPU-...", "pci_bus_id": "...",
                    "memory_total_mib": 81559, "memory_used_mib": 0, "temperature_c": 40,
                    "utilization_pct": 0, "power_w": 70.5, "ecc_uncorrected": 0,
                    "retired_pages_pending": false, "xid": [], "lost": false,
                    "processes": [{"pid": 1234, "used_mib": 500}]}],
         "links": [[0, 1, "nvlink"], [2, 3, "pcie_switch"]]}

    ``xid`` lists events since the previous read, so an XID left in the file counts
    again on every read (and keeps restarting the quarantine). A file that cannot be
    read or has a bad entry gives ``ok=False`` and no cards: a half-read file must not
    hide a card that is busy or broken.
    """

    source = "simulation"
    blocking = True
    reading_ttl_s = 0.0  # tests edit the file and read the answer at once

    def __init__(
        self, path: Path, settings: NodeSettings, *, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = Path(path)
        self._health = HealthTracker.from_settings(settings, now=now)
        self._warnings = DistinctWarnings(log)

    def snapshot(self) -> GpuSnapshot:
        try:
            snapshot = self._read()
        except SimulationError as exc:
            self._warnings.warn("file", str(exc))
            return GpuSnapshot.failed(self.source, str(exc))
        except Exception as exc:  # a bug here must not take the daemon down
            log.exception("GPU simulation: unexpected failure reading %s", self.path)
            return GpuSnapshot.failed(self.source, f"{self.path}: {exc!r}")
        self._warnings.clear("file")
        return snapshot

    def close(self) -> None:
        return None

    def _read(self) -> GpuSnapshot:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SimulationError(f"GPU simulation file {self.path}: {exc}") from exc
        try:
            return self._parse(data)
        except SimulationError as exc:
            raise SimulationError(f"GPU simulation file {self.path}: {exc}") from exc

    def _parse(self, data: object) -> GpuSnapshot:
        top = _expect(data, dict, "top level")
        readings = [
            _parse_card(entry, f"cards[{i}]")
            for i, entry in enumerate(_expect(top.get("cards", []), list, "cards"))
        ]
        indices = [card.index for card, _ in readings]
        if len(set(indices)) != len(indices):
            raise SimulationError(f"cards: duplicate index in {indices}")
        links = _parse_links(top.get("links", []), set(indices))
        cards = tuple(self._health.judge(card, faults) for card, faults in readings)
        return GpuSnapshot(
            source=self.source,
            ok=True,
            error=None,
            driver=_field(top, "driver", str, "top level"),
            cuda=_field(top, "cuda", str, "top level"),
            cards=tuple(sorted(cards, key=lambda c: c.index)),
            processes_ok=True,
            links=MappingProxyType(links),
        )


def _parse_card(entry: object, where: str) -> tuple[CardFacts, CardFaults]:
    card = _expect(entry, dict, where)
    index = _field(card, "index", int, where)
    if index is None or index < 0:
        raise SimulationError(f"{where}: needs an index >= 0")
    processes = _expect(card.get("processes", []), list, f"{where}.processes")
    facts = CardFacts(
        index=index,
        uuid=_field(card, "uuid", str, where),
        name=_field(card, "name", str, where),
        pci_bus_id=_field(card, "pci_bus_id", str, where),
        memory_total_mib=_field(card, "memory_total_mib", int, where),
        memory_used_mib=_field(card, "memory_used_mib", int, where),
        temperature_c=_field(card, "temperature_c", int, where),
        utilization_pct=_field(card, "utilization_pct", int, where),
        power_w=_number(card, "power_w", where),
        processes=tuple(
            _parse_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)
        ),
    )
    xids = _expect(card.get("xid", []), list, f"{where}.xid")
    faults = CardFaults(
        ecc_uncorrected=_field(card, "ecc_uncorrected", int, where),
        retired_pages_pending=bool(_field(card, "retired_pages_pending", bool, where)),
        lost=bool(_field(card, "lost", bool, where)),
        xids=tuple(_expect(x, int, f"{where}.xid[{i}]") for i, x in enumerate(xids)),
    )
    return facts, faults


def _parse_process(entry: object, where: str) -> GpuProcess:
    process = _expect(entry, dict, where)
    pid = _field(process, "pid", int, where)
    if pid is None:
        raise SimulationError(f"{where}: needs a pid")
    return GpuProcess(pid=pid, used_mib=_field(process, "used_mib", int, where))


def _parse_links(data: object, indices: set[int]) -> dict[tuple[int, int], str]:
    links: dict[tuple[int, int], str] = {}
    for i, entry in enumerate(_expect(data, list, "links")):
        where = f"links[{i}]"
        item = _expect(entry, list, where)
        if len(item) != 3:
            raise SimulationError(f"{where}: expected [card, card, kind], got {item!r}")
        a, b = _expect(item[0], int, where), _expect(item[1], int, where)
        kind = _expect(item[2], str, where)
        if kind not in LINK_KINDS:
            raise SimulationError(f"{where}: kind must be one of {LINK_KINDS}, got {kind!r}")
        if a == b or not {a, b} <= indices:
            raise SimulationError(f"{where}: needs two different listed cards, got {a}, {b}")
        links[(min(a, b), max(a, b))] = kind
    return links


def _expect(value: object, kind: type[T], where: str) -> T:
    # bool is an int to Python, never to the file's author.
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise SimulationError(f"{where}: expected {kind.__name__}, got {value!r}")


def _field(entry: Mapping[str, object], key: str, kind: type[T], where: str) -> T | None:
    value = entry.get(key)
    return None if value is None else _expect(value, kind, f"{where}.{key}")


def _number(entry: Mapping[str, object], key: str, where: str) -> float | None:
    """A whole or fractional number (watts: 312 or 312.5)."""
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SimulationError(f"{where}.{key}: expected a number, got {value!r}")
    return float(value)


# --- choosing a probe -------------------------------------------------------------------


def make_probe(settings: NodeSettings) -> GpuProbe:
    """The simulation file when one is set, else NVML, else a probe that says why not."""
    if settings.gpu_simulation_file is not None:
        log.info("GPU probe: simulation file %s", settings.gpu_simulation_file)
        return SimulatedProbe(settings.gpu_simulation_file, settings)
    try:
        probe = _nvml_probe(settings)
    except DriverUnavailableError as exc:
        log.info("GPU probe: none (%s)", exc.reason)
        return NoDriverProbe(exc.reason)
    log.info("GPU probe: NVML")
    return probe


def _nvml_probe(settings: NodeSettings) -> GpuProbe:
    try:
        from tuneplane_node.gpu.nvml import NvmlProbe

        return NvmlProbe(settings)
    except DriverUnavailableError:
        raise
    except ImportError as exc:
        raise DriverUnavailableError(f"nvidia-ml-py is not installed: {exc}") from exc
    except Exception as exc:  # an old or broken binding: run without GPUs, say why
        log.exception("GPU probe: NVML failed to start")
        raise DriverUnavailableError(f"NVML probe failed to start: {exc!r}") from exc


class DriverUnavailableError(Exception):
    """The GPU driver could not be initialised; raised by a probe's constructor only."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
