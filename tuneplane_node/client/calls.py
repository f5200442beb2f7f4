"""Each verb of the API as one `Call`: its method, path, body or query, and how its
answer is read. The sync and the async client send the same calls, so a verb's wire form
is written once, here.

A body holds only what the caller gave: a field left out is the node's default, as ""
is for a 0.3.15 console.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from tuneplane_node.client import answers
from tuneplane_node.client.images import ImageGc, Images, Prefetch
from tuneplane_node.client.volumes import VolumeGc, VolumePull, Volumes

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[Any], T]
    body: Mapping[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    query: Mapping[str, str] | None = None
    wait_s: float = 0.0  # how much longer than a plain answer the node may take


WAIT_FILL_S = 3600.0
"""What a volume prefetch with ``wait`` may take beyond a plain answer: an hour's fill."""
STOP_ALLOWANCE_S = 300.0
"""What a stop without a ``timeout`` may take: the node's default grace period
(``TUNEPLANE_LOCAL_STOP_TIMEOUT``, 30 s unless its operator changed it), with room."""


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    read_only: bool = False


@dataclass(frozen=True)
class Scratch:
    """Scratch space with a hard size: a filesystem of the job's own at ``path``."""

    path: str
    size: int | str  # a size like "50g", or bytes


@dataclass(frozen=True)
class Volume:
    """A read-only file or directory of the node's volume store, bound at ``path``:
    ``source`` an ``https://`` URL (its ``sha256`` required: 64 hex) or an OCI reference
    (``registry/repo:tag``; ``sha256``, if given, its manifest's digest)."""

    source: str
    path: str
    sha256: str = ""  # "": not given (an OCI reference's tag resolves it)

    def to_json(self) -> dict[str, str]:
        body = {"source": self.source, "path": self.path}
        return body | {"sha256": self.sha256} if self.sha256 else body


@dataclass(frozen=True)
class Container:
    """A launch's container. A field left at its default is not sent: the node's own
    default applies. ``fields``: any other field of the contract, by its wire name
    (one newer than this client), sent as given."""

    image: str
    name: str = ""  # the job's ref; "": the node's (tuneplane-<run id>)
    command: Sequence[str] = ()  # the argv; (): the image's own
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    workdir: str = ""
    shm_size: int | str = ""
    cpu_limit: float | str = ""
    memory_limit: int | str = ""
    disk_limit: int | str = ""  # "": the node's TUNEPLANE_JOB_DISK_LIMIT
    inode_limit: int | str = ""  # "": the node's TUNEPLANE_JOB_INODE_LIMIT
    network: str = ""
    user: str = ""
    stop_signal: str = ""
    warn_signal: str = ""  # the warning before the node's own stops; "": the operator's
    warn_s: float | str = ""  # seconds from it to the stop signal; "": the operator's
    isolation: str = ""  # "sandbox": under the node's sandbox runtime; "": the node's rule
    rdma: bool | None = None
    read_only_root: bool | None = None  # None: the node's rule (its operator's true holds)
    scratch: Scratch | None = None  # None: no scratch space
    volumes: Sequence[Volume] = ()  # read-only files of the node's volume store
    pull_policy: str = ""
    registry_auth: Mapping[str, str] | None = field(default=None, repr=False)  # a secret
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"image": self.image}
        for name in _PLAIN:
            if (value := getattr(self, name)) not in ("", {}):
                body[name] = dict(value) if isinstance(value, Mapping) else value
        if self.command:
            body["command"] = list(self.command)
        if self.mounts:
            body["mounts"] = [[m.host, m.container, m.read_only] for m in self.mounts]
        if self.scratch is not None:
            body["scratch"] = {"path": self.scratch.path, "size": self.scratch.size}
        if self.volumes:
            body["volumes"] = [volume.to_json() for volume in self.volumes]
        for flag in ("rdma", "read_only_root"):
            if (value := getattr(self, flag)) is not None:
                body[flag] = value
        if self.registry_auth is not None:
            body["registry_auth"] = dict(self.registry_auth)
        return {**body, **self.fields}


_PLAIN: tuple[str, ...] = (
    *("name", "env", "labels", "workdir", "shm_size", "cpu_limit", "memory_limit"),
    *("disk_limit", "inode_limit"),
    *("network", "user", "stop_signal", "pull_policy", "isolation", "warn_signal", "warn_s"),
)
"""The container's fields sent as they are, when given."""


def launch(
    run_id: str,
    container: Container | Mapping[str, Any],
    requested_gpus: int | None,
    relaunch: bool | None = None,
) -> Call[answers.Launched]:
    spec = container.to_json() if isinstance(container, Container) else dict(container)
    body: dict[str, Any] = {"run_id": run_id, "container": spec}
    if requested_gpus is not None:
        body["requested_gpus"] = requested_gpus
    if relaunch is not None:
        body["relaunch"] = relaunch
    return Call("POST", "/node/v1/launch", lambda a: answers.build(answers.Launched, a), body)


def observe(refs: Sequence[str]) -> Call[dict[str, answers.JobState]]:
    return Call("POST", "/node/v1/observe", answers.states, {"refs": list(refs)})


