"""What a launch binds into its container from the host: its bind mounts
(``container.mounts``) and its scratch space (``container.scratch``), each a `Field` of
the container's table with its reader; and the rule every target path keeps
(`read_target`: absolute, and not where the engine or the kernel keeps its own).
Whether a host path may be mounted is the node's to decide when it opens it
(`jobs.mounts.policy`), not the contract's.
"""

from __future__ import annotations

from collections.abc import Mapping

from tuneplane_node.errors import MISSING, InvalidField
from tuneplane_node.sizes import MAX_SIZE, size_in_bytes
from tuneplane_node.wire.fields import (
    Field,
    Given,
    Refusals,
    Schema,
    closed_object,
    number,
    or_empty,
)
from tuneplane_node.wire.readers import PATH, SIZE_TEXT, empty_as, is_absolute, read_list, read_size
from tuneplane_node.wire.values import Mount, Scratch

UNMOUNTABLE = "a job may not mount onto /, /etc, nor under /proc, /sys, /dev, /run/nvidia*"
MAX_MOUNTS = 64
MIN_SCRATCH = 2**20


def mount_forms() -> Schema:
    """A bind mount: ``[host, container]``, ``[host, container, read_only]``, or an
    object of those keys (others ignored)."""
    flag = {"type": "boolean"}
    pair = {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [PATH, PATH]}
    triple = {"type": "array", "minItems": 3, "maxItems": 3, "prefixItems": [PATH, PATH, flag]}
    keys = {"host": PATH, "container": PATH, "read_only": flag}
    named = {"type": "object", "properties": keys, "required": ["host", "container"]}
    return {"anyOf": [pair, triple, {**named, "additionalProperties": True}]}


def _mounts(given: Given) -> tuple[Mount, ...]:
    value = read_list(given, most=MAX_MOUNTS, what="[host, container, read_only]")
    with Refusals() as refusals:
        mounts = [
            refusals.read(_mount, entry, f"{given.field}[{i}]") for i, entry in enumerate(value)
        ]
    return tuple(mounts)


def _mount(entry: object, field: str) -> Mount:
    if isinstance(entry, Mapping):
        entry = [entry.get("host"), entry.get("container"), entry.get("read_only", False)]
    if not isinstance(entry, list) or len(entry) not in (2, 3):
        raise InvalidField(field, "must be [host, container, read_only]")
    host, target, read_only = (*entry, False)[:3]
    for path in (host, target):
        if not is_absolute(path):
            raise InvalidField(field, "host and container must be absolute paths without '..'")
    if not isinstance(read_only, bool):
        raise InvalidField(field, "read_only must be true or false")
    if not _mountable_target(target):
        raise InvalidField(field, f"{target}: {UNMOUNTABLE}")
    return Mount(host, target, read_only)


def _mountable_target(target: str) -> bool:
    """Not the root, not /etc itself (the engine writes hosts and resolv.conf into it), not
    the kernel's or the devices' trees, nor the NVIDIA runtime's sockets."""
    parts = [part for part in target.split("/") if part not in ("", ".")]
    if not parts or parts == ["etc"] or parts[0] in ("proc", "sys", "dev"):
        return False
    return not (parts[0] == "run" and len(parts) > 1 and parts[1].startswith("nvidia"))


def _scratch(given: Given) -> Scratch | None:
    """``{"path", "size"}``, both required; ``""`` or null: none. Each bad part is
    refused by its own name (``container.scratch.size``); the node's ceiling,
    `TUNEPLANE_JOB_SCRATCH_MAX`, is the launcher's to hold."""
    value = empty_as(given.value, None)
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"path", "size"}:
        raise InvalidField(given.field, 'must be {"path": "/scratch", "size": "50g"}')
    with Refusals() as refusals:
        path = refusals.read(read_target, value.get("path"), f"{given.field}.path")
        size = refusals.read(_scratch_size, Given(value, f"{given.field}.size", given.run_id))
    return Scratch(path, size)


def read_target(path: object, field: str) -> str:
    """A path in the container that something is bound at (a scratch space, a volume):
    required, absolute, and not where the engine or the kernel keeps its own."""
    if path is None or path == "":
        raise InvalidField(field, "required, an absolute path", problem=MISSING)
    if not is_absolute(path):
        raise InvalidField(field, "must be an absolute path without '..'")
    if not _mountable_target(str(path)):
        raise InvalidField(field, f"{path}: {UNMOUNTABLE}")
    return str(path)


def _scratch_size(given: Given) -> int:
    if given.value is None or given.value == "":
        raise InvalidField(given.field, "required, a size like 50g", problem=MISSING)
    return int(size_in_bytes(read_size(given, least=MIN_SCRATCH)) or 0)


MOUNTS = Field(
    "mounts",
    or_empty({"type": "array", "maxItems": MAX_MOUNTS, "items": mount_forms()}),
    f"At most {MAX_MOUNTS} bind mounts, each `[host, container, read_only]` "
    "(`read_only` may be left out: false); both paths absolute, without `..`. "
    '`{"host", "container", "read_only"}` objects are accepted too. The host path '
    "must exist, lie under one of `TUNEPLANE_ALLOWED_MOUNT_ROOTS` (by default the "
    "storage root and the model dirs) on that root's filesystem, and be its own real "
    "path: the node opens it from the root one component at a time without "
    "following a symlink, and the engine mounts what was opened (a path swapped "
    "for a link meanwhile is refused, never followed). It may not be, hold or lie "
    "in the node's own files (token, TLS key, registry auth file, state directory) "
    "nor the engine's directories. An engine on another machine takes no host "
    f"mounts. As for the container path, {UNMOUNTABLE}. A bad mount is a `422` "
    "naming `container.mounts[i]`, with the reason in words.",
    read=_mounts,
)
SCRATCH = Field(
    "scratch",
    or_empty(
        closed_object(
            path=PATH,
            size={"anyOf": [number(least=MIN_SCRATCH, most=MAX_SIZE, whole=True), SIZE_TEXT]},
        )
    ),
    'Scratch space with a hard size, `{"path": "/scratch", "size": "50g"}`: '
    "a filesystem of the job's own (ext4 in a sparse file of the node's "
    "`TUNEPLANE_SCRATCH_ROOT`, loop-mounted, nosuid and nodev, its root writable "
    "by any user of the job), bound at `path`. A write past `size` is `ENOSPC` "
    "in the job; the node's disk grows by at most `size`, which the job's "
    "`disk_limit` does not count. It is deleted with the container (remove, reap, "
    f"a failed launch). `size`: like `shm_size`'s, from {MIN_SCRATCH // 2**20} MiB "
    "to `TUNEPLANE_JOB_SCRATCH_MAX`; `path`: absolute, not another mount's "
    f"target, and as for mounts, {UNMOUNTABLE}. A bad one is a `422` naming "
    '`container.scratch.path` or `container.scratch.size`. `""` or none: no '
    "scratch. The process runtime and an engine on another machine refuse it "
    "(`422`).",
    read=_scratch,
)
