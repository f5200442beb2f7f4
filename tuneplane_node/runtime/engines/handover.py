"""A writable mount handed to a job's own user namespace where the OCI runtime cannot
id-map it (runc before 1.2; `TUNEPLANE_JOB_USERNS_WRITABLE=chown`, issue 51).

The job's root is an unprivileged id of its range on the host: a directory of root's is
read-only to it. So its files are given to that id, as kubelet's ``fsGroup`` with
``OnRootMismatch``: nothing where the top directory is the job's root's already (a
relaunch given the same range), else every entry of the tree not already its. Not
podman's ``U``: that walks by path (``filepath.Walk`` then ``Lchown``), and a job of the
same tenant running on the same directory could swap a subdirectory for a link to the
host's ``/etc`` under it. Here every entry is changed through its directory's descriptor
without following links (`os.fwalk`, ``fchownat(AT_SYMLINK_NOFOLLOW)``), and the walk stays
on the mount's filesystem. Blocking: on the engine's pool, between the container's create
(which chose its range) and its start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from tuneplane_node.errors import SpecRefused
from tuneplane_node.wire.values import Mount

log = logging.getLogger(__name__)


def root_ids(host_config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The host's uid and gid of the container's root, from its inspect's
    ``HostConfig.IDMappings`` (``"0:2147483647:65536"``); None without a mapping of 0."""
    mappings = host_config.get("IDMappings") or {}
    found = [_root(mappings.get(key) or ()) for key in ("UidMap", "GidMap")]
    uid, gid = found
    return None if uid is None or gid is None else (uid, gid)


def _root(entries: Sequence[str]) -> int | None:
    for entry in entries:
        inside, _, rest = str(entry).partition(":")
        if inside == "0" and rest:
            return int(rest.split(":", 1)[0])
    return None


def hand_over(top: str, uid: int, gid: int) -> int:
    """Every entry under the directory ``top`` (``top`` too) owned by ``uid:gid``, unless
    ``top`` is already; how many entries were changed. Links are changed themselves,
    never followed; another filesystem under ``top`` is not entered."""
    found = os.stat(top, follow_symlinks=False)
    if (found.st_uid, found.st_gid) == (uid, gid):
        return 0
    changed = _own(top, None, found, uid, gid)
    for _, dirs, files, fd in os.fwalk(top, follow_symlinks=False):
        for name in [*dirs, *files]:
            try:
                entry = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if entry.st_dev != found.st_dev:
                    if name in dirs:
                        dirs.remove(name)  # a mount below: not the job's to be given
                    continue
                changed += _own(name, fd, entry, uid, gid)
            except FileNotFoundError:
                continue  # gone meanwhile (a running job of the tenant's): nothing to give
    log.info("handed %s to uid %d: %d entries", top, uid, changed)
    return changed


def _own(name: str, fd: int | None, entry: os.stat_result, uid: int, gid: int) -> int:
    if (entry.st_uid, entry.st_gid) == (uid, gid):
        return 0
    os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    return 1


def hand_over_mounts(host_config: Mapping[str, Any], mounts: Sequence[Mount]) -> None:
    """Each writable mount handed to the container's root (its inspect's
    ``HostConfig``); one that cannot be is a `SpecRefused` naming it."""
    ids = root_ids(host_config)
    if ids is None:  # no range of its own: nothing to hand over
        return
    for mount in [m for m in mounts if not m.read_only]:
        try:
            hand_over(mount.host, *ids)
        except OSError as exc:
            raise SpecRefused(
                engine="podman", action=f"hand {mount.container} to the job's user namespace",
                reason=exc.strerror or str(exc), field="container.mounts",
            ) from exc  # fmt: skip
