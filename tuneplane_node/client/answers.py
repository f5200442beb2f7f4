"""The node's answers as typed objects (the image and volume verbs' in `images` and
`volumes`, read the same way).

Tolerant on purpose: a key this client does not know (a newer node's) is skipped, and a
key the node did not send (an older node's) is its field's default, so neither end
breaks the other. Every object keeps the answer it was read from in ``raw``, so a newer
field is one ``raw["..."]`` away. Statuses and phases are `str` enums and times aware
`datetime`s (`words`); any other value is taken as the node gave it. Each class holds
the fields of one shape of the contract, every one of them: `tests/unit/test_client_contract.py`
fails when a class and the node's shape (`tuneplane_node.wire`) differ by a field, either
way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from tuneplane_node.client.words import (
    FaultScope,
    JobStatus,
    LaunchPhase,
    NodeStateName,
    PendingPhase,
    StopPhase,
    moment,
    word,
)

Json = Mapping[str, Any]


class Answer:
    """An answer's object. ``raw``: the JSON it was read from, every key of it.
    ``convert``: how a field is read from its JSON value (a nested object, a list)."""

    raw: Json = MappingProxyType({})
    convert: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}


Converters = dict[str, Any]  # a field's name -> what reads it (3.10 reads the hint)
A = TypeVar("A", bound=Answer)


def build(cls: type[A], data: object) -> A:
    """``cls`` from an answer's object: its known keys, converted as ``cls.convert`` says."""
    given: Json = data if isinstance(data, Mapping) else {}
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        if spec.name in given:
            convert = cls.convert.get(spec.name)
            value = given[spec.name]
            values[spec.name] = value if convert is None or value is None else convert(value)
    answer = cls(**values)
    object.__setattr__(answer, "raw", dict(given))  # frozen, and no field: never compared
    return answer


def each(cls: type[A]) -> Callable[[Any], tuple[A, ...]]:
    return lambda items: tuple(build(cls, item) for item in items)


def by_ref(cls: type[A]) -> Callable[[Any], dict[str, A]]:
    return lambda items: {str(ref): build(cls, item) for ref, item in dict(items).items()}


def one(cls: type[A]) -> Callable[[Any], A]:
    return lambda item: build(cls, item)


@dataclass(frozen=True)
class Stopping(Answer):
    """A stop under way: ``phase`` (warned, signalled) and since when; ``note``: why it
    went otherwise than asked (``warning skipped: not caught``)."""

    phase: StopPhase | None = None
    since: datetime | None = None
    note: str | None = None

    convert: ClassVar[Converters] = {"phase": word(StopPhase), "since": moment}


