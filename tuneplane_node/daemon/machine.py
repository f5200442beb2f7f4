"""The node's answers: health, inventory and the node state (cordon, drain, uncordon),
each a JSON shape of the contract (`wire.answers`) filled from the job service's result
(the jobs' answers are `render`'s).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

from tuneplane_node.clock import rfc3339
from tuneplane_node.daemon.render import encode, volume_store_json
from tuneplane_node.fabrics import FabricFacts
from tuneplane_node.gpu.breaker import BreakerState
from tuneplane_node.gpu.probe import CardFacts, CardFault, GpuSnapshot, Occupancy
from tuneplane_node.inventory import DiskReading, Filesystem, LocalDisk
from tuneplane_node.jobs import words
from tuneplane_node.jobs.words import Inventory, NodeState, NodeStatus, Standing, StoreView
from tuneplane_node.runtime.base import CacheStatus
from tuneplane_node.wire import PROTOCOL, PROTOCOLS
from tuneplane_node.wire.answers import (
    GIB,
    BreakerJson,
    CacheJson,
    CardFaultJson,
    CardJson,
    CardStateJson,
    ConditionsJson,
    DiskJson,
    FabricJson,
    FilesystemJson,
    GpuFieldsJson,
    HealthJson,
    ImageGcJson,
    ImageStoreJson,
    InventoryJson,
    IsolationJson,
    JobDiskJson,
    LocalDiskJson,
    NodeEventJson,
    NodeStateJson,
    NoticeJson,
    ProbeJson,
)
from tuneplane_node.wire.volumes import VolumeStoreJson

K = TypeVar("K")
V = TypeVar("V")

# --- answers: health ---------------------------------------------------------------------


def image_store_json(store: words.ImageStore) -> ImageStoreJson:
    return {
        "path": store.path,
        "total_bytes": store.total_bytes,
        "free_bytes": store.free_bytes,
        "used_ratio": store.used_ratio,
        "pressure": store.pressure,
        "inodes_total": store.inodes_total,
        "inodes_free": store.inodes_free,
        "inode_pressure": store.inode_pressure,
    }


def conditions_json(conditions: words.Conditions) -> ConditionsJson:
    return {
        "disk_pressure": conditions.disk_pressure,
        "pid_pressure": conditions.pid_pressure,
        "memory_pressure": conditions.memory_pressure,
        "inode_pressure": conditions.inode_pressure,
        "disk_pressure_unexplained": conditions.disk_pressure_unexplained,
    }


def job_disk_json(rule: words.DiskRule) -> JobDiskJson:
    return {"limit": rule.limit, "held_by": rule.held_by}


def image_gc_json(run: words.GcRun) -> ImageGcJson:
    return {
        "scope": run.scope,
        "removed": [
            {"image": r.image, "id": r.id, "size_bytes": r.size_bytes, "why": r.why}
            for r in run.removed
        ],
        "freed_bytes": run.freed_bytes,
        "image_store": image_store_json(run.store),
    }


def health_json(status: NodeStatus, *, features: Sequence[str] = ()) -> HealthJson:
    """Health; ``features``: the optional features the node serves (the daemon's
    routes say which)."""
    answer: dict[str, Any] = {
        "ok": status.ok,
        "protocol": PROTOCOL,
        "runtime": {"name": status.engine.engine, "version": status.engine.version},
        "series": status.series,
        "disk": _DISK.of(status.disk),
        "pending_pulls": {
            ref: {"image": view.image, "phase": view.phase, "error": view.error}
            for ref, view in status.pending.items()
        },
    }
    if status.cache is not None:
        answer["state_cache"] = cache_json(status.cache)
    if not status.ok:
        answer["error"] = status.why_not_ok()
    answer.update(_GPU_FIELDS.of(status.occupancy))
    answer["node_state"] = _NODE_STATE.of(status.node)  # new beside 0.3.15's: after them
    answer["gpu_ready"] = status.gpu.ready
    answer["gpu_not_ready_reason"] = status.gpu.reason
    answer["image_store"] = _IMAGE_STORE.of(status.image_store)
    answer["conditions"] = _CONDITIONS.of(status.conditions)
    answer["job_disk"] = _JOB_DISK.of(status.job_disk)
    answer["volume_store"] = _VOLUME_STORE.of(status.volume_store)
    answer |= {"protocols": list(PROTOCOLS), "features": list(features)}
    answer["notices"] = _NOTICES.of(status.notices)
    answer["launch_refused_reason"] = status.launch_refused
    return cast(HealthJson, answer)


class HealthAnswers:
    """Health's answer encoded, kept around the state cache's ages while every other
    part is the object it was: their sources hand out the same object until what it
    says changes (the engine's health, the occupancy, readiness, the readings, the node
    state), so one comparison of the parts says the rest of the answer is the one
    encoded before, and a health call encodes only the ages. Byte for byte
    ``encode(health_json(status, features=features))``. Used on the event loop only."""

    def __init__(self) -> None:
        self._parts: tuple[object, ...] | None = None
        self._around = (b"", b"")  # the answer before the state cache's value, and after
        # The last answer whole, by the status and features it was made of: the health
        # calls of one turn share one status (`TurnShared`), ages and all.
        self._last: tuple[NodeStatus, Sequence[str], bytes] | None = None

    def encode(self, status: NodeStatus, *, features: Sequence[str]) -> bytes:
        last = self._last
        if last is not None and last[0] is status and last[1] is features:
            return last[2]
        parts = _health_parts(status, features)
        if parts != self._parts:  # each part by identity first (a tuple's comparison)
            self._around = _around_cache(status, features)
            self._parts = parts
        head, tail = self._around
        whole = (
            head
            if status.cache is None
            else b"".join((head, encode(cache_json(status.cache)), tail))
        )
        self._last = (status, features, whole)
        return whole


def _health_parts(status: NodeStatus, features: Sequence[str]) -> tuple[object, ...]:
    pending = tuple((ref, v.image, v.phase, v.error) for ref, v in status.pending.items())
    return (
        status.engine, status.series, status.disk, status.cache is None, status.occupancy,
        status.error, status.node, status.gpu, status.image_store, status.conditions,
        status.job_disk, status.volume_store, tuple(features), pending, status.notices,
    )  # fmt: skip


def _around_cache(status: NodeStatus, features: Sequence[str]) -> tuple[bytes, bytes]:
    """The answer's members before the state cache's value and after it, encoded."""
    answer: dict[str, Any] = cast(dict[str, Any], health_json(status, features=features))
    if "state_cache" not in answer:
        return encode(answer), b""
    keys = list(answer)
    at = keys.index("state_cache")  # never first ("ok" is) nor last ("features" is)
    before = encode({key: answer[key] for key in keys[:at]})
    after = encode({key: answer[key] for key in keys[at + 1 :]})
    return before[:-1] + b',"state_cache":', b"," + after[1:]


def disk_json(reading: DiskReading | None) -> DiskJson | None:
    if reading is None:
        return None
    space = reading.space
    used = round(100.0 * (space.total - space.free) / space.total, 1) if space.total else None
    return {"path": reading.path, "used_pct": used, "free_gib": round(space.available / GIB, 2)}


def cache_json(cache: CacheStatus) -> CacheJson:
    return {
        "synced": cache.synced,
        "last_event_age_s": cache.last_event_age_s,
        "last_relist_age_s": cache.last_relist_age_s,
        "containers": cache.containers,
    }


def gpu_fields_json(occupancy: Occupancy | None) -> GpuFieldsJson:
    """The GPU part of health; all unknown (null) when the engine could not be read."""
    if occupancy is None:
        return {
            "gpus_total": None,
            "gpus_free": None,
            "gpus_reserved": None,
            "free_gpus": None,
            "external": None,
            "external_pids": None,
            "external_probe_ok": None,
            "unhealthy": None,
            "by_job": None,
            "gpu_detail": None,
            "explain": None,
            "gpu_probe": None,
            "draining": None,
            "gpu_breaker": None,
        }
    return {
        "gpus_total": occupancy.total if occupancy.known else None,
        "gpus_free": len(occupancy.available),
        "gpus_reserved": len(occupancy.reserved),
        "free_gpus": list(occupancy.free),
        "external": sorted(occupancy.external),
        "external_pids": {str(k): list(v) for k, v in sorted(occupancy.external.items())},
        "external_probe_ok": occupancy.external_probe_ok,
        "unhealthy": {str(k): v for k, v in occupancy.unhealthy.items()},
        "by_job": {str(k): v for k, v in occupancy.by_job.items()},
        "gpu_detail": _gpu_detail(occupancy),
        "explain": occupancy.explain(),
        "gpu_probe": probe_json(occupancy.gpus),
        "draining": {str(k): v for k, v in occupancy.draining.items()},
        "gpu_breaker": breaker_json(occupancy.breaker),
    }


def breaker_json(state: BreakerState | None) -> BreakerJson | None:
    if state is None:
        return None
    return {"limit": state.limit, "taken": state.taken, "kept_in": state.kept_in,
            "tripped": state.tripped}  # fmt: skip


class Last(Generic[K, V]):
    """A part of health made for the last object it was made of, which its source hands
    out again until what it says changes (the allocator's occupancy, a reading, the node
    state): building the GPU part for 8 cards was 25 us of every health call, and the
    other parts a few more. Callers only read what it returns."""

    def __init__(self, make: Callable[[K], V]) -> None:
        self.make = make
        self._last: tuple[K, V] | None = None

    def of(self, value: K) -> V:
        last = self._last
        if last is not None and last[0] is value:
            return last[1]
        made = self.make(value)
        self._last = (value, made)
        return made


_GPU_FIELDS: Last[Occupancy | None, GpuFieldsJson] = Last(gpu_fields_json)


def _gpu_detail(occupancy: Occupancy) -> list[CardStateJson]:
    """Per card: the driver's facts (null where it said nothing) and where the card is."""
    cards = {card.index: card for card in occupancy.gpus.cards} if occupancy.gpus else {}
    return [
        card_state_json(cards.get(index, CardFacts(index)), occupancy.card_state(index))
        for index in range(occupancy.total)
    ]


