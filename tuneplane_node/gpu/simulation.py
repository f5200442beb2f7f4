"""SimulatedProbe: the GPU facts from a JSON file instead of the driver."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.gpu.health import ACTIONS, CardFaults, HealthTracker
from tuneplane_node.gpu.probe import (
    LINK_KINDS,
    CardFacts,
    DistinctWarnings,
    GpuProcess,
    GpuSnapshot,
)
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


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
         "links": [[0, 1, "nvlink"], [2, 3, "pcie_switch"]],
         "numa_cpus": {"0": [0, 1], "1": [2, 3]}}

    A card's optional ``numa_node`` and the top-level ``numa_cpus`` (a NUMA node, as a
    string key, to its CPU numbers) are all the node knows of CPU affinity: a card gets
    the CPUs of its node, and none (unknown) when either is missing.

    ``xid`` lists events since the previous read, so an XID left in the file counts
    again on every read (and keeps restarting the quarantine). A card's optional
    ``recovery_action`` is the driver's (``NONE``, ``GPU_RESET``, ``NODE_REBOOT``,
    ``DRAIN_P2P``, ``DRAIN_AND_RESET``, ...) and ``resets`` how many times it was reset:
    a simulated reset is that count raised (with the XID gone from the file). The top
    level's optional ``fabric_manager`` (``Completed``, ``In Progress``, ``Not Started``:
    an NVSwitch machine's) and ``toolkit_version`` (what ``nvidia-ctk --version`` says)
    stand in for the machine's. A file that cannot be
    read or has a bad entry gives ``ok=False`` and no cards: a half-read file must not
    hide a card that is busy or broken.
    """

    source = "simulation"
    blocking = True
    reading_ttl_s = 0.0  # tests edit the file and read the answer at once

    def __init__(self, path: Path, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = Path(path)
        self._health = HealthTracker.from_settings(settings, clock=clock)
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
        numa = _parse_numa_cpus(top.get("numa_cpus", {}))
        cards = tuple(
            self._health.judge(replace(card, cpus=numa.get(card.numa_node, ())), faults)
            for card, faults in readings
        )
        return GpuSnapshot(
            source=self.source,
            ok=True,
            error=None,
            driver=_field(top, "driver", str, "top level"),
            cuda=_field(top, "cuda", str, "top level"),
            cards=tuple(sorted(cards, key=lambda c: c.index)),
            processes_ok=True,
            links=MappingProxyType(links),
            fabric=_fabric(top),
            toolkit=_field(top, "toolkit_version", str, "top level"),
        )


FABRIC_STATES = ("Completed", "In Progress", "Not Started")


def _fabric(top: Mapping[str, object]) -> str | None:
    state = _field(top, "fabric_manager", str, "top level")
    if state is not None and state not in FABRIC_STATES:
        raise SimulationError(f"top level.fabric_manager: one of {', '.join(FABRIC_STATES)}")
    return state


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
        numa_node=_numa_node(card, where),
        processes=tuple(
            _parse_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)
        ),
    )
    xids = _expect(card.get("xid", []), list, f"{where}.xid")
    action = _field(card, "recovery_action", str, where)
    if action is not None and action not in ACTIONS:
        raise SimulationError(f"{where}.recovery_action: one of {', '.join(ACTIONS)}")
    faults = CardFaults(
        ecc_uncorrected=_field(card, "ecc_uncorrected", int, where),
        retired_pages_pending=bool(_field(card, "retired_pages_pending", bool, where)),
        lost=bool(_field(card, "lost", bool, where)),
        xids=tuple(_expect(x, int, f"{where}.xid[{i}]") for i, x in enumerate(xids)),
        recovery_action=action,
        resets=_field(card, "resets", int, where),
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


def _numa_node(card: Mapping[str, object], where: str) -> int | None:
    node = _field(card, "numa_node", int, where)
    if node is not None and node < 0:
        raise SimulationError(f"{where}.numa_node: needs a node >= 0, got {node}")
    return node


def _parse_numa_cpus(data: object) -> dict[int | None, tuple[int, ...]]:
    nodes: dict[int | None, tuple[int, ...]] = {}
    for key, cpus in _expect(data, dict, "numa_cpus").items():
        where = f"numa_cpus[{key!r}]"
        if not (isinstance(key, str) and key.isdigit()):
            raise SimulationError(f"{where}: a NUMA node is a whole number as a string key")
        numbers = [_expect(cpu, int, where) for cpu in _expect(cpus, list, where)]
        if any(cpu < 0 for cpu in numbers):
            raise SimulationError(f"{where}: CPU numbers are >= 0, got {numbers}")
        nodes[int(key)] = tuple(sorted(set(numbers)))
    return nodes


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
