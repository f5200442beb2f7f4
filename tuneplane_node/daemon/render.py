"""Answers made of the job service's results: each JSON shape of the contract
(`wire.answers`, `wire.images`, `wire.stats`) filled from the typed result it answers,
and its JSON text.

The contract's shapes stay at the bottom (`wire` imports nothing above `errors`), so a
client reads them without the daemon; turning a result into one is the daemon's, beside
the routes that answer with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from tuneplane_node.clock import rfc3339
from tuneplane_node.errors import FieldError
from tuneplane_node.fetch.fetching import shown
from tuneplane_node.jobs import words
from tuneplane_node.jobs.observe.stats import CardSample, JobSample, JobStats
from tuneplane_node.jobs.observe.views import Observed
from tuneplane_node.jobs.words import (
    EntryView,
    FailedFill,
    ImagesView,
    ImageView,
    JobChanges,
    JobView,
    PendingView,
    Prefetched,
    PullView,
    StoppedView,
    StoreView,
    VolumeFill,
    VolumeGcRun,
    VolumePrefetched,
    VolumesView,
)
from tuneplane_node.runtime.base import ContainerState, LogText
from tuneplane_node.runtime.labels import HIDDEN_LABELS, network_of
from tuneplane_node.wire.answers import (
    ErrorJson,
    JobsJson,
    LaunchJson,
    LogsJson,
    ObserveJson,
    PendingStateJson,
    ReapJson,
    StateJson,
    StoppedStateJson,
    StoppingJson,
)
from tuneplane_node.wire.images import ImageJson, ImagesJson, PrefetchJson, PullJson
from tuneplane_node.wire.stats import AbsentJson, CardUsageJson, StatsJson, UsageJson
from tuneplane_node.wire.values import FAILED, PRESENT
from tuneplane_node.wire.volumes import (
    FILLING,
    VolumeEntryJson,
    VolumeFillJson,
    VolumeGcJson,
    VolumePullJson,
    VolumesJson,
    VolumeStoreJson,
)


def encode(answer: object) -> bytes:
    """An answer's JSON text. orjson: 37 us where json.dumps takes 509 for a 300-ref observe.
    The same keys, values and order as json.dumps; compact, and UTF-8 where json.dumps
    escapes (both are the same JSON to any reader)."""
    return orjson.dumps(answer)


# --- answers: observe ------------------------------------------------------------------


def state_json(view: JobView) -> StateJson:
    """One shape for a container and a pending launch (which adds its ``pending_*``);
    a container the node stopped itself (a drain, its disk) adds its ``stop_reason``, one
    a stop is under way for its ``stopping``, a running one the disk monitor measured
    (or one stopped for its disk) its ``disk_used_bytes``, ``disk_limit_bytes``,
    ``disk_deleted_open_bytes``, ``disk_inodes`` and ``inode_limit``."""
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
        shown["disk_deleted_open_bytes"] = view.disk.deleted_open_bytes
        shown["disk_inodes"] = view.disk.inodes
        shown["inode_limit"] = view.disk.inode_limit
    if view.gpu_fault:
        shown["gpu_fault"] = view.gpu_fault
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
        "network": network_of(view.labels) if view.exists else None,
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
        "network": None,  # decided when its container is made, beside the jobs there then
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


def observe_json(views: Mapping[str, JobView]) -> ObserveJson:
    return {"states": {ref: state_json(view) for ref, view in views.items()}}


class EncodedStates:
    """A container's ``"name":{state}`` member of an observe answer, by the view object:
    the state cache hands out the same state from one observe to the next until the
    engine changes it, and the service the same view around it while its facts (stop
    reason, stop under way, disk figures) hold (`StoppedViews`), so one identity check
    says the member is the one encoded before.

    An entry keeps its view alive (an ``id`` names one object only while it lives), so
    the memo is cleared whenever it holds ``limit``: old views go, memory stays bounded.
    Used on the event loop only."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._memo: dict[int, tuple[JobView, str, bytes]] = {}

    def entry(self, ref: str, view: JobView) -> bytes:
        hit = self._memo.get(id(view))
        if hit is not None and hit[0] is view and hit[1] == ref:
            return hit[2]
        state = view.state if isinstance(view, StoppedView) else view
        # Only a cached state asked by its name: a pending launch's progress moves, and a
        # missing container is a new object on every call.
        if not (isinstance(state, ContainerState) and state.exists and state.name == ref):
            return _member(ref, view)
        if len(self._memo) >= self.limit:
            self._memo.clear()
        data = _member(ref, view)
        self._memo[id(view)] = (view, ref, data)
        return data


