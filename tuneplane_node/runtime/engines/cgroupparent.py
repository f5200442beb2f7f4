"""The one parent cgroup every job is created under, the node's own (kubelet's kubepods).

Each job keeps its own pids and memory limits; the parent bounds them all together, at
what the node may give jobs: PIDs at the kernel's ``pid_max`` less the host's reserve
(``TUNEPLANE_SYSTEM_RESERVED_PIDS``), memory at the machine's less
``TUNEPLANE_SYSTEM_RESERVED_MEMORY``. Two jobs forking without end then leave the host
its PIDs, whatever each job's own limit.

The engine's cgroup driver decides the parent's form (`JobParent.engine_form`):
``cgroupfs`` takes a path (``/tuneplane-jobs``), which the node owns and bounds itself
where it may write the cgroup tree; ``systemd`` takes a slice (``tuneplane-jobs.slice``,
nested by its dashes: ``/tuneplane.slice/tuneplane-jobs.slice``), which is systemd's: the
shipped unit bounds it (``TasksMax=``, ``MemoryMax=``) and the node only reads it. On
cgroup v1 each controller has its own tree (``pids/``, ``memory/``), on v2 one directory
holds both. `EngineParent` is an engine runtime's part in it, a helper it composes as
it does `EngineImages`; nothing here imports an SDK.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuneplane_node import inventory
from tuneplane_node.errors import ConfigError
from tuneplane_node.runtime.cgroups import CGROUP_ROOT, V1_UNLIMITED, Bounds, pid_max, wanted
from tuneplane_node.runtime.engines.seam import EngineSeam
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
SYSTEMD = "systemd"
CGROUPFS = "cgroupfs"
"""Below this, what the reserve leaves all jobs is a mistake in the settings."""
CONTROLLERS = ("pids", "memory")


@dataclass(frozen=True)
class JobParent:
    """The parent as one engine names it: ``name`` (the setting), the engine's cgroup
    ``driver``, and whether this machine's tree is cgroup v2 (``unified``)."""

    name: str
    driver: str
    unified: bool

    @property
    def engine_form(self) -> str:
        """What ``cgroup_parent`` is on create: a slice for systemd, a path otherwise."""
        return f"{self.name}.slice" if self.driver == SYSTEMD else f"/{self.name}"

    @property
    def path(self) -> str:
        """Where it is in the cgroup tree."""
        return slice_path(self.engine_form) if self.driver == SYSTEMD else self.engine_form

    @property
    def owned(self) -> bool:
        """Whether the node bounds it itself (a slice's bounds are systemd's)."""
        return self.driver != SYSTEMD

    def dirs(self, root: Path = CGROUP_ROOT) -> dict[str, Path]:
        """Its directory in each controller's tree: one for both on v2."""
        where = self.path.lstrip("/")
        return {c: root / where if self.unified else root / c / where for c in CONTROLLERS}


def slice_path(unit: str) -> str:
    """systemd's path of a slice, nested by its dashes: ``a-b.slice`` is
    ``/a.slice/a-b.slice``."""
    parts = unit.removesuffix(".slice").split("-")
    return "".join(f"/{'-'.join(parts[: n + 1])}.slice" for n in range(len(parts)))


def is_unified(root: Path = CGROUP_ROOT) -> bool:
    """cgroup v2 alone; a hybrid host (v1 controllers, an empty v2 tree) is v1."""
    return (root / "cgroup.controllers").exists()


# Per version: (pids file, memory file).
FILES = {True: ("pids.max", "memory.max"), False: ("pids.max", "memory.limit_in_bytes")}


def read(parent: JobParent, root: Path = CGROUP_ROOT) -> Bounds | None:
    """The bounds the parent holds now; None when it does not exist here."""
    dirs = parent.dirs(root)
    if not all(directory.is_dir() for directory in dirs.values()):
        return None
    pids_file, memory_file = FILES[parent.unified]
    return Bounds(
        pids=_bound(dirs["pids"] / pids_file),
        memory_bytes=_bound(dirs["memory"] / memory_file),
    )