@dataclass(frozen=True)
class JobState(Answer):
    """One job as observe, the list and the watch show it: a container, or a pending
    launch (``pending_phase`` set: pulling, then starting, or failed)."""

    name: str = ""
    exists: bool = False
    status: JobStatus | None = None  # None: no container
    exit_code: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    oom_killed: bool = False
    stop_signal: str | None = None
    read_only_root: bool | None = None  # its image filesystem read-only; None: not known
    network: str | None = None  # host, isolated, sealed, bridge, none, fabric:<name>; None: unknown
    userns: str | None = None  # "own": a user namespace of its own; "host"; None: not known
    userns_note: str | None = None  # why it keeps the host's; how its mounts reach its own
    runtime: str | None = None  # its OCI runtime (runsc: sandboxed); None: not known
    stop_reason: str | None = None  # the node stopped it itself (a drain, disk_limit...)
    stopping: Stopping | None = None
    disk_used_bytes: int | None = None  # written to the engine's disk (running, or at a stop)
    disk_limit_bytes: int | None = None
    gpu_fault: str | None = None  # a job-scope fault of a card it holds (XID 13): no stop
    disk_deleted_open_bytes: int | None = None  # of disk_used_bytes: deleted files held open
    disk_inodes: int | None = None  # the inodes it made there
    inode_limit: int | None = None
    pending_phase: PendingPhase | None = None
    pending_image: str | None = None
    pending_elapsed_s: float | None = None
    pending_gpus: int | None = None
    pending_bytes_done: int | None = None
    pending_bytes_total: int | None = None
    pending_layers_done: int | None = None
    pending_layers_total: int | None = None
    pending_error: str | None = None
    pending_rate_bytes_per_s: float | None = None  # None while unknown, never 0
    pending_eta_s: float | None = None

    convert: ClassVar[Converters] = {"stopping": one(Stopping), "status": word(JobStatus)}
    convert |= {"created_at": moment, "started_at": moment, "finished_at": moment}
    convert |= {"pending_phase": word(PendingPhase)}

    @property
    def pending(self) -> bool:
        """A launch with no container yet (or one that failed before it had one)."""
        return self.pending_phase is not None

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass(frozen=True)
class Launched(Answer):
    """A launch's answer: ``phase`` running (it has a container) or pulling (it waits
    for its image; observe or watch it), or exited (``relaunch=False``: the run's job
    ended, with ``exit_code``); ``idempotent``: the same run was already there."""

    phase: LaunchPhase | None = None
    ref: str = ""  # the job's ref; "" from a node before the launch answer carried it
    container_id: str | None = None
    gpus: tuple[int, ...] = ()
    idempotent: bool = False
    image: str | None = None
    requested_gpus: int | None = None
    exit_code: int | None = None

    convert: ClassVar[Converters] = {"gpus": tuple, "phase": word(LaunchPhase)}


@dataclass(frozen=True)
class NodeState(Answer):
    """Whether the node takes launches: ready, cordoned, draining or drained."""

    state: NodeStateName | None = None
    reason: str | None = None
    since: datetime | None = None

    convert: ClassVar[Converters] = {"state": word(NodeStateName), "since": moment}


@dataclass(frozen=True)
class Runtime(Answer):
    name: str = ""
    version: str | None = None


@dataclass(frozen=True)
class ImageStore(Answer):
    """The filesystem of the engine's data root; a figure is None when the node cannot
    know it (a remote engine, the process runtime)."""

    path: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    used_ratio: float | None = None
    pressure: bool | None = None
    inodes_total: int | None = None
    inodes_free: int | None = None
    inode_pressure: bool | None = None


@dataclass(frozen=True)
class VolumeStore(Answer):
    """The volume store's filesystem (a figure None when it cannot be read), the bytes
    of its own entries and partial files, and its eviction thresholds."""

    path: str = ""
    total_bytes: int | None = None
    free_bytes: int | None = None
    used_bytes: int | None = None
    high_percent: int | None = None
    low_percent: int | None = None


@dataclass(frozen=True)
class Conditions(Answer):
    """What a console may schedule by; None: the node cannot say (or does not)."""

    disk_pressure: bool | None = None
    pid_pressure: bool | None = None
    memory_pressure: bool | None = None
    inode_pressure: bool | None = None
    disk_pressure_unexplained: bool | None = None  # pressure no job, scratch or image made


@dataclass(frozen=True)
class JobDisk(Answer):
    """The node's disk limit for a job, and what holds it: ``project_quotas``,
    ``monitor``, or None (not known, or nothing: a remote engine)."""

    limit: str = ""
    held_by: str | None = None


@dataclass(frozen=True)
class Isolation(Answer):
    """How far the node keeps jobs from the host: its rules (``TUNEPLANE_JOB_USERNS``,
    ``TUNEPLANE_JOB_SANDBOX``, ``TUNEPLANE_SANDBOX_RUNTIME``), whether the engine gives
    jobs a user namespace of their own and has the sandbox runtime (None: it could not
    say), and the engine's runtimes."""

    userns: str = ""
    sandbox: str = ""
    sandbox_runtime: str = ""
    own_userns: bool | None = None
    sandbox_available: bool | None = None
    runtimes: tuple[str, ...] = ()

    convert: ClassVar[Converters] = {"runtimes": tuple}