KEPT_ANSWERS = 128
"""Observe answers kept whole at most, one per set of refs polled (a console's whole
node, a job's page of its own, an observer's tenant): past it, the oldest kept goes."""
KEPT_BYTES = 8 << 20
"""Their bytes at most: an answer of 4,096 refs is about 2.4 MiB."""


class ObserveAnswers:
    """Observe's answers whole, by the refs asked, while what they were made of holds
    (`Observed`): a console polling the same jobs of a node where nothing changed gets
    the same bytes without a view read or a member joined (for 300 refs, the daemon's
    CPU per observe 0.58 ms -> 0.28). Any change drops them all. Used on the event loop
    only."""

    def __init__(self, count: int = KEPT_ANSWERS, size: int = KEPT_BYTES) -> None:
        self.count, self.size = count, size
        self._at: Observed | None = None  # what every kept answer was made of
        self._kept: dict[tuple[str, ...], bytes] = {}
        self._bytes = 0

    def get(self, refs: tuple[str, ...], at: Observed | None) -> bytes | None:
        """The answer kept for ``refs`` as asked (their order is the answer's) at ``at``."""
        if at is None or self._at is None or not at.same(self._at):
            return None
        return self._kept.get(refs)

    def keep(self, refs: tuple[str, ...], at: Observed | None, answer: bytes) -> None:
        """Keep ``answer``, made at ``at`` (read before it was made: a change meanwhile
        leaves it under a state that has passed, never served again)."""
        if at is None or len(answer) > self.size:
            return
        if self._at is None or not at.same(self._at):
            self._at, self._bytes = at, 0
            self._kept.clear()
        self._bytes += len(answer) - len(self._kept.pop(refs, b""))
        self._kept[refs] = answer
        while len(self._kept) > self.count or self._bytes > self.size:
            self._bytes -= len(self._kept.pop(next(iter(self._kept))))


def _member(ref: str, view: JobView) -> bytes:
    return orjson.dumps(ref) + b":" + orjson.dumps(state_json(view))


# --- answers: the jobs list and its watch ------------------------------------------------


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


class JobAnswers:
    """Observe's answer and the jobs list's and watch's, encoded byte for byte as their
    shapes would be (``encode(observe_json(views))``, ``encode(jobs_json(...))``), each
    cached state's member once (`EncodedStates`: building and encoding 300 states' dicts
    was half of observe's time), the list once per index (the change log's position
    names one set of views, so consoles listing a node that did not change get the same
    bytes). One per app (`daemon.state.MEMOS`): two apps of one process keep their own.
    Used on the event loop only."""

    def __init__(self) -> None:
        self.states = EncodedStates()
        self.observed = ObserveAnswers()
        self._listing: tuple[str, bytes] = ("", b"")  # the list's last index, its answer

    def observe(self, views: Mapping[str, JobView]) -> bytes:
        parts = [self.states.entry(ref, view) for ref, view in views.items()]
        return b'{"states":{' + b",".join(parts) + b"}}"

    def jobs(self, changes: JobChanges, *, watched: bool, node: object = None) -> bytes:
        """Every job (the list), or with ``watched`` what changed since the query's
        index, and ``node`` (the node's own change, `NodeEventJson`) when given."""
        if watched:
            return self._jobs(changes, watched=True, node=node)
        index = str(changes.index)
        if self._listing[0] != index:
            self._listing = (index, self._jobs(changes, watched=False))
        return self._listing[1]

    def _jobs(self, changes: JobChanges, *, watched: bool, node: object = None) -> bytes:
        parts = [self.states.entry(ref, view) for ref, view in changes.jobs.items()]
        index = orjson.dumps(str(changes.index))
        head = b'{"index":' + index + b',"jobs":{' + b",".join(parts)
        if not watched:
            return head + b"}}"
        full = b"true" if changes.full else b"false"
        tail = b',"node":' + orjson.dumps(node) if node is not None else b""
        return (
            head + b'},"removed":' + orjson.dumps(list(changes.removed)) + b',"full":' + full
            + tail + b"}"
        )  # fmt: skip


