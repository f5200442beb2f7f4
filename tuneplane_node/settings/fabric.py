"""An InfiniBand (or RoCE) fabric as the operator names it (``TUNEPLANE_FABRICS``, a
JSON list), with its optional fabric network, checked whole."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from typing import Literal

from pydantic import BaseModel, Field, model_validator

INTERFACE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$"
"""A Linux network interface name (IFNAMSIZ: at most 15 characters)."""


class Fabric(BaseModel):
    """An InfiniBand (or RoCE) fabric as the operator names it, with the HCAs attached to
    it, and optionally the fabric network of the jobs that span machines without holding
    the whole machine: a ``macvlan`` or ``ipvlan`` network on the fabric's ``interface``
    (ib0, an RoCE NIC), where each such job gets an IPv4 address of its own from
    ``range`` (inside ``subnet``), routable from the other machines of the fabric."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    hcas: list[str] = Field(min_length=1)
    interface: str | None = Field(default=None, pattern=INTERFACE_PATTERN)
    """The fabric's netdev on this machine; None: no fabric network for this fabric."""
    network: Literal["macvlan", "ipvlan"] = "macvlan"
    """The engine's driver of the fabric network (ipvlan for an InfiniBand netdev, whose
    link layer macvlan cannot bridge; either for an RoCE NIC)."""
    subnet: IPv4Network | None = None
    """The fabric's IPv4 subnet (CIDR), as the other machines route it."""
    range: IPv4Network | None = None
    """The addresses (CIDR, inside ``subnet``) this node hands out, one per job: each
    machine of the fabric is given a range of its own."""
    gateway: IPv4Address | None = None
    """The subnet's gateway, when it has one (inside ``subnet``, outside ``range``)."""

    @model_validator(mode="after")
    def _network_whole(self) -> Fabric:
        """A fabric network is given whole (interface, subnet, range) or not at all."""
        given = {"interface": self.interface, "subnet": self.subnet, "range": self.range}
        if not any(given.values()) and self.gateway is None:
            return self
        missing = [key for key, value in given.items() if value is None]
        if missing:
            raise ValueError(
                f"fabric {self.name}: a fabric network needs interface, subnet and range "
                f"(missing: {', '.join(missing)})"
            )
        assert self.subnet is not None and self.range is not None
        if not self.range.subnet_of(self.subnet):
            raise ValueError(
                f"fabric {self.name}: range {self.range} is not inside subnet {self.subnet}"
            )
        if self.gateway is not None:
            if self.gateway not in self.subnet:
                raise ValueError(
                    f"fabric {self.name}: gateway {self.gateway} is not inside subnet {self.subnet}"
                )
            if self.gateway in self.range:
                raise ValueError(
                    f"fabric {self.name}: gateway {self.gateway} is inside range {self.range}: "
                    "the node would hand it to a job"
                )
        return self

    @property
    def has_network(self) -> bool:
        return self.interface is not None

    @property
    def network_gateway(self) -> IPv4Address:
        """The fabric network's gateway: the operator's, else the subnet's first address
        (as podman chooses, and docker is told), which the node never hands to a job."""
        assert self.subnet is not None
        return self.gateway if self.gateway is not None else self.subnet.network_address + 1