@dataclass(frozen=True)
class Disk(Answer):
    """The filesystem of the node's storage root."""

    path: str = ""
    used_pct: float | None = None
    free_gib: float | None = None


@dataclass(frozen=True)
class Cache(Answer):
    """The node's state cache of the engine (docker and podman only)."""

    synced: bool = False
    last_event_age_s: float | None = None
    last_relist_age_s: float | None = None
    containers: int | None = None


@dataclass(frozen=True)
class PendingPull(Answer):
    """A pending launch's pull, as health lists it by ref."""

    image: str = ""
    phase: PendingPhase | None = None
    error: str | None = None

    convert: ClassVar[Converters] = {"phase": word(PendingPhase)}


@dataclass(frozen=True)
class Process(Answer):
    """A process on a card, and the card memory it uses (None: not known)."""

    pid: int = -1
    used_mib: int | None = None


@dataclass(frozen=True)
class CardFault(Answer):
    """A card's fault as the node judged it: ``scope`` job (told), card (out until reset)
    or node (cordoned, drained); ``cause``: ``XID 48``, ``GPU_RESET``, a standing fault."""

    scope: FaultScope | None = None
    cause: str = ""
    since: datetime | None = None

    convert: ClassVar[Converters] = {"since": moment, "scope": word(FaultScope)}


@dataclass(frozen=True)
class Breaker(Answer):
    """The circuit breaker on cards taken out automatically: ``limit`` per hour, ``taken``
    in the last hour, ``kept_in`` faulted cards it keeps in (``tripped`` while any)."""

    limit: int = 0
    taken: int = 0
    kept_in: int = 0
    tripped: bool = False


@dataclass(frozen=True)
class Card(Answer):
    """A card as the driver describes it; each figure None where it said nothing."""

    index: int = -1
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    temperature_c: int | None = None
    unhealthy: str | None = None
    processes: tuple[Process, ...] = ()
    numa_node: int | None = None
    fault: CardFault | None = None

    convert: ClassVar[Converters] = {"processes": each(Process), "fault": one(CardFault)}


@dataclass(frozen=True)
class CardState(Card):
    """A card in health's ``gpu_detail``, and where it is (free, a job's, external...)."""

    state: str = ""


@dataclass(frozen=True)
class Probe(Answer):
    """Where the card facts come from, and why they are missing when they are."""

    source: str = ""
    ok: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Notice(Answer):
    """A notice the node acts on: the cloud's (or the OS's) word that the machine goes
    away (``ends_jobs``: the node drains for it), or may (it only cordons)."""

    source: str = ""  # aws, gcp, azure, logind
    kind: str = ""  # preempt, terminate, maintenance, rebalance, shutdown
    reason: str = ""
    ends_jobs: bool = False
    deadline: datetime | None = None  # None: the source gave none
    since: datetime | None = None
    detail: str = ""

    convert: ClassVar[Converters] = {"deadline": moment, "since": moment}


@dataclass(frozen=True)
class NodeEvent(Answer):
    """The node's own change, as a watch tells it: its state, and the notices standing."""

    state: NodeStateName | None = None
    reason: str | None = None
    since: datetime | None = None
    notices: tuple[Notice, ...] = ()

    convert: ClassVar[Converters] = {"state": word(NodeStateName), "since": moment}
    convert |= {"notices": each(Notice)}


