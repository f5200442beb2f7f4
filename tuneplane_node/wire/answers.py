"""Every answer of protocol 1, as TypedDicts built from the job service's typed results.

A console written for 0.3.15 reads these field by field: each shape is a TypedDict, so
mypy holds the builders to it, and `tests/test_wire.py` pins them key by key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypedDict, cast

import orjson

from tuneplane_node.errors import FieldError
from tuneplane_node.gpu.allocator import Occupancy
from tuneplane_node.gpu.probe import CardFacts, GpuSnapshot
from tuneplane_node.inventory import DiskReading, FabricFacts, Filesystem, LocalDisk
from tuneplane_node.jobs import results
from tuneplane_node.jobs.nodestate import STATES, NodeState
from tuneplane_node.jobs.pending import FAILED, PULLING, STARTING
from tuneplane_node.jobs.results import (
    Inventory,
    JobChanges,
    JobView,
    NodeStatus,
    PendingView,
    StoppedView,
)
from tuneplane_node.jobs.stopper import SIGNALLED, WARNED
from tuneplane_node.runtime.base import HIDDEN_LABELS, CacheStatus, ContainerState, LogText
from tuneplane_node.wire import PROTOCOL, PROTOCOLS
from tuneplane_node.wire.fields import Words

GIB = 2**30

# The words of the answers' statuses and phases, each an enum of the OpenAPI document.
JOB_STATUSES = ("created", "running", "paused", "restarting", "removing", "stopping", "exited")
JobStatus = Annotated[
    str,
    Words(
        "JobStatus",
        (*JOB_STATUSES, "dead"),
        "A container's status, in docker's words (libpod's configured, initialized and "
        "stopped read as created and exited); a pending launch is created, or dead once "
        "failed.",
    ),
]
PendingPhase = Annotated[
    str, Words("PendingPhase", (PULLING, STARTING, FAILED), "Where a pending launch is.")
]
LaunchPhase = Annotated[
    str,
    Words(
        "LaunchPhase",
        ("running", "exited", PULLING, STARTING, FAILED),
        "What a launch did: runs, or pends; `exited` only for `relaunch: false`.",
    ),
]
StopPhase = Annotated[
    str, Words("StopPhase", (WARNED, SIGNALLED), "Which signal of a stop under way went out.")
]
NodeStateName = Annotated[
    str, Words("NodeStateName", STATES, "Whether the node takes launches (ready) or not.")
]


def encode(answer: object) -> bytes:
    """An answer's JSON text. orjson: 37 us where json.dumps takes 509 for a 300-ref observe.
    The same keys, values and order as json.dumps; compact, and UTF-8 where json.dumps
    escapes (both are the same JSON to any reader)."""
    return orjson.dumps(answer)


# --- answers: observe ------------------------------------------------------------------


class StateJson(TypedDict):
    name: str
    exists: bool
    status: JobStatus | None
    exit_code: int | None
    labels: dict[str, str]
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    oom_killed: bool
    stop_signal: str | None
    read_only_root: bool | None
    userns: str | None
    userns_note: str | None
    runtime: str | None


class _StoppingOptional(TypedDict, total=False):
    note: str  # "warning skipped: not caught": the job has no handler for the warning


class StoppingJson(_StoppingOptional):
    phase: StopPhase
    since: str


class StoppedStateJson(StateJson, total=False):
    stop_reason: str
    stopping: StoppingJson
    disk_used_bytes: int | None
    disk_limit_bytes: int | None


class PendingStateJson(StateJson):
    pending_phase: PendingPhase
    pending_image: str
    pending_elapsed_s: float
    pending_gpus: int
    pending_bytes_done: int
    pending_bytes_total: int
    pending_layers_done: int
    pending_layers_total: int
    pending_error: str | None
    pending_rate_bytes_per_s: float | None
    pending_eta_s: float | None


def state_json(view: JobView) -> StateJson:
    """One shape for a container and a pending launch (which adds its ``pending_*``);
    a container the node stopped itself (a drain, its disk) adds its ``stop_reason``, one
    a stop is under way for its ``stopping``, a running one the disk monitor measured
    (or one stopped for its disk) its ``disk_used_bytes`` and ``disk_limit_bytes``."""
    if isinstance(view, PendingView):
        return _pending_json(view)
    if isinstance(view, StoppedView):
        return _stopped_json(view)
    return _container_json(view)


def _stopped_json(view: StoppedView) -> StoppedStateJson:
    shown: StoppedStateJson = {**_container_json(view.state)}  # type: ignore[typeddict-item]
    if view.stop_reason:
        shown["stop_reason"] = view.stop_reason
    if view.stopping:
        stopping: StoppingJson = {"phase": view.stopping.phase, "since": view.stopping.since}
        if view.stopping.note:
            stopping["note"] = view.stopping.note
        shown["stopping"] = stopping
    if view.disk:
        shown["disk_used_bytes"] = view.disk.used_bytes
        shown["disk_limit_bytes"] = view.disk.limit_bytes
    return shown


def _container_json(view: ContainerState) -> StateJson:
    return {
        "name": view.name,
        "exists": view.exists,
        "status": view.status if view.exists else None,
        "exit_code": view.exit_code,
        "labels": shown_labels(view.labels),
        "created_at": view.created_at,
        "started_at": view.started_at,
        "finished_at": view.finished_at,
        "oom_killed": view.oom_killed,
        "stop_signal": view.stop_signal if view.exists else None,
        "read_only_root": view.read_only_root if view.exists else None,
        "userns": view.userns,
        "userns_note": view.userns_note,
        "runtime": view.runtime,
    }


def shown_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A job's labels as answers show them: the node's own (`HIDDEN_LABELS`) left out."""
    return {key: value for key, value in labels.items() if key not in HIDDEN_LABELS}


