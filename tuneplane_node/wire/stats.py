"""``POST /node/v1/stats``: its request and its answer, the jobs' resource usage.

A request is observe's (``{"refs": [...]}``, the same limits), and ``refs`` may be left
out: every running job of the node. The answer is ``{"stats": {ref: ...}}``: a running
job's figures from the node's latest sample, and for any other ref only whether it
exists and its status. Every figure is null where it is unknown, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from tuneplane_node.wire.answers import JobStatus
from tuneplane_node.wire.fields import Body, Field, Refusals
from tuneplane_node.wire.verbs import REFS_DOC, REFS_LIST, parse_refs


class ProcessMemoryJson(TypedDict):
    pid: int
    memory_used_bytes: int | None


class CardUsageJson(TypedDict):
    index: int
    utilization_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: float | None
    temperature_celsius: int | None
    processes: list[ProcessMemoryJson] | None


class AbsentJson(TypedDict):
    exists: bool
    status: JobStatus | None


class UsageJson(AbsentJson):
    cpu_ratio: float | None
    memory_bytes: int | None
    memory_limit_bytes: int | None
    pids: int | None
    sampled_at: str | None
    gpus: list[CardUsageJson]
    disk_used_bytes: int | None
    disk_limit_bytes: int | None
    gpu_fault: str | None  # a job-scope fault of a card it holds: ``<uuid> XID 13 since ...``
    disk_deleted_open_bytes: int | None
    disk_inodes: int | None
    inode_limit: int | None


class StatsJson(TypedDict):
    stats: dict[str, AbsentJson]


STATS = Body(
    "StatsBody", (Field("refs", REFS_LIST, f"{REFS_DOC} Absent: every running job of the node."),)
)


def parse_stats(body: Mapping[str, Any]) -> list[str] | None:
    """The refs asked for; None (no ``refs``): every running job of the node."""
    with Refusals() as refusals:
        refusals.unknown(body, STATS)
        refs = None if "refs" not in body else refusals.read(parse_refs, body)
    return refs
