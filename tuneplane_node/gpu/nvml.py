"""NvmlProbe: the GPU facts from the NVIDIA driver. The only module that imports ``pynvml``.

Every NVML call is guarded here: `snapshot()` never raises, and no NVML object or error
leaves this module. Per card, "not supported" and "no permission" mean *unknown*; any
other failure (GPU_IS_LOST above all) means the card is lost. Topology, driver and CUDA
versions are read once at start: they do not change while the driver is loaded. XID
events arrive on a background thread and wait in a queue for the next snapshot.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, TypeVar

import pynvml

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.gpu import numa
from tuneplane_node.gpu.health import ACTIONS, CardFaults, HealthTracker
from tuneplane_node.gpu.probe import (
    CardFacts,
    DistinctWarnings,
    DriverUnavailableError,
    GpuProcess,
    GpuSnapshot,
)
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")

MIB = 1 << 20
EVENT_WAIT_MS = 1000
# Errors that say "this card cannot tell you that", not "this card is gone".
_UNKNOWN_CODES = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_INVALID_ARGUMENT,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
_PCIE_SWITCH_LEVELS = frozenset(
    {pynvml.NVML_TOPOLOGY_INTERNAL, pynvml.NVML_TOPOLOGY_SINGLE, pynvml.NVML_TOPOLOGY_MULTIPLE}
)
_NUMA_LEVELS = frozenset({pynvml.NVML_TOPOLOGY_HOSTBRIDGE, pynvml.NVML_TOPOLOGY_NODE})
_SCOPE_NODE = pynvml.NVML_AFFINITY_SCOPE_NODE


def _optional(call: Callable[..., T], *args: Any) -> T | None:
    """``call(*args)``, or None when the card cannot answer it; lost-card errors propagate."""
    try:
        return call(*args)
    except pynvml.NVMLError as exc:
        if exc.value in _UNKNOWN_CODES:
            return None
        raise
    except pynvml.NVMLLibraryMismatchError:
        return None


def _text(value: object) -> str | None:
    """Old bindings return bytes where new ones return str."""
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _bus_key(bus_id: object) -> str | None:
    """A PCI bus id comparable across calls (domain width differs: 0000: vs 00000000:)."""
    text = _text(bus_id)
    if not text:
        return None
    domain, _, rest = text.strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    try:
        return f"{int(head or '0', 16):x}:{bus}:{rest}"
    except ValueError:
        return text.strip().lower()


def _cuda_version(value: int | None) -> str | None:
    return None if not value else f"{value // 1000}.{value % 1000 // 10}"


@dataclass(frozen=True)
class _Reading:
    card: CardFacts
    faults: CardFaults
    processes_ok: bool


class NvmlProbe:
    """The GPU probe of a machine with the NVIDIA driver. Raises DriverUnavailableError at init."""

    source = "nvml"
    blocking = True
    reading_ttl_s = 1.0  # a read is a few driver calls per card, on a worker thread

    def __init__(self, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> None:
        try:
            pynvml.nvmlInit()
        except Exception as exc:
            raise DriverUnavailableError(f"NVML did not start: {exc}") from exc
        self._closed = False
        self._health = HealthTracker.from_settings(settings, clock=clock)
        self._warnings = DistinctWarnings(log)
        self.driver = _text(self._system(pynvml.nvmlSystemGetDriverVersion))
        self.cuda = _cuda_version(self._system(pynvml.nvmlSystemGetCudaDriverVersion_v2))
        self._count = self._system(pynvml.nvmlDeviceGetCount) or 0
        handles = _start_handles(self._count)
        self.links: Mapping[tuple[int, int], str] = MappingProxyType(read_topology(handles))
        self._places = {index: read_affinity(index, handle) for index, handle in handles.items()}
        enabled = settings.local_check_gpu_health
        self._xids = XidWatcher(handles) if enabled and handles else None

    def snapshot(self) -> GpuSnapshot:
        if self._closed:
            return GpuSnapshot.failed(self.source, "GPU probe closed", driver=self.driver)
        try:
            return self._snapshot()
        except Exception as exc:  # a bug or a driver gone: say so, never raise
            self._warnings.warn("driver", f"NVML: snapshot failed: {exc!r}")
            return GpuSnapshot.failed(self.source, f"NVML: {exc}", driver=self.driver)

    def close(self) -> None:
        """Stop the XID thread and shut NVML down; later snapshots say the probe is closed."""
        if self._closed:
            return
        self._closed = True
        if self._xids is not None:
            self._xids.close()
        try:
            pynvml.nvmlShutdown()
        except Exception as exc:
            log.warning("NVML shutdown failed: %s", exc)

    def _snapshot(self) -> GpuSnapshot:
        count = max(self._count, pynvml.nvmlDeviceGetCount())
        xids = self._xids.drain() if self._xids is not None else {}
        readings = [self._read_card(i, tuple(xids.get(i, ()))) for i in range(count)]
        self._warnings.clear("driver")
        return GpuSnapshot(
            source=self.source,
            ok=True,
            error=None,
            driver=self.driver,
            cuda=self.cuda,
            cards=tuple(self._health.judge(r.card, r.faults) for r in readings),
            processes_ok=_processes_known(readings),
            links=self.links,
            fabric=read_fabric(count),
        )

    def _read_card(self, index: int, xids: tuple[int, ...]) -> _Reading:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            reading = read_card(index, handle, xids)
            reading = self._placed(reading)
        except Exception as exc:
            self._warnings.warn(("card", index), f"GPU {index} not answering: {exc!r}")
            lost = CardFaults(lost=True, xids=xids)
            return _Reading(CardFacts(index=index), lost, processes_ok=False)
        self._warnings.clear(("card", index))
        return reading

    def _placed(self, reading: _Reading) -> _Reading:
        """The card with the NUMA node and CPUs read at start (the driver's do not move)."""
        node, cpus = self._places.get(reading.card.index, (None, ()))
        return replace(reading, card=replace(reading.card, numa_node=node, cpus=cpus))

    @staticmethod
    def _system(call: Callable[[], T]) -> T | None:
        try:
            return call()
        except Exception as exc:
            log.warning("NVML: %s failed: %s", call.__name__, exc)
            return None


def _start_handles(count: int) -> dict[int, Any]:
    handles: dict[int, Any] = {}
    for index in range(count):
        try:
            handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            log.warning("GPU %d: no handle at start (%s); it will read as lost", index, exc)
    return handles


def _processes_known(readings: list[_Reading]) -> bool:
    """Every answering card listed its processes. A lost card is out anyway, so its
    unknown list does not hide the others'; but all cards lost is nothing known."""
    answering = [r for r in readings if not r.faults.lost]
    if readings and not answering:
        return False
    return all(r.processes_ok for r in answering)


def read_card(index: int, handle: Any, xids: tuple[int, ...]) -> _Reading:
    """One card's facts and fault signals. Raises when the card does not answer."""
    memory = _optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
    pci = _optional(pynvml.nvmlDeviceGetPciInfo, handle)
    processes = read_processes(handle)
    busy = _optional(pynvml.nvmlDeviceGetUtilizationRates, handle)
    milliwatts = _optional(pynvml.nvmlDeviceGetPowerUsage, handle)
    card = CardFacts(
        index=index,
        uuid=_text(_optional(pynvml.nvmlDeviceGetUUID, handle)),
        name=_text(_optional(pynvml.nvmlDeviceGetName, handle)),
        pci_bus_id=_text(pci.busId) if pci is not None else None,
        memory_total_mib=memory.total // MIB if memory is not None else None,
        memory_used_mib=memory.used // MIB if memory is not None else None,
        temperature_c=_optional(
            pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
        ),
        utilization_pct=busy.gpu if busy is not None else None,
        power_w=milliwatts / 1000 if milliwatts is not None else None,
        processes=processes or (),
    )
    return _Reading(card, read_faults(handle, xids), processes_ok=processes is not None)


def read_faults(handle: Any, xids: tuple[int, ...]) -> CardFaults:
    """The health signals the card supports; an unsupported one reads as no fault."""
    ecc = _optional(
        pynvml.nvmlDeviceGetTotalEccErrors,
        handle,
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    pending = _optional(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    remap = _optional(pynvml.nvmlDeviceGetRemappedRows, handle)
    return CardFaults(
        ecc_uncorrected=ecc,
        retired_pages_pending=pending == pynvml.NVML_FEATURE_ENABLED,
        row_remap_failure=bool(remap[3]) if remap is not None else False,
        xids=xids,
        recovery_action=read_recovery_action(handle),
    )


_FABRIC = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "Not Started",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "In Progress",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "Completed",
}  # in the order a fabric comes up; NOT_SUPPORTED: not an NVSwitch machine


def read_fabric(count: int) -> str | None:
    """The NVSwitch fabric's state, the least advanced card's; None: no card is on one,
    or the driver cannot say."""
    states = []
    for index in range(count):
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            info = _optional(pynvml.nvmlDeviceGetGpuFabricInfo, handle)
        except Exception:  # a lost card says so in its own reading
            continue
        state = _FABRIC.get(getattr(info, "state", None))
        if state is not None:
            states.append(state)
    order = list(_FABRIC.values())
    return min(states, key=order.index) if states else None


_ACTIONS = {
    getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}", None): name for name in ACTIONS
}  # an older binding lacks some: those read as unknown


def read_recovery_action(handle: Any) -> str | None:
    """The driver's recovery action for the card (driver 565+), by name; None: the driver
    or the binding cannot say."""
    field = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    if field is None:
        return None
    values = _optional(pynvml.nvmlDeviceGetFieldValues, handle, [field])
    if not values or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
        return None
    return _ACTIONS.get(int(values[0].value.uiVal))


def read_processes(handle: Any) -> tuple[GpuProcess, ...] | None:
    """Compute processes on the card; None when the driver will not list them."""
    found = _optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if found is None:
        return None
    return tuple(
        GpuProcess(
            pid=int(p.pid),
            used_mib=int(p.usedGpuMemory) // MIB if p.usedGpuMemory is not None else None,
        )
        for p in found
    )


# --- topology ---------------------------------------------------------------------------


def read_topology(handles: Mapping[int, Any]) -> dict[tuple[int, int], str]:
    """``(lo, hi) -> kind`` for every pair closer than across the system.

    A card or pair that cannot answer is left out: it counts as across the system.
    """
    places: dict[int, _Place] = {}
    for index, handle in handles.items():
        try:
            places[index] = _Place(handle, _bus_key(_pci_bus(handle)), _nvlink_peers(handle))
        except Exception as exc:
            log.warning("GPU %d: topology unknown: %s", index, exc)
    links: dict[tuple[int, int], str] = {}
    for lo, hi in itertools.combinations(sorted(places), 2):
        try:
            kind = _link_kind(places[lo], places[hi])
        except Exception as exc:
            log.warning("GPUs %d and %d: topology unknown: %s", lo, hi, exc)
            continue
        if kind is not None:
            links[(lo, hi)] = kind
    return links


def _link_kind(a: _Place, b: _Place) -> str | None:
    if _nvlinked(a, b):
        return "nvlink"
    level = _optional(pynvml.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle)
    if level in _PCIE_SWITCH_LEVELS:
        return "pcie_switch"
    return "numa" if level in _NUMA_LEVELS else None


def _pci_bus(handle: Any) -> object:
    pci = _optional(pynvml.nvmlDeviceGetPciInfo, handle)
    return pci.busId if pci is not None else None


@dataclass(frozen=True)
class _NvLinkPeers:
    gpus: frozenset[str]  # bus ids of cards at the far end of an active link
    switches: frozenset[str]  # bus ids of NVSwitches at the far end of an active link


@dataclass(frozen=True)
class _Place:
    """Where a card sits: what topology needs of it."""

    handle: Any
    bus: str | None
    peers: _NvLinkPeers


def _nvlink_peers(handle: Any) -> _NvLinkPeers:
    gpus: set[str] = set()
    switches: set[str] = set()
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        if _optional(pynvml.nvmlDeviceGetNvLinkState, handle, link) != pynvml.NVML_FEATURE_ENABLED:
            continue
        remote = _optional(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        bus = _bus_key(remote.busId) if remote is not None else None
        if bus is None:
            continue
        kind = _optional(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        (switches if kind == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH else gpus).add(bus)
    return _NvLinkPeers(frozenset(gpus), frozenset(switches))


def _nvlinked(a: _Place, b: _Place) -> bool:
    """Linked directly, or through a shared NVSwitch (HGX boards: the far end is a switch)."""
    if b.bus in a.peers.gpus or a.bus in b.peers.gpus:
        return True
    return bool(a.peers.switches & b.peers.switches)


# --- CPU affinity -----------------------------------------------------------------------


def read_affinity(index: int, handle: Any) -> tuple[int | None, tuple[int, ...]]:
    """The card's NUMA node and that node's CPUs: the driver's memory and CPU affinity,
    else sysfs (the PCI device's ``numa_node``, the node's ``cpulist``); unknown stays so."""
    try:
        nodes = mask_numbers(_optional(pynvml.nvmlDeviceGetMemoryAffinity, handle, 4, _SCOPE_NODE))
        node = nodes[0] if len(nodes) == 1 else numa.pci_numa_node(_text(_pci_bus(handle)))
        words = max(16, -(-(os.cpu_count() or 1) // 64))
        cpus = mask_numbers(
            _optional(pynvml.nvmlDeviceGetCpuAffinityWithinScope, handle, words, _SCOPE_NODE)
        )
    except Exception as exc:  # old bindings lack these calls; a card gone says so later
        log.warning("GPU %d: NUMA node and CPUs unknown: %s", index, exc)
        return None, ()
    if not cpus and node is not None:
        cpus = numa.node_cpus().get(node, ())
    return node, cpus


def mask_numbers(words: Any) -> tuple[int, ...]:
    """The set bits of an array of 64-bit words, bit 0 of word 0 first; () for None."""
    if words is None:
        return ()
    return tuple(
        64 * position + bit
        for position, word in enumerate(words)
        for bit in range(64)
        if int(word) >> bit & 1
    )


# --- XID events -------------------------------------------------------------------------


class XidWatcher:
    """A named daemon thread waiting on an NVML event set for critical XID errors.

    Waits in ``EVENT_WAIT_MS`` slices so `close()` stops it within about a second.
    Events queue as ``index -> [xid, ...]`` until `drain()` hands them to a snapshot.
    """

    def __init__(self, handles: Mapping[int, Any]) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[int]] = {}
        self._stop = threading.Event()
        self._by_handle = {_address(h): i for i, h in handles.items()}
        self._warnings = DistinctWarnings(log)
        self._events: Any = None
        self._thread: threading.Thread | None = None
        try:
            self._events = pynvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("NVML: no event set, XID errors will not be seen: %s", exc)
            return
        if not [i for i, h in handles.items() if self._register(i, h)]:
            log.warning("NVML: no card reports XID events; XID errors will not be seen")
            return
        self._thread = threading.Thread(target=self._run, name="tuneplane-nvml-xid", daemon=True)
        self._thread.start()

    def drain(self) -> dict[int, list[int]]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * EVENT_WAIT_MS / 1000)
            if self._thread.is_alive():
                log.warning("NVML: XID thread did not stop; leaving its event set")
                return
        if self._events is not None:
            try:
                pynvml.nvmlEventSetFree(self._events)
            except Exception as exc:
                log.warning("NVML: freeing the event set failed: %s", exc)

    def _register(self, index: int, handle: Any) -> bool:
        xid = pynvml.nvmlEventTypeXidCriticalError
        try:
            if not pynvml.nvmlDeviceGetSupportedEventTypes(handle) & xid:
                return False
            pynvml.nvmlDeviceRegisterEvents(handle, xid, self._events)
        except Exception as exc:
            log.warning("GPU %d: cannot watch XID events: %s", index, exc)
            return False
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._record(pynvml.nvmlEventSetWait_v2(self._events, EVENT_WAIT_MS))
            except pynvml.NVMLError_Timeout:
                continue
            except Exception as exc:  # GPU lost, driver gone: keep trying, quietly
                self._warnings.warn("wait", f"NVML: waiting for XID events failed: {exc!r}")
                self._stop.wait(EVENT_WAIT_MS / 1000)
                continue
            self._warnings.clear("wait")

    def _record(self, data: Any) -> None:
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return
        index = self._by_handle.get(_address(data.device))
        if index is None:
            index = _optional(pynvml.nvmlDeviceGetIndex, data.device)
        if index is None:
            log.warning("NVML: XID %d on a card not watched", data.eventData)
            return
        with self._lock:
            self._pending.setdefault(index, []).append(int(data.eventData))


def _address(handle: Any) -> int | None:
    """A device handle's pointer value: the same card gives the same handle in events."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def library_version() -> str:
    """The NVML library's version, or why there is none (``--version``): no card is read."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"unavailable ({exc})"
    try:
        return str(_text(pynvml.nvmlSystemGetNVMLVersion()))
    finally:
        pynvml.nvmlShutdown()