def card_json(card: CardFacts) -> CardJson:
    return {
        "index": card.index,
        "uuid": card.uuid,
        "name": card.name,
        "pci_bus_id": card.pci_bus_id,
        "memory_total_mib": card.memory_total_mib,
        "memory_used_mib": card.memory_used_mib,
        "temperature_c": card.temperature_c,
        "unhealthy": card.unhealthy,
        "processes": [{"pid": p.pid, "used_mib": p.used_mib} for p in card.processes],
        "numa_node": card.numa_node,
        "fault": fault_json(card.fault),
    }


def fault_json(fault: CardFault | None) -> CardFaultJson | None:
    return None if fault is None else {"scope": fault.scope, "cause": fault.cause,
                                       "since": fault.since}  # fmt: skip


def card_state_json(card: CardFacts, state: str) -> CardStateJson:
    return {**card_json(card), "state": state}


def probe_json(gpus: GpuSnapshot | None) -> ProbeJson | None:
    """Where the GPU facts come from, and why they are missing when they are."""
    if gpus is None:
        return None
    return {"source": gpus.source, "ok": gpus.ok, "error": gpus.error}


# --- answers: inventory ------------------------------------------------------------------


def isolation_json(rule: words.IsolationRule) -> IsolationJson:
    return {**dataclasses.asdict(rule), "runtimes": list(rule.runtimes)}  # type: ignore[typeddict-item]  # the same keys


