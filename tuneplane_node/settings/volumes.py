"""`VolumeStoreSettings`: the volume store's settings, declared apart (`NodeSettings`
extends it): where the store is, where the node may fetch from for a tenant, its fills,
eviction and pins (``TUNEPLANE_VOLUME_*``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from tuneplane_node.settings.values import DAY

MAX_NETWORKS = 256


class VolumeStoreSettings(BaseSettings):
    """The volume store's: its place, the reach of its fetches, its fills, eviction and
    pins (a view of `NodeSettings`, whose environment names they keep)."""

    volume_root: Path | None = None
    """Directory of the node's volume store (``container.volumes``: each file by its
    sha256, each OCI volume a directory by its manifest's, filled once per machine);
    unset: ``volumes`` in the state directory. Never a mount root nor inside or holding
    one: jobs see its entries only through their own read-only binds."""
    volume_insecure_hosts: list[str] = []
    """Hosts (``host:port``, JSON list) whose volumes may be fetched over plain
    ``http://``: URLs, and OCI registries (and their token services) the node asks over
    http; every other volume URL and registry is ``https://``."""
    volume_allowed_networks: list[str] = Field([], max_length=MAX_NETWORKS)
    """Networks (CIDRs, JSON list) a volume's fetch may reach although they are internal:
    the node fetches for a tenant only from public addresses (never loopback, link-local,
    private, CGNAT, multicast, reserved or this machine's own), unless listed here (an
    internal mirror, a registry on the LAN)."""
    volume_ca_file: Path | None = None
    """A PEM file of certificate authorities trusted for volume sources (https URLs,
    registries, their token services) besides the system's: a private CA's mirror."""
    volume_fills: int = Field(4, ge=1, le=64)
    """Volume fills downloading at once. Fills of a file over 1 GiB (or of an unknown
    size) take at most one less, so a small fill never waits behind big ones."""
    volume_fill_timeout_s: float = Field(6 * 3600.0, gt=0, le=7 * DAY, allow_inf_nan=False)
    """Seconds a volume fill may take in all (its retries included) before it fails."""
    volume_gc_high_percent: int = Field(85, ge=1, le=100)
    """Use of the volume store's filesystem, in percent, at which the least recently
    used entries are evicted; a fill that would cross it, even after eviction, is
    refused before its first byte (507 ``volume_store_full``)."""
    volume_gc_low_percent: int = Field(80, ge=0, le=99)
    """Use, in percent, eviction brings the volume store's filesystem down to; below
    the high one."""
    volume_pin_s: float = Field(3600.0, ge=0, le=30 * DAY, allow_inf_nan=False)
    """Seconds an entry prefetched by ``POST /node/v1/volumes/pull`` is kept from
    eviction (from the prefetch; in the daemon's memory: a restart forgets the pin)."""

    @field_validator("volume_insecure_hosts")
    @classmethod
    def _host_and_port(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            name, _, port = host.rpartition(":")
            if not name or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{host!r} is not host:port")
        return [host.lower() for host in hosts]

    @field_validator("volume_allowed_networks")
    @classmethod
    def _networks(cls, networks: list[str]) -> list[str]:
        """Each a CIDR (an address alone is its own /32 or /128), kept in its canonical
        spelling; host bits set are refused, as a typo in a trust rule must not widen it."""
        found = []
        for network in networks:
            try:
                found.append(str(ipaddress.ip_network(network.strip(), strict=True)))
            except ValueError as exc:
                raise ValueError(f"{network!r} is not a network ({exc})") from None
        return found
