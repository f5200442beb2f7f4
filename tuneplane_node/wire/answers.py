"""Every answer of protocol 1, as TypedDicts: the shapes, not their making (the daemon's
`render` fills them from the job service's results).

A console written for 0.3.15 reads these field by field: each shape is a TypedDict, so
mypy holds the builders to it, and `tests/unit/test_wire_answers.py` pins them key by key.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from tuneplane_node.wire.fields import Words
from tuneplane_node.wire.values import FAILED, PULLING, SIGNALLED, STARTING, STATES, WARNED
from tuneplane_node.wire.volumes import VolumeStoreJson

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
    network: str | None
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
    gpu_fault: str  # a fault of a card it holds that is the job's own (XID 13): not stopped
    disk_deleted_open_bytes: int | None
    disk_inodes: int | None
    inode_limit: int | None


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


class ObserveJson(TypedDict):
    states: dict[str, StateJson]


class NoticeJson(TypedDict):
    """A notice the node acts on: the cloud's (or the OS's) word that the machine goes
    away, or may. ``kind``: ``preempt``, ``terminate``, ``maintenance``, ``rebalance`` or
    ``shutdown``; ``ends_jobs``: whether the node drains for it (else it only cordons);
    ``deadline``: when the machine goes (null: the source gave none); ``since``: when
    the node heard it."""

    source: str
    kind: str
    reason: str
    ends_jobs: bool
    deadline: str | None
    since: str
    detail: str


class NodeEventJson(TypedDict):
    """The node's own change, as a watch hears it: its state and the notices standing."""

    state: NodeStateName
    reason: str | None
    since: str | None
    notices: list[NoticeJson]


class _JobsWatched(TypedDict, total=False):
    removed: list[str]  # with index: the refs gone since it
    full: bool  # with index: true when ``jobs`` is every job (the cursor was too old)
    node: NodeEventJson  # with index: the node itself changed since (a notice, its state)


class JobsJson(_JobsWatched):
    index: str
    jobs: dict[str, StateJson]


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
    inodes_total: int | None
    inodes_free: int | None
    inode_pressure: bool | None


class ConditionsJson(TypedDict):
    """What a console may schedule by; each null when unknown."""

    disk_pressure: bool | None
    pid_pressure: bool | None
    memory_pressure: bool | None
    inode_pressure: bool | None
    disk_pressure_unexplained: bool | None


class JobDiskJson(TypedDict):
    """``TUNEPLANE_JOB_DISK_LIMIT`` as set, and what holds a job to it."""

    limit: str
    held_by: str | None


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


FaultScope = Annotated[
    str,
    Words(
        "FaultScope",
        ("job", "card", "node"),
        "What a card's fault reaches: the job on it (told), the card (out until reset), "
        "the machine (cordoned, drained).",
    ),
]


class CardFaultJson(TypedDict):
    """A card's fault as the node judged it: ``cause`` is ``XID 48``, the driver's
    recovery action (``GPU_RESET``) or a standing fault; ``since``: RFC 3339."""

    scope: FaultScope
    cause: str
    since: str


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
    fault: CardFaultJson | None


class BreakerJson(TypedDict):
    """The circuit breaker on automatic take-outs: ``limit`` per hour, ``taken`` in the
    last hour, ``kept_in`` faulted cards it keeps in; ``tripped`` while any."""

    limit: int
    taken: int
    kept_in: int
    tripped: bool


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
    draining: dict[str, str] | None  # cards whose job is gone, not clean yet: why
    gpu_breaker: BreakerJson | None


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
    volume_store: VolumeStoreJson | None
    """The node's volume store (`GET /node/v1/volumes`' figures); null when not known."""
    notices: list[NoticeJson]
    """The cloud's (or the OS's) notices the node acts on, the most urgent first: a
    console reschedules by them before the machine is gone."""
    launch_refused_reason: str | None
    """The condition every launch is refused for now (``disk_pressure``,
    ``inode_pressure``: a ``507``), and ``ok`` is false for it; null: launches are
    taken. A console schedules elsewhere while it is set."""


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
    volume_store: VolumeStoreJson | None
    """The node's volume store; null when not known (`tuneplane-node inventory`)."""
    gpus_draining: dict[str, str] | None
    """Cards whose job's container is gone, not clean yet, and why; null when not known
    (`tuneplane-node inventory`, or the engine down)."""


class NodeStateJson(TypedDict):
    state: NodeStateName
    reason: str | None
    since: str | None