def inventory_json(facts: Inventory, *, features: Sequence[str] = ()) -> InventoryJson:
    """What the machine has; ``features`` as health's."""
    machine, gpus = facts.machine, facts.gpus
    return {
        "accelerator_series": machine.series,
        "accelerator_name": gpus.common_name() if gpus else None,
        "accelerator_count": facts.accelerator_count,
        "driver": gpus.driver if gpus else None,
        "runtime": facts.runtime,
        "storage_root_visible": machine.storage_root_visible,
        "disk_free_bytes": machine.disk_free_bytes,
        "cpu_count": machine.cpu_count,
        "memory_bytes": machine.memory_bytes,
        "node_id": machine.node_id,
        "hostname": machine.hostname,
        "agent_version": machine.agent_version,
        "cuda_version": gpus.cuda if gpus else None,
        "gpus": [card_json(card) for card in gpus.cards] if gpus else [],
        "storage": [filesystem_json(entry) for entry in machine.storage],
        "local_disk": local_disk_json(machine.local_disk),
        "fabrics": [fabric_json(fabric) for fabric in machine.fabrics],
        "node_state": node_state_json(facts.node),
        "cpu_affinity": facts.cpu_affinity,
        "image_store": image_store_json(facts.image_store),
        "conditions": conditions_json(facts.conditions),
        "job_disk": job_disk_json(facts.job_disk),
        "protocols": list(PROTOCOLS),
        "features": list(features),
        "isolation": isolation_json(facts.isolation),
        "volume_store": store_json(facts.volume_store),
        "gpus_draining": (
            None if facts.draining is None else {str(k): v for k, v in facts.draining.items()}
        ),
    }


