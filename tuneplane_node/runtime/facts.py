"""What an engine says of itself (its health, how it hands cards, mounts and isolation,
its data root, its images) and of what its containers use (CPU, memory, disk).

Plain data, each answer of a `runtime.base.ContainerRuntime` method that reports a fact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tuneplane_node.inventory import Space


@dataclass(frozen=True)
class RuntimeHealth:
    ok: bool
    engine: str
    version: str | None = None
    error: str | None = None


CDI_GPU_KIND = "nvidia.com/gpu"
"""The CDI kind of an NVIDIA card: the device ``nvidia.com/gpu=<index>``."""


@dataclass(frozen=True)
class DeviceSupport:
    """How an engine can hand cards to a container, as it says of itself.

    ``runtimes``: docker's OCI runtimes by name (an ``nvidia`` one means the NVIDIA
    Container Toolkit is set up). ``cdi_dirs``: where the engine reads CDI specifications
    (``nvidia.com/gpu=N`` devices), empty when it reads none; ``cdi_local``: whether
    those directories are this machine's (an engine over TCP reads its own host's).
    ``error``: the engine could not be asked."""

    runtimes: tuple[str, ...] = ()
    cdi_dirs: tuple[str, ...] = ()
    cdi_local: bool = True
    error: str | None = None

    @property
    def cards_by_cdi(self) -> bool:
        """Whether docker must be given the cards as CDI devices (its ``cdi`` driver):
        no ``nvidia`` runtime for its GPU device request, but CDI specifications read."""
        return "nvidia" not in self.runtimes and bool(self.cdi_dirs)


CUDA_REQUIRE = "NVIDIA_REQUIRE_CUDA"
CUDA_VERSION = "CUDA_VERSION"
CUDA_DISABLE = "NVIDIA_DISABLE_REQUIRE"
CUDA_KEYS = (CUDA_REQUIRE, CUDA_VERSION, CUDA_DISABLE)


def cuda_env(env: Iterable[object]) -> dict[str, str]:
    """An image's ``KEY=value`` entries that say its CUDA requirement (the rest are not
    kept: `gpu.cudareq` reads these)."""
    found = {}
    for entry in env:
        key, _, value = str(entry).partition("=")
        if key in CUDA_KEYS:
            found[key] = value[:4096]
    return found


@dataclass(frozen=True)
class ImageInfo:
    """An image as the engine holds it: its id (``sha256:...``, the same on both
    engines), its size on disk, the names (``repo:tag``) it goes by there, and the
    registry digests (``repo@sha256:...``) it was pulled as."""

    id: str
    size_bytes: int | None = None
    names: tuple[str, ...] = ()
    digests: tuple[str, ...] = ()
    # Its environment's CUDA requirement (``NVIDIA_REQUIRE_CUDA``, ``CUDA_VERSION``,
    # ``NVIDIA_DISABLE_REQUIRE``; `gpu.cudareq`), the only entries kept.
    cuda_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineImage:
    """One image of the engine: its id, the references it goes by (``repo:tag``, and
    ``repo@digest``), its size on the engine's disk (shared layers counted in each
    image that has them, as the engines report it), when it was built (RFC 3339, the
    image's own date, not its arrival) and whether any container, the node's or not,
    running or not, is made from it."""

    id: str
    refs: tuple[str, ...]
    size: int
    created: str | None = None
    in_use: bool = False


@dataclass(frozen=True)
class DataRoot:
    """Where the engine keeps its images (docker's DockerRootDir, podman's graphRoot),
    and the size of its filesystem: None when that path is not on this machine (an
    engine not reached through a unix socket: its path says nothing of the disks here),
    or cannot be measured. ``project_quotas``: whether its filesystem holds a job's
    writable layer to its disk limit itself (`runtime.engines.store.project_quotas`);
    None: unknown."""

    path: str
    space: Space | None
    project_quotas: bool | None = None


@dataclass(frozen=True)
class DiskUse:
    """What a container has written to the engine's disk (`runtime.diskwalk`):
    ``used_bytes`` None when it cannot be measured from here (a remote engine, a storage
    driver without an upper directory); ``complete`` false when the walk's time budget
    ran out first, so the figure is a lower bound; ``walk_s``: how long the walk took.
    ``deleted_open_bytes``: the part of ``used_bytes`` that is deleted files its
    processes hold open (`runtime.openfiles`); None where they cannot be read here."""

    used_bytes: int | None
    complete: bool = True
    walk_s: float = 0.0
    deleted_open_bytes: int | None = None
    inodes: int | None = None  # the files, directories and links counted, each once


STAGED, DIRECT, REMOTE = "staged", "direct", "remote"


@dataclass(frozen=True)
class MountSupport:
    """How a runtime takes a job's host mounts. `STAGED`: the engine shares this
    machine's filesystem, and is handed the node's staging path of each mount (`jobs.
    staging`). `DIRECT`: the process runtime (development only), which mounts nothing.
    `REMOTE`: the engine is another machine's (tcp://, ssh://): no host path of this
    one means anything there, and a staged one could not be handed over, so host mounts
    are refused. ``engine_dirs``: the engine's own directories as it reports them (its
    data root, podman's run root), which no job may mount."""

    mode: str
    engine_dirs: tuple[str, ...] = ()


@dataclass(frozen=True)
class IsolationSupport:
    """What an engine can isolate a job with, as it says of itself.

    ``default_runtime``: the OCI runtime its containers get unless told otherwise, with its
    ``runtime_version`` where the engine says it. ``runtimes``: each runtime a container
    may be given by name, with the arguments it is registered with. ``per_job_userns``:
    whether each container can get a user namespace of its own (podman's ``userns=auto``).
    ``idmap_mounts``: whether a bind mount can be id-mapped into one (runc 1.2 and later,
    crun). ``remaps_users``: the engine maps every container's users (docker's
    ``userns-remap``, rootless podman). ``error``: the engine could not be asked."""

    default_runtime: str = ""
    runtime_version: str = ""
    runtimes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    per_job_userns: bool = False
    idmap_mounts: bool = False
    remaps_users: bool = False
    error: str | None = None


NAMESPACED_RUNTIMES = ("runc", "crun")
"""The OCI runtimes that run a job on the host's kernel in namespaces the engine asks
for, a user namespace included; a sandbox (runsc, kata) brings a kernel of its own."""


def maps_users(runtime: str) -> bool:
    """Whether a job under that runtime can be given a user namespace of its own."""
    return runtime.rsplit("/", 1)[-1] in NAMESPACED_RUNTIMES


JOB_INTERFACE = "eth0"
"""The fabric network's interface inside a job: docker names a container's only network's
interface eth0, podman is told to (checked by the engine tests)."""


@dataclass(frozen=True)
class Usage:
    """What one running container uses now, each figure None where it cannot be read.

    ``cpu_seconds`` is the CPU time its processes have used since it started (a counter:
    the job service turns two readings into cores in use). ``memory_bytes`` is its working
    set, what `docker stats` shows: charged memory less the page cache the kernel can drop
    at once (inactive files). ``memory_limit_bytes`` is None when it has no limit.
    ``source`` says where the figures came from: ``cgroup`` files, or the ``engine``'s stats.
    """

    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    pids: int | None = None
    source: str = "cgroup"
