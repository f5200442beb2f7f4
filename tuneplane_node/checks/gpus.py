"""The check's card steps: the cards and whether they are ready, their CPUs and memory,
the fabrics and the RDMA devices a job may be given (and the engine's memlock for them)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from tuneplane_node import fabrics
from tuneplane_node.checks.findings import FAIL, OK, WARN, Finding
from tuneplane_node.errors import ConfigError, NodeError
from tuneplane_node.settings import NodeSettings, env_name

NET_SYSFS = Path("/sys/class/net")

if TYPE_CHECKING:
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.gpu.probe import GpuProbe, GpuSnapshot


def check_gpus(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.gpu.factory import make_probe

    probe = make_probe(settings)
    try:
        snapshot = probe.snapshot()
        found = [_cards_finding(settings, snapshot)]
        if snapshot.ok and snapshot.source != "none":
            found.append(check_affinity(settings, snapshot))
        return [*found, *asyncio.run(_ready_finding(settings, probe))]
    finally:
        probe.close()


def _cards_finding(settings: NodeSettings, snapshot: GpuSnapshot) -> Finding:
    if snapshot.source == "none":
        count = settings.local_gpu_count
        cards = f"{count} card(s) from {env_name('local_gpu_count')}" if count else "no cards"
        return (WARN, f"gpu: no driver ({snapshot.error}); {cards}")
    if not snapshot.ok:
        return (FAIL, f"gpu: {snapshot.source}: {snapshot.error}")
    names = Counter(card.name or "unnamed" for card in snapshot.cards)
    listed = ", ".join(f"{n} x {name}" for name, n in names.items()) or "no cards"
    where = snapshot.source
    if settings.gpu_simulation_file is not None:
        where = f"simulation file {settings.gpu_simulation_file}"
    return (OK, f"gpu: {where}, driver {snapshot.driver or 'unknown'}: {listed}")


def check_affinity(settings: NodeSettings, snapshot: GpuSnapshot) -> Finding:
    """Where a one-card job of each card would run, as a launch would decide it."""
    from tuneplane_node.jobs.rules.affinity import CpuAffinity

    if settings.cpu_affinity == "off":
        return (OK, f"cpu affinity: off ({env_name('cpu_affinity')}): jobs run on every CPU")
    affinity = CpuAffinity(settings)
    placed = {card.index: affinity.placement((card.index,), snapshot) for card in snapshot.cards}
    where = "; ".join(f"gpu {index}: {place}" for index, place in placed.items()) or "no cards"
    return (OK, f"cpu affinity: numa: {where}")  # an unknown node says so, and runs anywhere


async def _ready_finding(settings: NodeSettings, probe: GpuProbe) -> list[Finding]:
    """Whether a GPU job can run, as health's ``gpu_ready`` says it (the same reader)."""
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.runtime import detect_runtime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return []  # the engine step has said so
    try:
        allocator = GpuAllocator(runtime, settings, probe=probe)
        readiness = await allocator.ready()
        held = await _held_cards(allocator)
    finally:
        await runtime.close()
    if readiness.ready is None:
        return [(OK, "gpu jobs: none here (no cards)"), *held]
        return [(OK, "gpu jobs: none here (no cards)")]
    if not readiness.ready:
        return [(FAIL, f"gpu jobs: cannot run: {readiness.reason}"), *held]
    if not settings.local_gpu_passthrough:
        setting = f"{env_name('local_gpu_passthrough')}=false"
        return [(WARN, f"gpu jobs: {setting}: jobs are labelled with cards but see none"), *held]
    return [(OK, f"gpu jobs: ready, {runtime.name} can hand the cards to containers"), *held]


async def _held_cards(allocator: GpuAllocator) -> list[Finding]:
    """The cards no launch gets now though no job of the node holds them: a compute
    process left on one (a job's that outlived its container drains it: the daemon
    keeps it out until it is gone), a fault that takes it out."""
    try:
        occupancy = await allocator.occupancy()
    except NodeError:
        return []  # the engine step has said so
    found: list[Finding] = []
    for index, pids in sorted(occupancy.external.items()):
        listed = ", ".join(str(pid) for pid in pids)
        found.append((WARN, f"gpu {index}: draining: compute process {listed} on it, no job of "
                            "the node: no launch gets it until it is gone"))  # fmt: skip
    for index, why in sorted(occupancy.unhealthy.items()):
        found.append((WARN, f"gpu {index}: out: {why}"))
    return found


def check_fabrics(settings: NodeSettings) -> list[Finding]:
    if not settings.fabrics:
        return [(OK, "fabrics: none configured")]
    try:
        fabrics.check_fabrics(settings.fabrics)
    except ConfigError as exc:
        return [(FAIL, f"fabrics: {exc.message}")]
    return [
        (WARN, f"fabric {fact.fabric}: {', '.join(fact.hcas)}: no active port")
        if fact.rate_gbps is None
        else (OK, f"fabric {fact.fabric}: {', '.join(fact.hcas)} at {fact.rate_gbps:g} Gb/s")
        for fact in fabrics.fabrics(settings.fabrics)
    ]


def check_fabric_network(settings: NodeSettings, *, net: Path = NET_SYSFS) -> list[Finding]:
    """Where the jobs asking for the host network without the whole machine run, and
    whether the fabric network's interface is here (else their launch is a 502)."""
    fabric = settings.fabric_network
    if fabric is None:
        return []
    where = f"fabric network {fabric.name}: {fabric.network} on {fabric.interface}"
    if not (net / str(fabric.interface)).exists():
        return [(FAIL, f"{where}: no interface {fabric.interface} on this machine ({net})")]
    count = fabric.range.num_addresses if fabric.range is not None else 0
    return [(OK, f"{where}, range {fabric.range} ({count} addresses): jobs asking for host "
                 "that do not get it run there")]  # fmt: skip


def check_rdma(settings: NodeSettings) -> list[Finding]:
    """Whether a job given RDMA devices can have its memlock: the engine's process's own
    hard limit bounds it (`runtime.engines.memlock`)."""
    from tuneplane_node.runtime import memlock

    devices = fabrics.rdma_devices(settings.rdma_device_dir) if settings.rdma != "off" else ()
    if not devices:
        why = "off" if settings.rdma == "off" else f"no devices under {settings.rdma_device_dir}"
        return [(OK, f"rdma: {why}")]
    wanted = settings.rdma_memlock_bytes
    engine = settings.local_runtime
    found = memlock.read(settings, "docker" if engine == "auto" else engine)
    if engine == "auto" and not found.known:  # auto: docker, else podman
        engine = "podman"
        found = memlock.read(settings, engine)
    asked = f"{env_name('rdma_memlock')}={settings.rdma_memlock}"
    if not found.known:
        return [(WARN, f"rdma: {len(devices)} devices; the engine's locked-memory limit is "
                       f"unknown ({found.source}): {asked} may be refused")]  # fmt: skip
    refused = found.refusal(wanted)
    if refused is not None:
        return [(FAIL, (
            f"rdma: {len(devices)} devices, and the {engine} engine cannot give "
            f"a job {asked}: {refused}; every card job would be refused (memlock_unavailable): "
            f"set LimitMEMLOCK=infinity in the engine's unit, or {env_name('rdma_memlock')} "
            f"to at most {found.hard}"
        ))]  # fmt: skip
    return [(OK, f"rdma: {len(devices)} devices; {asked} within the engine's hard limit")]