def jobs(index: str = "", wait: float | None = None) -> Call[answers.Jobs]:
    """The list; with ``index``, the blocking query (the node adds up to a sixteenth of
    ``wait``, or of its default, 60 s)."""
    query = {"index": index} if index else {}
    if index and wait is not None:
        query["wait"] = f"{wait:g}"
    held = (60.0 if wait is None else wait) * 17 / 16 if index else 0.0
    return Call("GET", "/node/v1/jobs", _jobs, query=query, wait_s=held)


def _jobs(answer: Any) -> answers.Jobs:
    return answers.build(answers.Jobs, answer)


def stats(refs: Sequence[str] | None) -> Call[dict[str, answers.Usage]]:
    return Call("POST", "/node/v1/stats", answers.usages, {} if refs is None else {"refs": [*refs]})


def stop(
    ref: str,
    *,
    timeout: float | None,
    signal: str | None,
    warn_signal: str | None,
    warn_s: float | None,
) -> Call[None]:
    body = given(ref=ref, timeout=timeout, signal=signal, warn_signal=warn_signal, warn_s=warn_s)
    grace = STOP_ALLOWANCE_S if timeout is None else timeout
    return Call("POST", "/node/v1/stop", answers.nothing, body, wait_s=grace + (warn_s or grace))


def signal(ref: str, signal: str) -> Call[None]:
    return Call("POST", "/node/v1/signal", answers.nothing, {"ref": ref, "signal": signal})


def remove(ref: str) -> Call[None]:
    return Call("POST", "/node/v1/remove", answers.nothing, {"ref": ref})


def reap(max_age_s: float | None) -> Call[int]:
    return Call("POST", "/node/v1/reap", answers.removed_count, given(max_age_s=max_age_s))


def logs(
    ref: str, *, tail: int | None, since: float | str | datetime | None, follow: bool = False
) -> Call[answers.Logs]:
    query = {"ref": ref}
    if tail is not None:
        query["tail"] = str(tail)
    if since is not None:
        query["since"] = since.isoformat() if isinstance(since, datetime) else str(since)
    if follow:
        query["follow"] = "1"
    return Call("GET", "/node/v1/logs", lambda a: answers.build(answers.Logs, a), query=query)


def images() -> Call[Images]:
    """The node's images and pulls."""
    return Call("GET", "/node/v1/images", answers.one(Images))


def pull_image(
    image: str, registry_auth: Mapping[str, str] | None, pull_policy: str
) -> Call[Prefetch]:
    """A prefetch: its ``phase`` is pulling or present."""
    body: dict[str, Any] = {"image": image}
    if registry_auth is not None:
        body["registry_auth"] = dict(registry_auth)
    if pull_policy:
        body["pull_policy"] = pull_policy
    return Call("POST", "/node/v1/images/pull", answers.one(Prefetch), body)


def volumes() -> Call[Volumes]:
    """The volume store's entries, its fills and the store."""
    return Call("GET", "/node/v1/volumes", answers.one(Volumes))


def pull_volume(source: str, sha256: str = "", *, wait: bool) -> Call[VolumePull]:
    """A volume prefetch: its ``phase`` is filling or present. ``wait``: the answer
    comes when the fill has ended (at most `WAIT_FILL_S` more than a plain answer)."""
    body: dict[str, Any] = {"source": source, "sha256": sha256}
    if wait:
        body["wait"] = True
    read = answers.one(VolumePull)
    return Call("POST", "/node/v1/volumes/pull", read, body, wait_s=WAIT_FILL_S if wait else 0.0)


def volume_gc() -> Call[VolumeGc]:
    """One eviction run of the volume store now: what it removed and the store after."""
    read = answers.one(VolumeGc)
    return Call("POST", "/node/v1/volumes/gc", read, {}, wait_s=STOP_ALLOWANCE_S)


def image_gc() -> Call[ImageGc]:
    """One image GC run now: what it removed and the store after."""
    read = answers.one(ImageGc)
    return Call("POST", "/node/v1/images/gc", read, {}, wait_s=STOP_ALLOWANCE_S)


def health() -> Call[answers.Health]:
    return Call("GET", "/node/v1/health", lambda a: answers.build(answers.Health, a))


def inventory() -> Call[answers.Inventory]:
    return Call("GET", "/node/v1/inventory", lambda a: answers.build(answers.Inventory, a))


def cordon(reason: str) -> Call[answers.NodeState]:
    return Call("POST", "/node/v1/cordon", _node_state, {"reason": reason})


def uncordon() -> Call[answers.NodeState]:
    return Call("POST", "/node/v1/uncordon", _node_state, {})


def reset_breaker() -> Call[answers.Breaker]:
    return Call(
        "POST", "/node/v1/gpus/reset-breaker", lambda a: answers.build(answers.Breaker, a), {}
    )


def drain(
    reason: str, *, grace_s: float | None, warn_signal: str | None, warn_s: float | None
) -> Call[answers.NodeState]:
    body = given(reason=reason, grace_s=grace_s, warn_signal=warn_signal, warn_s=warn_s)
    return Call("POST", "/node/v1/drain", _node_state, body)


def _node_state(answer: Any) -> answers.NodeState:
    return answers.build(answers.NodeState, answer)


def given(**fields: Any) -> dict[str, Any]:
    """The fields that were given (not None): the others are the node's defaults."""
    return {name: value for name, value in fields.items() if value is not None}
