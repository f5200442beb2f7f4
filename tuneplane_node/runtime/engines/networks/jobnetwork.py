"""The node's job networks (``TUNEPLANE_JOB_NETWORK``), as the engines make them.

A spec's network ``isolated`` or ``sealed`` is one the node makes, where jobs cannot
reach each other (``sealed``: nor the outside world). Docker: one bridge network per
kind, inter-container traffic off (held by the engine's firewall rules), labelled
`LABEL_NODE_NETWORK`; a network of that name the node did not make is refused, never
used. Podman 4.3 (CNI) has no such option for a shared bridge: each job gets a bridge of
its own (``isolate=true``), labelled `LABEL_NETWORK_OF` with its container, removed with
it; one whose container is gone is pruned. No SDK here: the adapters make the calls.

The fabric network (``TUNEPLANE_FABRICS``, a spec's network `FABRIC`) is one per node on
both engines: ``tuneplane-fabric-<name>``, a ``macvlan``/``ipvlan`` network on the fabric's
interface, labelled ``tuneplane.node-network=fabric``, each job given its address (its
label) as a static IP; one of that name that is not so is refused, never used.
"""

from __future__ import annotations

from collections.abc import Mapping
from ipaddress import IPv4Address
from typing import Any

from tuneplane_node.errors import ConfigError, EngineRefused
from tuneplane_node.settings import Fabric, NodeSettings, env_name

ISOLATED, SEALED = "isolated", "sealed"
NODE_NETWORKS = (ISOLATED, SEALED)
"""The spec networks the node makes for its jobs."""
LABEL_NODE_NETWORK = "tuneplane.node-network"
"""On a network the node made: which kind (``isolated``, ``sealed``)."""
LABEL_NETWORK_OF = "tuneplane.network-of"
"""On a podman job's own network: its container's name."""
LABEL_NETWORK_STORE = "tuneplane.network-store"
"""On a podman job's own network: the store of the service that made it. Podman services
on one machine share the CNI configuration, so only a network of the service's own store
may be pruned for want of its container."""
NO_ICC = "com.docker.network.bridge.enable_icc"
DOCKER_NAMES = {ISOLATED: "tuneplane-jobs", SEALED: "tuneplane-jobs-sealed"}
JOB_PREFIX = "tuneplane-jobs-"


def docker_network(kind: str) -> str:
    """Docker's shared network of that kind."""
    return DOCKER_NAMES[kind]


def own_network(container: str) -> str:
    """A podman job's network of its own."""
    return f"{JOB_PREFIX}{container}"


def checked(engine: str, name: str, kind: str, found: Mapping[str, Any]) -> None:
    """`EngineRefused` unless the network found (docker's inspect document) is the one the
    node makes: its label, inter-container traffic off, internal exactly when sealed."""
    labels = found.get("Labels") or {}
    options = found.get("Options") or {}
    why = None
    if labels.get(LABEL_NODE_NETWORK) != kind:
        why = f"it is not the node's (no label {LABEL_NODE_NETWORK}={kind})"
    elif str(options.get(NO_ICC, "")).lower() != "false":
        why = f"it lets containers reach each other ({NO_ICC} is not false)"
    elif bool(found.get("Internal")) != (kind == SEALED):
        why = "it is internal" if kind != SEALED else "it is not internal"
    if why is not None:
        raise EngineRefused(
            engine=engine,
            action=f"put a job on network {name}",
            reason=f"network {name} exists and {why}: remove or rename it",
        )


FABRIC_KIND = "fabric"
"""`LABEL_NODE_NETWORK` on the fabric network the node made."""
FABRIC_PREFIX = "tuneplane-fabric-"


def configured(settings: NodeSettings) -> Fabric:
    """The fabric with a network, which a spec on `FABRIC` runs on."""
    if settings.fabric_network is None:  # `NetworkRule` puts no job there without one
        raise ConfigError(f"a fabric-network job, and no network in {env_name('fabrics')}")
    return settings.fabric_network


def podman_fabric_body(fabric: Fabric) -> dict[str, Any]:
    """libpod's ``/networks/create`` body of the fabric's network."""
    assert fabric.range is not None
    first, last = fabric.range.network_address, fabric.range.broadcast_address
    subnet = {
        "subnet": str(fabric.subnet),
        "gateway": str(gateway(fabric)),
        "lease_range": {"start_ip": str(first), "end_ip": str(last)},
    }
    return {
        "name": fabric_network(fabric),
        "driver": fabric.network,
        "network_interface": fabric.interface,
        "subnets": [subnet],
        "labels": {LABEL_NODE_NETWORK: FABRIC_KIND},
    }


def fabric_network(fabric: Fabric) -> str:
    """The engines' name of the fabric's network."""
    return f"{FABRIC_PREFIX}{fabric.name}"


def gateway(fabric: Fabric) -> IPv4Address:
    """The fabric network's gateway, as the engines are told it (`Fabric.network_gateway`)."""
    return fabric.network_gateway


def fabric_checked(
    engine: str, fabric: Fabric, *, labels: Mapping[str, Any], driver: str, parent: str,
    subnets: list[str],
) -> None:  # fmt: skip
    """`EngineRefused` unless the fabric network found is the one the operator's settings
    describe (a changed setting is a network to remove by hand: jobs may be on it)."""
    name, why = fabric_network(fabric), None
    if labels.get(LABEL_NODE_NETWORK) != FABRIC_KIND:
        why = f"it is not the node's (no label {LABEL_NODE_NETWORK}={FABRIC_KIND})"
    elif driver != fabric.network or parent != fabric.interface:
        found, wanted = f"{driver} on {parent or '-'}", f"{fabric.network} on {fabric.interface}"
        why = f"it is {found}, not {wanted}"
    elif str(fabric.subnet) not in subnets:
        why = f"its subnets are {', '.join(subnets) or 'none'}, not {fabric.subnet}"
    if why is not None:
        raise EngineRefused(
            engine=engine,
            action=f"put a job on network {name}",
            reason=f"network {name} exists and {why}: remove it (with its jobs) or rename it",
        )
