"""A job's CPUs and memory next to its cards (``TUNEPLANE_CPU_AFFINITY``).

Host-to-device copies are about 3x faster from the card's own NUMA node than across the
socket link, so a job holding cards is created confined to its cards' nodes: their CPUs
(``cpuset_cpus``) and their memory (``cpuset_mems``). Only at create: updating a GPU
container's cgroup later loses its devices ("Failed to initialize NVML: Unknown Error",
kubernetes#77073), so a cpuset is never changed on a running job.

What the driver (or the simulation file) says is bounded by what this machine has: a CPU
it does not have is dropped, and a node it does not have leaves the memory nodes out. A
job that asks for more CPUs than its nodes have, or whose cards' nodes are unknown, gets
no cpuset at all, and the log says why.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tuneplane_node.gpu import numa
from tuneplane_node.gpu.probe import GpuSnapshot
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.labels import run_id_of
from tuneplane_node.runtime.spec import ContainerSpec, format_cpulist
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)


class CpuAffinity:
    """The cpuset of a job on given cards, from the GPU facts and this machine's nodes."""

    def __init__(
        self,
        settings: NodeSettings,
        *,
        machine_nodes: Mapping[int, tuple[int, ...]] | None = None,
        machine_cpus: tuple[int, ...] | None = None,
        gpus: Callable[[], Awaitable[GpuSnapshot]] | None = None,
    ) -> None:
        self.mode = settings.cpu_affinity
        self.gpus = gpus  # the cards' facts, for `place`; None: `placement` alone (check)
        # Read once: CPUs and nodes come and go only with hotplug, which a node survives
        # by its restart. A test says what machine it is (its CPUs: its nodes' unless given).
        if machine_nodes is None:
            machine_nodes, machine_cpus = numa.node_cpus(), numa.online_cpus()
        self.nodes = dict(machine_nodes)
        known = {cpu for node in self.nodes.values() for cpu in node}
        self.cpus = frozenset(machine_cpus if machine_cpus is not None else known)

    def apply(self, spec: ContainerSpec, gpus: GpuSnapshot | None) -> ContainerSpec:
        """``spec`` with the cpuset of its cards (``spec.gpus``), or unchanged, said why."""
        if self.mode == "off" or not spec.gpus:
            return spec
        placed = self.placement(spec.gpus, gpus, cpu_limit=spec.cpu_limit)
        job = job_fields(spec.name, run_id_of(spec.labels))
        if placed.why:
            log.info("launch %s: no cpuset: %s", spec.name, placed.why, extra=job)
            return spec
        log.info("launch %s: cpuset %s", spec.name, placed, extra=job)
        return replace(spec, cpuset_cpus=placed.cpus, cpuset_mems=placed.mems)

    async def place(self, plan: LaunchRequest) -> LaunchRequest:
        """The place step: the spec on its cards' CPUs and memory nodes (`apply`), by the
        cards' facts read now; a job without cards as it is."""
        if not plan.spec.gpus or self.gpus is None:
            return plan
        return replace(plan, spec=self.apply(plan.spec, await self.gpus()))

    def placement(
        self, cards: Sequence[int], gpus: GpuSnapshot | None, *, cpu_limit: float | None = None
    ) -> Placement:
        """The CPUs and memory nodes of ``cards`` on this machine, or why there are none."""
        places = {
            card.index: (card.numa_node, card.cpus)
            for card in (gpus.cards if gpus is not None else ())
            if card.numa_node is not None and card.cpus
        }
        unknown = [index for index in cards if index not in places]
        if unknown:
            return Placement(why=f"the NUMA node or CPUs of gpu {unknown} are unknown")
        nodes = sorted({places[index][0] for index in cards})
        wanted = {cpu for index in cards for cpu in places[index][1]}
        cpus = tuple(sorted(wanted & self.cpus))
        if not cpus:
            return Placement(why=f"none of the CPUs {format_cpulist(wanted)} is on this machine")
        if cpu_limit is not None and cpu_limit > len(cpus):
            why = f"cpu_limit {cpu_limit:g} asks more than the {len(cpus)} CPUs"
            return Placement(why=f"{why} of NUMA node(s) {format_cpulist(nodes)}")
        mems = tuple(nodes) if set(nodes) <= set(self.nodes) else ()
        return Placement(cpus, mems)


@dataclass(frozen=True)
class Placement:
    """A job's cpuset: its CPUs and memory nodes (() for mems: left out), or ``why`` not."""

    cpus: tuple[int, ...] = ()
    mems: tuple[int, ...] = ()
    why: str = ""

    def __str__(self) -> str:
        if self.why:
            return f"none ({self.why})"
        mems = format_cpulist(self.mems) if self.mems else "left out"
        return f"cpus {format_cpulist(self.cpus)}, mems {mems}"