@dataclass(frozen=True)
class Health(Answer):
    """The node's health. A GPU figure is None when the node cannot know it (never 0)."""

    ok: bool = False
    error: str | None = None  # when not ok: why
    protocol: int | None = None
    protocols: tuple[int, ...] = ()  # (): a node that does not say
    features: tuple[str, ...] = ()
    runtime: Runtime | None = None
    series: str | None = None
    gpus_total: int | None = None
    gpus_free: int | None = None
    gpus_reserved: int | None = None
    free_gpus: tuple[int, ...] | None = None
    by_job: Mapping[str, str] | None = None
    external: tuple[int, ...] | None = None  # cards another process holds
    external_pids: Mapping[str, tuple[int, ...]] | None = None
    external_probe_ok: bool | None = None
    unhealthy: Mapping[str, str] | None = None  # card index -> why
    gpu_detail: tuple[CardState, ...] | None = None
    explain: tuple[str, ...] | None = None
    gpu_probe: Probe | None = None
    disk: Disk | None = None
    state_cache: Cache | None = None
    pending_pulls: Mapping[str, PendingPull] = field(default_factory=dict)
    node_state: NodeState | None = None
    gpu_ready: bool | None = None  # None: a machine without cards by design
    gpu_not_ready_reason: str | None = None
    image_store: ImageStore | None = None
    conditions: Conditions | None = None
    job_disk: JobDisk | None = None
    volume_store: VolumeStore | None = None
    notices: tuple[Notice, ...] = ()  # the cloud's notices the node acts on: reschedule
    draining: Mapping[str, str] | None = None  # card index -> why it is not clean yet
    gpu_breaker: Breaker | None = None
    launch_refused_reason: str | None = None  # disk_pressure, inode_pressure: launches 507

    convert: ClassVar[Converters] = {
        "gpu_breaker": one(Breaker),
        "runtime": one(Runtime),
        "node_state": one(NodeState),
        "free_gpus": tuple,
    }
    convert |= {"protocols": tuple, "features": tuple, "image_store": one(ImageStore)}
    convert |= {"conditions": one(Conditions), "job_disk": one(JobDisk), "external": tuple}
    convert |= {"volume_store": one(VolumeStore), "notices": each(Notice)}
    convert |= {"external_pids": lambda pids: {k: tuple(v) for k, v in dict(pids).items()}}
    convert |= {"gpu_detail": each(CardState), "explain": tuple, "gpu_probe": one(Probe)}
    convert |= {"disk": one(Disk), "state_cache": one(Cache)}
    convert |= {"pending_pulls": by_ref(PendingPull)}


@dataclass(frozen=True)
class Filesystem(Answer):
    """One filesystem a job may write to, and the paths of the node's on it."""

    paths: tuple[str, ...] = ()
    fs_type: str | None = None
    shared: bool = False
    free_bytes: int | None = None
    total_bytes: int | None = None

    convert: ClassVar[Converters] = {"paths": tuple}


@dataclass(frozen=True)
class LocalDisk(Answer):
    free_bytes: int | None = None
    total_bytes: int | None = None


@dataclass(frozen=True)
class Fabric(Answer):
    """A network fabric of the machine (InfiniBand, RoCE) and its adapters."""

    fabric: str = ""
    hcas: tuple[str, ...] = ()
    rate_gbps: float | None = None
    rdma_to_jobs: bool = False

    convert: ClassVar[Converters] = {"hcas": tuple}


@dataclass(frozen=True)
class Inventory(Answer):
    """What the machine has: its cards, storage and fabrics among the rest."""

    node_id: str | None = None
    hostname: str | None = None
    agent_version: str = ""
    protocols: tuple[int, ...] = ()
    features: tuple[str, ...] = ()
    accelerator_series: str | None = None
    accelerator_name: str | None = None
    accelerator_count: int | None = None
    driver: str | None = None
    cuda_version: str | None = None
    runtime: str | None = None
    cpu_count: int | None = None
    memory_bytes: int | None = None
    disk_free_bytes: int | None = None
    cpu_affinity: str = ""
    storage_root_visible: bool | None = None
    gpus: tuple[Card, ...] = ()
    storage: tuple[Filesystem, ...] = ()
    local_disk: LocalDisk | None = None
    fabrics: tuple[Fabric, ...] = ()
    node_state: NodeState | None = None
    image_store: ImageStore | None = None
    conditions: Conditions | None = None
    job_disk: JobDisk | None = None
    isolation: Isolation | None = None
    volume_store: VolumeStore | None = None
    gpus_draining: Mapping[str, str] | None = None  # card index -> why; None: not known

    convert: ClassVar[Converters] = {
        "node_state": one(NodeState),
        "protocols": tuple,
        "features": tuple,
    }
    convert |= {"gpus": each(Card), "storage": each(Filesystem), "fabrics": each(Fabric)}
    convert |= {"local_disk": one(LocalDisk)}
    convert |= {"image_store": one(ImageStore), "conditions": one(Conditions)}
    convert |= {"job_disk": one(JobDisk), "isolation": one(Isolation)}
    convert |= {"volume_store": one(VolumeStore)}