def _pending_json(view: PendingView) -> PendingStateJson:
    """A pending launch reads as a container that exists: created, or dead once failed."""
    progress = view.progress
    return {
        "name": view.ref,
        "exists": True,
        "status": "dead" if view.failed else "created",
        "exit_code": None,
        "labels": shown_labels(view.labels),
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "oom_killed": False,
        "stop_signal": view.stop_signal,
        "read_only_root": view.read_only_root,
        "userns": None,  # decided, and said, once the container is made
        "userns_note": None,
        "runtime": None,
        "pending_phase": view.phase,
        "pending_image": view.image,
        "pending_elapsed_s": view.elapsed_s,
        "pending_gpus": view.requested_gpus,
        "pending_bytes_done": progress.bytes_done,
        "pending_bytes_total": progress.bytes_total,
        "pending_layers_done": progress.layers_done,
        "pending_layers_total": progress.layers_total,
        "pending_error": view.error,
        "pending_rate_bytes_per_s": view.rate_bytes_per_s,
        "pending_eta_s": view.eta_s,
    }


class ObserveJson(TypedDict):
    states: dict[str, StateJson]


def observe_json(views: Mapping[str, JobView]) -> ObserveJson:
    return {"states": {ref: state_json(view) for ref, view in views.items()}}


def encode_observe(views: Mapping[str, JobView]) -> bytes:
    """``encode(observe_json(views))``, byte for byte, with each cached state's JSON
    encoded once (building and encoding 300 states' dicts was half of observe's time)."""
    parts = [_STATES.entry(ref, view) for ref, view in views.items()]
    return b'{"states":{' + b",".join(parts) + b"}}"


