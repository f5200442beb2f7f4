"""The "ours" rule: which containers are the node's, whoever asks.

One rule, one place: the service and every collaborator that acts on a container by its
name (the stopper, the reaper, the logs reader) read a container through it, so none can
touch a container without the node's run-id label.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tuneplane_node.runtime.base import ContainerState

log = logging.getLogger(__name__)


class Listing(Protocol):
    """What a collaborator that walks the node's containers asks of the engine (the
    reaper, the drain, the network's neighbours)."""

    async def ps(self) -> list[ContainerState]: ...


class Inspecting(Protocol):
    """What telling the node's containers from others asks of the engine."""

    async def inspect(self, name: str) -> ContainerState: ...
    async def inspect_fresh(self, name: str) -> ContainerState: ...


class OursRule:
    """A container of the node's, or missing: one without the run-id label is none of
    its business (`Own`, the collaborators' view of it)."""

    def __init__(self, runtime: Inspecting) -> None:
        self.runtime = runtime

    async def __call__(self, ref: str, *, fresh: bool = False) -> ContainerState:
        """The node's container of that name. ``fresh``: ask the engine itself, not the
        cache (which may not yet know of an exit)."""
        read = self.runtime.inspect_fresh if fresh else self.runtime.inspect
        return self.mine(await read(ref), ref)

    @staticmethod
    def mine(state: ContainerState, ref: str) -> ContainerState:
        """The rule itself, for a state already read (observe reads many at once)."""
        if state.exists and not state.ours:
            log.debug("%s is not a container of this node: treated as missing", ref)
            return ContainerState.missing(ref)
        return state
