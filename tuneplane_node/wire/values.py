"""What the contract's requests are read into, and the words its answers use: plain data
the parsers (`requests`) make, at the bottom of the package so the job service, the
engines and the clients below and beside it take the same values without importing
anything above `errors`. A launch's container is typed here (`LaunchContainer`); the
runtime's `ContainerSpec` is that and the node's decisions.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

# --- the words of the answers' phases and states ------------------------------------------

PULLING, STARTING, FAILED = "pulling", "starting", "failed"
"""A pending launch's phases (and a pull's: pulling or failed)."""
PRESENT = "present"
"""A prefetch whose image is here already."""
WARNED, SIGNALLED = "warned", "signalled"
"""Which signal of a stop under way went out."""
READY, CORDONED, DRAINING, DRAINED = "ready", "cordoned", "draining", "drained"
STATES = (READY, CORDONED, DRAINING, DRAINED)
"""The node's states: whether it takes launches."""

# --- request values -----------------------------------------------------------------------

IF_NOT_PRESENT = "if_not_present"
ALWAYS = "always"
PULL_POLICIES = (IF_NOT_PRESENT, ALWAYS)

DEFAULT_WAIT_S = 60.0
MAX_WAIT_S = 300.0
"""A watch query's wait for a change: its default and its bound, in seconds."""

LABEL_RUN_ID = "tuneplane.run-id"
"""The label that makes a container the node's: its run id. Without it, not ours."""
LABEL_GPUS = "tuneplane.gpus"
"""The cards a container holds, ``0,3``: the only record of which cards are taken."""

LABEL_NETWORK = "tuneplane.network"
"""The network the node gave the job (`host`, `isolated`, `sealed`, `bridge`, `none`,
``fabric:<name>``): observe's ``network``."""
LABEL_MOUNTS = "tuneplane.mounts"
"""The key of the job's staged mounts (``<state dir>/mounts/<key>``), set when it has any."""
LABEL_DISK_LIMIT = "tuneplane.disk-limit"
"""The bytes a job may write to the engine's disk (writable layer and anonymous volumes),
as the node decided at its launch: what the disk monitor holds it to, after a restart too."""
LABEL_INODE_LIMIT = "tuneplane.inode-limit"
"""The inodes a job may make on the engine's disk, as the node decided at its launch."""
LABEL_SPEC = "tuneplane.spec"
"""A digest of each field of the spec the run was launched with (`jobs.retries`): a
retry with another spec is told apart. The node's own: observe never shows it."""
LABEL_USERNS = "tuneplane.userns"
"""Whether the job has a user namespace of its own: ``own`` (``own: <how>`` where its
writable mounts are handed to its range), or ``host: <why>`` where the node left it the
host's (`jobs.rules.isolation`). Observe shows it as ``userns`` and ``userns_note``."""
LABEL_FABRIC_ADDRESS = "tuneplane.fabric-address"
"""A fabric-network job's IPv4 address on the fabric (`jobs.rules.fabric`): the only record of
which addresses of the operator's range are taken. Shown: the console may pass it on."""
LABEL_RUNTIME = "tuneplane.runtime"
"""The OCI runtime the node asked for the job (a sandbox's); absent: the engine's default."""
LABEL_VOLUMES = "tuneplane.volumes"
"""The sha256 of each volume store entry a job binds, ``<hex>,<hex>``: what eviction
never removes while the container exists. The node's own: no answer shows it."""
LABEL_WARN_SIGNAL = "tuneplane.warn-signal"
"""The signal the job asked to be warned with (``container.warn_signal``) before a stop the
node makes on its own; absent: the operator's ``TUNEPLANE_JOB_WARN_SIGNAL``."""
LABEL_WARN_S = "tuneplane.warn-s"
"""Seconds from that warning to the stop signal (``container.warn_s``); absent: the
operator's ``TUNEPLANE_JOB_WARN_S``."""
SANDBOX = "sandbox"
"""``container.isolation``'s one value: the job runs under the node's sandbox runtime."""
NODE_LABELS = (
    LABEL_RUN_ID, LABEL_GPUS, LABEL_NETWORK, LABEL_MOUNTS, LABEL_DISK_LIMIT, LABEL_SPEC,
    LABEL_USERNS, LABEL_RUNTIME, LABEL_VOLUMES, LABEL_FABRIC_ADDRESS, LABEL_WARN_SIGNAL,
    LABEL_WARN_S, LABEL_INODE_LIMIT,
)  # fmt: skip
HIDDEN_LABELS = frozenset(
    {LABEL_SPEC, LABEL_MOUNTS, LABEL_DISK_LIMIT, LABEL_USERNS, LABEL_RUNTIME, LABEL_VOLUMES}
    | {LABEL_INODE_LIMIT}
)
"""Labels the node keeps for itself: no answer shows them (a 0.3.15 console's observe
reads the labels it always did)."""


class Mount(NamedTuple):
    host: str
    container: str
    read_only: bool = False


class Scratch(NamedTuple):
    """A job's scratch space: a filesystem of its own of ``size_bytes`` at ``path`` (the
    node makes it and binds it in as one of the job's mounts, `jobs.scratch`)."""

    path: str
    size_bytes: int


class Volume(NamedTuple):
    """A file of the node's volume store a job sees read-only at ``path``: the bytes of
    ``source`` (an ``https://`` URL) whose sha256 is ``sha256`` (hex)."""

    source: str
    path: str
    sha256: str