def _bound(path: Path) -> int | None:
    """A limit file's figure; None for ``max``, v1's near-2**63 "none", or unreadable."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) >= V1_UNLIMITED:
        return None
    return int(text)


def writable(parent: JobParent, root: Path = CGROUP_ROOT) -> bool:
    """Whether this process may make and bound the parent: a read-only cgroup tree (a
    unit's ``ProtectControlGroups=yes``, a container's) says no."""
    for directory in parent.dirs(root).values():
        existing = directory if directory.exists() else directory.parent
        if not os.access(existing, os.W_OK):
            return False
    return True


def write(parent: JobParent, bounds: Bounds, root: Path = CGROUP_ROOT) -> None:
    """Make the parent (cgroupfs: the node's own) and write ``bounds`` into it; an
    OSError says why not. Idempotent: the node's figure, raised or lowered."""
    dirs = parent.dirs(root)
    if parent.unified:
        _enable_controllers(dirs["pids"].parent)
    for directory in dirs.values():
        directory.mkdir(exist_ok=True)
    pids_file, memory_file = FILES[parent.unified]
    if not parent.unified:
        _hierarchical(dirs["memory"])
    if bounds.pids is not None:
        (dirs["pids"] / pids_file).write_text(str(bounds.pids))
    if bounds.memory_bytes is not None:
        (dirs["memory"] / memory_file).write_text(str(bounds.memory_bytes))


def _enable_controllers(directory: Path) -> None:
    """v2: a child has pids.max and memory.max only where its parent hands them down."""
    control = directory / "cgroup.subtree_control"
    present = set(control.read_text().split())
    missing = [c for c in CONTROLLERS if c not in present]
    if missing:
        control.write_text(" ".join(f"+{c}" for c in missing))


def _hierarchical(memory_dir: Path) -> None:
    """v1 before Linux 6.0: a memory cgroup bounds its children only with use_hierarchy
    (set while it has none; always on, and not writable, since)."""
    flag = memory_dir / "memory.use_hierarchy"
    try:
        if flag.read_text().strip() == "0":
            flag.write_text("1")
    except OSError as exc:
        log.warning("the jobs' parent %s: cannot set use_hierarchy: %s", memory_dir, exc)


@dataclass(frozen=True)
class ParentReport:
    """The parent as `check` says it: where, what the node wants, what it holds
    (None: not here yet, or not visible from here), and the node's part."""

    parent: JobParent
    wanted: Bounds
    held: Bounds | None
    error: str | None = None  # why the node could not bound it

    @property
    def bounded(self) -> bool:
        return self.held is not None and self.held.within(self.wanted)


def describe_parent(report: ParentReport) -> str:
    """One line: where the parent is, what it holds against what the node wants, who
    bounds it."""
    parent = report.parent
    where = f"{parent.engine_form} ({parent.driver} driver, cgroup v{2 if parent.unified else 1})"
    held = "not there yet" if report.held is None else report.held.described()
    text = f"{where}: holds {held}; the node's figures: {report.wanted.described()}"
    if report.error is not None:
        return f"{text}; not bounded by the node: {report.error}"
    return text


class EngineParent:
    """An engine runtime's part in the jobs' parent: it learns the engine's driver (the
    adapter's ``driver``, as its info says: ``cgroupfs`` or ``systemd``) at the first
    launch, readies the parent before each create (`EngineRuntime.run`: the create
    options name it), bounds a parent the node owns, and says what the parent holds
    (`check`). Made with the seam, the settings and that call."""

    def __init__(self, seam: EngineSeam, settings: NodeSettings, driver: Callable[[], str]) -> None:
        self.seam, self.settings, self.driver = seam, settings, driver
        self.parent: JobParent | None = None  # once the engine said its cgroup driver

    def ready(self) -> None:
        """The jobs' parent: learnt at the first launch (the engine's driver decides its
        form), and, where the node owns it, made and bounded whenever it is missing (a
        reboot, an operator's rmdir). A parent the node cannot bound is logged, and
        jobs go under it with their own limits (`check` says so)."""
        if self.parent is None:
            self.parent = self._learn_parent()
            report = self._bound_parent(self.parent)
            level = logging.INFO if report.bounded else logging.WARNING
            log.log(level, "jobs' parent cgroup: %s", describe_parent(report))
        elif self.parent.owned and self.seam.local() and read(self.parent) is None:
            self._bound_parent(self.parent)

    def _learn_parent(self) -> JobParent:
        return JobParent(
            self.settings.job_cgroup_parent,
            driver=self.driver(),
            unified=is_unified(),
        )

    def _bound_parent(self, parent: JobParent) -> ParentReport:
        """Write the node's bounds into a parent it owns on this machine."""
        wanted = self._wanted_bounds()
        error = self._why_unbounded(parent)
        if error is None and parent.owned:
            try:
                write(parent, wanted)
            except OSError as exc:
                error = f"cannot write the cgroup tree: {exc.strerror or exc}"
        return self._parent_report(parent, wanted, error)

    def _wanted_bounds(self) -> Bounds:
        pids, memory = pid_max(), inventory.memory_total()
        try:
            return wanted(self.settings, pids=pids, machine_bytes=memory)
        except ConfigError:  # refused at start (`JobRules`): not here
            return Bounds(pids=None, memory_bytes=None)

    def _why_unbounded(self, parent: JobParent) -> str | None:
        if not self.seam.local():
            return "the engine is remote: its cgroups are its own host's"
        if parent.owned and not writable(parent):
            return "this process cannot write the cgroup tree (read-only here)"
        return None

    def _parent_report(self, parent: JobParent, wanted: Bounds, error: str | None) -> ParentReport:
        held = read(parent) if self.seam.local() else None
        return ParentReport(parent, wanted, held, error)

    async def report(self) -> ParentReport:
        """The jobs' parent as it is now, and whether the node could bound it; changes
        nothing (`check`)."""
        return await self.seam.call("report its cgroup driver", self._read_parent, read=True)

    def _read_parent(self) -> ParentReport:
        parent = self.parent or self._learn_parent()
        wanted = self._wanted_bounds()
        return self._parent_report(parent, wanted, self._why_unbounded(parent))
