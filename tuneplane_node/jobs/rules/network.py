"""Which network a job gets (``TUNEPLANE_JOB_HOST_NETWORK``), written on its container.

The host network is a room shared with the node and every other job: a job on it reaches
the loopback services (the node's API, a local registry), another job's rendezvous port,
and during a restart the node's own port. So under ``whole-node`` (the default) a job
asking for ``host`` gets it only when it holds every card of the machine while no other
job of the node runs or is being launched, and only where a job cannot take the node's
port across a restart: the port is held by systemd (socket activation) or the API is
served over TLS (a squatter cannot present the node's certificate). Any other such job
runs on the node's job network (bridged, below). A job launched beside a host-network
job holds no card of the machine, so it is bridged whatever it asks. ``allow`` gives
every job what it asks, ``bridge`` bridges every host request, ``refuse`` refuses it.

A job off the host's network runs on the node's job network (``TUNEPLANE_JOB_NETWORK``):
``isolated`` or ``sealed`` (the runtime makes the engine's network for it, where jobs
cannot reach each other), or the engine's own ``bridge``. The network a job got is its
container's label (`LABEL_NETWORK`: ``host``, ``isolated``, ``sealed``, ``bridge`` or
``none``): observe shows it.

Where the operator gave a fabric network (``TUNEPLANE_FABRICS``), a job asking for
``host`` that is not given it runs there instead (label ``fabric:<name>``): a 0.3.15
console's multi-node job keeps an address the other machines reach.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from tuneplane_node.errors import InvalidField
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.ours import Listing
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.labels import run_id_of, with_network
from tuneplane_node.runtime.spec import FABRIC, ContainerSpec
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.wire.values import FAILED

log = logging.getLogger(__name__)
HOST, BRIDGE = "host", "bridge"
HOST_NETWORK = env_name("job_host_network")
WHOLE_NODE = "whole-node"
PORT_NOT_HELD = (
    "the node's port is not held across its restarts (no systemd socket activation) and "
    f"its API is plain HTTP: a host-network job could take the port and the console's "
    f"token; run it under contrib/systemd's socket unit or set {env_name('tls_cert_file')}"
)

PORT_UNSAFE = "the node's port is not held across restarts and the API is plain HTTP"


@dataclass(frozen=True)
class Neighbours:
    """What the ``whole-node`` rule looks at, for one launch: the machine's cards (None:
    unknown) and the node's other jobs (running, created or being launched)."""

    cards: int | None
    others: int


class NetworkRule:
    """The operator's rule for a launch asking for ``host``, decided once at start-up."""

    def __init__(self, settings: NodeSettings, *, port_held: bool = False) -> None:
        self.mode = settings.job_host_network
        self.bridge = settings.job_network  # what a bridged job runs on
        self.port_safe = port_held or settings.tls_cert_file is not None
        self.fabric = settings.fabric_network  # where a host request not granted runs
        self._port_said = False

    def vetted(self, spec: ContainerSpec) -> ContainerSpec:
        """Before the cards are chosen: `InvalidField` under ``refuse``, the bridge under
        ``bridge``; ``whole-node`` decides at placement (`placed`)."""
        if spec.network != HOST or self.mode in ("allow", WHOLE_NODE):
            return spec
        if self.mode == "refuse":
            raise InvalidField(
                "container.network",
                f"host networking is refused on this node ({HOST_NETWORK}=refuse): "
                "use bridge or none",
            )
        return self._bridged(spec, f"{HOST_NETWORK}=bridge")

    def needs_neighbours(self, spec: ContainerSpec) -> bool:
        return spec.network == HOST and self.mode == WHOLE_NODE

    def placed(self, spec: ContainerSpec, around: Neighbours | None = None) -> ContainerSpec:
        """The spec on the network it gets, written in its label. ``around``: the
        machine around a launch `needs_neighbours` says is to be decided."""
        if around is not None and self.needs_neighbours(spec):
            why = self._not_whole(spec, around)
            if why is not None:
                return self._bridged(spec, why)
        if spec.network == BRIDGE:
            return self._on_job_network(spec)
        if spec.network == FABRIC:  # put there by `vetted`, its label says which
            return spec
        return replace(spec, labels=with_network(spec.labels, spec.network))

    def _not_whole(self, spec: ContainerSpec, around: Neighbours) -> str | None:
        """Why the launch may not have the host network, None when it may."""
        if not self.port_safe:
            if not self._port_said:  # the operator's setup: said once, not at each launch
                self._port_said = True
                log.warning("host-network jobs run on the bridge: %s", PORT_NOT_HELD)
            return PORT_UNSAFE
        if around.cards is None or around.cards == 0:
            return "the machine's cards are unknown or none: no job holds the whole machine"
        if len(spec.gpus) < around.cards:
            return f"it holds {len(spec.gpus)} of the machine's {around.cards} cards"
        if around.others:
            return f"{around.others} other job(s) of the node run on this machine"
        return None

    def _bridged(self, spec: ContainerSpec, why: str) -> ContainerSpec:
        log.log(
            logging.DEBUG if why == PORT_UNSAFE else logging.INFO,
            "launch %s: host network asked, run on the bridge (%s: %s)", spec.name,
            HOST_NETWORK, why,
            extra=job_fields(spec.name, run_id_of(spec.labels), image=spec.image),
        )  # fmt: skip
        if self.fabric is not None:
            return self._on_fabric(spec)
        return self._on_job_network(spec)

    def _on_job_network(self, spec: ContainerSpec) -> ContainerSpec:
        """Off the host's network: on the node's job network, which its label names."""
        network = self.bridge
        return replace(spec, network=network, labels=with_network(spec.labels, network))

    def _on_fabric(self, spec: ContainerSpec) -> ContainerSpec:
        """A host request not granted, where the operator gave a fabric network: there,
        so a job spanning machines still advertises an address they reach (its address
        is chosen at placement: `jobs.rules.fabric`)."""
        assert self.fabric is not None
        label = f"{FABRIC}:{self.fabric.name}"
        return replace(spec, network=FABRIC, labels=with_network(spec.labels, label))


async def neighbours(
    ref: str, *, runtime: Listing, allocator: GpuAllocator, pending: PendingTable
) -> Neighbours:
    """The machine's cards and the node's jobs other than ``ref``: live containers, launches
    pending a pull, and launches holding cards whose container is being made."""
    occupancy = await allocator.occupancy()
    others = {state.name for state in await runtime.ps() if state.live and state.ours}
    others |= {record.ref for record in pending.records() if record.phase != FAILED}
    others |= set(occupancy.claims)
    others.discard(ref)
    return Neighbours(occupancy.total if occupancy.known else None, len(others))


class NetworkPlacement:
    """The place step of a launch's network: the operator's rule (`NetworkRule.placed`)
    with the machine around it, read only where ``whole-node`` must decide a host
    request (``around``: the machine's cards and the node's other jobs, for a ref)."""

    def __init__(self, rule: NetworkRule, around: Callable[[str], Awaitable[Neighbours]]) -> None:
        self.rule = rule
        self.around = around

    async def place(self, plan: LaunchRequest) -> LaunchRequest:
        """The spec on the network it gets, written in its label, by its cards."""
        spec = plan.spec
        around = await self.around(spec.name) if self.rule.needs_neighbours(spec) else None
        return replace(plan, spec=self.rule.placed(spec, around))
