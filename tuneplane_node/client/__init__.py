"""A client of the node's API for consoles: `NodeClient` (async) and `SyncNodeClient`,
one method per verb, the answers as typed objects (`answers`), a refusal as
`NodeRefused` carrying the node's ``code`` and bad fields.

It imports nothing of the daemon (no engine SDK, no NVML, no aiohttp): a console installs
it alone as the ``tuneplane-node-client`` distribution (``contrib/client``), or with the
daemon as ``tuneplane-node[client]``.

    async with NodeClient("http://node-7:8470", token=token) as node:
        launched = await node.launch("r-1", {"image": "reg/trainer:1"}, requested_gpus=2)
        async for page in node.watch():
            ...  # page.full: every job; else page.jobs changed, page.removed gone
"""

from __future__ import annotations

from tuneplane_node.client.answers import (
    Health,
    Inventory,
    Jobs,
    JobState,
    Launched,
    Logs,
    NodeState,
    Pending,
    Usage,
)
from tuneplane_node.client.errors import ClientError, FieldError, NodeRefused, Unreachable
from tuneplane_node.client.nodes import PROTOCOL, NodeClient, SyncNodeClient

__all__ = [
    "PROTOCOL",
    "ClientError",
    "FieldError",
    "Health",
    "Inventory",
    "JobState",
    "Jobs",
    "Launched",
    "Logs",
    "NodeClient",
    "NodeRefused",
    "NodeState",
    "Pending",
    "SyncNodeClient",
    "Unreachable",
    "Usage",
]
