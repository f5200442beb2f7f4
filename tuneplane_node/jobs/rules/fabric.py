"""The fabric network's addresses, and what NCCL needs to use them (``TUNEPLANE_FABRICS``).

A job that spans machines without holding the whole machine runs on the fabric network
(a ``macvlan``/``ipvlan`` network on the fabric's interface,
`runtime.engines.networks.jobnetwork`) with an IPv4 address of its own from the
operator's range, so the address NCCL advertises is one the other machines reach. The
address is written on the container (`LABEL_FABRIC_ADDRESS`): labels are the truth, so
after a restart the node reads the addresses held from the engine, and nothing but a
launch being made is held in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace
from ipaddress import IPv4Address
from pathlib import Path

from tuneplane_node.errors import FabricAddressesExhausted
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.facts import JOB_INTERFACE
from tuneplane_node.runtime.labels import fabric_address_of, with_fabric_address
from tuneplane_node.runtime.spec import FABRIC, ContainerSpec
from tuneplane_node.settings import Fabric

log = logging.getLogger(__name__)
IB_SYSFS = Path("/sys/class/infiniband")
ROCE_V2 = "RoCE v2"
IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


def addresses(fabric: Fabric) -> Iterator[IPv4Address]:
    """The range's addresses a job may have, in order: not the subnet's network or
    broadcast address, nor its gateway (without one, the subnet's first address, which
    both engines reserve as the network's gateway)."""
    assert fabric.subnet is not None and fabric.range is not None
    subnet = fabric.subnet
    never = {subnet.network_address, subnet.broadcast_address, fabric.network_gateway}
    return (address for address in fabric.range if address not in never)


class FabricAddresses:
    """Hands each fabric-network launch an address no container of the node holds and
    no other launch is being given (``fabric`` None: the node has no fabric network,
    and no spec is on it). `claim` reads the labels and chooses under one lock;
    the claim is held until the launch's container carries the label or the launch ends
    without one (`release`)."""

    def __init__(self, fabric: Fabric | None, runtime: ContainerRuntime) -> None:
        self.fabric = fabric
        self.runtime = runtime
        self._claims: dict[str, IPv4Address] = {}
        self._lock = asyncio.Lock()

    async def held(self) -> set[IPv4Address]:
        """The addresses on the node's containers (any state: an exited job's container
        still holds its address until it is removed), and those being handed out."""
        held = set(self._claims.values())
        for state in await self.runtime.ps():
            label = fabric_address_of(state.labels) if state.ours else None
            if label:
                try:
                    held.add(IPv4Address(label))
                except ValueError:
                    log.warning("container %s: fabric address %r unreadable", state.name, label)
        return held

    async def claim(self, ref: str) -> IPv4Address:
        """The lowest free address for launch ``ref`` (the same again for a ref that holds
        one), or `FabricAddressesExhausted`."""
        fabric = self.fabric
        assert fabric is not None  # `NetworkRule` puts no job there without one
        async with self._lock:
            if ref in self._claims:
                return self._claims[ref]
            held = await self.held()
            count = 0
            for address in addresses(fabric):
                count += 1
                if address not in held:
                    self._claims[ref] = address
                    return address
            raise FabricAddressesExhausted(fabric=fabric.name, range_=str(fabric.range), held=count)

    def release(self, ref: str) -> None:
        """The launch's container carries the label now, or the launch ended without one."""
        self._claims.pop(ref, None)

    async def place(self, plan: LaunchRequest) -> LaunchRequest:
        """The place step: a fabric-network spec with its address (label; held with the
        cards, `Reservation`) and NCCL's interface and GID index (env), each unless the
        console set it; any other spec as it is. After the network's step: a host
        request not granted may be put on the fabric there."""
        if plan.spec.network != FABRIC or self.fabric is None:
            return plan
        return replace(plan, spec=await self._addressed(plan.spec, self.fabric))

    async def _addressed(self, spec: ContainerSpec, fabric: Fabric) -> ContainerSpec:
        address = await self.claim(spec.name)
        env = dict(spec.env)
        env.setdefault("NCCL_SOCKET_IFNAME", JOB_INTERFACE)
        gid = await asyncio.to_thread(gid_index, fabric)  # sysfs: off the loop
        if gid is not None:
            env.setdefault("NCCL_IB_GID_INDEX", str(gid))
        labels = with_fabric_address(spec.labels, str(address))
        return replace(spec, env=env, labels=labels)


def gid_index(fabric: Fabric, *, sysfs: Path | None = None) -> int | None:
    """NCCL's GID index for an RoCE fabric: the lowest RoCE v2 GID holding an IPv4 address
    (on the fabric's interface where the kernel says which), of the first HCA of the
    fabric whose port is Ethernet. None on InfiniBand (NCCL's default GID 0 is right), or
    where no such device or GID is found."""
    for hca in fabric.hcas:
        for port in sorted(((sysfs or IB_SYSFS) / hca / "ports").glob("*")):
            if _read(port / "link_layer") != "Ethernet":
                continue
            found = _roce_v2_ipv4(port, fabric.interface)
            if found is not None:
                return found
    return None


def _roce_v2_ipv4(port: Path, interface: str | None) -> int | None:
    candidates = []
    for entry in (port / "gid_attrs" / "types").glob("*"):
        if not entry.name.isdigit() or _read(entry) != ROCE_V2:
            continue
        if not (_read(port / "gids" / entry.name) or "").startswith(IPV4_MAPPED):
            continue
        ndev = _read(port / "gid_attrs" / "ndevs" / entry.name)
        candidates.append((interface is not None and ndev == interface, -int(entry.name)))
    if not candidates:
        return None
    return -max(candidates)[1]


def _read(path: Path) -> str | None:
    """A sysfs attribute, stripped; None when absent or unreadable (an unset GID's type
    reads EINVAL)."""
    try:
        return path.read_text().strip()
    except OSError:
        return None
