"""Well-formed, but not now on this node (409): the cards, the cordon, a name or a run
held, what the node or its engine cannot give this job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from tuneplane_node.errors.base import NodeError


class Conflict(NodeError):
    status = 409
    code: ClassVar[str] = "conflict"


class ProtocolMismatch(Conflict):
    code: ClassVar[str] = "protocol_mismatch"

    def __init__(self, *, console: str, node: int) -> None:
        super().__init__(f"wire protocol mismatch: console={console}, node={node}")
        self.console = console
        self.node = node


class NoCapacity(Conflict):
    """Not enough GPUs: says what was asked and where every card is."""

    code: ClassVar[str] = "no_capacity"

    def __init__(
        self,
        *,
        requested: int,
        free: Sequence[int],
        held: Mapping[int, str],
        reserved: int = 0,
        external: Sequence[int] = (),
        unhealthy: Mapping[int, str] | None = None,
    ) -> None:
        unhealthy = dict(unhealthy or {})
        parts = [f"{len(free)} free {list(free)}", f"{len(held)} held by jobs"]
        if reserved:
            parts.append(f"{reserved} reserved for pending launches")
        if external:
            parts.append(f"{len(external)} used by processes outside the node {list(external)}")
        if unhealthy:
            parts.append(f"{len(unhealthy)} unhealthy {sorted(unhealthy)}")
        super().__init__(f"not enough GPUs: asked for {requested}; " + ", ".join(parts))
        self.requested = requested
        self.free = list(free)
        self.held = dict(held)
        self.reserved = reserved
        self.external = list(external)
        self.unhealthy = unhealthy


class GpuNotReady(Conflict):
    """A launch asking for cards on a node whose engine cannot hand them to a container
    (no NVIDIA runtime, no CDI specification for a card) or whose card count is unknown:
    refused before the engine is asked, with the fix, never a 502 from the engine."""

    code = "gpu_not_ready"

    def __init__(self, *, reason: str) -> None:
        super().__init__(f"this node cannot run GPU jobs: {reason}")
        self.reason = reason


class DriverTooOld(Conflict):
    """A launch asking for cards whose image needs a newer CUDA than the driver gives
    (its ``NVIDIA_REQUIRE_CUDA`` or ``CUDA_VERSION``): it would run without a usable card
    (a trainer on the CPU, silently). Refused before anything is made."""

    code: ClassVar[str] = "driver_too_old"

    def __init__(self, *, image: str, needs: str, driver_cuda: str, driver: str | None) -> None:
        of = f" (driver {driver})" if driver else ""
        super().__init__(
            f"the image {image} needs CUDA {needs}; this node's driver gives CUDA "
            f"{driver_cuda}{of}: run it on a node with a newer driver, or an image built "
            f"for CUDA {driver_cuda} or older"
        )
        self.image = image
        self.needs = needs
        self.driver_cuda = driver_cuda


class NameTaken(Conflict):
    """The container name belongs to another run: a launch never takes it over."""

    code: ClassVar[str] = "name_held"

    def __init__(self, *, ref: str, run_id: str | None) -> None:
        super().__init__(f"the container name {ref} is held by run {run_id}")
        self.ref = ref
        self.run_id = run_id


class RunConflict(Conflict):
    """A launch of a run whose container (or pending launch) exists with another spec: a
    retry is idempotent only when it asks for the same job; nothing is done."""

    code: ClassVar[str] = "run_conflict"

    def __init__(self, *, ref: str, run_id: str, fields: Sequence[str]) -> None:
        super().__init__(
            f"run {run_id} already has {ref}, launched with another spec ({', '.join(fields)} "
            "differ): remove it to launch the new one, or send the spec it was launched with"
        )
        self.ref = ref
        self.run_id = run_id
        self.fields = tuple(fields)


class NodeCordoned(Conflict):
    """New launches are refused: the node is cordoned, draining or drained."""

    code: ClassVar[str] = "cordoned"

    def __init__(self, *, state: str, reason: str | None) -> None:
        why = f": {reason}" if reason else " (no reason given)"
        super().__init__(f"the node is {state} and takes no new launches{why}")
        self.state = state
        self.reason = reason


class NotRunning(Conflict):
    """A signal asked for a job that is not running: nothing was sent."""

    code: ClassVar[str] = "not_running"

    def __init__(self, *, ref: str, job_status: str) -> None:
        super().__init__(f"{ref} is not running ({job_status}): no signal was sent")
        self.ref = ref
        self.job_status = job_status


class NoRdma(Conflict):
    """``container.rdma: true`` on a node that hands jobs no RDMA devices."""

    code: ClassVar[str] = "no_rdma"

    def __init__(self, *, why: str) -> None:
        super().__init__(f"container.rdma: this node hands jobs no RDMA devices ({why})")
        self.why = why


class MemlockUnavailable(Conflict):
    """A launch that would get RDMA devices, whose memlock (``TUNEPLANE_RDMA_MEMLOCK``) is
    above the engine's own hard limit: the engine would refuse to start it (a 502)."""

    code: ClassVar[str] = "memlock_unavailable"

    def __init__(self, *, engine: str, why: str) -> None:
        super().__init__(
            f"container.rdma: the {engine} engine cannot give a job with RDMA devices its "
            f"locked memory: {why}; set LimitMEMLOCK=infinity in the engine's unit, or "
            "TUNEPLANE_RDMA_MEMLOCK to a size within the limit"
        )
        self.engine = engine


class SandboxUnavailable(Conflict):
    """A job the node would sandbox (its rule, or ``container.isolation: "sandbox"``)
    that the engine cannot run under the sandbox runtime: never run under runc instead."""

    code: ClassVar[str] = "sandbox_unavailable"

    def __init__(self, *, runtime: str, why: str, fix: str) -> None:
        super().__init__(f"container.isolation: no sandbox runtime {runtime} for it: {why}; {fix}")
        self.runtime = runtime
        self.why = why


class UsernsUnavailable(Conflict):
    """``TUNEPLANE_JOB_USERNS=always`` and a writable host mount the engine cannot id-map
    into the job's own user namespace (its root could not write it)."""

    code: ClassVar[str] = "userns_unavailable"

    def __init__(self, *, mount: str, why: str, fix: str) -> None:
        super().__init__(f"{mount}: {why}, under TUNEPLANE_JOB_USERNS=always; {fix}")
        self.mount = mount
        self.why = why


class FabricAddressesExhausted(Conflict):
    """A launch for the fabric network while every address of the operator's range is
    held by a container of the node (or a launch being made)."""

    code: ClassVar[str] = "fabric_addresses_exhausted"

    def __init__(self, *, fabric: str, range_: str, held: int) -> None:
        super().__init__(
            f"fabric {fabric}: all {held} addresses of its range {range_} are held by the "
            "node's jobs; remove finished jobs or widen the range (TUNEPLANE_FABRICS)"
        )
        self.fabric = fabric
        self.range = range_
