"""A launch as the launcher carries it (its plan, and the one shape of its steps), and
what it answers: started, already there, or pulling; a stop under way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tuneplane_node.jobs.words.images import ImageStore
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import IF_NOT_PRESENT, RegistryAuth


@dataclass(frozen=True)
class LaunchRequest:
    """A launch's plan: the contract's launch (`wire.values.Launch`) with its runtime
    spec, as the launch's steps (`LaunchStep`) rewrite it, each into a new value.
    ``auth``: the launch's own registry credentials (its repr hides them); they never
    enter the spec, whose labels and env reach the engine."""

    run_id: str
    requested_gpus: int
    spec: ContainerSpec
    auth: RegistryAuth | None = None
    pull_policy: str = IF_NOT_PRESENT
    relaunch: bool = True  # False: an exited container of the run is the answer
    store: ImageStore | None = None
    """The engine's image store as vetting read it: one reading per launch serves the
    disk limit and the room check (None: not vetted yet)."""
    volume_auth: Mapping[str, RegistryAuth | None] = field(default_factory=dict)
    """Each OCI volume's credentials, by its digest (`VolumeSources`): hidden as ``auth``."""

    @property
    def ref(self) -> str:
        return self.spec.name


class LaunchStep(Protocol):
    """One step of a launch's phase, the one door shape of both (as kubelet's admit
    handlers): the plan as the step leaves it, or a `NodeError` refusing the launch.

    The vet steps run before the run's lock, in `jobs.node.build_node`'s order, on the
    launch as the console asked; the place steps run once the cards are reserved (after
    the image's pull, for a pending launch), on the plan with its cards (``spec.gpus``)
    and the image id it is made from. A step changes nothing outside the plan, but for
    what a place step holds until the container exists or the launch ends (a fabric
    address, with the cards; staged mounts, released by the launcher)."""

    async def __call__(self, plan: LaunchRequest, /) -> LaunchRequest: ...


@dataclass(frozen=True)
class Stopping:
    """A stop under way: ``warned`` (the warning signal went out) or ``signalled`` (the
    stop signal did), since that moment (RFC 3339)."""

    phase: str
    since: str
    note: str | None = None  # why the stop went otherwise than asked


# --- launch -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Started:
    """The image was here: the container runs with these cards."""

    container_id: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class AlreadyRunning:
    """The run's container is live already: nothing was done."""

    gpus: tuple[int, ...]


@dataclass(frozen=True)
class AlreadyExited:
    """The run's container exited, and the launch asked for no relaunch: nothing was
    done (at most once)."""

    exit_code: int | None


@dataclass(frozen=True)
class Pulling:
    """The image is being pulled in the background; the cards are reserved."""

    image: str
    requested_gpus: int


@dataclass(frozen=True)
class AlreadyPending:
    """A launch of this ref is pending already: nothing was done."""

    phase: str
    image: str


LaunchResult = Started | AlreadyRunning | AlreadyExited | Pulling | AlreadyPending
