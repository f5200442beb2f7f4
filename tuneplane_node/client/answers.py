"""The node's answers as typed objects, each read from its JSON by ``of``.

Only the fields a console acts on are attributes; every answer keeps its whole JSON in
``raw``, so a field a newer node adds is there before this client names it. ``None`` is
unknown, never zero, as the node says it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value) if isinstance(value, list) else ()


@dataclass(frozen=True)
class Launched:
    """What a launch did: ``phase`` running (``container_id`` and ``gpus``), pulling,
    starting or failed (``image``); ``idempotent``: the run was there already."""

    ref: str
    phase: str
    idempotent: bool = False
    container_id: str | None = None
    gpus: tuple[int, ...] = ()
    image: str | None = None
    requested_gpus: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Launched:
        return cls(
            ref=answer["ref"],
            phase=answer["phase"],
            idempotent=bool(answer.get("idempotent", False)),
            container_id=answer.get("container_id"),
            gpus=_tuple(answer.get("gpus")),
            image=answer.get("image"),
            requested_gpus=answer.get("requested_gpus"),
            raw=answer,
        )


@dataclass(frozen=True)
class Pending:
    """A launch without a container yet: its pull's phase and progress."""

    phase: str
    image: str
    elapsed_s: float
    gpus: int
    bytes_done: int
    bytes_total: int
    error: str | None

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> Pending | None:
        if "pending_phase" not in state:
            return None
        return cls(
            phase=state["pending_phase"],
            image=state["pending_image"],
            elapsed_s=state["pending_elapsed_s"],
            gpus=state["pending_gpus"],
            bytes_done=state["pending_bytes_done"],
            bytes_total=state["pending_bytes_total"],
            error=state["pending_error"],
        )


@dataclass(frozen=True)
class JobState:
    """A job as observe shows it; ``pending`` for a launch still pulling or starting."""

    name: str
    exists: bool
    status: str | None
    exit_code: int | None
    labels: Mapping[str, str]
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    oom_killed: bool
    stop_signal: str | None
    stop_reason: str | None = None
    pending: Pending | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, state: Mapping[str, Any]) -> JobState:
        return cls(
            name=state["name"],
            exists=state["exists"],
            status=state["status"],
            exit_code=state["exit_code"],
            labels=dict(state.get("labels") or {}),
            created_at=state.get("created_at"),
            started_at=state.get("started_at"),
            finished_at=state.get("finished_at"),
            oom_killed=bool(state.get("oom_killed")),
            stop_signal=state.get("stop_signal"),
            stop_reason=state.get("stop_reason"),
            pending=Pending.of(state),
            raw=state,
        )

    @property
    def run_id(self) -> str | None:
        return self.labels.get("tuneplane.run-id")


def states(answer: Mapping[str, Any], key: str = "states") -> dict[str, JobState]:
    return {ref: JobState.of(state) for ref, state in (answer.get(key) or {}).items()}


@dataclass(frozen=True)
class NodeState:
    """Whether the node takes launches: ready, cordoned, draining or drained."""

    state: str
    reason: str | None
    since: str | None

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> NodeState:
        return cls(answer["state"], answer.get("reason"), answer.get("since"))


@dataclass(frozen=True)
class Health:
    """Whether the node can serve, its cards, and what it speaks and serves."""

    ok: bool
    error: str | None
    protocols: tuple[int, ...]
    features: tuple[str, ...]
    gpus_total: int | None
    gpus_free: int | None
    by_job: Mapping[str, str] | None
    node_state: NodeState
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Health:
        return cls(
            ok=answer["ok"],
            error=answer.get("error"),
            protocols=_tuple(answer.get("protocols")) or (answer["protocol"],),
            features=_tuple(answer.get("features")),
            gpus_total=answer.get("gpus_total"),
            gpus_free=answer.get("gpus_free"),
            by_job=answer.get("by_job"),
            node_state=NodeState.of(answer["node_state"]),
            raw=answer,
        )


@dataclass(frozen=True)
class Inventory:
    """What the machine has; the whole of it in ``raw``."""

    node_id: str | None
    hostname: str | None
    agent_version: str
    accelerator_count: int | None
    features: tuple[str, ...]
    protocols: tuple[int, ...]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Inventory:
        return cls(
            node_id=answer.get("node_id"),
            hostname=answer.get("hostname"),
            agent_version=answer["agent_version"],
            accelerator_count=answer.get("accelerator_count"),
            features=_tuple(answer.get("features")),
            protocols=_tuple(answer.get("protocols")),
            raw=answer,
        )


@dataclass(frozen=True)
class Logs:
    text: str
    truncated: bool = False

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Logs:
        return cls(answer["logs"], bool(answer.get("truncated", False)))


@dataclass(frozen=True)
class Usage:
    """A job's figures from the node's latest sample (None: unknown); only ``exists``
    and ``status`` for a job that is not running."""

    exists: bool
    status: str | None
    cpu_ratio: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None
    sampled_at: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, entry: Mapping[str, Any]) -> Usage:
        return cls(
            exists=entry["exists"],
            status=entry["status"],
            cpu_ratio=entry.get("cpu_ratio"),
            memory_bytes=entry.get("memory_bytes"),
            pids=entry.get("pids"),
            sampled_at=entry.get("sampled_at"),
            raw=entry,
        )


@dataclass(frozen=True)
class Jobs:
    """A page of ``GET /node/v1/jobs``: ``full``, every job of the node (the console's
    copy is replaced by it); otherwise what changed after the cursor it was asked with
    (``jobs`` changed or created, ``removed`` gone). ``index``: the next cursor."""

    index: str
    jobs: Mapping[str, JobState]
    removed: tuple[str, ...] = ()
    full: bool = True

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Jobs:
        return cls(
            index=str(answer["index"]),
            jobs=states(answer, "jobs"),
            removed=_tuple(answer.get("removed")),
            full=bool(answer.get("full", True)),
        )
