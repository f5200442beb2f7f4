"""The views of `NodeSettings` by concern, each the few settings one wing of the node reads
(as kopf groups its configuration "instead of a flat mega-object"), while the variables
stay flat, ``TUNEPLANE_*``.

A view is a frozen copy, made from the settings when read (`NodeSettings.images`, ...):
`build_node` reads each once and hands it to the collaborators of its concern, which
then cannot read, nor depend on, any other setting. A view's field has the name of the
setting it holds, a field or a property of `NodeSettings` (so ``env_name(field)`` is its
variable, and a message names it so), and its type, a list as a tuple;
``tests/unit/test_settings_views.py`` holds both. Rules and defaults stay with
`NodeSettings`: a view holds values it has already checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

View = TypeVar("View")


def made_from(settings: object, view: type[View]) -> View:
    """The view of the settings: each of its fields copied from the setting of its name,
    a list as a tuple (`NodeSettings`, which imports this module, calls it)."""
    names = [field.name for field in dataclasses.fields(view)]  # type: ignore[arg-type]
    values = {name: getattr(settings, name) for name in names}
    return view(**{n: tuple(v) if isinstance(v, list) else v for n, v in values.items()})


@dataclass(frozen=True)
class ImageSettings:
    """The image wing's (jobs/images/): its pulls' bounds, the private-image rule, the
    image GC and the prefetch pins; where the ledger and the private record are kept."""

    state_dir: Path
    local_image_pull_timeout_s: float
    local_image_pull_stall_s: float
    private_image_check: bool
    private_image_recheck_s: float
    image_gc: Literal["node", "all", "off"]
    image_gc_high_percent: int
    image_gc_low_percent: int
    inode_high_percent: int
    inode_low_percent: int
    image_gc_min_age_s: float
    image_gc_max_unused_s: float
    image_gc_interval_s: float
    image_pin_s: float


@dataclass(frozen=True)
class VolumeSettings:
    """The volume store's (jobs/volumes/): where it is, where its fetches may reach
    (the hosts asked over plain http, the internal networks allowed, the CAs trusted),
    its fills (a download's stall bound is an image pull's) and their deadline, eviction
    and pins."""

    volume_dir: Path
    local_image_pull_stall_s: float
    volume_insecure_hosts: tuple[str, ...]
    volume_allowed_networks: tuple[str, ...]
    volume_ca_file: Path | None
    volume_fills: int
    volume_fill_timeout_s: float
    volume_gc_high_percent: int
    volume_gc_low_percent: int
    volume_pin_s: float


@dataclass(frozen=True)
class LifecycleSettings:
    """The end of a job's container (the stopper, the reaper, the drain): a stop's
    grace without one of its own, an engine call's deadline (a wait for an exit, the age
    of a never-started container that is wreckage), how long an exited one is kept, and
    the relist period the wreckage sweep follows; the warning a stop the node makes on
    its own gives a job whose launch said none."""

    local_stop_timeout: float
    local_api_timeout: float
    local_container_ttl_s: float
    state_relist_s: float
    job_warn_signal: str | None
    job_warn_s: float


@dataclass(frozen=True)
class ObserveSettings:
    """What a console reads (jobs/observe/): the watch's change log and its waiting
    queries, a logs answer's size and the engine threads a follow may hold, the usage
    samples' period."""

    watch_history: int
    watch_max: int
    logs_max_bytes: int
    runtime_threads: int
    stats_interval_s: float