@dataclass(frozen=True)
class ProcessMemory(Answer):
    pid: int = -1
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class CardUsage(Answer):
    index: int = -1
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: int | None = None
    processes: tuple[ProcessMemory, ...] | None = None  # None: the driver cannot say

    convert: ClassVar[Converters] = {"processes": each(ProcessMemory)}


@dataclass(frozen=True)
class Usage(Answer):
    """What a job uses, from the node's latest sample; only ``exists`` and ``status``
    for a job that is not running."""

    exists: bool = False
    status: JobStatus | None = None
    cpu_ratio: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    pids: int | None = None
    sampled_at: datetime | None = None
    gpus: tuple[CardUsage, ...] = ()
    disk_used_bytes: int | None = None  # the disk monitor's latest measure
    disk_limit_bytes: int | None = None
    gpu_fault: str | None = None  # a job-scope fault of a card it holds
    disk_deleted_open_bytes: int | None = None  # of disk_used_bytes: deleted files held open
    disk_inodes: int | None = None  # the inodes it made there
    inode_limit: int | None = None

    convert: ClassVar[Converters] = {"gpus": each(CardUsage), "status": word(JobStatus)}
    convert |= {"sampled_at": moment}


@dataclass(frozen=True)
class Logs(Answer):
    logs: str = ""
    truncated: bool = False  # the node's cap cut older output


@dataclass(frozen=True)
class Jobs(Answer):
    """The node's jobs by ref, and the ``index`` to watch on from.

    ``full``: ``jobs`` is every job of the node (the list; or a watch's resync after a
    daemon restart or a cursor past the node's history), so a copy is replaced by it.
    Else it is a delta: ``jobs`` the jobs changed since the last index, as they are now,
    and ``removed`` the refs gone. `apply` does either to a console's copy."""

    index: str = ""
    jobs: Mapping[str, JobState] = field(default_factory=dict)
    removed: tuple[str, ...] = ()
    full: bool = True  # the list itself has no "full": it is every job
    node: NodeEvent | None = None  # a watch's: the node changed (a notice, its state)

    convert: ClassVar[Converters] = {"jobs": by_ref(JobState), "removed": tuple}
    convert |= {"node": one(NodeEvent)}

    def apply(self, copy: MutableMapping[str, JobState]) -> None:
        """Bring ``copy`` (ref -> state) to what the node holds as of ``index``."""
        if self.full:
            copy.clear()
        copy.update(self.jobs)
        for ref in self.removed:
            copy.pop(ref, None)


def states(answer: object) -> dict[str, JobState]:
    """Observe's answer: the state of each ref asked for."""
    return by_ref(JobState)(_member(answer, "states"))


def usages(answer: object) -> dict[str, Usage]:
    return by_ref(Usage)(_member(answer, "stats"))


def removed_count(answer: object) -> int:
    return int(_member(answer, "removed") or 0)


def nothing(answer: object) -> None:
    """``{"ok": true}``: the verb was done."""


def _member(answer: object, key: str) -> Any:
    return answer.get(key) or {} if isinstance(answer, Mapping) else {}
