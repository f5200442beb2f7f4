"""The labels the node writes on a job container and reads back, side by side (as
kubelet's ``kuberuntime/labels.go``): a label's writing and its parsing never drift apart.

Labels are the truth: which cards a job holds, its disk and inode limits, its user
namespace, its OCI runtime, the warning a stop sends it, its network, its fabric
address, its staged mounts and volumes, the spec it was launched with. Each is written
once, when its container is made (the runtimes write `job_labels` of the spec; the
launch's steps add theirs with the ``with_*`` writers), and read back from `ps` after a
restart by the ``*_of`` readers. The names are spelt where the contract keeps them
(`wire.values`: a console reads some and may set none), and every other module takes
them from here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from tuneplane_node.runtime.spec import ContainerSpec, format_gpus
from tuneplane_node.signals import job_signal
from tuneplane_node.wire.values import (
    HIDDEN_LABELS,
    LABEL_DISK_LIMIT,
    LABEL_FABRIC_ADDRESS,
    LABEL_GPUS,
    LABEL_INODE_LIMIT,
    LABEL_MOUNTS,
    LABEL_NETWORK,
    LABEL_RUN_ID,
    LABEL_RUNTIME,
    LABEL_SPEC,
    LABEL_USERNS,
    LABEL_VOLUMES,
    LABEL_WARN_S,
    LABEL_WARN_SIGNAL,
    NODE_LABELS,
)

__all__ = [
    "HIDDEN_LABELS",
    "LABEL_DISK_LIMIT",
    "LABEL_FABRIC_ADDRESS",
    "LABEL_GPUS",
    "LABEL_INODE_LIMIT",
    "LABEL_MOUNTS",
    "LABEL_NETWORK",
    "LABEL_RUNTIME",
    "LABEL_RUN_ID",
    "LABEL_SPEC",
    "LABEL_USERNS",
    "LABEL_VOLUMES",
    "LABEL_WARN_S",
    "LABEL_WARN_SIGNAL",
    "NODE_LABELS",
]

log = logging.getLogger(__name__)
Labels = Mapping[str, str]

# --- written: the spec's, by every runtime as it makes the container ----------------------


def job_labels(spec: ContainerSpec) -> dict[str, str]:
    """The labels a job container carries: the spec's (its run id, and what the launch's
    steps added), its cards, its limits, its user namespace, its runtime, its warning."""
    labels = {**spec.labels, LABEL_GPUS: format_gpus(spec.gpus)}
    if spec.disk_limit_bytes is not None:
        labels[LABEL_DISK_LIMIT] = str(spec.disk_limit_bytes)
    if spec.inode_limit is not None:
        labels[LABEL_INODE_LIMIT] = str(spec.inode_limit)
    if spec.own_userns or spec.userns_note:
        kind = "own" if spec.own_userns else "host"
        labels[LABEL_USERNS] = f"{kind}: {spec.userns_note}" if spec.userns_note else kind
    if spec.runtime:
        labels[LABEL_RUNTIME] = spec.runtime
    if spec.warn_signal:
        labels[LABEL_WARN_SIGNAL] = spec.warn_signal
    if spec.warn_s is not None:
        labels[LABEL_WARN_S] = f"{spec.warn_s:g}"
    return labels


# --- written: by the launch's steps, into the spec's labels --------------------------------


def with_network(labels: Labels, network: str) -> dict[str, str]:
    """``network``: ``host``, the job network's name, or ``fabric:<its name>``."""
    return {**labels, LABEL_NETWORK: network}


def with_fabric_address(labels: Labels, address: str) -> dict[str, str]:
    return {**labels, LABEL_FABRIC_ADDRESS: address}


def with_staged(labels: Labels, *, mounts: str, volumes: Iterable[str]) -> dict[str, str]:
    """The key of the job's staged mounts, and the digests of the volumes it binds."""
    staged = {**labels, LABEL_MOUNTS: mounts}
    digests = ",".join(dict.fromkeys(volumes))
    if digests:
        staged[LABEL_VOLUMES] = digests
    return staged


def with_fingerprint(labels: Labels, fingerprint: str) -> dict[str, str]:
    """The digest of what the console asked (`jobs.retries`): a relaunch compares it."""
    return {**labels, LABEL_SPEC: fingerprint}


def without_fingerprint(labels: Labels) -> dict[str, str]:
    return {key: value for key, value in labels.items() if key != LABEL_SPEC}


# --- read back ---------------------------------------------------------------------------


def parse_gpus(label: str | None) -> tuple[int, ...]:
    """Card indices from a ``tuneplane.gpus`` label; junk entries are dropped, loudly."""
    cards: set[int] = set()
    for part in (label or "").split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit():
            cards.add(int(part))
        else:
            log.warning("ignoring bad entry %r in %s label %r", part, LABEL_GPUS, label)
    return tuple(sorted(cards))


def gpus_of(labels: Labels) -> tuple[int, ...]:
    return parse_gpus(labels.get(LABEL_GPUS))


def run_id_of(labels: Labels) -> str | None:
    """The run id; without it the container is not the node's."""
    return labels.get(LABEL_RUN_ID)


def disk_limit_of(labels: Labels) -> int | None:
    """The bytes it may write; None: no limit (or a label that is no number)."""
    return _count(labels.get(LABEL_DISK_LIMIT, ""))


def inode_limit_of(labels: Labels) -> int | None:
    """The inodes it may make; None: no limit (a job of an older node)."""
    return _count(labels.get(LABEL_INODE_LIMIT, ""))


def userns_of(labels: Labels) -> str | None:
    """``own`` or ``host``; None for a job launched without one."""
    label = labels.get(LABEL_USERNS)
    return None if label is None else label.split(":", 1)[0]


def userns_note_of(labels: Labels) -> str | None:
    """Why it keeps the host's user namespace, or how its writable mounts reach its own."""
    parts = labels.get(LABEL_USERNS, "").split(": ", 1)
    return parts[1] if len(parts) == 2 else None


def runtime_of(labels: Labels) -> str | None:
    """The OCI runtime the node asked for; None: the engine's default."""
    return labels.get(LABEL_RUNTIME)


def warn_signal_of(labels: Labels) -> str | None:
    """The signal its launch asked a stop of the node's to warn with; None: none, or
    none a job may be sent."""
    return job_signal(labels.get(LABEL_WARN_SIGNAL))


def warn_s_of(labels: Labels) -> float | None:
    """The seconds its launch gave the warning; None: none, or no finite number."""
    try:
        value = float(labels.get(LABEL_WARN_S) or "nan")
    except ValueError:
        return None
    return value if 0 <= value < float("inf") else None


def network_of(labels: Labels) -> str | None:
    return labels.get(LABEL_NETWORK) or None


def fabric_address_of(labels: Labels) -> str | None:
    return labels.get(LABEL_FABRIC_ADDRESS) or None


def mounts_of(labels: Labels) -> str:
    """The key of its staged mounts; "" for none."""
    return labels.get(LABEL_MOUNTS, "")


def volumes_of(labels: Labels) -> tuple[str, ...]:
    """The digests of the volumes it binds."""
    return tuple(filter(None, labels.get(LABEL_VOLUMES, "").split(",")))


def fingerprint_of(labels: Labels) -> str | None:
    return labels.get(LABEL_SPEC)


def _count(label: str) -> int | None:
    return int(label) if label.isdigit() else None
