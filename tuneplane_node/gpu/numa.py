"""Where a card sits among the machine's CPUs and memory: NUMA nodes and CPU lists, from sysfs.

A NUMA node is a number; its CPUs a sorted tuple. Every reader here answers what sysfs
says or nothing (unknown is not zero): a node that cannot be read is left out, a card
whose node the kernel does not know (``numa_node`` is -1 on a one-node machine) has none.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

NODE_SYSFS = Path("/sys/devices/system/node")
PCI_SYSFS = Path("/sys/bus/pci/devices")
CPU_ONLINE = Path("/sys/devices/system/cpu/online")
MAX_CPU = 1 << 16  # far past any machine: a list naming more is a bad file, not a host
_NODE_DIR = re.compile(r"node([0-9]+)")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``0-3,8,10-11`` (the kernel's list format) as sorted numbers; ValueError when bad."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        lo, hi = int(first), int(last or first)
        if not 0 <= lo <= hi < MAX_CPU:
            raise ValueError(f"not a CPU range: {part!r}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def node_cpus(sysfs: Path = NODE_SYSFS) -> dict[int, tuple[int, ...]]:
    """Every NUMA node of this machine with its CPUs; {} when sysfs has no node list."""
    nodes: dict[int, tuple[int, ...]] = {}
    try:
        entries = list(sysfs.iterdir())
    except OSError:
        return nodes
    for entry in entries:
        match = _NODE_DIR.fullmatch(entry.name)
        cpus = _cpulist(entry / "cpulist") if match else None
        if match and cpus is not None:
            nodes[int(match.group(1))] = cpus
    return dict(sorted(nodes.items()))


def online_cpus(path: Path = CPU_ONLINE) -> tuple[int, ...] | None:
    """The CPUs the kernel runs now; None when it cannot be read."""
    return _cpulist(path)


def pci_numa_node(bus_id: str | None, sysfs: Path = PCI_SYSFS) -> int | None:
    """The NUMA node of a PCI device (``0000:17:00.0``); None when the kernel does not say.

    NVML's bus ids have an 8-digit domain (``00000000:17:00.0``); sysfs names have 4.
    """
    if not bus_id:
        return None
    domain, _, rest = bus_id.strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    try:
        name = f"{int(head or '0', 16):04x}:{bus}:{rest}"
        node = int((sysfs / name / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _cpulist(path: Path) -> tuple[int, ...] | None:
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError) as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None
