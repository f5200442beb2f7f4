"""The wire contract with the console: request parsing and every JSON shape. Pure data.

The only place a field name of the contract is spelt. Parsers turn request bodies into
the job service's inputs and raise `InvalidField` naming the field, so a bad request is
a 422 the console can act on, never a traceback. Renderers turn the service's typed
results into the answers of protocol 1, whose shapes a console written for 0.3.15
reads field by field: each shape is a TypedDict, so mypy holds the builders to it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from tuneplane_node.errors import InvalidField
from tuneplane_node.gpu.allocator import Occupancy
from tuneplane_node.gpu.probe import CardFacts, GpuSnapshot
from tuneplane_node.inventory import DiskReading, FabricFacts, Filesystem, LocalDisk
from tuneplane_node.jobs.results import (
    AlreadyPending,
    AlreadyRunning,
    Inventory,
    JobView,
    LaunchRequest,
    LaunchResult,
    NodeStatus,
    PendingView,
    Pulling,
    Started,
)
from tuneplane_node.runtime.base import (
    LABEL_GPUS,
    LABEL_RUN_ID,
    CacheStatus,
    ContainerSpec,
    Mount,
    container_name,
)

PROTOCOL = 1
PROTOCOL_HEADER = "X-TunePlane-Node-Protocol"
MAX_BODY_BYTES = 1024 * 1024
MAX_REFS = 10_000
MAX_REF = 300
MAX_TAIL = 100_000
DEFAULT_TAIL = 2000
MAX_GPUS = 1024
MAX_CPUS = 10_000.0
_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}")
_SIZE = re.compile(r"\d+(\.\d+)?[bkmgBKMG]?")
_DECIMAL = re.compile(r"\d+(\.\d+)?|\.\d+")
GIB = 2**30


# --- requests ---------------------------------------------------------------------------


def parse_launch(body: Mapping[str, Any]) -> LaunchRequest:
    run_id = _text(body, "run_id", required=True, limit=200)
    container = body.get("container")
    if not isinstance(container, Mapping):
        raise InvalidField("container", "required, an object")
    gpus = _empty_as(container.get("gpus"), None)
    if gpus is not None and not isinstance(gpus, list):
        raise InvalidField("container.gpus", "must be a list of card indices")
    requested = body.get("requested_gpus")
    if requested is None:  # 0.3.15 consoles may say it only through container.gpus
        requested = len(gpus or [])
    if not _is_int(requested) or not 0 <= requested <= MAX_GPUS:
        raise InvalidField("requested_gpus", f"must be a whole number from 0 to {MAX_GPUS}")
    return LaunchRequest(run_id, int(requested), parse_container(container, run_id))


def parse_container(body: Mapping[str, Any], run_id: str) -> ContainerSpec:
    name = _text(body, "container.name") or container_name(run_id)
    if not _NAME.fullmatch(name):
        raise InvalidField("container.name", "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    labels = _string_map(body, "container.labels")
    if LABEL_GPUS in labels or labels.get(LABEL_RUN_ID, run_id) != run_id:
        raise InvalidField("container.labels", f"{LABEL_GPUS} and {LABEL_RUN_ID} are the node's")
    return ContainerSpec(
        name=name,
        image=_text(body, "container.image", required=True, limit=1000),
        command=_argv(body.get("command")),
        env=_string_map(body, "container.env"),
        mounts=_mounts(body.get("mounts")),
        labels={**labels, LABEL_RUN_ID: run_id},
        workdir=_text(body, "container.workdir") or None,
        shm_size=_size(body, "container.shm_size"),
        cpu_limit=_cpus(body.get("cpu_limit")),
        memory_limit=_size(body, "container.memory_limit"),
        network=_text(body, "container.network") or "host",
        user=_text(body, "container.user") or None,
    )


def _key(field: str) -> str:
    return field.rsplit(".", 1)[-1]


def _empty_as(value: object, default: object) -> object:
    """0.3.15 consoles send every field, ``""`` for the ones they leave empty."""
    return default if value is None or value == "" else value


def _text(body: Mapping[str, Any], field: str, *, required: bool = False, limit: int = 4096) -> str:
    value = body.get(_key(field))
    if value is None or value == "":
        if required:
            raise InvalidField(field, "required, a non-empty string")
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise InvalidField(field, f"must be a string of at most {limit} characters")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _argv(value: object) -> tuple[str, ...]:
    value = _empty_as(value, [])
    # A string would need a shell to split it: the node never runs one.
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise InvalidField("container.command", "must be a list of strings (an argv)")
    return tuple(value)


def _string_map(body: Mapping[str, Any], field: str) -> dict[str, str]:
    value = _empty_as(body.get(_key(field)), {})
    if not isinstance(value, Mapping):
        raise InvalidField(field, "must be an object of strings")
    result = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise InvalidField(f"{field}.{key}", "must be a string")
        result[str(key)] = str(item)
    return result


def _mounts(value: object) -> tuple[Mount, ...]:
    value = _empty_as(value, [])
    if not isinstance(value, list):
        raise InvalidField("container.mounts", "must be a list of [host, container, read_only]")
    return tuple(_mount(entry, f"container.mounts[{i}]") for i, entry in enumerate(value))


def _mount(entry: object, field: str) -> Mount:
    if isinstance(entry, Mapping):
        entry = [entry.get("host"), entry.get("container"), entry.get("read_only", False)]
    if not isinstance(entry, list) or len(entry) not in (2, 3):
        raise InvalidField(field, "must be [host, container, read_only]")
    host, target, read_only = (*entry, False)[:3]
    for path in (host, target):
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise InvalidField(field, "host and container must be absolute paths")
    if not isinstance(read_only, bool):
        raise InvalidField(field, "read_only must be true or false")
    return Mount(host, target, read_only)


def _size(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(_key(field))
    if value is None or value == "":
        return None
    if _is_int(value) and value > 0:
        return str(value)
    if isinstance(value, str) and _SIZE.fullmatch(value):
        return value.lower()
    raise InvalidField(field, "must be a size like 512m, 16g or a number of bytes")


def _cpus(value: object) -> float | None:
    """A number of CPUs: a number, or 0.3.15's string (``""`` no limit, ``"2"``, ``"0.5"``)."""
    value = _empty_as(value, None)
    if value is None:
        return None
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField("container.cpu_limit", 'must be a number of CPUs, like 2 or "0.5"')
    if not (math.isfinite(value) and 0 < value <= MAX_CPUS):
        raise InvalidField("container.cpu_limit", f"must be more than 0 and at most {MAX_CPUS:g}")
    return float(value)