class EncodedStates:
    """A container's ``"name":{state}`` member of an observe answer, by the state object:
    the state cache hands out the same object from one observe to the next until the
    engine changes it.

    A stopped container's view is a new pair on every call around the cache's same
    state: it is kept by that state and its reason. An entry keeps its state alive (an
    ``id`` names one object only while it lives), so the memo is cleared whenever it
    holds ``limit``: old states go, memory stays bounded. Used on the event loop only."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._memo: dict[int, tuple[ContainerState, object, bytes]] = {}

    def entry(self, ref: str, view: JobView) -> bytes:
        state, reason = _behind(view)
        # Only a cached state asked by its name: a pending launch's progress moves, and a
        # missing container is a new object on every call.
        if not (isinstance(state, ContainerState) and state.exists and state.name == ref):
            return _member(ref, view)
        hit = self._memo.get(id(state))
        if hit is not None and hit[0] is state and hit[1] == reason:
            return hit[2]
        if len(self._memo) >= self.limit:
            self._memo.clear()
        data = _member(ref, view)
        self._memo[id(state)] = (state, reason, data)
        return data


def _behind(view: JobView) -> tuple[ContainerState | PendingView, object]:
    """The state behind a view (the cache's object for a container), and the facts the
    service paired with it (the stop reason, the stop under way)."""
    if isinstance(view, StoppedView):
        return view.state, (view.stop_reason, view.stopping, view.disk)
    return view, None


def _member(ref: str, view: JobView) -> bytes:
    return orjson.dumps(ref) + b":" + orjson.dumps(state_json(view))


_STATES = EncodedStates()


# --- answers: the jobs list and its watch ------------------------------------------------


class _JobsWatched(TypedDict, total=False):
    removed: list[str]  # with index: the refs gone since it
    full: bool  # with index: true when ``jobs`` is every job (the cursor was too old)


class JobsJson(_JobsWatched):
    index: str
    jobs: dict[str, StateJson]


def jobs_json(changes: JobChanges, *, watched: bool) -> JobsJson:
    """Every job (the list), or with ``watched`` what changed since the query's index."""
    answer: JobsJson = {
        "index": str(changes.index),
        "jobs": {ref: state_json(view) for ref, view in changes.jobs.items()},
    }
    if watched:
        answer["removed"] = list(changes.removed)
        answer["full"] = changes.full
    return answer


def encode_jobs(changes: JobChanges, *, watched: bool) -> bytes:
    """``encode(jobs_json(...))``, byte for byte, each cached state encoded once (as
    `encode_observe`); the list, once per index: the change log's position names one set
    of views, so consoles listing a node that did not change get the same bytes."""
    if not watched:
        return _LISTING.of(changes)
    return _encode_jobs(changes, watched=True)


class LastListing:
    """The list's answer for the last index it was built for. Used on the loop only."""

    def __init__(self) -> None:
        self._last: tuple[str, bytes] = ("", b"")

    def of(self, changes: JobChanges) -> bytes:
        index = str(changes.index)
        if self._last[0] != index:
            self._last = (index, _encode_jobs(changes, watched=False))
        return self._last[1]


_LISTING = LastListing()


def _encode_jobs(changes: JobChanges, *, watched: bool) -> bytes:
    parts = [_STATES.entry(ref, view) for ref, view in changes.jobs.items()]
    head = b'{"index":' + orjson.dumps(str(changes.index)) + b',"jobs":{' + b",".join(parts)
    if not watched:
        return head + b"}}"
    full = b"true" if changes.full else b"false"
    return head + b'},"removed":' + orjson.dumps(list(changes.removed)) + b',"full":' + full + b"}"


# --- answers: launch and the other verbs -------------------------------------------------


class StartedJson(TypedDict):
    phase: LaunchPhase
    container_id: str
    gpus: list[int]
    ref: str


class RunningJson(TypedDict):
    phase: LaunchPhase
    idempotent: bool
    gpus: list[int]
    ref: str


class ExitedJson(TypedDict):
    phase: LaunchPhase
    idempotent: bool
    exit_code: int | None
    ref: str


class PullingJson(TypedDict):
    phase: LaunchPhase
    image: str
    requested_gpus: int
    ref: str


class PendingJson(TypedDict):
    phase: LaunchPhase
    idempotent: bool
    image: str
    ref: str


LaunchJson = StartedJson | RunningJson | ExitedJson | PullingJson | PendingJson


def launch_json(result: results.LaunchResult, *, ref: str) -> LaunchJson:
    """What the launch did, and the ``ref`` it made (the name every other verb takes:
    a run id outside ``[a-zA-Z0-9_.-]`` gets a hashed one)."""
    if isinstance(result, results.Started):
        gpus = [*result.gpus]
        return {"phase": "running", "container_id": result.container_id, "gpus": gpus, "ref": ref}
    if isinstance(result, results.AlreadyRunning):
        return {"phase": "running", "idempotent": True, "gpus": [*result.gpus], "ref": ref}
    if isinstance(result, results.AlreadyExited):
        return {"phase": "exited", "idempotent": True, "exit_code": result.exit_code, "ref": ref}
    if isinstance(result, results.Pulling):
        wanted = result.requested_gpus
        return {"phase": "pulling", "image": result.image, "requested_gpus": wanted, "ref": ref}
    assert isinstance(result, results.AlreadyPending)
    return {"phase": result.phase, "idempotent": True, "image": result.image, "ref": ref}


class OkJson(TypedDict):
    ok: bool


class ReapJson(TypedDict):
    removed: int


class _LogsOptional(TypedDict, total=False):
    truncated: bool  # only when the byte cap cut older output


class LogsJson(_LogsOptional):
    logs: str


class FieldErrorJson(TypedDict):
    field: str
    code: str
    detail: str


class _ErrorOptional(TypedDict, total=False):
    errors: list[FieldErrorJson]  # a request error's bad fields, the detail's first
    # An insufficient_storage of the engine's store: its figures (null when unknown).
    needed_bytes: int | None
    free_bytes: int | None
    freeable_bytes: int | None
    high_percent: int | None


class ErrorJson(_ErrorOptional):
    detail: str
    code: str


OK: OkJson = {"ok": True}


def reap_json(removed: int) -> ReapJson:
    return {"removed": removed}


def logs_json(text: LogText) -> LogsJson:
    """0.3.15's shape; ``truncated`` is added only when the cap cut the answer."""
    answer: LogsJson = {"logs": text.text}
    if text.truncated:
        answer["truncated"] = True
    return answer


def error_json(
    detail: str,
    code: str,
    errors: Sequence[FieldError] = (),
    figures: Mapping[str, int | None] | None = None,
) -> ErrorJson:
    """0.3.15's ``detail``, the error's ``code``, a request error's bad fields, and a
    storage refusal's figures."""
    answer: ErrorJson = {"detail": detail, "code": code}
    if figures:
        answer.update(figures)  # type: ignore[typeddict-item]  # the four keys above
    if errors:
        answer["errors"] = [
            {"field": error.field, "code": error.code, "detail": error.detail} for error in errors
        ]
    return answer


# --- answers: health ---------------------------------------------------------------------


class RuntimeJson(TypedDict):
    name: str
    version: str | None


class DiskJson(TypedDict):
    path: str
    used_pct: float | None
    free_gib: float


class ImageStoreJson(TypedDict):
    """The filesystem of the engine's data root; each value null when unknown (a remote
    engine, a runtime without images)."""

    path: str | None
    total_bytes: int | None
    free_bytes: int | None
    used_ratio: float | None
    pressure: bool | None


def image_store_json(store: results.ImageStore) -> ImageStoreJson:
    return {
        "path": store.path,
        "total_bytes": store.total_bytes,
        "free_bytes": store.free_bytes,
        "used_ratio": store.used_ratio,
        "pressure": store.pressure,
    }


class ConditionsJson(TypedDict):
    """What a console may schedule by; each null when unknown."""

    disk_pressure: bool | None
    pid_pressure: bool | None
    memory_pressure: bool | None


def conditions_json(conditions: results.Conditions) -> ConditionsJson:
    return {
        "disk_pressure": conditions.disk_pressure,
        "pid_pressure": conditions.pid_pressure,
        "memory_pressure": conditions.memory_pressure,
    }


class JobDiskJson(TypedDict):
    """``TUNEPLANE_JOB_DISK_LIMIT`` as set, and what holds a job to it."""

    limit: str
    held_by: str | None


def job_disk_json(rule: results.DiskRule) -> JobDiskJson:
    return {"limit": rule.limit, "held_by": rule.held_by}


class IsolationJson(TypedDict):
    """``TUNEPLANE_JOB_USERNS``, ``TUNEPLANE_JOB_SANDBOX`` and ``TUNEPLANE_SANDBOX_RUNTIME``
    as set; whether the engine gives jobs their own user namespace and has the sandbox
    runtime (null: it could not say), and its runtimes."""

    userns: str
    sandbox: str
    sandbox_runtime: str
    own_userns: bool | None
    sandbox_available: bool | None
    runtimes: list[str]


def isolation_json(rule: results.IsolationRule) -> IsolationJson:
    return {**dataclasses.asdict(rule), "runtimes": list(rule.runtimes)}  # type: ignore[typeddict-item]  # the same keys


class RemovedImageJson(TypedDict):
    image: str
    id: str
    size_bytes: int
    why: str


class ImageGcJson(TypedDict):
    """One image GC run: what it removed, least recently used first, and the store after."""

    scope: str
    removed: list[RemovedImageJson]
    freed_bytes: int
    image_store: ImageStoreJson


def image_gc_json(run: results.GcRun) -> ImageGcJson:
    return {
        "scope": run.scope,
        "removed": [
            {"image": r.image, "id": r.id, "size_bytes": r.size_bytes, "why": r.why}
            for r in run.removed
        ],
        "freed_bytes": run.freed_bytes,
        "image_store": image_store_json(run.store),
    }


class PendingPullJson(TypedDict):
    image: str
    phase: PendingPhase
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
    numa_node: int | None


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
    node_state: NodeStateJson
    gpu_ready: bool | None
    """Whether a launch asking for cards can run here: the card count is known and the
    engine can hand cards to a container (an ``nvidia`` runtime, a CDI specification of
    each card); null on a node without cards. False: ``gpu_not_ready_reason`` says why."""
    gpu_not_ready_reason: str | None
    image_store: ImageStoreJson
    conditions: ConditionsJson
    job_disk: JobDiskJson
    protocols: list[int]
    features: list[str]


def health_json(status: NodeStatus, *, features: Sequence[str] = ()) -> HealthJson:
    """Health; ``features``: the optional features the node serves (the daemon's
    routes say which)."""
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
    answer.update(_GPU_FIELDS.of(status.occupancy))
    answer["node_state"] = node_state_json(status.node)  # new beside 0.3.15's: after them
    answer["gpu_ready"] = status.gpu.ready
    answer["gpu_not_ready_reason"] = status.gpu.reason
    answer["image_store"] = image_store_json(status.image_store)
    answer["conditions"] = conditions_json(status.conditions)
    answer["job_disk"] = job_disk_json(status.job_disk)
    answer |= {"protocols": list(PROTOCOLS), "features": list(features)}
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


class LastGpuFields:
    """The GPU part of health for the last occupancy object, which the allocator hands
    out again until a container, a claim or the probe's reading changes: building it
    for 8 cards was 25 us of every health call. Callers only read what it returns."""

    def __init__(self) -> None:
        self._last: tuple[Occupancy | None, GpuFieldsJson] = (None, gpu_fields_json(None))

    def of(self, occupancy: Occupancy | None) -> GpuFieldsJson:
        last, fields = self._last
        if occupancy is not last:
            fields = gpu_fields_json(occupancy)
            self._last = (occupancy, fields)
        return fields


_GPU_FIELDS = LastGpuFields()


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
    rdma_to_jobs: bool


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
    node_state: NodeStateJson
    cpu_affinity: str
    image_store: ImageStoreJson
    conditions: ConditionsJson
    job_disk: JobDiskJson
    protocols: list[int]
    features: list[str]
    isolation: IsolationJson


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


class NodeStateJson(TypedDict):
    state: NodeStateName
    reason: str | None
    since: str | None


def node_state_json(node: NodeState) -> NodeStateJson:
    return {"state": node.state, "reason": node.reason, "since": node.since}