# --- answers: launch and the other verbs -------------------------------------------------


def launch_json(result: words.LaunchResult, *, ref: str) -> LaunchJson:
    """What the launch did, and the ``ref`` it made (the name every other verb takes:
    a run id outside ``[a-zA-Z0-9_.-]`` gets a hashed one)."""
    if isinstance(result, words.Started):
        gpus = [*result.gpus]
        return {"phase": "running", "container_id": result.container_id, "gpus": gpus, "ref": ref}
    if isinstance(result, words.AlreadyRunning):
        return {"phase": "running", "idempotent": True, "gpus": [*result.gpus], "ref": ref}
    if isinstance(result, words.AlreadyExited):
        return {"phase": "exited", "idempotent": True, "exit_code": result.exit_code, "ref": ref}
    if isinstance(result, words.Pulling):
        wanted = result.requested_gpus
        return {"phase": "pulling", "image": result.image, "requested_gpus": wanted, "ref": ref}
    assert isinstance(result, words.AlreadyPending)
    return {"phase": result.phase, "idempotent": True, "image": result.image, "ref": ref}


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


# --- the image verbs -----------------------------------------------------------------


def prefetch_json(result: Prefetched) -> PrefetchJson:
    return {"image": result.image, "phase": result.phase}


def images_json(view: ImagesView) -> ImagesJson:
    return {
        "images": [image_json(image) for image in view.images],
        "pulls": [pull_json(pull) for pull in view.pulls],
    }


def image_json(image: ImageView) -> ImageJson:
    return {
        "image": image.image,
        "id": image.id,
        "size_bytes": image.size_bytes,
        "pulled_at": image.pulled_at,
        "last_used_at": image.last_used_at,
        "in_use_by": list(image.in_use_by),
        "private": image.private,
    }


def pull_json(pull: PullView) -> PullJson:
    progress = pull.progress
    return {
        "image": pull.image,
        "phase": pull.phase,
        "bytes_done": progress.bytes_done,
        "bytes_total": progress.bytes_total,
        "layers_done": progress.layers_done,
        "layers_total": progress.layers_total,
        "rate_bytes_per_s": pull.rate_bytes_per_s,
        "eta_s": pull.eta_s,
        "started_at": pull.started_at,
        "waiting": list(pull.waiting),
        "error": pull.error,
    }


# --- stats -----------------------------------------------------------------------------


def stats_json(stats: Mapping[str, JobStats]) -> StatsJson:
    return {"stats": {ref: job_stats_json(job) for ref, job in stats.items()}}


def job_stats_json(job: JobStats) -> AbsentJson:
    """A running job's figures; only ``exists`` and ``status`` for any other ref."""
    if job.sample is None:
        return {"exists": job.exists, "status": job.status}
    return usage_json(job, job.sample)


def usage_json(job: JobStats, sample: JobSample) -> UsageJson:
    return {
        "exists": job.exists,
        "status": job.status,
        "cpu_ratio": sample.cpu_ratio,
        "memory_bytes": sample.memory_bytes,
        "memory_limit_bytes": sample.memory_limit_bytes,
        "pids": sample.pids,
        "sampled_at": sample.sampled_at,
        "gpus": [card_usage_json(card) for card in sample.gpus],
        "disk_used_bytes": job.disk.used_bytes if job.disk else None,
        "disk_limit_bytes": job.disk.limit_bytes if job.disk else None,
        "gpu_fault": job.gpu_fault,
        "disk_deleted_open_bytes": job.disk.deleted_open_bytes if job.disk else None,
        "disk_inodes": job.disk.inodes if job.disk else None,
        "inode_limit": job.disk.inode_limit if job.disk else None,
    }


