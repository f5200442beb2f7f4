"""The job service: every rule about the node's jobs, between HTTP and the engines."""

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
    StoppedView,
)
from tuneplane_node.jobs.service import JobService, read_inventory, reapable

__all__ = [
    "AlreadyPending",
    "AlreadyRunning",
    "Inventory",
    "JobService",
    "JobView",
    "LaunchRequest",
    "LaunchResult",
    "NodeStatus",
    "PendingView",
    "Pulling",
    "Started",
    "StoppedView",
    "read_inventory",
    "reapable",
]
