"""The job service: every rule about the node's jobs, between HTTP and the engines."""

from tuneplane_node.jobs.health import read_inventory
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.jobs.node import Node, build_node
from tuneplane_node.jobs.reaper import reapable
from tuneplane_node.jobs.service import JobService
from tuneplane_node.jobs.words.launch import (
    AlreadyExited,
    AlreadyPending,
    AlreadyRunning,
    LaunchRequest,
    LaunchResult,
    Pulling,
    Started,
    Stopping,
)
from tuneplane_node.jobs.words.status import Inventory, NodeStatus
from tuneplane_node.jobs.words.views import JobView, PendingView, StoppedView
from tuneplane_node.wire.values import StopPlan

__all__ = [
    "AlreadyExited",
    "AlreadyPending",
    "AlreadyRunning",
    "Inventory",
    "JobService",
    "JobView",
    "LaunchRequest",
    "LaunchResult",
    "Node",
    "NodeStatus",
    "PendingView",
    "Pulling",
    "Started",
    "StopPlan",
    "StoppedView",
    "Stopping",
    "build_node",
    "launch_request",
    "read_inventory",
    "reapable",
]
