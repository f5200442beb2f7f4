"""The node's answers as typed objects.

Tolerant on purpose: a key this client does not know (a newer node's) is skipped, and a
key the node did not send (an older node's) is its field's default, so neither end
breaks the other. Every object keeps the answer it was read from in ``raw``, so a newer
field is one ``raw["..."]`` away. A value is taken as the node gave it: the node's
OpenAPI document (``GET /node/v1/openapi.json``) holds the types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

Json = Mapping[str, Any]


class Answer:
    """An answer's object. ``raw``: the JSON it was read from, every key of it.
    ``convert``: how a field is read from its JSON value (a nested object, a list)."""

    raw: Json = MappingProxyType({})
    convert: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}


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
    """A stop under way: ``phase`` (warned, stopping, killing) and since when."""

    phase: str = ""
    since: str = ""


@dataclass(frozen=True)
class JobState(Answer):
    """One job as observe, the list and the watch show it: a container, or a pending
    launch (``pending_phase`` set: pulling, then starting, or failed)."""

    name: str = ""
    exists: bool = False
    status: str | None = None  # created, running, exited, dead...; None: no container
    exit_code: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    oom_killed: bool = False
    stop_signal: str | None = None
    read_only_root: bool | None = None  # its image filesystem read-only; None: not known
    userns: str | None = None  # "own": a user namespace of its own; "host"; None: not known
    userns_note: str | None = None  # why it keeps the host's
    runtime: str | None = None  # its OCI runtime (runsc: sandboxed); None: not known
    stop_reason: str | None = None  # the node stopped it itself (a drain, disk_limit...)
    stopping: Stopping | None = None
    disk_used_bytes: int | None = None  # written to the engine's disk (running, or at a stop)
    disk_limit_bytes: int | None = None
    pending_phase: str | None = None
    pending_image: str | None = None
    pending_elapsed_s: float | None = None
    pending_gpus: int | None = None
    pending_bytes_done: int | None = None
    pending_bytes_total: int | None = None
    pending_layers_done: int | None = None
    pending_layers_total: int | None = None
    pending_error: str | None = None

    convert: ClassVar = {"stopping": one(Stopping)}

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

    phase: str = ""
    ref: str = ""  # the job's ref; "" from a node before the launch answer carried it
    container_id: str | None = None
    gpus: tuple[int, ...] = ()
    idempotent: bool = False
    image: str | None = None
    requested_gpus: int | None = None
    exit_code: int | None = None

    convert: ClassVar = {"gpus": tuple}


@dataclass(frozen=True)
class NodeState(Answer):
    """Whether the node takes launches: ready, cordoned, draining or drained."""

    state: str = ""
    reason: str | None = None
    since: str | None = None


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


@dataclass(frozen=True)
class Conditions(Answer):
    """What a console may schedule by; None: the node cannot say (or does not)."""

    disk_pressure: bool | None = None
    pid_pressure: bool | None = None
    memory_pressure: bool | None = None


@dataclass(frozen=True)
class JobDisk(Answer):
    """The node's disk limit for a job, and what holds it: ``project_quotas``,
    ``monitor``, or None (not known, or nothing: a remote engine)."""

    limit: str = ""
    held_by: str | None = None


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
    node_state: NodeState | None = None
    gpu_ready: bool | None = None  # None: a machine without cards by design
    gpu_not_ready_reason: str | None = None
    image_store: ImageStore | None = None
    conditions: Conditions | None = None
    job_disk: JobDisk | None = None

    convert: ClassVar = {"runtime": one(Runtime), "node_state": one(NodeState), "free_gpus": tuple}
    convert |= {"protocols": tuple, "features": tuple, "image_store": one(ImageStore)}
    convert |= {"conditions": one(Conditions), "job_disk": one(JobDisk)}


@dataclass(frozen=True)
class Inventory(Answer):
    """What the machine has; ``raw`` holds its cards, storage and fabrics whole."""

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
    node_state: NodeState | None = None
    image_store: ImageStore | None = None
    conditions: Conditions | None = None
    job_disk: JobDisk | None = None

    convert: ClassVar = {"node_state": one(NodeState), "protocols": tuple, "features": tuple}
    convert |= {"image_store": one(ImageStore), "conditions": one(Conditions)}
    convert |= {"job_disk": one(JobDisk)}


@dataclass(frozen=True)
class CardUsage(Answer):
    index: int = -1
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: int | None = None


@dataclass(frozen=True)
class Usage(Answer):
    """What a job uses, from the node's latest sample; only ``exists`` and ``status``
    for a job that is not running."""

    exists: bool = False
    status: str | None = None
    cpu_ratio: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    pids: int | None = None
    sampled_at: str | None = None
    gpus: tuple[CardUsage, ...] = ()
    disk_used_bytes: int | None = None  # the disk monitor's latest measure
    disk_limit_bytes: int | None = None

    convert: ClassVar = {"gpus": each(CardUsage)}


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

    convert: ClassVar = {"jobs": by_ref(JobState), "removed": tuple}

    def apply(self, copy: MutableMapping[str, JobState]) -> None:
        """Bring ``copy`` (ref -> state) to what the node holds as of ``index``."""
        if self.full:
            copy.clear()
        copy.update(self.jobs)
        for ref in self.removed:
            copy.pop(ref, None)


@dataclass(frozen=True)
class Image(Answer):
    """An image the node pulled, or that its own containers are made from."""

    image: str = ""
    id: str = ""
    size_bytes: int | None = None
    pulled_at: str | None = None  # None: the node never pulled it
    last_used_at: str | None = None
    in_use_by: tuple[str, ...] = ()
    private: bool = False

    convert: ClassVar = {"in_use_by": tuple}


@dataclass(frozen=True)
class ImagePull(Answer):
    """One download, however many launches wait on it: pulling, or failed (``error``)."""

    image: str = ""
    phase: str = ""
    bytes_done: int | None = None
    bytes_total: int | None = None
    layers_done: int | None = None
    layers_total: int | None = None
    rate_bytes_per_s: float | None = None
    eta_s: float | None = None
    started_at: str | None = None
    waiting: tuple[str, ...] = ()
    error: str | None = None

    convert: ClassVar = {"waiting": tuple}


@dataclass(frozen=True)
class Images(Answer):
    """``GET /node/v1/images``: the node's images and its pulls."""

    images: tuple[Image, ...] = ()
    pulls: tuple[ImagePull, ...] = ()

    convert: ClassVar = {"images": each(Image), "pulls": each(ImagePull)}


@dataclass(frozen=True)
class Prefetch(Answer):
    """A prefetch's answer: ``phase`` present (nothing pulled) or pulling."""

    image: str = ""
    phase: str = ""


@dataclass(frozen=True)
class RemovedImage(Answer):
    image: str = ""
    id: str = ""
    size_bytes: int | None = None
    why: str = ""


@dataclass(frozen=True)
class ImageGc(Answer):
    """One image GC run: what it removed (least recently used first) and the store after."""

    scope: str = ""
    freed_bytes: int = 0
    removed: tuple[RemovedImage, ...] = ()
    image_store: ImageStore | None = None

    convert: ClassVar = {"removed": each(RemovedImage), "image_store": one(ImageStore)}


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