@dataclass(frozen=True, repr=False)
class RegistryAuth:
    """Credentials for the registry of one pull: a user and password, or an identity
    token. ``source`` says where they came from (``launch``, ``file``), for the logs.

    Its repr and str name the source only: a credential passes through, it never reaches
    a log line, an error or an answer (design, principle 10)."""

    username: str = ""
    password: str = ""
    identity_token: str = ""
    source: str = "launch"

    def __repr__(self) -> str:
        return f"RegistryAuth(source={self.source!r}, <hidden>)"

    __str__ = __repr__

    @property
    def secrets(self) -> tuple[str, ...]:
        """What must never be shown, to scrub an engine's words with."""
        return tuple(s for s in (self.password, self.identity_token) if s)

    def fingerprint(self, salt: bytes) -> str:
        """A salted hash of the credential: what the node may keep and compare."""
        material = "\x00".join((self.username, self.password, self.identity_token))
        return hmac.new(salt, material.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class StopPlan:
    """How a stop goes. With ``warn_signal``: that signal first, and up to ``warn_s`` (None:
    as long as the grace period) for the job to end by itself. Then ``signal`` (None: the
    job's own stop signal), then SIGKILL once ``grace`` has passed (None: the node's
    ``TUNEPLANE_LOCAL_STOP_TIMEOUT``)."""

    grace: float | None = None
    signal: str | None = None
    warn_signal: str | None = None
    warn_s: float | None = None


@dataclass(frozen=True)
class PrefetchRequest:
    """A pull ahead of the launches that will need it. ``auth`` as a launch's."""

    image: str
    auth: RegistryAuth | None = None
    pull_policy: str = IF_NOT_PRESENT


@dataclass(frozen=True)
class Cursor:
    """A position in one daemon process's change log: opaque to the console, which
    sends back the ``index`` it was given. ``epoch`` names the process."""

    epoch: str
    position: int

    def __str__(self) -> str:
        return f"{self.epoch}-{self.position}"

    @classmethod
    def read(cls, text: str) -> Cursor | None:
        """The cursor a ``str`` made; None for anything else."""
        epoch, _, position = text.partition("-")
        if not (CURSOR_EPOCH.fullmatch(epoch) and position.isascii() and position.isdigit()):
            return None
        if len(position) > 19:  # past any position a process reaches
            return None
        return cls(epoch, int(position))


CURSOR_EPOCH = re.compile(r"[0-9a-f]{16}")


NAME_PREFIX = "tuneplane-"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")
_MAX_NAME = 120


def container_name(run_id: str) -> str:
    """A launch's container name where the console gave none: ``tuneplane-<safe id>``;
    ids that had to be changed get a hash so two never collide."""
    safe = _UNSAFE.sub("-", run_id)
    if safe == run_id and len(safe) <= _MAX_NAME:
        return NAME_PREFIX + safe
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{NAME_PREFIX}{safe[:_MAX_NAME]}-{digest}"


@dataclass(frozen=True)
class LaunchContainer:
    """A launch's ``container`` as the contract reads it: each attribute is the field of
    that name in `container.CONTAINER`, as its reader made it (a test holds names and
    types together). The runtime's `ContainerSpec` extends it with the node's decisions,
    so a field is declared once, here, and the spec has it by that name and type.
    ``command`` is the entry argv: it replaces the image ENTRYPOINT.

    The order is the order of ``tuneplane.spec``'s digests (`jobs.retries`): a new field
    goes last."""

    name: str  # the console's, or `container_name` of the run: the ref of every verb
    image: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    shm_size: str | None = None
    cpu_limit: float | None = None
    # The console's word, then the node's decision (the machine less its reserve).
    memory_limit: str | None = None
    network: str = "host"  # the console's word, then the network the node gives it
    user: str | None = None
    stop_signal: str | None = None  # None: the image's STOPSIGNAL, else SIGTERM
    rdma: bool | None = None  # the console's word: None for the node's rule (TUNEPLANE_RDMA)
    # The console's word (None: not asked), then the node's decision (the operator's
    # TUNEPLANE_JOB_READ_ONLY_ROOT or the console's true): the image's filesystem
    # read-only, the job writing only in its tmpfs (and mounts).
    read_only_root: bool | None = None
    disk_limit: str | None = None  # the console's word; None: the node's default
    scratch: Scratch | None = None  # None: no scratch space
    volumes: tuple[Volume, ...] = ()  # bound read-only at start
    isolation: str = ""  # "sandbox", or "" for the node's rule
    # The console's word for the node's own stops (labels LABEL_WARN_*); None: the operator's.
    warn_signal: str | None = None
    warn_s: float | None = None
    # The console's word, then the node's decision (TUNEPLANE_JOB_INODE_LIMIT): the
    # inodes it may make there, written in its LABEL_INODE_LIMIT; None: no limit.
    inode_limit: int | None = None


@dataclass(frozen=True)
class Launch:
    """A launch as the contract reads it, what `JobService.launch` takes. ``auth``: the
    launch's own registry credentials (their repr hides them); they are never part of
    the container, whose labels and env reach the engine."""

    run_id: str
    requested_gpus: int
    container: LaunchContainer
    auth: RegistryAuth | None = None
    pull_policy: str = IF_NOT_PRESENT
    relaunch: bool = True  # False: an exited container of the run is the answer

    @property
    def ref(self) -> str:
        """The container's name: the ref of every other verb."""
        return self.container.name