def filesystem_json(entry: Filesystem) -> FilesystemJson:
    return {
        "paths": list(entry.paths),
        "fs_type": entry.fs_type,
        "shared": entry.shared,
        "free_bytes": entry.free_bytes,
        "total_bytes": entry.total_bytes,
    }


def local_disk_json(disk: LocalDisk | None) -> LocalDiskJson | None:
    if disk is None:
        return None
    return {"free_bytes": disk.free_bytes, "total_bytes": disk.total_bytes}


def fabric_json(fabric: FabricFacts) -> FabricJson:
    return {
        "fabric": fabric.fabric,
        "hcas": list(fabric.hcas),
        "rate_gbps": fabric.rate_gbps,
        "rdma_to_jobs": fabric.rdma_to_jobs,
    }


# --- answers: cordon, drain, uncordon ------------------------------------------------------


def node_state_json(node: NodeState) -> NodeStateJson:
    return {"state": node.state, "reason": node.reason, "since": node.since}


def notice_json(standing: Standing) -> NoticeJson:
    notice = standing.notice
    deadline = rfc3339(notice.deadline) if notice.deadline is not None else None
    return {
        "source": notice.source, "kind": notice.kind, "reason": notice.reason,
        "ends_jobs": notice.ends_jobs, "deadline": deadline,
        "since": rfc3339(standing.since), "detail": notice.detail,
    }  # fmt: skip


def notices_json(notices: tuple[Standing, ...]) -> list[NoticeJson]:
    return [notice_json(standing) for standing in notices]


def node_event_json(node: NodeState, notices: Sequence[Standing]) -> NodeEventJson:
    """The node's own change, as a watch tells it."""
    return {**node_state_json(node), "notices": notices_json(tuple(notices))}


def store_json(store: StoreView | None) -> VolumeStoreJson | None:
    return volume_store_json(store) if store is not None else None


# Health's parts by the last object each was made of (`Last`).
_DISK: Last[DiskReading | None, DiskJson | None] = Last(disk_json)
_NODE_STATE: Last[NodeState, NodeStateJson] = Last(node_state_json)
_IMAGE_STORE: Last[words.ImageStore, ImageStoreJson] = Last(image_store_json)
_CONDITIONS: Last[words.Conditions, ConditionsJson] = Last(conditions_json)
_JOB_DISK: Last[words.DiskRule, JobDiskJson] = Last(job_disk_json)
_VOLUME_STORE: Last[StoreView | None, VolumeStoreJson | None] = Last(store_json)
_NOTICES: Last[tuple[Standing, ...], list[NoticeJson]] = Last(notices_json)
