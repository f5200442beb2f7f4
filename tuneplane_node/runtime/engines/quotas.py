"""Whether the engine's store can hold a job's writable layer to a size itself.

Docker's overlay2 and podman's overlay take ``storage_opt size`` only where the store's
backing filesystem is xfs mounted with project quotas (``pquota``/``prjquota``): the
kernel then refuses a write past the size (``EDQUOT``), and nothing can outrun it. The
engine says its backing filesystem (docker's ``DriverStatus``, podman's
``store.graphStatus``); the mount's options are read here, in /proc/self/mountinfo,
so only for an engine on this machine. Anywhere else the disk monitor is the bound.
A kernel built without quota support (``CONFIG_QUOTA`` off) refuses those options at
mount time, so such a store never reads as having them.
"""

from __future__ import annotations

QUOTA_FILESYSTEMS = frozenset({"xfs"})
QUOTA_OPTIONS = frozenset({"pquota", "prjquota"})  # pqnoenforce counts, never refuses


def project_quotas(backing_fs: str | None, options: str | None) -> bool | None:
    """Whether the store enforces project quotas; None when either fact is unknown."""
    if backing_fs is None or options is None:
        return None
    enforced = QUOTA_OPTIONS & set(options.split(","))
    return backing_fs.strip().lower() in QUOTA_FILESYSTEMS and bool(enforced)


def backing_filesystem(status: object) -> str | None:
    """The ``Backing Filesystem`` of a storage driver's status: docker's list of pairs
    (``DriverStatus``) or podman's object (``store.graphStatus``)."""
    if isinstance(status, dict):
        status = list(status.items())
    for pair in status if isinstance(status, list) else ():
        if isinstance(pair, (list, tuple)) and len(pair) == 2 and pair[0] == "Backing Filesystem":
            return str(pair[1])
    return None


def size_option(limit_bytes: int | None, enforced: bool | None) -> dict[str, dict[str, str]]:
    """The create option that bounds the writable layer, both SDKs' spelling; none
    without a limit or without project quotas."""
    if limit_bytes is None or not enforced:
        return {}
    return {"storage_opt": {"size": str(limit_bytes)}}
