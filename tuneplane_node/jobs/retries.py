"""A launch of a run that exists already: a retry, told from another job.

The console's retry of a launch whose answer it lost is idempotent only when it asks
for the same job. So each container carries (label ``tuneplane.spec``) a digest of each
field of the spec the console sent, as the node parsed it (``""`` and a field left out
read alike, a map's order does not count); a launch of the run finds the fields that
differ. Registry credentials are not part of it: a retry with rotated credentials asks
for the same job, and no digest of a secret is written on a container. A container
without the label (made by an older node) is taken as the same spec, as 0.3.15 did.
Another spec is refused only where the run's job is live or kept (`retried`): an exited
one is launched again with it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

from tuneplane_node.errors import NameTaken, RunConflict
from tuneplane_node.jobs.words.launch import (
    AlreadyExited,
    AlreadyRunning,
    LaunchRequest,
    LaunchResult,
)
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.labels import fingerprint_of, with_fingerprint, without_fingerprint
from tuneplane_node.wire.values import LaunchContainer

CONTAINER_FIELDS = tuple(each.name for each in fields(LaunchContainer))
"""The container fields a console gives (the spec's others are the node's choices), in
the order the label has them."""
DIGEST_CHARS = 12


def fingerprint(request: LaunchRequest) -> str:
    """``field=digest`` for each field of the console's spec, space-separated."""
    return " ".join(f"{name}={_digest(value)}" for name, value in _fields(request).items())


def stamped(request: LaunchRequest) -> LaunchRequest:
    """The request, its spec labelled with its fingerprint (before the node's changes)."""
    labels = with_fingerprint(request.spec.labels, fingerprint(request))
    return replace(request, spec=replace(request.spec, labels=labels))


async def stamp(plan: LaunchRequest) -> LaunchRequest:
    """The first vet step: `stamped`, on the spec as the console asked."""
    return stamped(plan)


def retried(state: ContainerState, request: LaunchRequest) -> LaunchResult | None:
    """The answer to a `stamped` launch of the run of ``state`` (a container that
    exists); None: launch the request, in place of the container.

    Another run's name raises `NameTaken`. A live job is the answer (idempotent) to its
    own spec and a `RunConflict` to another. An exited one is launched again whatever
    the spec, as 0.3.15 did (a console resumes a run from its checkpoint with a new
    command); without ``relaunch`` it is the answer to its own spec (at most once) and
    a `RunConflict` to another. Wreckage (never started) is replaced either way: no job
    of it ever ran."""
    check_holder(state.name, state.run_id, request)
    if state.never_started or (request.relaunch and not state.live):
        return None
    check_same(state.name, state.labels, request)
    return AlreadyRunning(state.gpus) if state.live else AlreadyExited(state.exit_code)


def check_run(
    ref: str, holder: str | None, labels: Mapping[str, str], request: LaunchRequest
) -> None:
    """NameTaken when the name is another run's; RunConflict when the run's recorded
    spec (``labels``) is not the request's."""
    check_holder(ref, holder, request)
    check_same(ref, labels, request)


def check_holder(ref: str, holder: str | None, request: LaunchRequest) -> None:
    """NameTaken when the name is held by another run than the request's."""
    if holder != request.run_id:
        raise NameTaken(ref=ref, run_id=holder)


def check_same(ref: str, labels: Mapping[str, str], request: LaunchRequest) -> None:
    """Raise RunConflict naming the fields a `stamped` request changes from the spec the
    labels record; nothing when they record none. The stamp, not the request, is
    compared: the node changes the request after (a default memory limit, a network)."""
    recorded, asked = fingerprint_of(labels), fingerprint_of(request.spec.labels)
    if recorded is None or asked is None:
        return
    # pragma below: a field's name and its hex digest hold no "=" (rpartition is the same)
    before = dict(entry.partition("=")[::2] for entry in recorded.split())  # pragma: no mutate
    now = dict(entry.partition("=")[::2] for entry in asked.split())  # pragma: no mutate
    differ = [name for name in now.keys() | before.keys() if now.get(name) != before.get(name)]
    if differ:
        order = list(now)
        differ.sort(key=lambda name: order.index(name) if name in order else len(order))
        raise RunConflict(ref=ref, run_id=request.run_id, fields=differ)


def _fields(request: LaunchRequest) -> dict[str, Any]:
    spec = request.spec
    labels = without_fingerprint(spec.labels)
    values: dict[str, Any] = {"requested_gpus": request.requested_gpus}
    for name in CONTAINER_FIELDS:
        if name == "isolation" and not spec.isolation:
            continue  # only when asked: a run launched before the field is the same spec
        values[f"container.{name}"] = labels if name == "labels" else getattr(spec, name)
    if not spec.volumes:  # as the labels of containers made before volumes record it
        del values["container.volumes"]
    values["container.pull_policy"] = request.pull_policy
    return values


def _digest(value: object) -> str:
    canonical = json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:DIGEST_CHARS]


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    return value