def card_usage_json(card: CardSample) -> CardUsageJson:
    processes = card.processes
    return {
        "index": card.index,
        "utilization_ratio": card.utilization_ratio,
        "memory_used_bytes": card.memory_used_bytes,
        "memory_total_bytes": card.memory_total_bytes,
        "power_watts": card.power_watts,
        "temperature_celsius": card.temperature_celsius,
        "processes": None
        if processes is None
        else [{"pid": p.pid, "memory_used_bytes": p.memory_used_bytes} for p in processes],
    }


# --- volumes ---------------------------------------------------------------------------


def volumes_json(view: VolumesView) -> VolumesJson:
    return {
        "entries": [volume_entry_json(each) for each in view.entries],
        "fills": [
            *(fill_json(fill) for fill in view.fills),
            *(failed_fill_json(failed) for failed in view.failed),
        ],
        "volume_store": volume_store_json(view.store),
    }


def volume_entry_json(view: EntryView) -> VolumeEntryJson:
    return {
        "sha256": view.entry.digest,
        "size_bytes": view.entry.size,
        "phase": PRESENT,
        "last_used_at": rfc3339(view.last_used_at) if view.last_used_at else None,
        "in_use_by": None if view.in_use_by is None else list(view.in_use_by),
        "pin_expires_at": rfc3339(view.pin_expires_at) if view.pin_expires_at else None,
    }


def fill_json(fill: VolumeFill) -> VolumeFillJson:
    rate = fill.rate.rate(fill.clock.monotonic())
    left = None if fill.bytes_total is None else fill.bytes_total - fill.bytes_done
    return {
        "sha256": fill.digest,
        "source": shown(fill.source),
        "phase": FILLING,
        "bytes_done": fill.bytes_done,
        "bytes_total": fill.bytes_total,
        "rate_bytes_per_s": rate,
        "eta_s": None if not rate or left is None else round(left / rate, 3),
        "started_at": rfc3339(fill.started_at),
        "waiting": fill.waiters,
        "error": None,
    }


def failed_fill_json(failed: FailedFill) -> VolumeFillJson:
    """A failed prefetch's fill, with its error, until the next prefetch of it."""
    return {
        "sha256": failed.digest,
        "source": shown(failed.source),
        "phase": FAILED,
        "bytes_done": 0,
        "bytes_total": None,
        "rate_bytes_per_s": None,
        "eta_s": None,
        "started_at": rfc3339(failed.at),
        "waiting": 0,
        "error": failed.error,
    }


def volume_store_json(store: StoreView) -> VolumeStoreJson:
    space = store.space
    return {
        "path": str(store.path),
        "total_bytes": space.total_bytes if space else None,
        "free_bytes": space.free_bytes if space else None,
        "used_bytes": space.used_bytes if space else None,
        "high_percent": store.high_percent,
        "low_percent": store.low_percent,
    }


def volume_pull_json(result: VolumePrefetched) -> VolumePullJson:
    return {
        "sha256": result.digest,
        "phase": result.phase,
        "pin_expires_at": rfc3339(result.pin_expires_at),
        "size_bytes": result.entry.size if result.entry is not None else None,
        "fill": fill_json(result.fill) if result.fill is not None else None,
    }


def volume_gc_json(run: VolumeGcRun) -> VolumeGcJson:
    return {
        "removed": [
            {
                "sha256": each.entry.digest,
                "size_bytes": each.entry.size,
                "last_used_at": rfc3339(each.last_used_at),
            }
            for each in run.removed
        ],
        "freed_bytes": run.freed_bytes,
        "volume_store": volume_store_json(run.store),
    }