def parse_refs(body: Mapping[str, Any]) -> list[str]:
    refs = body.get("refs")
    if not isinstance(refs, list) or not all(
        isinstance(ref, str) and 0 < len(ref) <= MAX_REF for ref in refs
    ):
        raise InvalidField("refs", f"required, a list of container names (1 to {MAX_REF} long)")
    if len(refs) > MAX_REFS:
        raise InvalidField("refs", f"at most {MAX_REFS} per call")
    return refs


def parse_ref(body: Mapping[str, Any]) -> str:
    return _text(body, "ref", required=True, limit=MAX_REF)


def parse_seconds(body: Mapping[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(field, "must be a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidField(field, "must be a finite number of seconds, 0 or more")
    return seconds


def parse_tail(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_TAIL
    # isascii: "²" is a digit to str.isdigit, and not a number to int().
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_TAIL:
        raise InvalidField("tail", f"must be a whole number from 1 to {MAX_TAIL}")
    return int(value)


# --- answers: observe ------------------------------------------------------------------


class StateJson(TypedDict):
    name: str
    exists: bool
    status: str | None
    exit_code: int | None
    labels: dict[str, str]
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    oom_killed: bool


class PendingStateJson(StateJson):
    pending_phase: str
    pending_image: str
    pending_elapsed_s: float
    pending_gpus: int
    pending_bytes_done: int
    pending_bytes_total: int
    pending_layers_done: int
    pending_layers_total: int
    pending_error: str | None


def state_json(view: JobView) -> StateJson:
    """One shape for a container and a pending launch (which adds its ``pending_*``)."""
    if isinstance(view, PendingView):
        return _pending_json(view)
    return {
        "name": view.name,
        "exists": view.exists,
        "status": view.status if view.exists else None,
        "exit_code": view.exit_code,
        "labels": dict(view.labels),
        "created_at": view.created_at,
        "started_at": view.started_at,
        "finished_at": view.finished_at,
        "oom_killed": view.oom_killed,
    }


def _pending_json(view: PendingView) -> PendingStateJson:
    """A pending launch reads as a container that exists: created, or dead once failed."""
    progress = view.progress
    return {
        "name": view.ref,
        "exists": True,
        "status": "dead" if view.failed else "created",
        "exit_code": None,
        "labels": dict(view.labels),
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "oom_killed": False,
        "pending_phase": view.phase,
        "pending_image": view.image,
        "pending_elapsed_s": view.elapsed_s,
        "pending_gpus": view.requested_gpus,
        "pending_bytes_done": progress.bytes_done,
        "pending_bytes_total": progress.bytes_total,
        "pending_layers_done": progress.layers_done,
        "pending_layers_total": progress.layers_total,
        "pending_error": view.error,
    }


class ObserveJson(TypedDict):
    states: dict[str, StateJson]


def observe_json(views: Mapping[str, JobView]) -> ObserveJson:
    return {"states": {ref: state_json(view) for ref, view in views.items()}}


# --- answers: launch and the other verbs -------------------------------------------------


class StartedJson(TypedDict):
    phase: str
    container_id: str
    gpus: list[int]


class RunningJson(TypedDict):
    phase: str
    idempotent: bool
    gpus: list[int]


class PullingJson(TypedDict):
    phase: str
    image: str
    requested_gpus: int


class PendingJson(TypedDict):
    phase: str
    idempotent: bool
    image: str


LaunchJson = StartedJson | RunningJson | PullingJson | PendingJson


def launch_json(result: LaunchResult) -> LaunchJson:
    if isinstance(result, Started):
        return {"phase": "running", "container_id": result.container_id, "gpus": [*result.gpus]}
    if isinstance(result, AlreadyRunning):
        return {"phase": "running", "idempotent": True, "gpus": [*result.gpus]}
    if isinstance(result, Pulling):
        return {"phase": "pulling", "image": result.image, "requested_gpus": result.requested_gpus}
    assert isinstance(result, AlreadyPending)
    return {"phase": result.phase, "idempotent": True, "image": result.image}


class OkJson(TypedDict):
    ok: bool


class ReapJson(TypedDict):
    removed: int


class LogsJson(TypedDict):
    logs: str


class ErrorJson(TypedDict):
    detail: str


OK: OkJson = {"ok": True}


def reap_json(removed: int) -> ReapJson:
    return {"removed": removed}


def logs_json(text: str) -> LogsJson:
    return {"logs": text}


def error_json(detail: str) -> ErrorJson:
    return {"detail": detail}


# --- answers: health ---------------------------------------------------------------------


class RuntimeJson(TypedDict):
    name: str
    version: str | None


class DiskJson(TypedDict):
    path: str
    used_pct: float | None
    free_gib: float


class PendingPullJson(TypedDict):
    image: str
    phase: str
    error: str | None


class CacheJson(TypedDict):
    synced: bool
    last_event_age_s: float | None
    last_relist_age_s: float | None
    containers: int


class ProcessJson(TypedDict):
    pid: int
    used_mib: int | None


class CardJson(TypedDict):
    index: int
    uuid: str | None
    name: str | None
    pci_bus_id: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    temperature_c: int | None
    unhealthy: str | None
    processes: list[ProcessJson]


class CardStateJson(CardJson):
    state: str


class ProbeJson(TypedDict):
    source: str
    ok: bool
    error: str | None


class GpuFieldsJson(TypedDict):
    """Health's GPU part: every field null when the cards' state is unknown."""

    gpus_total: int | None
    gpus_free: int | None
    gpus_reserved: int | None
    free_gpus: list[int] | None
    external: list[int] | None
    external_pids: dict[str, list[int]] | None
    external_probe_ok: bool | None
    unhealthy: dict[str, str] | None
    by_job: dict[str, str] | None
    gpu_detail: list[CardStateJson] | None
    explain: list[str] | None
    gpu_probe: ProbeJson | None


class _HealthOptional(TypedDict, total=False):
    state_cache: CacheJson  # docker and podman only
    error: str  # when ok is false: why


class HealthJson(GpuFieldsJson, _HealthOptional):
    ok: bool
    protocol: int
    runtime: RuntimeJson
    series: str | None
    disk: DiskJson | None
    pending_pulls: dict[str, PendingPullJson]


def health_json(status: NodeStatus) -> HealthJson:
    answer: dict[str, Any] = {
        "ok": status.ok,
        "protocol": PROTOCOL,
        "runtime": {"name": status.engine.engine, "version": status.engine.version},
        "series": status.series,
        "disk": disk_json(status.disk),
        "pending_pulls": {
            ref: {"image": view.image, "phase": view.phase, "error": view.error}
            for ref, view in status.pending.items()
        },
    }
    if status.cache is not None:
        answer["state_cache"] = cache_json(status.cache)
    if not status.ok:
        answer["error"] = status.error or "the cards' occupancy could not be read"
    answer.update(gpu_fields_json(status.occupancy))
    return cast(HealthJson, answer)


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
    }


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
    }


def card_state_json(card: CardFacts, state: str) -> CardStateJson:
    return {**card_json(card), "state": state}


def probe_json(gpus: GpuSnapshot | None) -> ProbeJson | None:
    """Where the GPU facts come from, and why they are missing when they are."""
    if gpus is None:
        return None
    return {"source": gpus.source, "ok": gpus.ok, "error": gpus.error}


# --- answers: inventory ------------------------------------------------------------------


class FilesystemJson(TypedDict):
    paths: list[str]
    fs_type: str | None
    shared: bool
    free_bytes: int
    total_bytes: int


class LocalDiskJson(TypedDict):
    free_bytes: int
    total_bytes: int


class FabricJson(TypedDict):
    fabric: str
    hcas: list[str]
    rate_gbps: float | None


class InventoryJson(TypedDict):
    accelerator_series: str | None
    accelerator_name: str | None
    accelerator_count: int | None
    driver: str | None
    runtime: str | None
    storage_root_visible: bool | None
    disk_free_bytes: int | None
    cpu_count: int | None
    memory_bytes: int | None
    node_id: str | None
    hostname: str | None
    agent_version: str
    cuda_version: str | None
    gpus: list[CardJson]
    storage: list[FilesystemJson]
    local_disk: LocalDiskJson | None
    fabrics: list[FabricJson]


def inventory_json(facts: Inventory) -> InventoryJson:
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
    return {"fabric": fabric.fabric, "hcas": list(fabric.hcas), "rate_gbps": fabric.rate_gbps}
