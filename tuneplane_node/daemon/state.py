"""Typed application state (aiohttp AppKeys), shared by app.py and routes.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from tuneplane_node.daemon.access.tokens import TokenSet
from tuneplane_node.daemon.machine import HealthAnswers
from tuneplane_node.daemon.metrics import Metrics
from tuneplane_node.daemon.render import JobAnswers
from tuneplane_node.jobs.node import Node
from tuneplane_node.jobs.words import NodeStatus
from tuneplane_node.runtime.authfile import AuthFile
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks, TurnShared


@dataclass(frozen=True)
class Memos:
    """The answers kept encoded between requests, made with the app (`create_node_app`):
    an app's own, so two apps of one process (tests) never share an entry or evict each
    other's."""

    jobs: JobAnswers = field(default_factory=JobAnswers)  # observe, the list, the watch
    health: HealthAnswers = field(default_factory=HealthAnswers)


SETTINGS = web.AppKey("settings", NodeSettings)
NODE = web.AppKey("node", Node)
"""The node's services (`build_node`): each route talks to the one it needs."""
MEMOS = web.AppKey("memos", Memos)
HEALTH_STATUS = web.AppKey("health_status", TurnShared[NodeStatus])
"""The node's status for health, one per turn of the loop (`TurnShared`)."""
TOKENS = web.AppKey("tokens", TokenSet)
METRICS = web.AppKey("metrics", Metrics)
PORT_HELD = web.AppKey("port_held", bool)
"""Whether systemd holds the node's port across its restarts (socket activation): a
host-network job cannot take it meanwhile (`jobs.rules.network`)."""
REGISTRY_AUTH = web.AppKey("registry_auth", AuthFile)
"""The node's registry credentials file; absent when none is set."""
TASKS = web.AppKey("tasks", BackgroundTasks)
"""The background tasks: the node's loops (`Node.spawn_tasks`), the token file's watch,
the registry auth file's, the loop's lag, a SIGHUP's reload. Closed first at shutdown,
before the node's services."""
